"""`llmgw serve`: gunicorn managing uvicorn workers, each running `create_app()`.

Each worker is one process with one event loop; a streamed answer costs a task, not a
thread, so a worker holds thousands of slow generations at once. Workers share only the
metrics directory (metrics files, and the rate-limit counts: see gateway/request/limits.py): each
loads the plan and the keys, checks health and watches both files on its own.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sqlite3
import sys
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from llmgw.errors import PlanError, UsageError
from llmgw.gateway.request.limits import STATE_FILE_NAME, state_directory
from llmgw.gateway.schedule.policies import policy_named
from llmgw.gateway.server.gunicorn_conf import MADE_METRICS_DIR
from llmgw.gateway.settings import RETIRED, settings_from_env
from llmgw.gateway.state.keys import keys_from_settings
from llmgw.gateway.state.reload import last_good_path, read_table
from llmgw.gateway.state.workers import alive
from llmgw.plan import PlanProfile, PlanReplica, read_plan

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


def gunicorn_argv(bind: str, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "llmgw.gateway.server.asgi:app",
        "--worker-class",
        # uvicorn's worker, with limits on header size and count, header and body read
        # timeouts, and a cap on connections (see gateway/server/worker.py).
        "llmgw.gateway.server.worker.Worker",
        "--workers",
        str(workers),
        "--bind",
        bind,
        "--config",
        "python:llmgw.gateway.server.gunicorn_conf",
        # Long generations are the normal case: a worker restarting for a deploy or a
        # signal gets as long as a generous answer takes before it is killed.
        "--graceful-timeout",
        "120",
        # Requests hold no worker thread; a silent worker is dead, not busy.
        "--timeout",
        "60",
        "--keep-alive",
        "75",
    ]


def serve_environment(plan: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["LLMGW_PLAN"] = str(plan.resolve())
    # Workers are separate processes; metrics are summed from files in this directory.
    # gunicorn_conf empties it at start, and removes it at exit if it was made here.
    if env.get("PROMETHEUS_MULTIPROC_DIR"):
        env.pop(MADE_METRICS_DIR, None)  # the operator's, even if inherited from another run
    else:
        sweep_orphaned_metrics_dirs()
        made = tempfile.mkdtemp(prefix=f"{_MADE_PREFIX}{os.getpid()}-")
        env["PROMETHEUS_MULTIPROC_DIR"] = env[MADE_METRICS_DIR] = made
    # Workers must import this same llmgw, installed or not.
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PACKAGE_ROOT not in paths:
        env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *paths])
    return env


_MADE_PREFIX = "llmgw-metrics-"


def sweep_orphaned_metrics_dirs() -> None:
    """Remove the metrics directories of gateways that died without cleaning up.

    gunicorn's on_exit removes the directory a run made, but a master killed outright (the
    OOM killer, `kill -9`, a container's hard stop) runs no hook, and each restart after one
    left a directory behind in /tmp. Each is named for the pid that made it (`llmgw serve`
    becomes gunicorn's master); one whose pid is gone is swept at the next start.
    """
    for path in Path(tempfile.gettempdir()).glob(f"{_MADE_PREFIX}*-*"):
        pid = path.name.removeprefix(_MADE_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def check_bind(bind: str) -> None:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(f"--bind {bind!r} is not HOST:PORT; e.g. --bind 127.0.0.1:8080.")
    # gunicorn retries a taken address five times a second apart, printing a raw error for
    # each, and then exits 1; one try here says it at once, as `llmgw up` does.
    host = host.strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(
                    f"{host}:{port} is taken by another process, so the gateway was not started; "
                    "stop what holds it, or pass --bind HOST:PORT with a free port."
                ) from None
            raise UsageError(f"cannot listen on --bind {bind}: {exc.strerror or exc}.") from None


def check_environment(plan: Path, base: Mapping[str, str] | None = None) -> None:
    """What every worker will read at start, read once here: a bad LLMGW_* value or keys
    file is then one sentence and exit 2, not each worker's traceback and gunicorn's exit 3."""
    env = dict(os.environ if base is None else base)
    env["LLMGW_PLAN"] = str(plan)
    settings = settings_from_env(env)
    policy_named(settings.scheduler)
    for name, why in RETIRED.items():
        if name in env:
            print(f"llmgw: {why}", file=sys.stderr)
    keys = keys_from_settings(settings.keys_file, settings.api_keys_file)
    if keys is not None and keys.refusal:
        print(f"llmgw: {keys.refusal}", file=sys.stderr)
    if settings.redis_url and settings.keys_file is not None:
        # A wrong password or host would otherwise only show as every worker counting on
        # its own, forever; a Redis that is merely down now, the workers ride out.
        from llmgw.gateway.request.limits_redis import check_redis

        warning = check_redis(settings.redis_url)
        if warning:
            print(f"llmgw: {warning}", file=sys.stderr)
    if settings.keys_file is not None:
        check_state_directory(state_directory(env))


def check_state_directory(path: Path) -> None:
    """Budget spend and usage totals are kept here across restarts: a directory the gateway
    cannot write is found at start, not as every worker failing."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = path / f".llmgw-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"cannot keep the gateway's state (budget spend, usage totals) in {path}: "
            f"{exc.strerror or exc}. Set LLMGW_STATE_DIR to a directory the gateway may write "
            "that survives a restart."
        ) from None
    check_state_file(path / STATE_FILE_NAME)


