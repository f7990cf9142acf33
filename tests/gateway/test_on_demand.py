"""On-demand models through the real gateway: a request is held while the node's agent
starts the engine, then answered; leases go back; a load that never finishes is a 503."""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import free_port, gateway, model, wait_until, write_plan
from stand_in_agent import StandInAgent

from llmgw.plan import NodeUse, OnDemandUse, PlanNode, PlanProfile, PlanReplica, PortRange
from tests.plans import plan_of

TOKEN = "agent-token-for-tests"


def on_demand_plan(agent: StandInAgent, port: int):  # type: ignore[no-untyped-def]
    node = PlanNode(
        name="box", address="127.0.0.1", memory_gb=16, gpus=0, gpu_memory_gb=0, labels={},
        ports=PortRange(first=port, last=port), used=NodeUse(memory_gb=0, gpus=0, replicas=0),
        on_demand=OnDemandUse(replicas=1, memory_gb=1, largest_gb=1), agent=agent.url,
    )
    profile = PlanProfile(
        name="cpu", engine="llamacpp", priority=100, weight=1, ctx_size=2048, args=(), gpus=0,
        node_selector={}, served_name="lazy", external=False, start="on-demand", idle_stop_s=600,
        replicas=(PlanReplica(endpoint=f"http://127.0.0.1:{port}", node="box", port=port),),
    )
    return plan_of([model("lazy", [profile])], [node])


@pytest.fixture
def agent() -> Iterator[StandInAgent]:
    a = StandInAgent(TOKEN, load_s=1.0)
    yield a
    a.close()


def chat(gw_url: str, stream: bool = False, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        gw_url + "/v1/chat/completions",
        json={"model": "lazy", "messages": [{"role": "user", "content": "hi"}], "stream": stream},
        timeout=timeout,
    )


def test_requests_to_an_idle_model_are_held_until_its_engine_starts_then_answered(
    tmp_path: Path, agent: StandInAgent
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, on_demand_plan(agent, free_port()))
    with gateway(path, LLMGW_AGENT_TOKEN=TOKEN) as gw:
        ready = httpx.get(gw.url + "/readyz", timeout=10)
        assert ready.status_code == 200, "an idle on-demand replica is not a sick one"
        listing = httpx.get(gw.url + "/v1/models", timeout=10).json()["data"][0]
        assert listing["start"] == "on-demand"
        # Twenty at once against an engine that is not running: one start, twenty answers.
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: chat(gw.url, stream=i % 2 == 0), range(20)))
        failed = [a.text for a in answers if a.status_code != 200]
        assert not failed, failed
        assert agent.starts == 1, "requests that arrive together cause one start"
        assert agent.acquires >= 20
        wait_until(lambda: not agent.leases, 10, "every lease to be given back, streams included")


def test_a_load_that_never_finishes_is_a_503_with_retry_after_naming_the_model(tmp_path: Path) -> None:
    agent = StandInAgent(TOKEN, never_ready=True)
    try:
        path = tmp_path / "plan.json"
        write_plan(path, on_demand_plan(agent, free_port()))
        with gateway(path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="1.5") as gw:
            answer = chat(gw.url)
            assert answer.status_code == 503
            assert answer.headers.get("retry-after")
            message = answer.json()["error"]["message"]
            assert "lazy did not become ready within 1.5s" in message and "still loading" in message
    finally:
        agent.close()


def test_a_client_that_leaves_while_held_leaves_nothing_behind(tmp_path: Path) -> None:
    agent = StandInAgent(TOKEN, never_ready=True)
    try:
        path = tmp_path / "plan.json"
        write_plan(path, on_demand_plan(agent, free_port()))
        with gateway(path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="30") as gw:
            host, port = gw.url.removeprefix("http://").split(":")
            body = b'{"model": "lazy", "messages": []}'
            with socket.create_connection((host, int(port))) as client:
                client.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode() + body
                )
                # The first acquire asks without waiting, and is answered at once: a client that
                # left during it left no waiter for the agent to see (a failure on a loaded CI).
                wait_until(lambda: agent.acquires >= 2, 10, "the gateway to wait on the agent")
            wait_until(lambda: agent.waiters_gone >= 1, 10, "the agent to see its waiter leave")
            assert not agent.leases
    finally:
        agent.close()


def test_a_wrong_agent_token_is_a_sentence_saying_what_to_set(tmp_path: Path, agent: StandInAgent) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, on_demand_plan(agent, free_port()))
    with gateway(path, LLMGW_AGENT_TOKEN="not-the-token") as gw:
        answer = chat(gw.url)
        assert answer.status_code == 502
        assert "LLMGW_AGENT_TOKEN" in answer.json()["error"]["message"]
        assert agent.starts == 0


def test_requests_to_a_running_on_demand_engine_are_not_held_so_not_bounded(
    tmp_path: Path, agent: StandInAgent
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, on_demand_plan(agent, free_port()))
    with gateway(path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_MAX_HELD="1") as gw:
        assert chat(gw.url).status_code == 200  # started, and now running
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: chat(gw.url), range(10)))
        failed = [a.text for a in answers if a.status_code != 200]
        assert not failed, f"warm requests were counted against LLMGW_MAX_HELD: {failed[:2]}"
