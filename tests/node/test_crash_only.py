"""Crash-only, the node's side: the agent and an engine killed outright (SIGKILL) at a random
moment while the real gateway serves requests through them.

Killing the agent must not cost a request: its engines go on serving, and the agent started
again adopts them rather than starting new ones (README, Operations). Killing an engine costs
only the requests it held: the gateway tries another replica or answers with a sentence, and
the agent brings the engine back. `tests/gateway/test_crash_only.py` kills the gateway.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import httpx

from tests.gateway.harness import Load, gateway
from tests.node.agents import Agent, Fleet, alive, chat_model, stand_in_bin, wait_for


def _chat(n: int) -> dict[str, object]:
    return {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream": n % 2 == 0}


def _answered(url: str) -> bool:
    return httpx.post(url + "/v1/chat/completions", json=_chat(1), timeout=10).status_code == 200


def test_an_agent_killed_outright_under_load_costs_no_request_and_adopts_its_engines(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False)
    bin_dir = stand_in_bin(tmp_path / "bin", "llama-server")
    fleet.plan({"a.yaml": chat_model("a"), "b.yaml": chat_model("b")})
    first = Agent(fleet, bin_dir).start()
    again: Agent | None = None
    try:
        pids = {m: first.wait_state(m, "ready")["pid"] for m in ("a", "b")}
        with gateway(fleet.plan_path) as gw, Load(gw.url, _chat) as load:
            wait_for(lambda: load.done >= 10, 30, "requests under way")
            time.sleep(random.uniform(0.0, 1.0))
            first.stop(signal.SIGKILL)
            assert all(alive(p) for p in pids.values()), "a killed agent leaves its engines serving"
            again = Agent(fleet, bin_dir).start()
            adopted = {m: again.wait_state(m, "ready")["pid"] for m in ("a", "b")}
            served = load.done
            wait_for(lambda: load.done >= served + 10, 30, "requests after the restart")
        assert load.failures == [], f"{len(load.failures)} of {load.done} failed: {load.failures[:3]}"
        assert adopted == pids, "the restarted agent adopted the running engines"
        starts = (bin_dir / "starts.jsonl").read_text().splitlines()
        assert len(starts) == 2, "no engine was started twice"
    finally:
        for agent in (again, first):
            if agent is not None and agent.proc is not None and agent.proc.poll() is None:
                agent.stop()


def test_an_engine_killed_outright_under_load_is_brought_back_and_serves_again(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False)
    bin_dir = stand_in_bin(tmp_path / "bin", "llama-server")
    fleet.plan({"a.yaml": chat_model("a")})
    agent = Agent(fleet, bin_dir).start()
    try:
        pid = agent.wait_state("a", "ready")["pid"]
        with gateway(fleet.plan_path) as gw, Load(gw.url, _chat) as load:
            wait_for(lambda: load.done >= 10, 30, "requests under way")
            time.sleep(random.uniform(0.0, 1.0))
            os.kill(pid, signal.SIGKILL)
            back = wait_for(
                lambda: (r := agent.replicas()["a"]) and r["state"] == "ready" and r["pid"] != pid and r,
                30,
                "the engine brought back",
                agent,
            )
            # Requests in flight when it died, or sent while it was down, may fail; once the
            # gateway routes to it again, none may.
            wait_for(lambda: _answered(gw.url), 30, "the gateway to route to the engine again", agent)
            before, served = len(load.failures), load.done
            wait_for(lambda: load.done >= served + 10, 30, "requests after the engine came back", agent)
            assert load.failures[before:] == [], load.failures[before:][:3]
        assert back["restarts"] == 1 and back["last_exit"] == -9
        assert not alive(pid)
    finally:
        agent.stop()
