"""Swap-aware on-demand (issue 34) with the real llama-server and Gemma 3 270M: two names
of the model on a node with room for one. Requests alternating a, b are served in runs of
the loaded model, so they cost a few starts, not one each; and a lone request for the model
not loaded is answered within LLMGW_QUEUE_WAIT while the other has a steady stream.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.gateway.harness import gateway
from tests.node.agents import Agent, Fleet
from tests.node.gemma import ask, model_text

TOKEN = "a-token-for-the-fair-swap"
MEMORY_GB = 0.6  # holds one Gemma 3 270M (0.43 GB as estimated), not two
WAIT = 120  # LLMGW_QUEUE_WAIT: generous, as one load has taken 20 s beside other test runs


@pytest.mark.timeout(600)
def test_alternating_requests_cost_few_starts_and_a_lone_request_for_the_other_model_is_not_starved(
    tmp_path: Path, weights: Path
) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=MEMORY_GB)
    (tmp_path / "bin").mkdir()  # no stand-ins in that folder: the real llama-server
    agent = Agent(fleet, tmp_path / "bin", LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    on_demand = "    start: on-demand\n    idle_stop: 10m\n"
    fleet.plan({f"{m}.yaml": model_text(weights, m, on_demand) for m in ("a", "b")})
    agent.start()
    env = {"LLMGW_AGENT_TOKEN": TOKEN, "LLMGW_LOAD_TIMEOUT": "240", "LLMGW_QUEUE_WAIT": str(WAIT)}
    try:
        with gateway(fleet.plan_path, **env) as gw:
            names = ["a", "b"] * 6
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda name: ask(gw.url, name, timeout=300), names))
            assert [a.model for a in answers] == names
            starts = sum(r["starts"] for r in agent.replicas().values())
            assert starts <= 4, f"twelve requests alternating a, b started {starts} engines, not a few"

            stop = threading.Event()

            def steady_a() -> int:
                count = 0
                while not stop.is_set():
                    assert ask(gw.url, "a", timeout=300).model == "a"
                    count += 1
                return count

            with ThreadPoolExecutor(2) as pool:
                streams = [pool.submit(steady_a) for _ in range(2)]
                agent.wait_state("a", "ready", timeout=240)
                time.sleep(1)  # a loaded, and never without a request in flight
                start = time.monotonic()
                try:
                    lone = ask(gw.url, "b", timeout=WAIT + 60)
                finally:
                    took = time.monotonic() - start
                    stop.set()
                served_a = sum(s.result() for s in streams)
            assert lone.model == "b" and lone.choices[0].message.content
            assert took <= WAIT, f"b was answered after {took:.0f} s beside a steady stream for a"
            assert served_a > 0
    finally:
        agent.stop()
