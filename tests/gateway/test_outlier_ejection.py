"""Outlier ejection and the retry budget, through one gateway worker (so one worker's counts).

Health checks pass throughout (every fake engine says 200 to GET /health) and take a
replica out only after 100 failures: what a test sees is real requests' doing.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, dead_endpoint, gateway, model, plan, profile, wait_until, write_plan

EJECT_AFTER = 3
# Long enough for the twenty-odd requests a test makes while it lasts, on a busy machine: at
# 3 s, a loaded 2-core machine now and then let it run out mid-test, the replica came back on
# trial and took a request the test said it must not. The tests wait for the trial itself
# (`on_trial`), not a fixed time, so a longer ejection costs only its own length.
EJECT_TIME = 8.0


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine, engine_failing: Engine
) -> Iterator[Gateway]:
    doc = plan(
        [
            model("mixed", [profile([engine_failing.url, engine_a.url], "mixed")]),
            model("alone", [profile([engine_b.url], "alone")]),
            model("flaky", [profile([engine_a.url, engine_b.url], "flaky")]),
        ]
    )
    path = tmp_path_factory.mktemp("outlier") / "plan.json"
    write_plan(path, doc)
    with gateway(
        path,
        workers=1,
        LLMGW_HEALTH_INTERVAL="60",
        LLMGW_HEALTH_FAILURES="100",
        LLMGW_EJECT_AFTER=str(EJECT_AFTER),
        LLMGW_EJECT_TIME=str(EJECT_TIME),
        LLMGW_RETRY_FLOOR="1000",  # the budget has its own test
    ) as g:
        yield g


def ask(gw: Gateway, model_name: str, **fake: Any) -> httpx.Response:
    body = {"model": model_name, "messages": [], **fake}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)


def metric(gw: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def replica_state(gw: Gateway, model_name: str, endpoint: str) -> dict[str, Any]:
    status = httpx.get(gw.url + "/dashboard/status.json", timeout=10).json()
    profiles = status["models"][model_name]["profiles"]
    return dict(profiles["p"]["replicas"][endpoint])


def on_trial(gw: Gateway, model_name: str, endpoint: str) -> None:
    """Wait out the ejection: until the gateway says the replica is back on trial."""
    wait_until(
        lambda: replica_state(gw, model_name, endpoint)["state"] == "on trial",
        EJECT_TIME + 30,
        f"{endpoint} back on trial after its ejection",
    )


def test_a_replica_failing_real_requests_is_ejected_though_its_health_check_passes(
    gw: Gateway, engine_a: Engine, engine_failing: Engine
) -> None:
    for _ in range(4 * EJECT_AFTER):
        answer = ask(gw, "mixed")
        assert answer.status_code == 200, f"the other replica should have answered: {answer.text}"
    state = replica_state(gw, "mixed", engine_failing.url)
    assert state["state"] == "ejected", f"a replica that failed every request is still in rotation: {state}"
    assert metric(gw, "llmgw_ejections_total", replica=engine_failing.url) == 1
    logged = rf"replica {re.escape(engine_failing.url)} ejected for {EJECT_TIME:g}s"
    assert re.search(logged, gw.log()), gw.log()[-2000:]

    before = engine_failing.stats()["requests"]
    for _ in range(10):
        assert ask(gw, "mixed").status_code == 200
    assert engine_failing.stats()["requests"] == before, "an ejected replica was still sent requests"

    # Back on trial after the ejection time: one request, which fails, and it is out for twice as long.
    on_trial(gw, "mixed", engine_failing.url)
    for _ in range(5):
        assert ask(gw, "mixed").status_code == 200
    assert engine_failing.stats()["requests"] == before + 1, "on trial, a replica takes one request first"
    state = replica_state(gw, "mixed", engine_failing.url)
    assert state["state"] == "ejected" and state["ejections"] == 2, state
    assert state["returns_in"] > EJECT_TIME, f"the second ejection should last twice the first: {state}"


def test_a_replica_whose_trial_request_succeeds_returns_to_full_traffic(
    gw: Gateway, engine_a: Engine
) -> None:
    for _ in range(4 * EJECT_AFTER):
        assert ask(gw, "flaky", fake_status=503, fake_only="a").status_code == 200
    assert replica_state(gw, "flaky", engine_a.url)["state"] == "ejected"
    on_trial(gw, "flaky", engine_a.url)
    before = engine_a.stats()["requests"]
    for _ in range(6):
        assert ask(gw, "flaky").status_code == 200
    state = replica_state(gw, "flaky", engine_a.url)
    assert state["state"] == "in rotation", state
    assert engine_a.stats()["requests"] >= before + 2, "after a good trial request, full traffic resumes"
    assert metric(gw, "llmgw_ejection_returns_total", replica=engine_a.url) == 1
    assert "passed its trial request" in gw.log()


def test_the_last_replica_of_a_model_is_never_ejected(gw: Gateway, engine_b: Engine) -> None:
    for _ in range(2 * EJECT_AFTER):
        # A 503 is "not ready yet" (an engine loading says it), passed on as a 503.
        assert ask(gw, "alone", fake_status=503).status_code == 503
    state = replica_state(gw, "alone", engine_b.url)
    assert state["state"] == "in rotation", f"ejecting a model's only replica turns it into 503s: {state}"
    assert metric(gw, "llmgw_ejections_skipped_total", replica=engine_b.url) >= 1
    assert "more than half" in gw.log()
    assert ask(gw, "alone").status_code == 200


def test_a_500_every_replica_returns_marks_no_replica(gw: Gateway, engine_b: Engine) -> None:
    for _ in range(2 * EJECT_AFTER):
        assert ask(gw, "alone", fake_status=500).status_code == 500
    assert replica_state(gw, "alone", engine_b.url)["failed_in_a_row"] == 0, (
        "a request's own 500 counted against the replica: one client's bad requests could eject it"
    )


@pytest.fixture(scope="module")
def budget_gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    doc = plan([model("half-dead", [profile([dead_endpoint("127.0.0.7"), engine_a.url], "half-dead")])])
    path = tmp_path_factory.mktemp("budget") / "plan.json"
    write_plan(path, doc)
    with gateway(
        path,
        workers=1,
        LLMGW_HEALTH_INTERVAL="60",
        LLMGW_HEALTH_FAILURES="100000",
        LLMGW_EJECT_AFTER="100000",
        LLMGW_RETRY_FLOOR="2",
    ) as g:
        yield g


def test_retries_past_the_budget_are_refused_and_the_first_failure_is_the_answer(budget_gw: Gateway) -> None:
    started = time.monotonic()
    statuses = [ask(budget_gw, "half-dead").status_code for _ in range(60)]
    # The budget is per 10 s window: on a busy machine the 60 requests can span two.
    windows = math.ceil((time.monotonic() - started) / 10)
    refused = statuses.count(502)
    made = metric(budget_gw, "llmgw_retries_total", result="made")
    assert made <= 0.2 * 60 + 2 * windows, f"{made} retries for 60 requests: over 20% plus the floor"
    assert refused > 0 and refused == metric(budget_gw, "llmgw_retries_total", result="refused"), statuses
    assert set(statuses) == {200, 502}, statuses
    assert "retry budget is spent" in budget_gw.log()
