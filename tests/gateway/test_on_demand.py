"""On-demand models through the real gateway: a request is held while the node's agent
starts the engine, then answered; leases go back; a load that never finishes is a 503."""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from busy import keys_yaml, secret
from harness import free_port, gateway, model, wait_until, write_plan
from stand_in_agent import StandInAgent

from llmgw.gateway.server.serve import check_environment
from llmgw.plan import NodeUse, OnDemandUse, PlanNode, PlanProfile, PlanReplica, PortRange
from tests.plans import plan_of

TOKEN = "agent-token-for-tests"


def on_demand_plan(agent: StandInAgent, port: int):  # type: ignore[no-untyped-def]
    node = PlanNode(
        name="box",
        address="127.0.0.1",
        memory_gb=16,
        gpus=0,
        gpu_memory_gb=0,
        labels={},
        ports=PortRange(first=port, last=port),
        used=NodeUse(memory_gb=0, gpus=0, replicas=0),
        on_demand=OnDemandUse(replicas=1, memory_gb=1, largest_gb=1),
        agent=agent.url,
    )
    profile = PlanProfile(
        name="cpu",
        engine="llamacpp",
        priority=100,
        weight=1,
        ctx_size=2048,
        args=(),
        gpus=0,
        node_selector={},
        served_name="lazy",
        external=False,
        start="on-demand",
        idle_stop_s=600,
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
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
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


def test_one_key_cannot_fill_the_wait_for_a_starting_engine(tmp_path: Path) -> None:
    """Security issue 35, item 4: requests held for an on-demand start wait in their keys'
    queues, so one key past its queue is refused at once while another key's request is held
    and answered (the per-model LLMGW_MAX_HELD let one key refuse every other)."""
    agent = StandInAgent(TOKEN, load_s=3.0)
    try:
        path = tmp_path / "plan.json"
        write_plan(path, on_demand_plan(agent, free_port()))
        (tmp_path / "keys.yaml").write_text(keys_yaml())
        env = {"LLMGW_KEYS_FILE": str(tmp_path / "keys.yaml"), "LLMGW_QUEUE_PER_KEY": "2"}

        def chat_as(key: str) -> httpx.Response:
            return httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "lazy", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {secret(key)}"},
                timeout=60,
            )

        with gateway(path, LLMGW_AGENT_TOKEN=TOKEN, **env) as gw:
            with concurrent.futures.ThreadPoolExecutor(10) as pool:
                flood = [pool.submit(chat_as, "flood") for _ in range(10)]
                # Four hold the replica's slots (llama-server's default --parallel) while it
                # loads, two wait in the key's queue, and the other four are refused at once.
                wait_until(lambda: sum(f.done() for f in flood) >= 4, 10, "the flood past its queue refused")
                assert agent.starts == 1 and not agent.leases, "the engine is still loading"
                quiet = chat_as("quiet")
                codes = sorted(f.result().status_code for f in flood)
        assert quiet.status_code == 200, quiet.text
        assert codes == [200] * 6 + [429] * 4, codes
        refused = next(f.result() for f in flood if f.result().status_code == 429).json()["error"]
        assert refused["code"] == "queue_full" and "LLMGW_QUEUE_PER_KEY" in refused["message"]
    finally:
        agent.close()


def test_a_retired_setting_is_named_at_start_with_what_replaced_it(
    tmp_path: Path, agent: StandInAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, on_demand_plan(agent, free_port()))
    check_environment(path, {"LLMGW_MAX_HELD": "4"})  # what `llmgw serve` reads before gunicorn starts
    said = capsys.readouterr().err
    assert "LLMGW_MAX_HELD is no longer read" in said and "LLMGW_QUEUE_PER_KEY" in said, said


def test_requests_to_a_running_on_demand_engine_are_not_held(tmp_path: Path, agent: StandInAgent) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, on_demand_plan(agent, free_port()))
    with gateway(path, LLMGW_AGENT_TOKEN=TOKEN) as gw:
        assert chat(gw.url).status_code == 200  # started, and now running
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: chat(gw.url), range(10)))
        failed = [a.text for a in answers if a.status_code != 200]
        assert not failed, failed[:2]
        assert agent.starts == 1


BROKEN = "the engine exited at once (exit code 1); its log ends: error: unknown argument --this-flag"


@pytest.mark.parametrize("with_fallback", [True, False], ids=["fallback", "alone"])
def test_an_engine_that_fails_to_start_sends_its_request_on_at_once(
    tmp_path: Path, engine_a, with_fallback: bool
) -> None:
    """Its fallback answers (or a 503 names the engine's last words) in seconds, not after the
    whole load timeout: a broken on-demand engine once kept its request 120 s."""
    from harness import profile

    agent = StandInAgent(TOKEN, fails_to_start=BROKEN)
    try:
        planned = on_demand_plan(agent, free_port())
        if with_fallback:
            lazy = planned.models[0].model_copy(update={"fallbacks": ("backup",)})
            backup = model("backup", [profile([engine_a.url], "backup")])
            planned = plan_of([lazy, backup], planned.nodes)
        path = tmp_path / "plan.json"
        write_plan(path, planned)
        with gateway(path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="60") as gw:
            answer = chat(gw.url, timeout=30)
            assert answer.elapsed.total_seconds() < 10, "the request waited for an engine that had died"
            if with_fallback:
                assert answer.status_code == 200 and answer.headers["x-llmgw-fallback"] == "backup", (
                    answer.text
                )
            else:
                assert answer.status_code in (502, 503), answer.text
                assert "unknown argument --this-flag" in answer.json()["error"]["message"]
    finally:
        agent.close()
