"""Engines answer only the gateway: the agent starts each engine with a credential of its own,
kept in its state (0600) and out of every command line, tells it only to a caller with its
token, and the gateway sends it on every request; a request straight to an engine's port
without it is refused (401)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx

from tests.gateway.harness import gateway
from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin

TOKEN = "a-token-for-both"


def test_an_engine_answers_the_gateway_and_refuses_anyone_else(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=2)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    doc = fleet.plan({"a.yaml": chat_model("a")})
    endpoint = doc["models"][0]["profiles"][0]["replicas"][0]["endpoint"]
    agent.start()
    try:
        agent.wait_state("a", "ready")
        chat = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
        straight = httpx.post(endpoint + "/v1/chat/completions", json=chat, timeout=10)
        assert straight.status_code == 401, "the engine served a caller without its credential"
        forged = httpx.post(
            endpoint + "/v1/chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert forged.status_code == 401, "the agent's token opened the engine"

        open_status = httpx.get(agent.status_url + "/status", timeout=10).json()
        assert "credentials" not in open_status, "the open /status told the engine's key"
        told = httpx.get(
            agent.status_url + "/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ).json()["credentials"]
        key = told[endpoint]
        assert (
            httpx.post(
                endpoint + "/v1/chat/completions",
                json=chat,
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            ).status_code
            == 200
        )

        [started] = agent.started()
        assert "--api-key-file" in started["argv"] and key not in " ".join(started["argv"]), started["argv"]
        key_file = Path(started["argv"][started["argv"].index("--api-key-file") + 1])
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(key_file.parent).st_mode) == 0o700
        assert key not in agent.log_text(), "the key reached the agent's log"

        with gateway(fleet.plan_path, LLMGW_AGENT_TOKEN=TOKEN) as gw:
            # A client's own Authorization is its gateway key, never passed on to the engine.
            answer = httpx.post(
                gw.url + "/v1/chat/completions",
                json=chat,
                headers={"Authorization": "Bearer sk-x"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text + gw.log()[-3000:]
            assert key not in gw.log()
    finally:
        agent.stop()
