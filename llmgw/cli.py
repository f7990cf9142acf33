"""Command line: parse options, build the parts, run them, report, choose the exit code.

Nothing here decides anything about a catalogue; the stages do (lint, place, plan),
and reporters turn their results into text.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from llmgw import __version__
from llmgw.errors import FleetError, LlmgwError, UsageError
from llmgw.lint import LintResult, lint
from llmgw.plan import build_plan, dump_plan, read_plan
from llmgw.report import REPORTERS

# Exit codes shared by every command.
EXIT_OK, EXIT_FINDINGS, EXIT_CANNOT_RUN = 0, 1, 2


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


@main.command("lint")
@catalog_argument
@fleet_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(sorted(REPORTERS)),
    default="text",
    show_default=True,
)
@click.option("--strict", is_flag=True, help="Warnings fail the run too.")
def lint_command(catalog: Path, fleet_path: Path, fmt: str, strict: bool) -> None:
    """Check every model file against the schema and the fleet; report every finding."""
    reporter = REPORTERS[fmt]
    out = sys.stdout
    try:
        result = lint(catalog, fleet_path)
    except FleetError as exc:
        if fmt == "text":
            raise  # the sentence and its findings, on stderr, as for any error
        reporter(exc.findings, out, color=False)
        click.echo(f"llmgw: cannot use the fleet inventory {fleet_path}; fix it first.", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    reporter(result.findings, out, color=_use_color(out))
    if fmt == "text":
        click.echo(_summary(result), err=True)
    sys.exit(_lint_exit_code(result, strict))


def _summary(result: LintResult) -> str:
    errors, warnings = result.counts()
    files = result.files_checked
    if not errors and not warnings:
        return f"{files} model file(s) checked: no findings."
    return f"{files} model file(s) checked: {errors} error(s), {warnings} warning(s)."


def _lint_exit_code(result: LintResult, strict: bool) -> int:
    errors, warnings = result.counts()
    if errors or (strict and warnings):
        return EXIT_FINDINGS
    return EXIT_OK


@main.command("plan")
@catalog_argument
@fleet_option
@click.option(
    "--out",
    "out_path",
    default="plan.json",
    show_default=True,
    help="Where to write the plan; - for standard output.",
)
@click.option(
    "--previous",
    "previous_path",
    type=click.Path(path_type=Path),
    default=None,
    help="The plan now deployed: its replicas stay where they are while they still fit.",
)
def plan_command(catalog: Path, fleet_path: Path, out_path: str, previous_path: Path | None) -> None:
    """Lint, then write the resolved plan (nothing is written when lint finds errors)."""
    previous = read_plan(previous_path) if previous_path else None
    result = lint(catalog, fleet_path, previous=previous)
    errors, _ = result.counts()
    if errors:
        REPORTERS["text"](result.findings, sys.stderr, color=_use_color(sys.stderr))
        click.echo(f"{_summary(result)} No plan written.", err=True)
        sys.exit(EXIT_FINDINGS)
    text = dump_plan(build_plan(result, previous=previous))
    if out_path == "-":
        click.echo(text, nl=False)
    else:
        _write_atomically(Path(out_path), text)
        click.echo(f"Wrote {out_path}: {len(result.entries)} model(s). {_summary(result)}", err=True)


def _write_atomically(path: Path, text: str) -> None:
    # Written then renamed over, so a gateway watching the file never reads half a plan.
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(
            f"cannot write the plan to {path}: {exc.strerror or exc}; give --out a file path in "
            "a folder that exists, or - for standard output."
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


@main.command("inspect")
@click.argument("source")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "text", "yaml"]),
    default="text",
    show_default=True,
)
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
    from llmgw.inspect import inspect, is_model_file, model_file_source, write_facts
    from llmgw.report.inspect_formats import INSPECT_REPORTERS

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
# pay for httpx; the logic lives in llmgw.diff, llmgw.gitea and llmgw.inventory.


@main.command("diff")
@click.argument("old", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "markdown", "text"]),
    default="text",
    show_default=True,
)
@click.option(
    "--detailed-exitcode",
    is_flag=True,
    help="Exit 0 when nothing changes, 2 when something does, 1 on error (as terraform plan).",
)
def diff_command(old: Path, new: Path, fmt: str, detailed_exitcode: bool) -> None:
    """Show what deploying plan NEW over plan OLD changes, model by model.

    An empty OLD (such as /dev/null) stands for no plan: everything is added.
    """
    from llmgw.diff import diff_plans, read_side
    from llmgw.report.diff_formats import DIFF_REPORTERS

    try:
        changes = diff_plans(read_side(old), read_plan(new).doc)
    except LlmgwError as exc:
        if not detailed_exitcode:
            raise
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(1)
    out = sys.stdout
    DIFF_REPORTERS[fmt](changes, out, color=fmt == "text" and _use_color(out))
    if detailed_exitcode:
        sys.exit(2 if changes.has_changes else 0)


@main.command("pr-comment")
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
    from llmgw.gitea import (
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


@main.command("inventory")
@click.option("--name", default=None, help="Node name; this machine's short hostname when absent.")
@click.option("--address", default=None, help="Address the gateway reaches this node on.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option("--ports", default=None, metavar="FIRST-LAST", help="Ports replicas may use here.")
@click.option(
    "--format", "fmt", type=click.Choice(["json", "yaml"]), default="yaml", show_default=True
)
def inventory_command(
    name: str | None, address: str | None, labels: tuple[str, ...], ports: str | None, fmt: str
) -> None:
    """Print this machine's fleet entry from what it reports: memory, GPUs, engines on PATH.

    Paste the output under `nodes:` in fleet.yaml.
    """
    import json

    from llmgw.inventory import entry_yaml, parse_labels, parse_ports, take_inventory

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


@main.command("serve")
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
    from llmgw.gateway.serve import serve

    serve(plan_path, bind, workers)


@main.command("deploy")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--gateway", "gateway_url", required=True, metavar="URL", help="e.g. http://127.0.0.1:8080")
def deploy_command(plan_path: Path, gateway_url: str) -> None:
    """Send PLAN to a running gateway (token from LLMGW_ADMIN_TOKEN); it serves it at once."""
    from llmgw.gateway.deploy import deploy

    digest = deploy(plan_path, gateway_url)
    click.echo(f"{gateway_url} now serves {digest}.")


# Running the plan: the node agent, and `up` for a whole fleet on this one machine.


@main.group("node", invoke_without_command=True)
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
@click.pass_context
def node_command(
    ctx: click.Context,
    node_name: str | None,
    plan_path: Path | None,
    gateway_url: str | None,
    state_dir: Path,
    status_bind: str,
    grace: float,
) -> None:
    """Run and supervise the engines the plan places on this node, until stopped.

    Ctrl-C or SIGTERM stops every engine it started; an agent killed and started again
    takes back the engines still running instead of starting them twice.
    """
    if ctx.invoked_subcommand is not None:
        return
    from llmgw.node.agent import FilePlan, GatewayPlan, Settings
    from llmgw.node.run import run_node

    if not node_name:
        raise click.UsageError("--node NAME is required: the name this machine has in the plan.")
    if (plan_path is None) == (gateway_url is None):
        raise click.UsageError("give exactly one of --plan PATH or --gateway URL.")
    source = (
        FilePlan(plan_path)
        if plan_path is not None
        else GatewayPlan(str(gateway_url), os.environ.get("LLMGW_ADMIN_TOKEN"))
    )
    run_node(Settings(node_name, state_dir, grace_s=grace), source, status_bind)


@node_command.command("status")
@click.option("--agent", "agent_url", default="http://127.0.0.1:9100", show_default=True, metavar="URL")
def node_status_command(agent_url: str) -> None:
    """Print a running agent's replicas as a table."""
    import httpx

    url = agent_url.rstrip("/") + "/status"
    try:
        doc = httpx.get(url, timeout=10, trust_env=False).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise UsageError(f"no agent answers at {url} ({exc}); start one with `llmgw node`.") from None
    click.echo(f"node {doc['node']}, plan {doc['plan_digest']}")
    rows = [("MODEL", "PROFILE", "ENDPOINT", "STATE", "PID", "RESTARTS", "MESSAGE")]
    for r in doc["replicas"]:
        rows.append((r["model"], r["profile"], r["endpoint"], r["state"], str(r["pid"] or "-"),
                     str(r["restarts"]), r["message"] or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])


@main.command("up")
@click.argument("catalog", type=click.Path(path_type=Path), default=Path("examples/local"), required=False)
@click.option("--bind", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT", help="The gateway.")
@click.option("--status-bind", default="127.0.0.1:9100", show_default=True, metavar="HOST:PORT")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=Path(".llmgw-up"), show_default=True,
    help="The plan, fleet, engine logs and records.",
)
def up_command(catalog: Path, bind: str, status_bind: str, state_dir: Path) -> None:
    """Run CATALOG on this machine alone: plan it onto a one-node fleet, start the engines and the
    gateway, and stop them all on Ctrl-C."""
    from llmgw.up import up

    sys.exit(up(catalog, bind, status_bind, state_dir))
