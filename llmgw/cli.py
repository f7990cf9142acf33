"""Command line: parse options, build the parts, run them, report, choose the exit code.

Nothing here decides anything about a catalogue; the stages do (lint, place, plan),
and reporters turn their results into text.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.decorators import FC

from llmgw import __version__
from llmgw.atomic import replace_file
from llmgw.compiler.build import KubernetesTarget, build_plan
from llmgw.compiler.keys import (
    add_key,
    catalogue_names,
    key_name_is_valid,
    patterns_matching_nothing,
)
from llmgw.compiler.lint import LintResult, lint, read_fleet
from llmgw.engines import names
from llmgw.errors import FleetError, LlmgwError, UsageError
from llmgw.findings import Finding
from llmgw.gitops.report import REPORTERS
from llmgw.gitops.report.diff_formats import DIFF_REPORTERS
from llmgw.gitops.report.inspect_formats import INSPECT_REPORTERS
from llmgw.plan import Plan, dump_plan, read_plan, read_previous

if TYPE_CHECKING:
    from llmgw.gateway.state.keys import Tenant

# Exit codes shared by every command.
EXIT_OK, EXIT_FINDINGS, EXIT_CANNOT_RUN = 0, 1, 2

# Where `llmgw up` keeps this folder's fleet (its plan, logs and state): `status` reads it too.
UP_STATE = Path(".llmgw-up")


def _use_color(stream: object) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Group(click.Group):
    """Turns an LlmgwError anywhere below into its sentence and exit 2."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except LlmgwError as exc:
            click.echo(f"llmgw: {exc}", err=True)
            ctx.exit(EXIT_CANNOT_RUN)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="llmgw")
def main() -> None:
    """Compile a catalogue of models into a plan, and serve it."""


catalog_argument = click.argument(
    "catalog", type=click.Path(path_type=Path), default=Path("catalog"), required=False
)
fleet_option = click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(path_type=Path),
    default=Path("fleet.yaml"),
    show_default=True,
    help="Fleet inventory the catalogue is linted and placed against.",
)

previous_option = click.option(
    "--previous",
    "previous_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The plan now deployed (an empty file: none): its replicas stay where they are while "
    "they still fit, and a clash or a shortage is reported on the files changed since.",
)


def format_option(reporters: Mapping[str, object]) -> Callable[[FC], FC]:
    """`--format`, its choices the reporters a command has; text unless told."""
    choices = click.Choice(sorted(reporters))
    return click.option("--format", "fmt", type=choices, default="text", show_default=True)


keys_option = click.option(
    "--keys",
    "keys_path",
    type=click.Path(path_type=Path),
    default=None,
    help="API keys file to check against the catalogue [keys.yaml, when it exists].",
)


