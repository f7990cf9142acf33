"""Processes for gateway tests and the bench: fake engines and a real gunicorn gateway.

Everything listens on loopback, on ports the OS picks at run time, and every process is
killed by whoever started it, in a `finally`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

ROOT = Path(__file__).resolve().parents[2]
FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from llmgw.gateway.server.serve import gunicorn_argv, serve_environment  # noqa: E402
from llmgw.plan import Plan, PlanModel, PlanProfile, PlanReplica, dump_plan  # noqa: E402
from tests.plans import plan_of  # noqa: E402


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def dead_endpoint(host: str = "127.0.0.1") -> str:
    """An address where nothing listens: connections are refused at once."""
    return f"http://{host}:{free_port(host)}"


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def children(pid: int) -> set[int]:
    """A process's children alive now, as the kernel lists them; none once it has gone."""
    with contextlib.suppress(OSError):
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    return set()


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Engine:
    name: str
    url: str
    proc: subprocess.Popen[str]

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/fake/stats", timeout=10).json()


@contextlib.contextmanager
def engine(name: str, host: str = "127.0.0.1", *args: str) -> Iterator[Engine]:
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_ENGINE), "--host", host, "--port", "0", "--name", name, *args],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the fake prints this once it accepts connections
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"fake engine {name} did not start: {line!r}")
        yield Engine(name, "http://" + line.split()[1], proc)
    finally:
        stop(proc)


def profile(
    endpoints: list[str],
    served_name: str,
    priority: int = 100,
    weight: int = 1,
    name: str = "p",
    routing: Literal["prefix", "least-loaded"] | None = None,
    args: tuple[str, ...] = (),
) -> PlanProfile:
    """An external profile: placement cannot put a replica where a fake engine listens."""
    return PlanProfile(
        name=name,
        engine="llamacpp",
        priority=priority,
        weight=weight,
        ctx_size=8192,
        args=args,
        gpus=0,
        node_selector={},
        served_name=served_name,
        routing=routing,  # None: absent, as in plans from before routing (the task's default)
        external=True,
        replicas=tuple(PlanReplica(endpoint=e) for e in endpoints),
    )


def model(
    name: str,
    profiles: list[PlanProfile],
    task: Literal["chat", "completion", "embedding", "rerank"] = "chat",
    aliases: list[str] | None = None,
    description: str | None = None,
    max_output: int | None = None,
    context_length: int = 8192,
) -> PlanModel:
    return PlanModel(
        name=name,
        description=description,
        aliases=tuple(aliases or ()),
        task=task,
        source=f"hf://example/{name}",
        format="gguf",
        context_length=context_length,
        max_output=max_output,
        replicas=1,
        file=f"catalog/{name}.yaml",
        profiles=tuple(profiles),
        warnings=(),
    )


def plan(models: list[PlanModel]) -> Plan:
    return plan_of(models)