def check_state_file(state: Path) -> None:
    """The state file, if there is one, is a SQLite database the gateway may open: garbage or a
    directory at its name once passed the start, then every worker printed a traceback and
    gunicorn exited 3; a symlink there is refused, never followed."""
    if state.is_symlink():
        raise UsageError(
            f"{state} is a symbolic link; the gateway keeps its state only in a file of its own. "
            "Remove the link (or point LLMGW_STATE_DIR elsewhere)."
        )
    if not state.exists():
        return
    if not state.is_file():
        raise UsageError(
            f"{state} is not a file; move it away so the gateway can keep its state (budget spend, "
            "usage totals) there, or point LLMGW_STATE_DIR elsewhere."
        )
    try:
        db = sqlite3.connect(f"{state.as_uri()}?mode=ro", uri=True, timeout=5.0)
        try:
            db.execute("PRAGMA schema_version").fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise UsageError(
            f"{state} is not a state file the gateway can read ({exc}); move it away (the "
            "budgets' spend and usage totals in it are lost) and start again."
        ) from None


def serve(plan: Path, bind: str, workers: int) -> None:
    """Replace this process with gunicorn; returns only by raising UsageError or PlanError."""
    check_bind(bind)
    if workers < 1:
        raise UsageError(f"--workers {workers} cannot serve anything; use 1 or more.")
    check_environment(plan)
    # Refuse a bad plan here, in one sentence, not in every worker's traceback; routing it
    # is part of the check, since that is where a worker would fail next.
    try:
        read_table(plan, created=0)
    except PlanError as exc:
        # A restart must not turn one bad file into an outage: the workers fall back to the
        # last plan they served, and /readyz and the dashboard say why.
        last_good = last_good_path(plan)
        if not last_good.is_file():
            raise
        read_table(last_good, created=0)
        print(
            f"llmgw: {exc} Serving the last good plan ({last_good}) until a good one replaces it.",
            file=sys.stderr,
        )
    for line in _not_running(plan):
        print(f"llmgw serve: {line}", file=sys.stderr)
    argv = gunicorn_argv(bind, workers)
    os.execve(sys.executable, argv, serve_environment(plan))


def _not_running(path: Path) -> list[str]:
    """Which models no replica answers for yet, and who would start one: gunicorn's "Listening"
    once read as ready while every request to a plan whose engines were not running got 503."""
    try:
        plan = read_plan(path)
    except PlanError:
        return []  # served from the last good plan, as said above
    waiting: list[tuple[str, PlanProfile, PlanReplica]] = [
        (m.name, p, r) for m in plan.models for p in m.profiles if not p.on_demand for r in p.replicas
    ]

    def answers(endpoint: str) -> bool:
        try:
            return httpx.get(endpoint + "/health", timeout=0.5, trust_env=False).status_code < 500
        except (httpx.HTTPError, ValueError):
            return False

    endpoints = sorted({r.endpoint for _, _, r in waiting})
    with ThreadPoolExecutor(max_workers=16) as pool:
        up = dict(zip(endpoints, pool.map(answers, endpoints), strict=True))
    lines = []
    for model in plan.models:
        mine = [(p, r) for name, p, r in waiting if name == model.name]
        if not mine or any(up[r.endpoint] for _, r in mine):
            continue
        nodes = sorted({r.node for _, r in mine if r.node is not None})
        where = (
            f"started by the node agent on {', '.join(nodes)} (`llmgw node --node NAME`, or `llmgw up`)"
            if nodes
            else "run elsewhere: its profile lists endpoints, which llmgw does not start"
        )
        lines.append(
            f"no replica of {model.name} answers yet ({', '.join(r.endpoint for _, r in mine)}); its engines "
            f"are {where}. Until one does, requests for {model.name} get 503."
        )
    return lines
