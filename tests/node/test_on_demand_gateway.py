"""The whole on-demand path: the real gateway holds each request while the real node agent
makes room by memory and starts the engine (stand-ins for llama-server)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.gateway.harness import gateway, wait_until
from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin

TOKEN = "a-token-for-both"


def on_demand(name: str) -> str:
    return chat_model(name).replace("min_memory_gb: 0.1", "min_memory_gb: 0.5") + "    start: on-demand\n"


def test_two_models_that_do_not_fit_together_answer_in_turn_one_loaded_at_a_time(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=0.8)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": on_demand("a"), "b.yaml": on_demand("b")})
    agent.start()
    try:
        with gateway(fleet.plan_path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="60") as gw:
            for name in ("a", "b", "a", "b"):
                answer = httpx.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
                    timeout=90,
                )
                assert answer.status_code == 200, answer.text
                assert answer.json()["model"] == name
            status = httpx.get(agent.status_url + "/status", timeout=10).json()
            running = [r["model"] for r in status["replicas"] if r["state"] == "ready"]
            assert running == ["b"], f"one loaded at a time, the last asked for: {status['replicas']}"
            assert sum(r["evictions"] for r in status["replicas"]) == 3

            def every_worker_says_only_b_is_loaded() -> bool:
                # A new connection each time, so each worker is asked: the one that served
                # `a` last has no lease to tell it `a` was evicted; the agent does.
                for _ in range(8):
                    with httpx.Client(timeout=10) as fresh:
                        data = fresh.get(gw.url + "/v1/models").json()["data"]
                    listed = {m["id"]: m.get("loaded") for m in data}
                    if listed != {"a": False, "b": True}:
                        return False
                return True

            wait_until(every_worker_says_only_b_is_loaded, 15, "/v1/models to say what the agent has loaded")
    finally:
        agent.stop()
