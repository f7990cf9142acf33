"""`llmgw serve` before and after: settings it refuses to start with, and the metrics
directory each run leaves behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from harness import (
    ROOT,
    Engine,
    dead_endpoint,
    free_port,
    gateway,
    model,
    plan,
    profile,
    stop,
    subprocess_env,
    wait_until,
    write_plan,
)

from llmgw.gateway.server.serve import gunicorn_argv, serve_environment
from llmgw.node.host import port_is_free


def plan_file(where: Path, engine: Engine) -> Path:
    path = where / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine.url], "chat")])]))
    return path


def test_the_metrics_directory_made_for_a_run_is_removed_when_it_ends(
    tmp_path: Path, engine_a: Engine
) -> None:
    with gateway(plan_file(tmp_path, engine_a), workers=1) as gw:
        made = Path(gw.env["PROMETHEUS_MULTIPROC_DIR"])
        assert httpx.get(gw.url + "/metrics", timeout=10).status_code == 200
        assert any(made.glob("*.db")), "the worker keeps its metrics there"
    assert not made.exists(), "every restart would leave one more directory in /tmp"


def test_a_kept_metrics_directory_loses_the_last_runs_files_at_start(
    tmp_path: Path, engine_a: Engine
) -> None:
    kept = tmp_path / "metrics"
    kept.mkdir()
    stale = kept / "counter_999999.db"  # a pid from the last run, not a valid file at all
    stale.write_bytes(b"stale")
    mine = kept / "README"
    mine.write_text("the operator's own file\n")
    with gateway(plan_file(tmp_path, engine_a), workers=1, PROMETHEUS_MULTIPROC_DIR=str(kept)) as gw:
        assert not stale.exists(), "its counts would be added to this run's"
        assert httpx.get(gw.url + "/metrics", timeout=10).status_code == 200
    assert kept.is_dir() and mine.exists(), "a directory the operator chose is theirs"


BAD_SETTINGS = [
    ({"LLMGW_API_KEYS_FILE": "{tmp}/missing-keys.txt"}, "LLMGW_API_KEYS_FILE"),
    ({"LLMGW_API_KEYS_FILE": "{tmp}/keys.txt"}, "LLMGW_API_KEYS_FILE"),  # holds a key, not its digest
    ({"LLMGW_API_KEYS_FILE": "{tmp}/latin1.txt"}, "not UTF-8"),
    ({"LLMGW_KEYS_FILE": "{tmp}/keys.yaml"}, "is not a valid one"),
    ({"LLMGW_CHUNK_TIMEOUT": "5s"}, "LLMGW_CHUNK_TIMEOUT"),
    ({"LLMGW_HEALTH_FAILURES": "2.5"}, "LLMGW_HEALTH_FAILURES"),
    ({"LLMGW_FIRST_BYTE_TIMEOUT": "nan"}, "LLMGW_FIRST_BYTE_TIMEOUT"),
    ({"LLMGW_MAX_CONNECTIONS": "many"}, "LLMGW_MAX_CONNECTIONS"),
]


@pytest.mark.parametrize(("setting", "named"), BAD_SETTINGS, ids=[n for _, n in BAD_SETTINGS])
def test_llmgw_serve_refuses_a_bad_setting_in_one_sentence_before_starting(
    tmp_path: Path, setting: dict[str, str], named: str
) -> None:
    (tmp_path / "keys.txt").write_text("sk-the-key-itself\n")
    (tmp_path / "latin1.txt").write_bytes("# caf\u00e9\n".encode("latin-1"))
    impossible = "keys:\n  - name: a\n    sha256: " + "0" * 64 + "\n    expires: 2027-02-29\n"
    (tmp_path / "keys.yaml").write_text(impossible)
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile(["http://127.0.0.1:9"], "chat")])]))
    env = subprocess_env(**{k: v.format(tmp=tmp_path) for k, v in setting.items()})
    argv = ["serve", "--plan", str(path), "--bind", f"127.0.0.1:{free_port()}", "--workers", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", *argv], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr and "gunicorn" not in done.stderr.lower()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], f"want one sentence naming {named}, got {lines}"


def test_llmgw_serve_on_a_taken_port_says_so_in_one_sentence_at_once(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile(["http://127.0.0.1:9"], "chat")])]))

    def serve(bind: str) -> tuple[subprocess.CompletedProcess[str], float]:
        argv = [sys.executable, "-m", "llmgw", "serve", "--plan", str(path), "--bind", bind, "--workers", "1"]
        started = time.monotonic()
        done = subprocess.run(
            argv, env=subprocess_env(), capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        return done, time.monotonic() - started

    # What a refusal costs anyway on this machine (Python's start, the imports), however loaded.
    _, reference = serve("not-an-address")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done, took = serve(f"127.0.0.1:{port}")
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port} is taken" in lines[0], lines
    # gunicorn alone retried for five seconds, a raw error each, before it gave up.
    assert took < reference * 1.5 + 2, (
        f"took {took:.1f} s to say the port is taken, {reference:.1f} s to refuse"
    )


def test_llmgw_serve_says_at_start_which_models_no_engine_answers_for(
    tmp_path: Path, engine_a: Engine
) -> None:
    path = tmp_path / "plan.json"
    down = dead_endpoint()
    write_plan(
        path,
        plan(
            [
                model("up", [profile([engine_a.url], "up")]),
                model("down", [profile([down], "down")]),
            ]
        ),
    )
    bind = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "llmgw", "serve", "--plan", str(path), "--bind", bind, "--workers", "1"]
    proc = subprocess.Popen(argv, env=subprocess_env(), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()  # said before gunicorn starts
        assert said.startswith(f"llmgw serve: no replica of down answers yet ({down})"), said
        assert "endpoints, which llmgw does not start" in said and "get 503" in said, said
        wait_until(lambda: httpx.get(f"http://{bind}/healthz", timeout=2).status_code == 200, 60, "serving")
    finally:
        stop(proc)
    rest = proc.stderr.read()
    assert "no replica of up" not in rest, "a model whose engine answers is not said"


def test_a_gateway_started_by_gunicorn_itself_says_what_is_wrong_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan([model("chat", [profile(["http://127.0.0.1:9"], "chat")])]))
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = serve_environment(
        path,
        subprocess_env(
            LLMGW_API_KEYS_FILE=str(tmp_path / "missing-keys.txt"), PROMETHEUS_MULTIPROC_DIR=str(metrics)
        ),
    )
    done = subprocess.run(
        gunicorn_argv(f"127.0.0.1:{free_port()}", 1), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "cannot read LLMGW_API_KEYS_FILE" in done.stderr


def test_workers_die_with_a_master_killed_outright_and_free_the_port(
    tmp_path: Path, engine_a: Engine
) -> None:
    with gateway(plan_file(tmp_path, engine_a), workers=2) as gw:
        workers = gw.worker_pids()
        assert len(workers) == 2
        os.kill(gw.proc.pid, signal.SIGKILL)
        gw.proc.wait(10)

        def gone() -> bool:
            return not any(Path(f"/proc/{p}").exists() and _not_zombie(p) for p in workers)

        wait_until(gone, 10, "the workers to die with their master")
        host, port = gw.url.removeprefix("http://").split(":")
        wait_until(lambda: port_is_free(host, int(port)), 10, "the port free for a restarted service")


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_sigint_to_the_master_stops_every_worker_at_once_even_with_a_stream_open(
    tmp_path: Path, engine_a: Engine
) -> None:
    # SIGINT is gunicorn's quick stop: it sends its workers SIGQUIT, which uvicorn's worker
    # took only as "no longer alive" while its server ran on, until the master's graceful
    # timeout (120 s) ran out and it killed them, logging "Perhaps out of memory?".
    with gateway(plan_file(tmp_path, engine_a), workers=2) as gw:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "fake_chunks": 600,
            "fake_chunk_delay": 0.1,
        }
        with httpx.Client(timeout=30) as client, client.stream(
            "POST", gw.url + "/v1/chat/completions", json=body
        ) as answer:
            assert answer.status_code == 200
            next(answer.iter_raw())
            started = time.monotonic()
            os.kill(gw.proc.pid, signal.SIGINT)
            gw.proc.wait(30)
        took = time.monotonic() - started
        assert took < 10, f"the master took {took:.0f}s to stop its workers"
        assert "out of memory" not in gw.log(), gw.log()[-2000:]
        assert "was sent SIGKILL" not in gw.log(), gw.log()[-2000:]
