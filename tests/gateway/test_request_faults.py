"""A 500 may be the request's fault or the replica's: only another replica can tell which.

One worker, so every request's verdict lands in the same process; health probes run once
at start and then once a minute, and two failures take a replica out, so what a test sees
is the request path's own doing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, engine, gateway, model, plan, profile, write_plan


@pytest.fixture(scope="module")
def engine_c() -> Iterator[Engine]:
    with engine("c", "127.0.0.10") as e:
        yield e


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
    engine_a: Engine,
    engine_b: Engine,
    engine_c: Engine,
    engine_failing: Engine,
) -> Iterator[Gateway]:
    doc = plan(
        [
            model("trio", [profile([engine_a.url, engine_b.url, engine_c.url], "trio")]),
            model("flaky", [profile([engine_failing.url, engine_b.url], "flaky")]),
            model("alone", [profile([engine_c.url], "alone")]),
        ]
    )
    path = tmp_path_factory.mktemp("faults") / "plan.json"
    write_plan(path, doc)
    # Every test here retries on purpose, in bursts faster than the retry budget allows
    # (its own test is in test_outlier_ejection.py).
    with gateway(
        path, workers=1, LLMGW_HEALTH_INTERVAL="60", LLMGW_HEALTH_FAILURES="2", LLMGW_RETRY_FLOOR="1000"
    ) as g:
        yield g


def ask(gw: Gateway, model_name: str, **fake: Any) -> httpx.Response:
    body = {"model": model_name, "messages": [], **fake}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)


def out_of_rotation(gw: Gateway) -> set[str]:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return set(re.findall(r'llmgw_replica_healthy\{[^}]*replica="([^"]+)"[^}]*\} 0\.0', text))


def requests_seen(*engines: Engine) -> int:
    return sum(e.stats()["requests"] for e in engines)


def test_a_request_every_engine_fails_gets_the_engines_own_error_after_one_retry(
    gw: Gateway, engine_a: Engine, engine_b: Engine, engine_c: Engine
) -> None:
    before = requests_seen(engine_a, engine_b, engine_c)
    answer = ask(gw, "trio", fake_status=500)
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert "told to fail" in error["message"], f"the client got the gateway's words: {error}"
    assert requests_seen(engine_a, engine_b, engine_c) == before + 2, "retried once, not on every replica"


def test_requests_that_make_engines_fail_take_no_replica_out_of_rotation(
    gw: Gateway, engine_a: Engine, engine_b: Engine, engine_c: Engine
) -> None:
    for _ in range(10):
        assert ask(gw, "trio", fake_status=500).status_code == 500
    assert not out_of_rotation(gw), "one client's bad requests took replicas away from everyone"
    served = {ask(gw, "trio").json()["system_fingerprint"] for _ in range(6)}
    assert served == {"a", "b", "c"}


def test_a_replica_that_fails_what_another_answers_leaves_rotation(
    gw: Gateway, engine_failing: Engine
) -> None:
    for _ in range(3):
        answer = ask(gw, "flaky")
        assert answer.status_code == 200, answer.text
        assert answer.json()["system_fingerprint"] == "b"
    assert out_of_rotation(gw) == {engine_failing.url}


def test_the_only_replica_answering_500_passes_it_on_and_stays(gw: Gateway, engine_c: Engine) -> None:
    for _ in range(3):
        answer = ask(gw, "alone", fake_status=500)
        assert answer.status_code == 500 and "told to fail" in answer.text, answer.text
    assert engine_c.url not in out_of_rotation(gw)
    assert ask(gw, "alone").status_code == 200


def test_a_replica_answering_503_is_retried_on_the_next_as_before(gw: Gateway, engine_a: Engine) -> None:
    answer = ask(gw, "trio", fake_status=503, fake_only="a")
    assert answer.status_code == 200, "a 503 is retried on the next replica, as before"