def write_plan(path: Path, plan: Plan | dict[str, Any]) -> None:
    """As `llmgw plan` does: written beside, then renamed over. A dict is a plan a test broke
    on purpose (a stale digest, say), which no builder would make."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dump_plan(plan.doc if isinstance(plan, Plan) else plan), encoding="utf-8")
    os.replace(tmp, path)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Gateway:
    url: str
    plan_path: Path
    proc: subprocess.Popen[bytes]
    log_path: Path
    workers: int
    env: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> set[int]:
        """The gunicorn workers alive now: the master's children, as the kernel lists them."""
        return children(self.proc.pid)

    def every_worker(self, check: Any, timeout: float, what: str) -> dict[int, dict[str, Any]]:
        """Poll /readyz until every live worker's word passes `check(word)`.

        Any worker answers for all (state/workers.py): the kernel hands new connections to
        whichever worker wakes first, which on a quiet machine was nearly always the same one,
        so asking until each had answered could wait on one for good. A worker not yet in
        the answer (still starting) is waited for; a word is the answer's own fields.
        """
        latest: dict[int, dict[str, Any]] = {}

        def done() -> bool:
            with httpx.Client(timeout=10) as fresh:
                ready = fresh.get(self.url + "/readyz", headers=self.probe_headers()).json()
            latest.clear()
            for pid, word in ready["workers"].items():
                latest[int(pid)] = {"status": ready["status"], "pid": int(pid), **word}
            pids = self.worker_pids()
            # Fewer than started: gunicorn is still forking them, or replacing one.
            return len(pids) >= self.workers and all(p in latest and check(latest[p]) for p in pids)

        try:
            wait_until(done, timeout, f"every worker to report {what}")
        except AssertionError as exc:
            if self.proc.poll() is not None:
                ended = f"the gateway exited with {self.proc.returncode}; its log ends:"
                raise AssertionError(f"{exc}\n{ended}\n{self.log()[-4000:]}") from None
            raise AssertionError(f"{exc}\nworkers {self.worker_pids()} said {latest}") from None
        return {p: latest[p] for p in self.worker_pids() if p in latest}

    def probe_headers(self) -> dict[str, str]:
        """What /readyz and /metrics need: the metrics token, when the gateway has one."""
        token = self.env.get("LLMGW_METRICS_TOKEN")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def access_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(line))
        return lines


class Load:
    """Clients asking one question after another until stopped; every failure is kept.

    `body(n)` makes the n-th request's body (so a test can alternate streamed and not);
    `done` counts the requests sent, `failures` what was not a 200, `longest` the longest
    any request waited for its whole answer.
    """

    def __init__(
        self,
        url: str,
        body: Callable[[int], dict[str, Any]],
        clients: int = 4,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url, self.body, self.headers = url, body, headers or {}
        self.failures: list[str] = []
        self.done = 0
        self.longest = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        with httpx.Client(timeout=30, headers=self.headers) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    answer = client.post(self.url + "/v1/chat/completions", json=self.body(self.done))
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.longest = max(self.longest, time.monotonic() - start)
                self.done += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def ask_as(gw: Gateway, key: str, **body: object) -> httpx.Response:
    """A chat request with `key` (model `chat` unless `body` says), on a new connection each
    time, so the kernel spreads requests over the workers."""
    return httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def at_once(clients: int, send: Callable[[], int]) -> list[int]:
    """`clients` threads each sending one request at the same time; their statuses."""
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        status = send()
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout}s for {what}; last saw {last!r}")


@contextlib.contextmanager
def gateway(
    plan_path: Path, workers: int = 2, log_dir: Path | None = None, host: str = "127.0.0.1", **env: str
) -> Iterator[Gateway]:
    port = free_port(host)
    bind = f"{host}:{port}"
    if "LLMGW_STATE_DIR" not in env and "XDG_STATE_HOME" not in env:
        # Each gateway its own state (budget spend, usage totals), never the user's own.
        env["LLMGW_STATE_DIR"] = str((log_dir or plan_path.parent) / f"state-{port}")
    full_env = serve_environment(
        plan_path,
        subprocess_env(
            **{
                "LLMGW_HEALTH_INTERVAL": "0.5",
                "LLMGW_HEALTH_FAILURES": "2",
                "LLMGW_RELOAD_INTERVAL": "0.5",
                **env,
            }
        ),
    )
    log_path = (log_dir or plan_path.parent) / f"gateway-{port}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            gunicorn_argv(bind, workers),
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    gw = Gateway(f"http://{bind}", plan_path, proc, log_path, workers, full_env)
    try:
        expected = json.loads(plan_path.read_text())["digest"]

        def up(ready: dict[str, Any]) -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited with {proc.returncode}:\n{gw.log()}")
            # The digest proves it is our gateway answering, not a stranger that took the
            # port between free_port() and gunicorn's bind.
            return ready.get("digest") == expected

        # Every worker, not the first: a test that replaces the plan while a worker is
        # still booting would have that worker read the new file instead.
        gw.every_worker(up, 30, "its plan")
        yield gw
    finally:
        stop(proc)


DIGEST_HEADER = "X-Llmgw-Plan-Digest"
