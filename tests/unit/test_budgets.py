"""Budgets on the limiter alone, on a clock the test moves: calendar periods in UTC, the
refusal with its reset time, reservations settled, and the warning logged once a period."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest

from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.limits import LocalLimiter, state_directory
from llmgw.gateway.state.keys import Budget, Tenant


class Clock:
    def __init__(self, at: str) -> None:
        self.now = dt.datetime.fromisoformat(at).timestamp()

    def __call__(self) -> float:
        return self.now

    def to(self, at: str) -> None:
        self.now = dt.datetime.fromisoformat(at).timestamp()


@pytest.mark.parametrize(
    ("every", "at", "start", "end"),
    [
        ("day", "2026-03-04T23:59:59+00:00", "2026-03-04", "2026-03-05"),
        ("week", "2026-03-04T12:00:00+00:00", "2026-03-02", "2026-03-09"),  # a Wednesday
        ("week", "2026-03-08T23:00:00+00:00", "2026-03-02", "2026-03-09"),  # its Sunday
        ("month", "2026-12-31T23:59:59+00:00", "2026-12-01", "2027-01-01"),
        ("month", "2026-02-28T10:00:00+00:00", "2026-02-01", "2026-03-01"),
    ],
)
def test_periods_are_calendar_periods_in_utc(every: str, at: str, start: str, end: str) -> None:
    first, following = Budget(100, every).period(dt.datetime.fromisoformat(at))
    assert (first.date().isoformat(), following.date().isoformat()) == (start, end)
    assert first.tzinfo == dt.UTC and first.time() == dt.time(0)


def test_the_spend_counts_down_and_refuses_with_the_reset(tmp_path: Path) -> None:
    clock = Clock("2026-03-31T22:00:00+00:00")
    limiter, tenant = LocalLimiter(tmp_path, clock=clock), Tenant("team", budget=Budget(100, "month"))
    remaining = []
    for _ in range(2):
        window = limiter.admit(tenant, 30)
        assert window is not None and window.spend is not None
        remaining.append(window.headers()["x-llmgw-budget-remaining-tokens"])
        limiter.count(tenant, 20, 20, window.reservation, window.spend)
    assert remaining == ["100", "60"], "each answer's 40 tokens, not the 30 reserved, count"
    # 20 left: a request that may take 30 does not fit, and is told what would.
    with pytest.raises(ApiError) as short:
        limiter.admit(tenant, 30, prompt=5)
    assert (short.value.status, short.value.code) == (429, "budget_exceeded")
    assert "20 tokens left" in short.value.message and "max_tokens of at most 15" in short.value.message
    window = limiter.admit(tenant, 20)
    assert window is not None and window.spend is not None
    limiter.count(tenant, 10, 10, window.reservation, window.spend)
    with pytest.raises(ApiError) as refused:
        limiter.admit(tenant, 30)
    error = refused.value
    assert (error.status, error.code) == (429, "budget_exceeded")
    assert "2026-04-01T00:00:00Z" in error.message and "100 tokens a month" in error.message
    assert error.headers["x-llmgw-budget-reset"] == "2026-04-01T00:00:00Z"
    assert error.headers["x-llmgw-budget-remaining-tokens"] == "0"

    clock.to("2026-04-01T00:00:01+00:00")  # the next month: a fresh budget
    window = limiter.admit(tenant, 30)
    assert window is not None and window.headers()["x-llmgw-budget-remaining-tokens"] == "100"
    assert window.headers()["x-llmgw-budget-reset"] == "2026-05-01T00:00:00Z"


def test_a_request_is_admitted_only_when_its_reservation_fits_what_is_left(tmp_path: Path) -> None:
    """A 1,000-token budget and answers of up to 300: three fit, the fourth would overrun it
    and is refused, where before it was let in while anything was left and 1,200 were spent."""
    limiter, tenant = LocalLimiter(tmp_path), Tenant("team", budget=Budget(1000, "day"))
    answered = 0
    for _ in range(5):
        try:
            window = limiter.admit(tenant, 300)
        except ApiError:
            continue
        assert window is not None
        limiter.count(tenant, 0, 300, window.reservation, window.spend)
        answered += 1
    spend = limiter.spent(tenant)
    assert answered == 3 and spend is not None and spend.used == 900, (answered, spend)


def test_reservations_hold_the_budget_until_they_settle(tmp_path: Path) -> None:
    limiter, tenant = LocalLimiter(tmp_path), Tenant("team", budget=Budget(100, "day"))
    held = [limiter.admit(tenant, 50), limiter.admit(tenant, 50)]
    with pytest.raises(ApiError):  # two answers in flight may use all of it
        limiter.admit(tenant, 50)
    for window in held:
        assert window is not None
        limiter.charge(tenant, 0, window.reservation, window.spend)  # generated nothing
    assert limiter.admit(tenant, 50) is not None


def test_the_spend_outlives_the_limiter_in_the_state_directory(tmp_path: Path) -> None:
    tenant = Tenant("team", budget=Budget(100, "week"))
    (tmp_path / "metrics-1").mkdir(), (tmp_path / "metrics-2").mkdir()
    first = LocalLimiter(tmp_path / "metrics-1", tmp_path / "state")
    window = first.admit(tenant, 10)
    assert window is not None
    first.count(tenant, 5, 25, window.reservation, window.spend)
    again = LocalLimiter(tmp_path / "metrics-2", tmp_path / "state")  # a restart: a new metrics dir
    spend = again.spent(tenant)
    assert spend is not None and spend.used == 30
    assert again.totals("team") == {"completion_tokens": 25, "prompt_tokens": 5, "requests": 1}


def test_crossing_warn_at_logs_one_warning_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock("2026-03-02T08:00:00+00:00")
    tenant = Tenant("team-a", budget=Budget(100, "day", warn_at=0.5))
    workers = [LocalLimiter(tmp_path, clock=clock), LocalLimiter(tmp_path, clock=clock)]
    caplog.set_level(logging.WARNING, "llmgw.gateway")
    for i in range(6):
        limiter = workers[i % 2]
        window = limiter.admit(tenant, 1)
        assert window is not None
        limiter.count(tenant, 10, 5, window.reservation, window.spend)
    warnings = [r.getMessage() for r in caplog.records if "warn_at" in r.getMessage()]
    assert len(warnings) == 1 and "team-a" in warnings[0], warnings
    clock.to("2026-03-03T00:00:00+00:00")  # warned again in the next period
    for _ in range(4):
        window = workers[0].admit(tenant, 1)
        assert window is not None
        workers[0].count(tenant, 10, 5, window.reservation, window.spend)
    assert len([r for r in caplog.records if "warn_at" in r.getMessage()]) == 2


def test_the_state_directory_follows_the_platform_or_the_operator() -> None:
    assert state_directory({"LLMGW_STATE_DIR": "/srv/llmgw"}) == Path("/srv/llmgw")
    assert state_directory({"XDG_STATE_HOME": "/x"}) == Path("/x/llmgw")
    assert state_directory({}) == Path.home() / ".local" / "state" / "llmgw"


def test_a_state_directory_the_gateway_cannot_write_is_refused_at_start(tmp_path: Path) -> None:
    from llmgw.errors import UsageError
    from llmgw.gateway.server.serve import check_state_directory

    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory would go
    with pytest.raises(UsageError, match="LLMGW_STATE_DIR"):
        check_state_directory(blocked / "llmgw")


@pytest.mark.parametrize("kind", ["garbage", "directory", "symlink"])
def test_a_state_file_that_is_not_one_is_refused_at_start_in_one_sentence(tmp_path: Path, kind: str) -> None:
    from llmgw.errors import UsageError
    from llmgw.gateway.request.limits import STATE_FILE_NAME
    from llmgw.gateway.server.serve import check_state_directory

    state = tmp_path / "state"
    state.mkdir()
    target = state / STATE_FILE_NAME
    if kind == "garbage":
        target.write_bytes(b"this is not a database" * 100)
    elif kind == "directory":
        target.mkdir()
    else:
        (tmp_path / "elsewhere.sqlite").write_bytes(b"")
        target.symlink_to(tmp_path / "elsewhere.sqlite")
    with pytest.raises(UsageError) as refused:
        check_state_directory(state)
    assert str(target) in str(refused.value)


def test_keys_list_on_a_corrupt_state_file_says_which_file_and_what_to_do(llmgw, tmp_path: Path) -> None:
    from llmgw.gateway.request.limits import STATE_FILE_NAME

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE_NAME).write_bytes(b"garbage" * 1000)
    (tmp_path / "keys.yaml").write_text(
        f"keys:\n  - {{name: team, sha256: {'a' * 64}, budget: {{tokens: 100, every: day}}}}\n"
    )
    run = llmgw("keys", "list", "--file", "keys.yaml", cwd=tmp_path, LLMGW_STATE_DIR=str(tmp_path / "state"))
    assert run.code == 2 and STATE_FILE_NAME in run.stderr and "Traceback" not in run.stderr, run


def test_the_state_file_is_the_gateways_alone(tmp_path: Path) -> None:
    import os
    import stat

    from llmgw.gateway.request.limits import STATE_FILE_NAME

    (tmp_path / "metrics").mkdir()
    LocalLimiter(tmp_path / "metrics", tmp_path / "state").admit(Tenant("t", budget=Budget(10, "day")))
    for name in os.listdir(tmp_path / "state"):
        if name.startswith(STATE_FILE_NAME):
            assert stat.S_IMODE(os.stat(tmp_path / "state" / name).st_mode) == 0o600, name
