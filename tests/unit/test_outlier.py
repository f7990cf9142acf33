"""Outlier ejection and the retry budget, on their own: times, limits and counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.gateway.settings import settings_from_env
from llmgw.gateway.state import outlier
from llmgw.gateway.state.outlier import Outliers, RetryBudget
from llmgw.gateway.state.routes import Model, Profile, Replica


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr("llmgw.gateway.state.outlier.time.monotonic", fake)
    monkeypatch.setattr("llmgw.gateway.state.routes.time.monotonic", fake)
    return fake


def fleet(count: int) -> tuple[Model, list[Replica]]:
    replicas = [Replica(f"http://10.0.0.{i}:8080") for i in range(1, count + 1)]
    profile = Profile("p", "m", 1, tuple(replicas))
    return Model("m", "chat", None, ((profile,),), {}), replicas


def fail(outliers: Outliers, model: Model, replica: Replica, times: int) -> None:
    for _ in range(times):
        outliers.failed(model, replica, "answered 503")


def test_the_ejection_time_doubles_with_each_ejection_up_to_the_most(clock: Clock) -> None:
    model, (sick, _) = fleet(2)
    outliers = Outliers(eject_after=2, base=30, most=100)
    lasted = []
    for _ in range(4):
        fail(outliers, model, sick, 2 if not sick.ejected_until else 1)
        lasted.append(sick.ejected_until - clock.now)
        clock.now = sick.ejected_until  # back on trial; its one request fails again
    assert lasted == [30, 60, 100, 100], "30 s, then twice as long each time, never past the most"


def test_on_trial_a_replica_takes_one_request_at_a_time_until_one_succeeds(clock: Clock) -> None:
    model, (sick, _) = fleet(2)
    outliers = Outliers(eject_after=1, base=30, most=600)
    fail(outliers, model, sick, 1)
    assert not sick.routable()
    clock.now += 30
    assert sick.routable() and sick.on_trial()
    sick.inflight = 1
    assert not sick.routable(), "a second request went to a replica on trial"
    sick.inflight = 0
    outliers.answered(sick)
    sick.inflight = 5
    assert sick.routable() and not sick.ejected_until, "after a good trial request: full traffic"


@pytest.mark.parametrize(("count", "most_out"), [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2)])
def test_no_more_than_half_of_a_models_replicas_are_ejected(clock: Clock, count: int, most_out: int) -> None:
    model, replicas = fleet(count)
    outliers = Outliers(eject_after=1, base=30, most=600)
    for replica in replicas:
        fail(outliers, model, replica, 3)
    assert sum(1 for r in replicas if r.ejected_until) == most_out


def test_retries_stay_within_the_share_of_requests_plus_the_floor(clock: Clock) -> None:
    budget = RetryBudget(ratio=0.2, floor=3)
    for _ in range(100):
        budget.request()
    allowed = sum(budget.allow() for _ in range(100))
    assert allowed == 23
    clock.now += 11  # the window has moved on: only the floor is left
    assert sum(budget.allow() for _ in range(10)) == 3


def test_the_settings_read_the_ejection_and_budget_variables(tmp_path: Path) -> None:
    settings = settings_from_env(
        {
            "LLMGW_PLAN": str(tmp_path / "plan.json"),
            "LLMGW_EJECT_AFTER": "7",
            "LLMGW_EJECT_TIME": "0.5",
            "LLMGW_RETRY_BUDGET": "0.1",
            "LLMGW_MAX_RESPONSE_BYTES": "1024",
        }
    )
    assert (settings.eject_after, settings.eject_time, settings.retry_budget) == (7, 0.5, 0.1)
    assert settings.max_response_bytes == 1024
    assert outlier.RetryBudget(settings.retry_budget, settings.retry_floor).floor == 10
