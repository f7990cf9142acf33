"""On-demand replicas through the real `llmgw node` and its HTTP control calls (docs/on-demand.md):
started when acquired, one start for callers that come together, evicted by memory only when
idle, stopped after their idle time, and a caller that leaves starts nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.node.leases import LeasedEngine, NoRoom, engines_to_stop
from tests.node.agents import Agent, Fleet, alive, chat_model, wait_for

TOKEN = "a-token-for-tests"


def on_demand(name: str, gb: float = 0.5, idle: str = "60s") -> str:
    return (
        chat_model(name).replace("min_memory_gb: 0.1", f"min_memory_gb: {gb}")
        + f"    start: on-demand\n    idle_stop: {idle}\n"
    )


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    # 0.8 GB, of which the always-on c takes 0.1: room for one 0.5 GB on-demand model at a time.
    return Fleet(tmp_path / "fleet", others=False, memory_gb=0.8)



def endpoints(doc: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["profiles"][0]["replicas"][0]["endpoint"] for m in doc["models"]}


def run(agents: list[Agent], fleet: Fleet, bin_dir: Path, **env: str) -> Agent:
    agent = Agent(fleet, bin_dir, **{"LLMGW_AGENT_TOKEN": TOKEN, **env})
    agents.append(agent)
    return agent.start()


def acquire(
    agent: Agent, endpoint: str, token: str | None = TOKEN, wait_s: float = 20, **kw: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(
        agent.status_url + "/acquire",
        json={"endpoint": endpoint, "wait_s": wait_s},
        headers=headers,
        timeout=kw.get("timeout", wait_s + 10),
    )


def release(agent: Agent, lease: str) -> httpx.Response:
    return httpx.post(
        agent.status_url + "/release",
        json={"lease": lease},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )


def pids_of(agent: Agent, endpoint: str) -> list[int]:
    port = endpoint.rsplit(":", 1)[1]
    return [s["pid"] for s in agent.started() if s["argv"][s["argv"].index("--port") + 1] == port]


def plan_three(fleet: Fleet, idle: str = "60s") -> dict[str, str]:
    return endpoints(
        fleet.plan(
            {
                "a.yaml": on_demand("a", idle=idle),
                "b.yaml": on_demand("b", idle=idle),
                "c.yaml": chat_model("c"),
            }
        )
    )


def test_on_demand_replicas_wait_idle_while_the_always_on_one_starts_at_apply(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    agent.wait_state("c", "ready")
    replicas = agent.replicas()
    for name in ("a", "b"):
        assert replicas[name]["state"] == "idle", f"{name} started before anyone asked for it"
        assert replicas[name]["start"] == "on-demand" and replicas[name]["pid"] is None
        assert "starts on its first request" in replicas[name]["message"]
    assert replicas["c"]["start"] == "always"
    assert [pids_of(agent, where[n]) for n in ("a", "b")] == [[], []], "no engine process for a or b"
    status = agent.status()
    assert status is not None
    assert status["memory"]["total_gb"] == 0.8 and status["memory"]["always_on_gb"] == 0.1
    assert status["memory"]["on_demand_gb"] == 0 and status["memory"]["available_gb"] > 0


def test_an_acquire_starts_the_engine_and_leases_it_until_released(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_LOAD_S="0.5")
    answer = acquire(agent, where["a"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["state"] == "ready" and body["started"] is True and body["lease"]
    assert httpx.get(where["a"] + "/health", timeout=5).status_code == 200, "a lease was given before ready"
    a = agent.replicas()["a"]
    assert a["state"] == "ready" and a["in_flight"] == 1 and a["starts"] == 1
    assert a["load_s"] >= 0.5 and a["last_used"] is None
    assert release(agent, body["lease"]).status_code == 204
    a = agent.replicas()["a"]
    assert a["in_flight"] == 0 and a["last_used"] is not None and a["state"] == "ready"
    again = acquire(agent, where["a"]).json()
    assert again["started"] is False and agent.replicas()["a"]["starts"] == 1


def test_acquiring_b_evicts_the_idle_a_when_both_do_not_fit(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    # The always-on c starts at apply, in its own time: the acquires below can be done first.
    agent.wait_state("c", "ready")
    lease = acquire(agent, where["a"]).json()["lease"]
    release(agent, lease)
    [a_pid] = pids_of(agent, where["a"])
    answer = acquire(agent, where["b"])
    assert answer.status_code == 200, answer.text
    assert not alive(a_pid), "a's engine still runs beside b, in more memory than the node has"
    replicas = agent.replicas()
    assert replicas["a"]["state"] == "idle" and replicas["a"]["evictions"] == 1
    assert replicas["a"]["message"] == "evicted to make room for b"
    assert replicas["b"]["state"] == "ready" and replicas["c"]["state"] == "ready"
    status = agent.status()
    assert status is not None and status["memory"]["on_demand_gb"] == 0.5
    metrics = httpx.get(agent.status_url + "/metrics", timeout=5).text
    assert (
        f'llmgw_node_replica_evictions_total{{endpoint="{where["a"]}",model="a",profile="cpu"}} 1.0'
        in metrics
    )
    assert (
        f'llmgw_node_replica_state{{endpoint="{where["a"]}",model="a",profile="cpu",state="idle"}} 1.0'
        in metrics
    )
    table = subprocess.run(
        [sys.executable, "-m", "llmgw", "node", "status", "--agent", agent.status_url],
        env=agent.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "0.1 GB always-on + 0.5 GB on demand of 0.8 GB" in table, table
    assert "evicted to make room for b" in table and "on-demand" in table, table


def test_a_swap_does_not_wait_out_the_evicted_engines_orderly_exit(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    """An idle llama-server keeps nothing an orderly exit would save, so the agent evicts it
    with SIGKILL: here one that ignores SIGTERM (as a slow exit at its worst) would otherwise
    hold b's start for the agent's whole grace from SIGTERM to SIGKILL (5 s here)."""
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_IGNORE_TERM="1")
    agent.wait_state("c", "ready")
    release(agent, acquire(agent, where["a"]).json()["lease"])
    [a_pid] = pids_of(agent, where["a"])
    asked = time.monotonic()
    answer = acquire(agent, where["b"])
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - asked < 2.5, "b's start waited for a's orderly exit"
    assert not alive(a_pid)
    assert agent.replicas()["a"]["message"] == "evicted to make room for b"


def test_an_engine_with_a_request_in_flight_is_never_evicted(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    acquire(agent, where["a"])  # the lease is kept
    [a_pid] = pids_of(agent, where["a"])
    refused = acquire(agent, where["b"])
    assert refused.status_code == 409, refused.text
    message = refused.json()["message"]
    assert "a/cpu" in message and "in flight" in message, message
    assert alive(a_pid) and agent.replicas()["a"]["state"] == "ready"
    assert agent.replicas()["b"]["state"] == "idle" and pids_of(agent, where["b"]) == [], "b started anyway"


def test_twenty_acquires_together_share_one_start_and_all_get_leases(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_LOAD_S="1")
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: acquire(agent, where["a"]), range(20)))
    assert [a.status_code for a in answers] == [200] * 20, [a.text for a in answers if a.status_code != 200]
    assert len({a.json()["lease"] for a in answers}) == 20
    assert len(pids_of(agent, where["a"])) == 1, "more than one engine was started for a"
    a = agent.replicas()["a"]
    assert a["starts"] == 1 and a["in_flight"] == 20


def test_an_engine_without_requests_for_its_idle_time_is_stopped(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet, idle="2s")
    agent = run(agents, fleet, bin_dir)
    release(agent, acquire(agent, where["a"]).json()["lease"])
    [pid] = pids_of(agent, where["a"])
    a = agent.wait_state("a", "idle", timeout=10)
    assert not alive(pid), "the idle engine's process is still there"
    assert a["message"] == "stopped after 2 s without requests" and a["idle_stops"] == 1
    assert a["pid"] is None and a["evictions"] == 0


def test_control_calls_need_the_agents_token_and_status_stays_open(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    assert acquire(agent, where["a"], token="wrong").status_code == 401
    assert acquire(agent, where["a"], token=None).status_code == 401
    assert agent.replicas()["a"]["state"] == "idle", "a refused call started the engine"
    unset = Agent(fleet, bin_dir, LLMGW_AGENT_TOKEN="")
    unset.state_dir = fleet.root / "state2"
    agents.append(unset)
    unset.start()
    refused = acquire(unset, where["a"])
    assert refused.status_code == 403 and "set LLMGW_AGENT_TOKEN" in refused.json()["message"]
    assert httpx.get(unset.status_url + "/status", timeout=5).status_code == 200
    assert "LLMGW_AGENT_TOKEN is not set" in unset.log_text(), "no warning at the start"


def test_a_bad_body_or_an_unknown_endpoint_is_a_sentence(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    bad = httpx.post(agent.status_url + "/acquire", content=b"{not json", headers=headers, timeout=5)
    assert bad.status_code == 400 and "not JSON" in bad.json()["message"]
    big = httpx.post(agent.status_url + "/acquire", content=b" " * 100_000, headers=headers, timeout=5)
    assert big.status_code == 400 and "bytes" in big.json()["message"]
    unknown = acquire(agent, "http://127.0.0.1:1")
    assert unknown.status_code == 404 and "not a replica" in unknown.json()["message"]
    always = acquire(agent, where["c"])
    assert always.status_code == 404 and "always-on" in always.json()["message"]


def test_a_caller_that_leaves_before_ready_starts_nothing(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_LOAD_S="30")
    with pytest.raises(httpx.ReadTimeout):
        acquire(agent, where["a"], wait_s=60, timeout=1.5)
    [pid] = pids_of(agent, where["a"])
    a = agent.wait_state("a", "idle", timeout=10)
    wait_for(lambda: not alive(pid), 10, "the abandoned engine's process gone", agent)
    assert "abandoned" in a["message"] and a["in_flight"] == 0


def test_an_acquire_that_does_not_wait_never_evicts_a_loaded_model(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir)
    agent.wait_state("c", "ready")
    release(agent, acquire(agent, where["a"]).json()["lease"])
    # The gateway's first ask for a cold model does not wait: its client may be gone by the
    # time the engine is up. Stopping `a` for it once cost a loaded model and served nothing.
    quick = acquire(agent, where["b"], wait_s=0)
    assert quick.status_code == 503 and "wait_s" in quick.json()["message"], quick.text
    replicas = agent.replicas()
    assert replicas["a"]["state"] == "ready" and replicas["a"]["evictions"] == 0, replicas["a"]
    assert pids_of(agent, where["b"]) == [], "b was started for a caller that does not wait"
    waited = acquire(agent, where["b"])
    assert waited.status_code == 200, "a caller that waits still gets its room made"
    assert agent.replicas()["a"]["evictions"] == 1


def test_an_on_demand_engine_running_when_the_agent_restarts_is_adopted(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    first = run(agents, fleet, bin_dir)
    acquire(first, where["a"])
    [pid] = pids_of(first, where["a"])
    first.stop(signal.SIGKILL)
    again = run(agents, fleet, bin_dir)
    a = again.wait_state("a", "ready")
    assert a["pid"] == pid and a["starts"] == 0, "a second engine was started instead of adopting the first"


def test_an_acquire_not_ready_in_time_is_a_503_and_the_engine_keeps_loading(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_LOAD_S="30")
    late = acquire(agent, where["a"], wait_s=1)
    assert late.status_code == 503 and late.json()["state"] == "loading", late.text
    assert agent.replicas()["a"]["in_flight"] == 0, "a lease was taken without an answer"
    [pid] = pids_of(agent, where["a"])
    assert alive(pid) and agent.replicas()["a"]["state"] == "loading", (
        "the gateway's next ask would start over"
    )


def test_an_on_demand_engine_that_fails_with_nobody_waiting_goes_back_to_idle_with_why(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_EXIT="1")
    failed = acquire(agent, where["a"])
    assert failed.status_code == 503 and "exited at once" in failed.json()["message"], failed.text
    a = agent.wait_state("a", "idle", timeout=10)
    assert "exited at once" in a["message"] and a["starts"] == 1
    wait_for(lambda: agent.replicas()["c"]["restarts"] >= 1, 10, "the always-on c's backoff", agent)
    assert len(pids_of(agent, where["a"])) == 1, "an engine nobody asked for was restarted"


def _engine(key: str, gb: float, age: float, busy: str = "", gpus: tuple[int, ...] = ()) -> LeasedEngine:
    return LeasedEngine(key, f"{key}/cpu", gb, frozenset(gpus), busy, age)


def test_making_room_stops_the_least_recently_used_and_only_as_many_as_needed() -> None:
    running = [
        _engine("old", 2, 1.0),
        _engine("new", 2, 5.0),
        _engine("older", 2, 0.5, busy="1 request(s) in flight"),
    ]
    chosen = engines_to_stop(_engine("x", 2, 9), capacity_gb=7, running=running, free_gb=100)
    assert [e.key for e in chosen] == ["old"], "a leased or more recently used engine was stopped first"


def test_making_room_counts_what_the_machine_really_has_free() -> None:
    running = [_engine("a", 1, 1.0), _engine("b", 1, 2.0)]
    chosen = engines_to_stop(_engine("x", 2, 9), capacity_gb=100, running=running, free_gb=0.5)
    assert [e.key for e in chosen] == ["a", "b"], "the plan's figures fit, MemAvailable did not"
    with pytest.raises(NoRoom, match="MemAvailable"):
        engines_to_stop(_engine("x", 4, 9), capacity_gb=100, running=running, free_gb=0.5)


def test_a_gpu_start_stops_the_engines_on_its_gpus_and_never_a_leased_one() -> None:
    on_0 = _engine("on0", 0, 5.0, gpus=(0,))
    on_1 = _engine("on1", 0, 1.0, gpus=(1,))
    chosen = engines_to_stop(_engine("x", 0, 9, gpus=(0,)), capacity_gb=1, running=[on_0, on_1], free_gb=1)
    assert chosen == [on_0]
    leased = _engine("on0", 0, 5.0, busy="1 request(s) in flight", gpus=(0,))
    with pytest.raises(NoRoom, match="on0/cpu"):
        engines_to_stop(_engine("x", 0, 9, gpus=(0,)), capacity_gb=1, running=[leased], free_gb=1)


def test_an_on_demand_engine_that_exits_at_once_is_a_failed_start_retried_only_after_a_backoff(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    """A broken engine once restarted every 35 ms while its request waited out the whole load
    timeout: the caller is told at once that it failed, and asking again within the backoff
    starts nothing."""
    where = plan_three(fleet)
    agent = run(agents, fleet, bin_dir, STAND_IN_EXIT="1")
    started = time.monotonic()
    failed = acquire(agent, where["a"], wait_s=30)
    assert time.monotonic() - started < 10, "the caller waited out its wait for an engine that had died"
    assert failed.status_code == 503 and failed.json()["state"] == "failed", failed.text
    assert "exited at once" in failed.json()["message"]
    again = [acquire(agent, where["a"], wait_s=30) for _ in range(5)]
    assert all(a.status_code == 503 and a.json()["state"] == "failed" for a in again), [a.text for a in again]
    assert "started again in" in again[-1].json()["message"]
    assert len(pids_of(agent, where["a"])) == 1, "asking again within the backoff started the engine again"
    time.sleep(1.5)  # past the first backoff (1 s): the next caller may start it once more
    acquire(agent, where["a"], wait_s=30)
    assert len(pids_of(agent, where["a"])) == 2
