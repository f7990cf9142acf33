"""Node agents for tests: stand-in engines on PATH, plans from the real compiler, the real
`llmgw node` as a subprocess, and its /status read over HTTP."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from llmgw.compiler.build import build_plan
from llmgw.compiler.lint import lint
from llmgw.plan import dump_plan, read_plan
from tests.gateway.harness import ROOT, free_port

STAND_IN = Path(__file__).with_name("stand_in_engine.py")
NODE = "local"


def free_range(count: int) -> int:
    """The first of `count` consecutive ports that are free now, below the kernel's range of
    ephemeral ports: a range taken from it once collided with a port another test's process
    held, and once with the local end of a connection the gateway had just opened (a port
    the agent then rightly called held; a failed run, not a failed agent)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(50):
        first = rng.randrange(max(1024, low - 12_000), low - count)
        if all(_bindable(port) for port in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stand_in_bin(folder: Path, *names: str) -> Path:
    """A folder holding the stand-in engine under each name, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        exe = folder / name
        exe.write_text(f'#!/bin/sh\nSTAND_IN_AS="$0" exec "{sys.executable}" "{STAND_IN}" "$@"\n')
        exe.chmod(0o755)
    return folder


def chat_model(name: str, args: str = "[]", source: str = "weights.gguf", extra: str = "") -> str:
    return (
        f"name: {name}\nsource: {source}\ncontext_length: 1024\n{extra}"
        f"profiles:\n  - name: cpu\n    engine: llamacpp\n    min_memory_gb: 0.1\n    args: {args}\n"
    )


class Fleet:
    """A catalogue folder and a one-node fleet on 127.0.0.1, planned with the real compiler."""

    def __init__(self, root: Path, gpus: int = 0, others: bool = True, memory_gb: float = 16) -> None:
        self.root = root
        self.catalog = root / "catalog"
        self.catalog.mkdir(parents=True, exist_ok=True)
        (self.catalog / "weights.gguf").write_bytes(b"GGUF" + bytes(64))
        first = free_range(24)
        gpu_line = f"    gpus: {{count: {gpus}, memory_gb: 80}}\n" if gpus else ""
        self.fleet = root / "fleet.yaml"
        self.fleet.write_text(
            "nodes:\n"
            f"  - name: {NODE}\n    address: 127.0.0.1\n    memory_gb: {memory_gb:g}\n{gpu_line}"
            "    engines: [llamacpp, vllm]\n"
            f"    ports: {{first: {first}, last: {first + 23}}}\n"
        )
        if others:  # a second node, so tests see the agent leave other nodes' replicas alone
            self.fleet.write_text(
                self.fleet.read_text()
                + "  - name: elsewhere\n    address: 127.0.0.2\n    memory_gb: 1\n    labels: {pool: other}\n"
            )
        self.plan_path = root / "plan.json"

    def agent_at(self, url: str) -> None:
        """Record that the node's agent listens at `url` (the fleet's `agent_port`), so a
        gateway following the plan asks it there to start on-demand engines."""
        port = url.rsplit(":", 1)[1]
        text = self.fleet.read_text()
        self.fleet.write_text(text.replace("    engines:", f"    agent_port: {port}\n    engines:", 1))

    def plan(self, models: dict[str, str]) -> dict[str, Any]:
        for old in self.catalog.glob("*.yaml"):
            old.unlink()
        for file, text in models.items():
            (self.catalog / file).write_text(text)
        previous = read_plan(self.plan_path) if self.plan_path.exists() else None
        result = lint(self.catalog, self.fleet, previous=previous)
        assert result.counts()[0] == 0, result.findings
        doc = build_plan(result, previous=previous)
        tmp = self.plan_path.with_suffix(".tmp")
        tmp.write_text(dump_plan(doc))
        os.replace(tmp, self.plan_path)  # renamed over, as `llmgw plan` and deploys do
        return doc


class Agent:
    def __init__(self, fleet: Fleet, bin_dir: Path, *, source: list[str] | None = None, **env: str) -> None:
        self.fleet = fleet
        self.state_dir = fleet.root / "state"
        self.status_url = f"http://127.0.0.1:{free_port()}"
        self.log = fleet.root / "agent.log"
        self.starts = bin_dir / "starts.jsonl"
        self.source = source or ["--plan", str(fleet.plan_path)]
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "STAND_IN_DIR": str(bin_dir),
            "PYTHONPATH": str(ROOT),
            **env,
        }
        if "LLMGW_LLAMA_SERVER" not in env:
            self.env.pop("LLMGW_LLAMA_SERVER", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, node: str = NODE) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llmgw",
            "node",
            "--node",
            node,
            *self.source,
            "--state-dir",
            str(self.state_dir),
            "--status-bind",
            self.status_url.removeprefix("http://"),
            "--grace",
            "5",
        ]

    def start(self) -> Agent:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(), cwd=self.fleet.root, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_for(lambda: self.status() is not None, 20, "the agent's /status", self)
        return self

    def status(self) -> dict[str, Any] | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the agent exited ({self.proc.returncode}):\n{self.log_text()}")
        try:
            return httpx.get(self.status_url + "/status", timeout=5).json()
        except httpx.HTTPError:
            return None

    def replicas(self) -> dict[str, dict[str, Any]]:
        status = self.status() or {"replicas": []}
        return {r["model"]: r for r in status["replicas"]}

    def wait_state(self, model: str, state: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(
            lambda: _if(self.replicas().get(model), lambda r: r["state"] == state),
            timeout,
            f"{model} {state}",
            self,
        )

    def started(self) -> list[dict[str, Any]]:
        if not self.starts.exists():
            return []
        return [json.loads(line) for line in self.starts.read_text().splitlines()]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(60)


def _if(value: Any, check: Callable[[Any], bool]) -> Any:
    return value if value is not None and check(value) else None


def wait_for(check: Callable[[], Any], timeout: float, what: str, agent: Agent | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    detail = f"\nstatus: {json.dumps(agent.status(), indent=1)}\nlog:\n{agent.log_text()}" if agent else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"
