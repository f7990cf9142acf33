"""Crash-only: the gateway killed outright at any moment comes back by being started again.

`llmgw serve` is killed with SIGKILL (what the OOM killer, `kill -9` and a container
runtime's hard stop do) at a random moment while requests, streams and deploys are under
way. Nothing of the killed tree may be left (no worker holding the port, no metrics folder
in /tmp), starting it again must serve within seconds, and the plan it serves must be the
last deploy it accepted: an answered deploy is on disk, never only in a dying worker.

The node agent, an engine and `llmgw up` killed outright are tested beside their own code
(tests/node/test_agent.py, tests/node/test_up.py); README's "Operations" says what each
kill leaves and what starting again does.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from harness import (
    Engine,
    children,
    free_port,
    model,
    plan,
    profile,
    stop,
    subprocess_env,
    wait_until,
    write_plan,
)

from llmgw.plan import Plan

ADMIN = "admin-token-for-crash-tests"


def _plan(engine: Engine, generation: int) -> Plan:
    # Each deploy differs in what a client sees (the description), so its digest does too.
    return plan([model("chat", [profile([engine.url], "chat")], description=f"generation {generation}")])


def _serve(path: Path, port: int) -> subprocess.Popen[bytes]:
    env = subprocess_env(LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_HEALTH_INTERVAL="0.5", LLMGW_RELOAD_INTERVAL="0.5")
    argv = [sys.executable, "-m", "llmgw", "serve", "--plan", str(path), "--bind", f"127.0.0.1:{port}"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _serving(url: str) -> str | None:
    """The digest the gateway at `url` serves, once it answers ready."""
    answer = httpx.get(url + "/readyz", timeout=5)
    return str(answer.json()["digest"]) if answer.status_code == 200 else None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


class _Load:
    """Chats, streamed and not, and deploys, until stopped; records what was accepted."""

    def __init__(self, url: str, engine: Engine) -> None:
        self.url, self.engine = url, engine
        self.running = True
        self.answered = 0
        self.sent: list[str] = []  # digests of deploys sent, in order
        self.accepted: list[str] = []  # of those, the ones answered 200
        self.threads = [threading.Thread(target=self._chat, args=(i % 2 == 0,)) for i in range(4)]
        self.threads.append(threading.Thread(target=self._deploy))

    def __enter__(self) -> _Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        for thread in self.threads:
            thread.join(30)

    def _chat(self, stream: bool) -> None:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        if stream:
            body.update(fake_chunks=20, fake_chunk_delay=0.02)
        while self.running:
            try:
                with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=10) as answer:
                    for _ in answer.iter_bytes():
                        pass
                    if answer.status_code == 200:
                        self.answered += 1
            except httpx.HTTPError:
                time.sleep(0.05)  # the gateway is gone: the test is about to restart it

    def _deploy(self) -> None:
        generation = 1
        while self.running:
            generation += 1
            doc = _plan(self.engine, generation)
            self.sent.append(doc.digest)
            try:
                answer = httpx.post(
                    self.url + "/admin/plan",
                    json=doc.doc,
                    headers={"Authorization": f"Bearer {ADMIN}"},
                    timeout=10,
                )
            except httpx.HTTPError:
                return  # cut off by the kill: sent, perhaps written, never answered
            if answer.status_code == 200:
                self.accepted.append(doc.digest)
            time.sleep(0.1)


def _first_gateway(tmp_path: Path, engine: Engine) -> tuple[Path, int, subprocess.Popen[bytes]]:
    """`llmgw serve` on a free port, serving its first plan: the plan's path, the port, the master."""
    path = tmp_path / "plan.json"
    first = _plan(engine, 1)
    write_plan(path, first)
    port = free_port()
    master = _serve(path, port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _serving(url) == first.digest, 30, "the gateway to serve its first plan")
    except BaseException:
        stop(master)
        raise
    return path, port, master


def test_a_gateway_killed_outright_under_load_comes_back_serving_its_last_deploy(
    tmp_path: Path, engine_a: Engine
) -> None:
    path, port, master = _first_gateway(tmp_path, engine_a)
    url = f"http://127.0.0.1:{port}"
    restarted: subprocess.Popen[bytes] | None = None
    try:
        tree = {master.pid, *children(master.pid)}
        assert len(tree) == 3, "a master and its two workers"
        made = list(Path(tempfile.gettempdir()).glob(f"llmgw-metrics-{master.pid}-*"))
        assert made, "llmgw serve made its metrics folder"
        with _Load(url, engine_a) as load:
            wait_until(lambda: load.answered >= 5 and load.accepted, 30, "requests and a deploy under way")
            time.sleep(random.uniform(0.0, 1.5))
            master.send_signal(signal.SIGKILL)
            master.wait(10)
        wait_until(lambda: not any(_alive(p) for p in tree), 10, "every process of the killed gateway to end")

        started = time.monotonic()
        restarted = _serve(path, port)
        served = wait_until(lambda: _serving(url), 20, "the gateway started again to serve")
        took = time.monotonic() - started
        # The last deploy answered 200 was written before its answer; one cut off by the
        # kill may have been written too, and serving it is as right.
        last = load.sent.index(load.accepted[-1])
        assert served in load.sent[last : last + 2], (
            f"served {served}, but the last accepted deploy was {load.accepted[-1]}: "
            "an accepted deploy was lost"
        )
        answer = httpx.post(url + "/v1/chat/completions", json={"model": "chat", "messages": []}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert took < 15, f"the restarted gateway took {took:.1f}s to serve"
        assert not any(p.exists() for p in made), "the killed gateway's metrics folder is swept"
    finally:
        for proc in (master, restarted):
            if proc is not None:
                stop(proc)


def test_a_worker_killed_outright_under_load_is_replaced_and_no_deploy_is_lost(
    tmp_path: Path, engine_a: Engine
) -> None:
    _, port, master = _first_gateway(tmp_path, engine_a)
    url = f"http://127.0.0.1:{port}"
    try:
        with _Load(url, engine_a) as load:
            wait_until(lambda: load.answered >= 5 and load.accepted, 30, "requests and a deploy under way")
            time.sleep(random.uniform(0.0, 1.0))
            victim = random.choice(sorted(children(master.pid)))
            subprocess.run(["kill", "-KILL", str(victim)], check=True)
            wait_until(
                lambda: victim not in children(master.pid) and len(children(master.pid)) == 2,
                20,
                "gunicorn to replace the killed worker",
            )
            time.sleep(0.5)
        assert master.poll() is None, "the gateway kept running"
        # As above: the last accepted deploy, or one the killed worker wrote as it died.
        index = load.sent.index(load.accepted[-1])
        allowed = set(load.sent[index : index + 2])

        def every_worker_serves_the_last_deploy() -> bool:
            workers = httpx.get(url + "/readyz", timeout=5).json()["workers"]  # each worker's word
            digests = {word["digest"] for word in workers.values()}
            return len(digests) == 1 and digests <= allowed and len(workers) == 2

        wait_until(every_worker_serves_the_last_deploy, 15, "both workers to serve the last accepted deploy")
    finally:
        stop(master)