@main.command("lint", short_help="Check the catalogue against the schema and fleet.")
@catalog_argument
@fleet_option
@format_option(REPORTERS)
@click.option("--strict", is_flag=True, help="Warnings fail the run too.")
@previous_option
@keys_option
def lint_command(
    catalog: Path,
    fleet_path: Path,
    fmt: str,
    strict: bool,
    previous_path: Path | None,
    keys_path: Path | None,
) -> None:
    """Check every model file against the schema and the fleet; report every finding.

    With --previous, a clash or a shortage is reported on the files new or edited since
    that plan, as `llmgw plan --previous` reports it. keys.yaml is checked too, and with
    --previous, a key that now reaches a model it did not is said on that model's file.
    """
    reporter = REPORTERS[fmt]
    out = sys.stdout
    previous = read_previous(previous_path) if previous_path else None
    try:
        result = lint(catalog, fleet_path, previous=previous, keys=_keys_file(keys_path))
    except FleetError as exc:
        if fmt == "text":
            raise  # the sentence and its findings, on stderr, as for any error
        reporter(exc.findings, out, color=False)
        click.echo(f"llmgw: cannot use the fleet inventory {fleet_path}; fix it first.", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    reporter(result.findings, out, color=_use_color(out))
    if fmt == "text":
        click.echo(_summary(result, _keys_file(keys_path)), err=True)
    sys.exit(_lint_exit_code(result, strict))


def _keys_file(keys_path: Path | None) -> Path | None:
    """Without --keys, a keys.yaml in the working folder is the one checked."""
    if keys_path is None and Path("keys.yaml").is_file():
        return Path("keys.yaml")
    return keys_path


def _summary(result: LintResult, keys: Path | None = None) -> str:
    """What was checked and what was found, each file's findings said with it: a keys.yaml
    error was once counted as a model file's."""
    files = result.files_checked
    checked = f"{files} model file(s)" + (f" and {keys}" if keys is not None else "")
    if not result.findings:
        return f"{checked} checked: no findings."
    in_keys = [f for f in result.findings if keys is not None and Path(f.file) == keys]
    in_models = [f for f in result.findings if f not in in_keys]

    def counted(findings: list[Finding]) -> str:
        errors = sum(f.severity == "error" for f in findings)
        return f"{errors} error(s), {len(findings) - errors} warning(s)"

    said = f"{checked} checked: {counted(in_models)} in the catalogue"
    return said + (f", {counted(in_keys)} in {keys}." if in_keys else ".")


def _lint_exit_code(result: LintResult, strict: bool) -> int:
    errors, warnings = result.counts()
    if errors or (strict and warnings):
        return EXIT_FINDINGS
    return EXIT_OK


@main.command("plan", short_help="Lint, then write the resolved plan.")
@catalog_argument
@fleet_option
@click.option(
    "--out",
    "out_path",
    default="plan.json",
    show_default=True,
    help="Where to write the plan; - for standard output.",
)
@previous_option
@click.option(
    "--target",
    type=click.Choice(["nodes", "kubernetes"]),
    default="nodes",
    show_default=True,
    help="nodes: llmgw's node agents run each replica where it is placed. kubernetes: the "
    "scheduler places them, the gateway finds them by DNS (see `llmgw render kubernetes`).",
)
@click.option("--namespace", default=None, help="With --target kubernetes: the workloads' namespace [llmgw].")
@click.option(
    "--cluster-domain",
    default=None,
    help="With --target kubernetes: the cluster's DNS domain the gateway resolves "
    "NAME.NAMESPACE.svc.DOMAIN in [cluster.local].",
)
@keys_option
def plan_command(
    catalog: Path,
    fleet_path: Path,
    out_path: str,
    previous_path: Path | None,
    target: str,
    namespace: str | None,
    cluster_domain: str | None,
    keys_path: Path | None,
) -> None:
    """Lint, then write the resolved plan (nothing is written when lint finds errors).

    keys.yaml is linted too, as `llmgw lint` lints it: its errors also stop the plan.
    """
    kubernetes = _kubernetes_target(target, namespace, cluster_domain)
    previous = read_previous(previous_path) if previous_path else None
    result = lint(
        catalog, fleet_path, previous=previous, kubernetes=kubernetes is not None, keys=_keys_file(keys_path)
    )
    errors, _ = result.counts()
    if errors:
        REPORTERS["text"](result.findings, sys.stderr, color=_use_color(sys.stderr))
        keys = _keys_file(keys_path)
        click.echo(f"{_summary(result, keys)} No plan written.", err=True)
        if keys is not None and any(Path(f.file) == keys for f in result.findings):
            # A keys.yaml made for another catalogue, sitting in this folder, once stopped the
            # first screen's `llmgw plan` with no word of which file it had read.
            click.echo(
                f"llmgw: {keys} was read as this catalogue's keys file because it is in this folder; "
                "fix it, or name another with --keys FILE.",
                err=True,
            )
        sys.exit(EXIT_FINDINGS)
    text = dump_plan(build_plan(result, previous=previous, target=kubernetes))
    if out_path == "-":
        click.echo(text, nl=False)
    else:
        _write_atomically(Path(out_path), text)
        click.echo(
            f"Wrote {out_path}: {len(result.entries)} model(s). {_summary(result, _keys_file(keys_path))}",
            err=True,
        )


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def _kubernetes_target(target: str, namespace: str | None, domain: str | None) -> KubernetesTarget | None:
    if target != "kubernetes":
        if namespace is not None or domain is not None:
            raise click.BadParameter("--namespace and --cluster-domain need --target kubernetes.")
        return None
    defaults = KubernetesTarget()
    namespace = defaults.namespace if namespace is None else namespace
    domain = defaults.cluster_domain if domain is None else domain
    if not _DNS_LABEL.fullmatch(namespace):
        raise click.BadParameter(
            f"--namespace {namespace!r} is not a Kubernetes namespace name: lowercase letters, digits "
            "and '-', at most 63 (for example llmgw)."
        )
    if not _DNS_NAME.fullmatch(domain):
        raise click.BadParameter(
            f"--cluster-domain {domain!r} is not a DNS domain (for example cluster.local)."
        )
    return KubernetesTarget(namespace=namespace, cluster_domain=domain)


def _write_atomically(path: Path, text: str) -> None:
    # Renamed over a plan file, so a gateway watching it never reads half a plan; written
    # straight into anything else (/dev/null, a FIFO), which a rename would replace.
    try:
        replace_file(path, text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(
            f"cannot write the plan to {path}: {exc.strerror or exc}; give --out a file path in "
            "a folder that exists, or - for standard output."
        ) from None


@main.command("inspect", short_help="Print what a GGUF file's header says.")
@click.argument("source")
@format_option(INSPECT_REPORTERS)
@click.option(
    "--write",
    is_flag=True,
    help="SOURCE is a model file: fill its weights_bytes and architecture from the header.",
)
def inspect_command(source: str, fmt: str, write: bool) -> None:
    """Read a GGUF file's header and print what it says about the model.

    SOURCE is a local path, https://…, hf://org/repo/file.gguf, or a model file
    (catalog/NAME.yaml), whose source is read. Only the header is fetched: a few megabytes
    of a remote file, by HTTP Range requests (HF_TOKEN and HF_ENDPOINT apply to hf://).
    """
    from llmgw.compiler.inspect import inspect, is_model_file, model_file_source, write_facts

    model_file = Path(source) if is_model_file(source) else None
    if write and model_file is None:
        raise click.BadParameter(
            f"--write fills in a model file, and {source} is not one; give catalog/NAME.yaml.",
            param_hint="--write",
        )
    if model_file is not None:
        result = inspect(model_file_source(model_file), base_dir=model_file.parent)
    else:
        result = inspect(source)
    INSPECT_REPORTERS[fmt](result.facts(), sys.stdout)
    if model_file is None or not write:
        return
    changed = write_facts(model_file, result)
    if changed:
        click.echo(f"Wrote {' and '.join(changed)} into {model_file}.", err=True)
    else:
        click.echo(f"{model_file} already says what the header says; nothing written.", err=True)


# GitOps commands: diff, pr-comment, inventory. Imports are local so `llmgw lint` does not
# pay for httpx; the logic lives in llmgw.gitops.diff, llmgw.gitops.gitea and llmgw.gitops.inventory.


@main.command("diff", short_help="Show what deploying NEW over OLD changes.")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@format_option(DIFF_REPORTERS)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 when nothing changes, 2 when something does, 1 on error (as terraform plan).",
)
def diff_command(old: Path, new: Path, fmt: str, detailed_exitcode: bool) -> None:
    """Show what deploying plan NEW over plan OLD changes, model by model.

    An empty OLD (such as /dev/null) stands for no plan: everything is added.
    """
    from llmgw.gitops.diff import diff_plans, read_new_side, read_side

    try:
        changes = diff_plans(read_side(old), read_new_side(new))
    except LlmgwError as exc:
        if not detailed_exitcode:
            raise
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(1)
    out = sys.stdout
    DIFF_REPORTERS[fmt](changes, out, color=fmt == "text" and _use_color(out))
    if detailed_exitcode:
        sys.exit(2 if changes.has_changes else 0)


@main.command("pr-comment", short_help="Post llmgw's comment on the pull request.")
@click.option(
    "--body-file",
    default="-",
    show_default=True,
    help="Markdown to post; - for standard input.",
)
@click.option(
    "--pr",
    "number",
    type=click.IntRange(min=1),
    default=None,
    help="Pull request number; read from the workflow event ($GITHUB_EVENT_PATH) when absent.",
)
@click.option("--marker", default=None, help="Hidden first line the comment is found again by.")
def pr_comment_command(body_file: str, number: int | None, marker: str | None) -> None:
    """Post llmgw's comment on the pull request, or update it in place.

    Server, repository and token come from the environment Gitea Actions sets
    (GITHUB_SERVER_URL, GITHUB_REPOSITORY, GITHUB_TOKEN).
    """
    from llmgw.gitops.gitea import (
        DEFAULT_MARKER,
        GiteaError,
        ReadOnlyFork,
        post_comment,
        pull_request_from_env,
    )

    try:
        body = sys.stdin.read() if body_file == "-" else Path(body_file).read_text("utf-8")
    except OSError as exc:
        raise GiteaError(f"cannot read the comment body {body_file}: {exc.strerror}.") from None
    if not body.strip():
        raise GiteaError("the comment body is empty; pass the markdown to post with --body-file.")
    pr = pull_request_from_env(os.environ, number)
    try:
        posted = post_comment(pr, body, marker or DEFAULT_MARKER)
    except ReadOnlyFork as exc:
        click.echo(f"::warning title=pr-comment::{exc}")
        return
    where = f": {posted.url}" if posted.url else ""
    click.echo(
        f"{posted.action.capitalize()} comment {posted.comment_id} on pull request "
        f"#{pr.number} of {pr.owner}/{pr.repo}{where}",
        err=True,
    )


@main.command("inventory", short_help="Print this machine's fleet entry.")
@click.option("--name", default=None, help="Node name; this machine's short hostname when absent.")
@click.option("--address", default=None, help="Address the gateway reaches this node on.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option("--ports", default=None, metavar="FIRST-LAST", help="Ports replicas may use here.")
@click.option("--format", "fmt", type=click.Choice(["json", "yaml"]), default="yaml", show_default=True)
@click.option(
    "--kubernetes",
    "kubectl_json",
    default=None,
    metavar="FILE",
    help="Write a whole fleet from `kubectl get nodes -o json` saved in FILE (- for standard input).",
)
def inventory_command(
    name: str | None,
    address: str | None,
    labels: tuple[str, ...],
    ports: str | None,
    fmt: str,
    kubectl_json: str | None,
) -> None:
    """Print this machine's fleet entry from what it reports: memory, GPUs, engines the agent runs.

    Paste the output under `nodes:` in fleet.yaml. With --kubernetes, print a whole fleet
    file for a cluster instead, from what its nodes report as allocatable.
    """
    import json

    from llmgw.gitops.inventory import entry_yaml, parse_labels, parse_ports, take_inventory

    if kubectl_json is not None:
        if name or address or labels or ports:
            raise click.BadParameter(
                "--kubernetes reads every node from kubectl; --name, --address, --label and --ports "
                "describe this one machine, so leave them out (label the nodes in Kubernetes instead)."
            )
        _kubernetes_inventory(kubectl_json, fmt)
        return

    inventory = take_inventory(
        name=name,
        address=address,
        labels=parse_labels(labels),
        ports=parse_ports(ports) if ports else None,
    )
    if fmt == "json":
        click.echo(json.dumps(inventory.entry, indent=2))
    else:
        click.echo(entry_yaml(inventory.entry), nl=False)
    for note in inventory.notes:
        click.echo(f"llmgw inventory: {note}", err=True)


def _kubernetes_inventory(source: str, fmt: str) -> None:
    import json

    from llmgw.gitops.inventory import fleet_from_kubectl, fleet_yaml

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text("utf-8")
        doc = json.loads(text)
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror or exc}.") from None
    except ValueError:
        raise UsageError(
            f"{source} is not JSON; save the nodes with `kubectl get nodes -o json > nodes.json`."
        ) from None
    inventory = fleet_from_kubectl(doc)
    if fmt == "json":
        click.echo(json.dumps(inventory.entry, indent=2))
    else:
        click.echo(fleet_yaml(inventory.entry), nl=False)
    for note in inventory.notes:
        click.echo(f"llmgw inventory: {note}", err=True)


@main.command("serve", short_help="Serve the plan behind one OpenAI endpoint.")
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path),
    default=Path("plan.json"),
    show_default=True,
    help="The plan `llmgw plan` wrote; replace it (write, then rename) to reload.",
)
@click.option("--bind", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT")
@click.option("--workers", type=int, default=2, show_default=True, help="Worker processes.")
def serve_command(plan_path: Path, bind: str, workers: int) -> None:
    """Serve the plan's models behind one OpenAI-compatible endpoint (gunicorn + uvicorn)."""
    from llmgw.gateway.server.serve import serve

    serve(plan_path, bind, workers)


@main.group("keys", invoke_without_command=True, short_help="Named API keys in keys.yaml.")
@click.pass_context
def keys_group(ctx: click.Context) -> None:
    """Named API keys in keys.yaml: who may call the gateway, which models, how often.
    Without a command, `llmgw keys list`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(keys_list_command)


@keys_group.command("list")
@click.option(
    "--file",
    "keys_path",
    type=click.Path(path_type=Path),
    default=Path("keys.yaml"),
    show_default=True,
    help="The keys file the gateway serves.",
)
def keys_list_command(keys_path: Path = Path("keys.yaml")) -> None:
    """Each key's limits, and with a budget, its spend this period and what is left: read from
    the gateway's state directory (LLMGW_STATE_DIR, else $XDG_STATE_HOME/llmgw), or from Redis
    when LLMGW_REDIS_URL is set."""
    from llmgw.gateway.state.keys import read_keys_file

    for line in _key_lines(list({t.name: t for t in read_keys_file(keys_path).values()}.values())):
        click.echo(line)


def _key_lines(tenants: list[Tenant]) -> list[str]:
    import time

    from llmgw.gateway.request.limits import read_spend, state_directory
    from llmgw.gateway.request.limits_redis import read_spend as read_shared_spend
    from llmgw.gateway.state.keys import rfc3339

    state, url, now = state_directory(), os.environ.get("LLMGW_REDIS_URL"), time.time()
    lines = []
    for tenant in tenants:
        limits = [f"{n} {v}" for n, v in (("rpm", tenant.rpm), ("tpm", tenant.tpm)) if v is not None]
        line = f"{tenant.name}: " + (", ".join(limits) or "no limits")
        budget = tenant.budget
        if budget is not None:
            spend = read_spend(state, tenant.name, budget, now)
            used = read_shared_spend(url, tenant.name, spend) if url else spend.used
            figure = "unknown (Redis does not answer)" if used is None else str(used)
            left = "" if used is None else f", {max(0, budget.tokens - used)} left"
            line += f"; budget {budget.describe()}: {figure} spent{left}, resets {rfc3339(spend.reset)}"
        lines.append(line)
    return lines


@keys_group.command("add")
@click.argument("name")
@click.option(
    "--file",
    "keys_path",
    type=click.Path(path_type=Path),
    default=Path("keys.yaml"),
    show_default=True,
    help="The keys file to append to (made if missing).",
)
@click.option("--models", default=None, metavar="A,B,...", help="Names, aliases or globs it may use [all].")
@click.option("--rpm", type=click.IntRange(min=1), default=None, help="Requests per minute [no limit].")
@click.option("--tpm", type=click.IntRange(min=1), default=None, help="Tokens per minute [no limit].")
@click.option("--expires", type=click.DateTime(["%Y-%m-%d"]), default=None, help="Last day it works.")
@click.option(
    "--priority",
    type=click.Choice(["high", "normal", "low"]),
    default=None,
    help="Which requests go first when a model is busy [normal].",
)
@click.option(
    "--share",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Its share of a busy model beside keys of its priority [1].",
)
@click.option(
    "--budget",
    default=None,
    metavar="TOKENS/PERIOD",
    help="Tokens per day, week or month, e.g. 5000000/month [no budget].",
)
@click.option(
    "--warn-at",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=None,
    help="With --budget: log a warning when this fraction of it is spent.",
)
@click.option(
    "--catalog",
    "catalog",
    type=click.Path(path_type=Path),
    default=None,
    help="The catalogue --models must name models of [catalog/, when it exists].",
)
def keys_add_command(
    name: str,
    keys_path: Path,
    models: str | None,
    rpm: int | None,
    tpm: int | None,
    expires: datetime.datetime | None,
    priority: str | None,
    share: float | None,
    budget: str | None,
    warn_at: float | None,
    catalog: Path | None,
) -> None:
    """Make a new random key for NAME, append its hash to keys.yaml, and print the key once."""
    tokens, _, every = (budget or "").partition("/")
    if budget is not None and (
        not tokens.isdigit() or int(tokens) < 1 or every not in ("day", "week", "month")
    ):
        raise click.BadParameter(
            f"{budget!r} is not a budget; write tokens per period, as 5000000/month (day, week or month)",
            param_hint="--budget",
        )
    if warn_at is not None and budget is None:
        raise click.BadParameter(
            "--warn-at needs --budget: it is a fraction of the budget", param_hint="--warn-at"
        )
    if not key_name_is_valid(name):
        raise click.BadParameter(
            "use letters, digits, '.', '_' or '-' (it labels metrics)", param_hint="NAME"
        )
    patterns = [m.strip() for m in (models or "").split(",") if m.strip()]
    _check_models_exist(patterns, catalog)
    key = add_key(
        keys_path,
        name,
        patterns,
        rpm,
        tpm,
        expires.date() if expires else None,
        priority,
        share,
        budget=(int(tokens), every, warn_at) if budget is not None else None,
    )
    click.echo(key)
    click.echo(
        f"llmgw keys: added '{name}' to {keys_path}. The key above is shown this once and stored "
        "nowhere: hand it to its holder now. Commit the file; the gateway reads it when replaced.",
        err=True,
    )


def _check_models_exist(patterns: list[str], catalog: Path | None) -> None:
    # A misspelt model once went into keys.yaml silently: the key granted nothing, and only
    # the next lint (or the holder's 403) said so.
    if catalog is None:
        if not patterns or not Path("catalog").is_dir():
            return  # no catalogue to check against here; lint checks the file later
        catalog = Path("catalog")
    names = catalogue_names(catalog)
    unknown = patterns_matching_nothing(patterns, names)
    if not unknown:
        return
    which = ", ".join(repr(p) for p in unknown)
    raise click.BadParameter(
        f"{which} matches no model name or alias in {catalog}/, so the key would grant nothing "
        f"there; no key was made. The catalogue has: {', '.join(sorted(names)) or 'no models'}. "
        "Fix the spelling, or pass --catalog with the catalogue the gateway serves.",
        param_hint="--models",
    )


@main.command("deploy", short_help="Send a plan to a running gateway.")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--gateway", "gateway_url", required=True, metavar="URL", help="e.g. http://127.0.0.1:8080")
def deploy_command(plan_path: Path, gateway_url: str) -> None:
    """Send PLAN to a running gateway (token from LLMGW_ADMIN_TOKEN); it serves it at once."""
    from llmgw.gitops.deploy import clear_text_warning, deploy

    warning = clear_text_warning(gateway_url)
    if warning:
        click.echo(warning, err=True)
    digest = deploy(plan_path, gateway_url)
    click.echo(f"{gateway_url} now serves {digest}.")


@main.command("status", short_help="Whether each node runs the plan.")
@click.argument("plan_path", metavar="[PLAN]", type=click.Path(path_type=Path), required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Ask again until the fleet runs the plan, for at most this long.",
)
@click.option(
    "--fleet",
    "fleet_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The fleet file giving each agent's port [the one the plan was made from].",
)
def status_command(
    plan_path: Path | None, as_json: bool, wait_s: float | None, fleet_path: Path | None
) -> None:
    """Whether each node runs PLAN (default: the one `llmgw up` serves here).

    Per model Synced or OutOfSync, and Healthy, Progressing, Degraded, Missing or Suspended.
    Exit 0 when every model is Synced and Healthy or Suspended, 1 otherwise.
    """
    from llmgw.gitops.report.fleet_status import REPORTERS as FLEET_REPORTERS
    from llmgw.status import FleetStatus, agent_urls, fleet_status, wait_for_fleet

    if plan_path is None:
        # In a folder where `llmgw up` runs, the plan it serves: the first screen's plan.json
        # is the bundled fleet's, whose agents this machine does not run.
        plan_path = UP_STATE / "plan.json"
        if not plan_path.is_file():
            raise click.UsageError(
                "name the plan to check (`llmgw status plan.json`); with no PLAN, status reads "
                f"{plan_path}, which `llmgw up` writes in this folder, and there is none."
            )
    plan = read_plan(plan_path)
    if plan.target is not None:
        raise UsageError(
            f"{plan_path} is planned for {plan.target.kind}, which runs the replicas itself; ask "
            "its own tools (Argo CD, Flux, kubectl rollout status) whether it runs them."
        )
    urls = agent_urls(plan, _agent_ports(plan, fleet_path))
    report = FLEET_REPORTERS["json" if as_json else "text"]
    if wait_s is None:
        status = fleet_status(plan, urls)
    else:
        # People watching see each change as it comes; a machine reads the last answer only.
        def heard(status: FleetStatus) -> None:
            report(status, sys.stdout)
            click.echo("")

        status = wait_for_fleet(plan, urls, wait_s, heard=None if as_json else heard)
    if as_json or wait_s is None:
        report(status, sys.stdout)
    sys.exit(0 if status.ok else 1)


def _agent_ports(plan: Plan, fleet_path: Path | None) -> dict[str, int]:
    """Each node's agent_port from the fleet file: the one given, else the plan's own input
    when it is still where the plan was made (a deploy's checkout, `up`'s state folder)."""
    path = fleet_path if fleet_path is not None else Path(plan.inputs.fleet.path)
    if fleet_path is None and not path.is_file():
        return {}
    fleet, _ = read_fleet(path)
    return {node.name: node.agent_port for node in fleet.nodes}


# Running the plan: the node agent, and `up` for a whole fleet on this one machine.


@main.group("node", invoke_without_command=True, short_help="Run the engines the plan places here.")
@click.option("--node", "node_name", metavar="NAME", help="This machine's node name in the plan.")
@click.option("--plan", "plan_path", type=click.Path(path_type=Path), help="Plan file to follow.")
@click.option("--gateway", "gateway_url", metavar="URL", help="Follow the plan this gateway serves.")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=Path(".llmgw-node"),
    show_default=True,
    help="Engine records, logs and downloaded weights.",
)
@click.option("--status-bind", default="127.0.0.1:9100", show_default=True, metavar="HOST:PORT")
@click.option("--grace", type=float, default=30.0, show_default=True, help="Seconds from SIGTERM to SIGKILL.")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="This agent's token, read from a file (else LLMGW_AGENT_TOKEN[_FILE]).",
)
@click.pass_context
def node_command(
    ctx: click.Context,
    node_name: str | None,
    plan_path: Path | None,
    gateway_url: str | None,
    state_dir: Path,
    status_bind: str,
    grace: float,
    token_file: Path | None,
) -> None:
    """Run and supervise the engines the plan places on this node, until stopped.

    Ctrl-C or SIGTERM stops every engine it started; an agent killed and started again
    takes back the engines still running instead of starting them twice.
    """
    if ctx.invoked_subcommand is not None:
        return
    from llmgw.node.run import run_node
    from llmgw.node.runner import RunnerSettings
    from llmgw.node.sources import FilePlan, GatewayPlan

    if not node_name:
        raise click.UsageError("--node NAME is required: the name this machine has in the plan.")
    if token_file is not None:
        # Read where every token is read (llmgw/tokens.py), so a file that cannot be read is
        # one sentence; the token itself never sits in this process's environment.
        os.environ["LLMGW_AGENT_TOKEN_FILE"] = str(token_file)
    if (plan_path is None) == (gateway_url is None):
        raise click.UsageError("give exactly one of --plan PATH or --gateway URL.")
    if gateway_url is not None and os.environ.get("LLMGW_ADMIN_TOKEN"):
        from llmgw.gitops.deploy import clear_text_warning

        # The agent reads the plan with the admin token, which can also deploy: the same
        # token `llmgw deploy` warns about, crossing the same network.
        warning = clear_text_warning(gateway_url)
        if warning:
            click.echo(warning, err=True)
    source = (
        FilePlan(plan_path)
        if plan_path is not None
        else GatewayPlan(str(gateway_url), os.environ.get("LLMGW_ADMIN_TOKEN"))
    )
    run_node(
        RunnerSettings(node_name, state_dir, grace_s=grace, lease_ttl_s=_lease_ttl_s()), source, status_bind
    )


def _lease_ttl_s() -> float:
    text = os.environ.get("LLMGW_LEASE_TTL", "900")
    try:
        ttl = float(text)
    except ValueError:
        ttl = -1.0
    if ttl <= 0:
        raise UsageError(f"LLMGW_LEASE_TTL={text} is not a number of seconds above 0; unset it for 900.")
    return ttl


@node_command.command("status")
@click.option("--agent", "agent_url", default="http://127.0.0.1:9100", show_default=True, metavar="URL")
def node_status_command(agent_url: str) -> None:
    """Print a running agent's replicas as a table."""
    import httpx

    from llmgw.gitops.report.node_status import status_lines

    url = agent_url.rstrip("/") + "/status"
    try:
        doc = httpx.get(url, timeout=10, trust_env=False).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise UsageError(f"no agent answers at {url} ({exc}); start one with `llmgw node`.") from None
    for line in status_lines(doc):
        click.echo(line)


@main.command("up", short_help="Run a catalogue on this machine alone.")
@click.argument("catalog", type=click.Path(path_type=Path), default=Path("examples/local"), required=False)
@click.option("--bind", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT", help="The gateway.")
@click.option("--status-bind", default="127.0.0.1:9100", show_default=True, metavar="HOST:PORT")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=UP_STATE,
    show_default=True,
    help="The plan, fleet, engine logs and records.",
)
@click.option(
    "--memory-gb",
    type=float,
    metavar="GB",
    help="How much of this machine's memory the plan may use; all of it when absent.",
)
@click.option(
    "--logs",
    "show_logs",
    is_flag=True,
    help="The gateway's access log and the agent's log on this terminal, not in STATE_DIR's files.",
)
@click.option(
    "--keys",
    "keys_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="keys.yaml: who may call the gateway [keys.yaml here, as lint and plan read it; none: anyone].",
)
def up_command(
    catalog: Path,
    bind: str,
    status_bind: str,
    state_dir: Path,
    memory_gb: float | None,
    show_logs: bool,
    keys_path: Path | None,
) -> None:
    """Run CATALOG on this machine alone: plan it onto a one-node fleet, start the engines and the
    gateway, and stop them all on Ctrl-C (twice: at once)."""
    from llmgw.up import up

    sys.exit(up(catalog, bind, status_bind, state_dir, memory_gb, show_logs, _keys_file(keys_path)))


# Other orchestrators: the plan rendered into their files. `fetch` runs in their containers.


@main.group("render", short_help="Write the plan as another orchestrator's files.")
def render_group() -> None:
    """Write the plan as another orchestrator's files."""


@render_group.command("kubernetes")
@click.argument("plan_path", metavar="[PLAN]", type=click.Path(path_type=Path), default=Path("plan.json"))
@click.option(
    "--out",
    "out_dir",
    required=True,
    metavar="DIR|-",
    help="Folder for the manifests and kustomization.yaml; - for one stream on standard output.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="ENGINE=IMAGE",
    help=f"An engine's container image ({', '.join(names())}; ENGINE-gpu for its GPU build). Repeatable.",
)
@click.option(
    "--executable",
    "executables",
    multiple=True,
    metavar="ENGINE=PATH",
    help=f"Where the engine's program is in its image ({', '.join(names())}). Repeatable.",
)
@click.option("--gateway-image", default=None, help="The image built from the Containerfile [llmgw:VERSION].")
@click.option("--gateway-replicas", type=int, default=2, show_default=True)
@click.option(
    "--weights-volume",
    default="emptyDir",
    show_default=True,
    metavar="emptyDir|pvc:CLAIM|hostPath:/PATH",
    help="Where the init container downloads each model's weights.",
)
@click.option(
    "--redis-secret",
    default=None,
    metavar="NAME[:KEY]",
    help="The Secret (and its key [url]) holding the Redis URL every gateway replica counts rate "
    "limits on, set as LLMGW_REDIS_URL; without it each replica counts on its own.",
)
def render_kubernetes_command(
    plan_path: Path,
    out_dir: str,
    images: tuple[str, ...],
    executables: tuple[str, ...],
    gateway_image: str | None,
    gateway_replicas: int,
    weights_volume: str,
    redis_secret: str | None,
) -> None:
    """Render a plan written with `llmgw plan --target kubernetes` as Kubernetes manifests:
    per (model, profile) a Deployment, a headless Service and a PodDisruptionBudget, and the
    gateway with the plan in a ConfigMap. The same plan always gives the same bytes."""
    from llmgw.render.kubernetes import (
        DEFAULT_EXECUTABLES,
        DEFAULT_IMAGES,
        Options,
        RedisSecret,
        WeightsVolume,
        parse_pairs,
        render,
        stream,
        write_manifests,
    )

    options = Options(
        images=parse_pairs(images, "--image", DEFAULT_IMAGES),
        executables=parse_pairs(executables, "--executable", DEFAULT_EXECUTABLES),
        gateway_replicas=gateway_replicas,
        weights=WeightsVolume.parse(weights_volume),
        redis=RedisSecret.parse(redis_secret) if redis_secret is not None else None,
        **({"gateway_image": gateway_image} if gateway_image else {}),
    )
    files = render(read_plan(plan_path), options)
    if out_dir == "-":
        click.echo(stream(files), nl=False)
        return
    write_manifests(Path(out_dir), files)
    click.echo(f"Wrote {len(files)} file(s) to {out_dir}.", err=True)


@main.command("fetch", short_help="Download a model's weights for an engine.")
@click.argument("source")
@click.option(
    "--into",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="Folder the weights are left in, as `llmgw render` told the engine.",
)
@click.option("--bytes", "expected", type=int, default=None, help="The plan's weights_bytes, checked.")
def fetch_command(source: str, directory: Path, expected: int | None) -> None:
    """Download a model's weights for an engine in a container (the init container's job)."""
    from llmgw.node.weights import fetch_into

    path = fetch_into(source, directory, expected)
    click.echo(f"{source} is at {path}.", err=True)
