"""Budgets per key through the real gateway: the headers counting down, the 429 naming the
reset, a concurrent burst held to the budget, the spend kept over a restart in the state
directory and shared by two instances on Redis, and the warning logged once."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Engine, Gateway, ask_as, gateway, key_digest, model, plan, profile, write_plan
from redis_server import RedisServer, redis_server

DAILY, MONTHLY, BURST, WARNED = "sk-daily", "sk-monthly", "sk-burst", "sk-warned"
UNBOUNDED, CAREFUL = "sk-unbounded", "sk-careful"
ADMIN = "admin-secret"


def keys_file(path: Path) -> Path:
    path.write_text(
        "keys:\n"
        f"  - {{name: daily, sha256: {key_digest(DAILY)}, budget: {{tokens: 1000, every: day}}}}\n"
        f"  - {{name: monthly, sha256: {key_digest(MONTHLY)}, budget: {{tokens: 40, every: month}}}}\n"
        f"  - {{name: burst, sha256: {key_digest(BURST)}, budget: {{tokens: 60, every: week}}}}\n"
        f"  - {{name: unbounded, sha256: {key_digest(UNBOUNDED)}, budget: {{tokens: 3000, every: day}}}}\n"
        f"  - {{name: careful, sha256: {key_digest(CAREFUL)}, budget: {{tokens: 5000, every: day}}}}\n"
        f"  - {{name: warned, sha256: {key_digest(WARNED)}, "
        "budget: {tokens: 60, every: day, warn_at: 0.5}}\n"
    )
    return path


def plan_file(tmp: Path, engine: Engine) -> Path:
    path = tmp / "plan.json"
    # A model that bounds its answers: one that does not holds its whole context of a budget
    # per request (docs/budgets.md), which no budget here would admit.
    write_plan(
        path,
        plan(
            [
                model("chat", [profile([engine.url], "chat")], max_output=4),
                model("open", [profile([engine.url], "open")], context_length=1000),
            ]
        ),
    )
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("budgets")
    env = {"LLMGW_KEYS_FILE": str(keys_file(tmp / "keys.yaml")), "LLMGW_ADMIN_TOKEN": ADMIN}
    with gateway(plan_file(tmp, engine_a), **env) as g:
        yield g


def spend(gw: Gateway, name: str) -> dict[str, object]:
    doc = httpx.get(gw.url + f"/admin/keys/{name}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    return dict(doc.json()["budget"])


def next_midnight() -> str:
    today = dt.datetime.now(dt.UTC).date()
    return (today + dt.timedelta(days=1)).isoformat() + "T00:00:00Z"


def test_every_answer_counts_the_budget_down(gw: Gateway) -> None:
    answers = [ask_as(gw, DAILY, stream=i == 1) for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    remaining = [int(a.headers["x-llmgw-budget-remaining-tokens"]) for a in answers]
    # The fake engine's answers use 7 tokens; a stream, 3 of prompt and one a chunk (3).
    assert remaining == [1000, 993, 987], remaining
    assert {a.headers["x-llmgw-budget-reset"] for a in answers} == {next_midnight()}
    assert spend(gw, "daily")["used"] == 20


def test_a_request_that_would_overrun_the_budget_is_refused_with_what_fits_and_when(gw: Gateway) -> None:
    # Each request holds its prompt's estimate (a token per 4 bytes of body) and max_output (4)
    # until it settles at 7: it is admitted while that fits what is left of 40, and no longer.
    answers = [ask_as(gw, MONTHLY) for _ in range(8)]
    statuses = [a.status_code for a in answers]
    admitted = statuses.index(429)
    assert admitted >= 2 and set(statuses[admitted:]) == {429}, statuses
    refused = answers[admitted]
    left = 40 - 7 * admitted
    today = dt.datetime.now(dt.UTC).date()
    first = (today.replace(day=1) + dt.timedelta(days=32)).replace(day=1).isoformat() + "T00:00:00Z"
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded", error
    message = error["message"]
    assert f"{left} tokens left" in message and "40 tokens a month" in message and first in message, message
    assert "this request could take" in message, message
    assert refused.headers["x-llmgw-budget-reset"] == first
    assert refused.headers["x-llmgw-budget-remaining-tokens"] == str(left)
    assert int(refused.headers["Retry-After"]) > 0
    assert spend(gw, "monthly")["used"] == 7 * admitted <= 40, "the refused requests hold nothing"


def burst(gateways: list[Gateway], key: str, requests: int) -> list[int]:
    """All at once: the engine waits before answering, so every admission sees the others
    in flight, not yet settled."""
    statuses: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        status = ask_as(gateways[i % len(gateways)], key, max_tokens=4, fake_delay_first=0.5).status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_a_concurrent_burst_is_held_to_the_budget(gw: Gateway) -> None:
    statuses = burst([gw], BURST, 16)
    admitted = statuses.count(200)
    used = spend(gw, "burst")["used"]
    assert admitted >= 1 and statuses.count(429) == 16 - admitted, statuses
    # Each admission holds its prompt's estimate and max_tokens until the answer settles: the
    # burst stops at the budget, not 16 answers (112 tokens) past it.
    assert used == 7 * admitted and used <= 60, f"{admitted} answers used {used} of a budget of 60"


def test_a_burst_to_a_model_that_bounds_no_answer_holds_its_context_each(gw: Gateway, tmp_path: Path) -> None:
    """Nothing bounds these answers (no max_output, no max_tokens): each may run to the end of
    the context, 1,000 tokens, so each holds that much of the 3,000-token budget while it runs.
    Holding only the prompt let all sixteen in, and they spent 16,048 tokens."""
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        answer = ask_as(gw, UNBOUNDED, model="open", fake_delay_first=2)
        with lock:
            statuses.append(answer.status_code)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = statuses.count(200)
    # Three fit at once; on a loaded machine a few more may come after the first settle.
    assert 1 <= admitted <= 8 and statuses.count(429) == 16 - admitted, statuses
    assert spend(gw, "unbounded")["used"] <= 3000


def test_a_request_refused_for_a_bad_header_holds_none_of_the_budget(gw: Gateway) -> None:
    for _ in range(5):
        refused = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {CAREFUL}", "x-llmgw-priority": "urgent"},
            timeout=30,
        )
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_priority"
    assert spend(gw, "careful")["used"] == 0, "refused requests kept their tokens held"


def test_crossing_warn_at_logs_one_warning_and_metrics_show_the_fraction(gw: Gateway) -> None:
    for _ in range(5):
        ask_as(gw, WARNED)
    lines = [line for line in gw.log().splitlines() if "warn_at" in line]
    assert len(lines) == 1 and "'warned'" in lines[0], lines
    scraped = httpx.get(gw.url + "/metrics", headers=gw.probe_headers(), timeout=10).text
    assert 'llmgw_key_budget_used{key="warned"}' in scraped, "the used fraction is in /metrics"


def test_a_restart_keeps_the_spend_in_the_state_directory(tmp_path: Path, engine_a: Engine) -> None:
    env = {
        "LLMGW_KEYS_FILE": str(keys_file(tmp_path / "keys.yaml")),
        "XDG_STATE_HOME": str(tmp_path / "xdg"),  # the default place, under the platform's own
    }
    path = plan_file(tmp_path, engine_a)
    with gateway(path, **env) as first:
        assert ask_as(first, DAILY).status_code == 200
        assert ask_as(first, DAILY).status_code == 200
    assert (tmp_path / "xdg" / "llmgw" / "llmgw-state.sqlite").is_file()
    with gateway(path, **env) as again:
        answer = ask_as(again, DAILY)
    remaining = answer.headers["x-llmgw-budget-remaining-tokens"]
    assert remaining == "986", "the 14 tokens spent before the restart count"


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_two_instances_share_the_spend_on_redis(tmp_path: Path, engine_a: Engine, redis: RedisServer) -> None:
    env = {
        "LLMGW_KEYS_FILE": str(keys_file(tmp_path / "keys.yaml")),
        "LLMGW_ADMIN_TOKEN": ADMIN,
        "LLMGW_REDIS_URL": redis.url,
        "LLMGW_REDIS_TIMEOUT": "0.5",
    }
    path = plan_file(tmp_path, engine_a)
    with gateway(path, **env) as one, gateway(path, **env) as two:
        assert ask_as(one, DAILY).status_code == 200
        assert ask_as(two, DAILY).headers["x-llmgw-budget-remaining-tokens"] == "993"
        statuses = burst([one, two], BURST, 16)
        admitted = statuses.count(200)
        assert 1 <= admitted and spend(one, "burst")["used"] == spend(two, "burst")["used"] == 7 * admitted
        assert 7 * admitted <= 60, f"two instances let {admitted} answers through a budget of 60"
