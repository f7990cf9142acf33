"""The whole on-demand path: the real gateway holds each request while the real node agent
makes room by memory and starts the engine (stand-ins for llama-server)."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.gateway.harness import gateway, wait_until
from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin

sys.path.insert(0, str(REPO / "tests" / "gateway"))
from redis_server import redis_server  # noqa: E402

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


def test_what_is_loaded_follows_the_agent_as_it_changes_and_a_stopped_model_is_not_healthy(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=0.8)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": on_demand("a"), "b.yaml": on_demand("b")})
    agent.start()
    # Health checks (and so the agents' polls) every 30 s: only an agent that answers as its
    # state changes can tell the gateway of a swap within the waits below.
    slow = {"LLMGW_HEALTH_INTERVAL": "30", "LLMGW_HEALTH_FAILURES": "2"}
    try:
        with gateway(fleet.plan_path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="60", **slow) as gw:

            def dashboard(name: str) -> dict[str, object]:
                model: dict[str, object] = httpx.get(gw.url + "/dashboard/status.json", timeout=10).json()[
                    "models"
                ][name]
                return model

            before = dashboard("a")
            assert (before["healthy"], before["placed"], before["stopped"]) == (0, 1, 1), before
            page = httpx.get(gw.url + "/", timeout=10).text
            assert "stopped, started on demand" in page

            def ask(name: str) -> None:
                answer = httpx.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
                    timeout=90,
                )
                assert answer.status_code == 200, answer.text

            def every_worker_lists(loaded: dict[str, bool]) -> bool:
                for _ in range(6):  # new connections, so each worker is asked
                    with httpx.Client(timeout=10) as fresh:
                        data = fresh.get(gw.url + "/v1/models").json()["data"]
                    if {m["id"]: m.get("loaded") for m in data} != loaded:
                        return False
                return True

            ask("a")
            wait_until(lambda: every_worker_lists({"a": True, "b": False}), 10, "a loaded, b not")
            after = dashboard("a")
            assert (after["healthy"], after["stopped"]) == (1, 0), after
            ask("b")  # evicts a
            wait_until(lambda: every_worker_lists({"a": False, "b": True}), 10, "the swap to b seen")
            assert dashboard("a")["stopped"] == 1
    finally:
        agent.stop()


def test_the_agents_status_answers_a_waiting_caller_when_a_state_changes(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=0.8)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": on_demand("a")})
    agent.start()
    try:
        first = httpx.get(agent.status_url + "/status", timeout=10).json()
        quiet = httpx.get(
            agent.status_url + "/status", params={"after": first["changes"], "wait": 0.3}, timeout=10
        )
        assert quiet.json()["changes"] == first["changes"], "nothing changed, so it waited and said so"
        for bad in ("nan", "inf", "-1", "1e308"):
            refused = httpx.get(
                agent.status_url + "/status", params={"after": first["changes"], "wait": bad}, timeout=5
            )
            assert refused.status_code == 400, f"wait={bad} was {refused.status_code}, not refused at once"
        endpoint = first["replicas"][0]["endpoint"]
        with httpx.Client(timeout=60) as client:
            waiting = client.build_request(
                "GET", agent.status_url + "/status", params={"after": first["changes"], "wait": 50}
            )
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                answer = pool.submit(client.send, waiting)
                acquired = httpx.post(
                    agent.status_url + "/acquire",
                    json={"endpoint": endpoint, "wait_s": 30},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=60,
                )
                assert acquired.status_code == 200, acquired.text
                moved = answer.result(timeout=40).json()
        assert moved["changes"] > first["changes"]
        assert moved["replicas"][0]["state"] != "idle", moved["replicas"][0]
    finally:
        agent.stop()


def test_two_gateway_instances_on_redis_take_turns_so_a_steady_stream_starves_nothing(tmp_path: Path) -> None:
    """Swap-aware on-demand across instances (issue 34): with the line on Redis, a steady
    stream for `a` through two gateways lets a lone request for `b` in once it has waited its
    patience, on a node with room for one; each instance deciding alone never drained `a`."""
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=0.8)
    env = {"LLMGW_AGENT_TOKEN": TOKEN, "STAND_IN_LOAD_S": "0.3", "STAND_IN_SERVICE_S": "0.2"}
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), **env)
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": on_demand("a"), "b.yaml": on_demand("b")})
    agent.start()
    # Patience min(5 s, LLMGW_QUEUE_WAIT / 4) = 3 s; `b` gives up after 12 s.
    gw_env = {"LLMGW_AGENT_TOKEN": TOKEN, "LLMGW_QUEUE_WAIT": "12", "LLMGW_LOAD_TIMEOUT": "12"}
    stop = threading.Event()

    def chat(url: str, name: str) -> httpx.Response:
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)

    def stream_of_a(url: str) -> list[int]:
        statuses = []
        while not stop.is_set():
            statuses.append(chat(url, "a").status_code)
        return statuses

    try:
        with (
            redis_server(_made(tmp_path / "redis")) as redis,
            gateway(fleet.plan_path, LLMGW_REDIS_URL=redis.url, **gw_env) as one,
            gateway(fleet.plan_path, LLMGW_REDIS_URL=redis.url, **gw_env) as two,
            concurrent.futures.ThreadPoolExecutor(6) as pool,
        ):
            streams = [pool.submit(stream_of_a, gw.url) for gw in (one, two, one, two, one, two)]
            agent.wait_state("a", "ready")
            began = time.monotonic()
            lone = chat(two.url, "b")
            waited = time.monotonic() - began
            stop.set()
            of_a = [status for s in streams for status in s.result()]
        assert lone.status_code == 200, f"b after {waited:.1f} s beside a steady stream for a: {lone.text}"
        assert set(of_a) == {200}, sorted(set(of_a))
    finally:
        stop.set()
        agent.stop()


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory
