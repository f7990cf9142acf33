"""Engines that misbehave after they have started answering: each gives the client the
result the README documents, and nothing is left behind (the engine's open connections
and the worker's asyncio tasks return to where they were).

One worker, so /readyz always reports the worker that served the request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, engine, gateway, model, plan, profile, wait_until, write_plan

CHUNK = 1
LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def engine_m() -> Iterator[Engine]:
    with engine("m", "127.0.0.11") as e:
        yield e


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_m: Engine) -> Iterator[Gateway]:
    doc = plan([model("m", [profile([engine_m.url], "m")])])
    path = tmp_path_factory.mktemp("misbehaving") / "plan.json"
    write_plan(path, doc)
    with gateway(
        path,
        workers=1,
        LLMGW_CHUNK_TIMEOUT=str(CHUNK),
        LLMGW_FIRST_BYTE_TIMEOUT="3",
        LLMGW_HEALTH_INTERVAL="60",
        LLMGW_HEALTH_FAILURES="100",
        LLMGW_EJECT_AFTER="100",
        LLMGW_MAX_RESPONSE_BYTES=str(LIMIT),
    ) as g:
        yield g


def tasks(gw: Gateway) -> int:
    with httpx.Client(timeout=10) as fresh:
        return int(fresh.get(gw.url + "/readyz").json()["tasks"])


@pytest.fixture
def no_leaks(gw: Gateway, engine_m: Engine) -> Iterator[None]:
    """Checks, after the test, that connections and tasks are back at their baseline."""
    assert ask(gw).status_code == 200  # the pooled connection a healthy gateway keeps
    connections, running = engine_m.stats()["open"], tasks(gw)
    yield
    wait_until(
        lambda: engine_m.stats()["open"] <= connections,
        5,
        f"the engine's open connections back to {connections} (a leaked upstream connection)",
    )
    wait_until(lambda: tasks(gw) <= running, 5, f"the worker's asyncio tasks back to {running}")
    # A count left up would have least-loaded routing and DNS draining treat the engine as busy.
    wait_until(lambda: inflight(gw, engine_m) == 0, 5, "the replica's in-flight count back to 0")


def inflight(gw: Gateway, engine: Engine) -> int:
    with httpx.Client(timeout=10) as fresh:
        status = fresh.get(gw.url + "/dashboard/status.json").json()
    return int(status["models"]["m"]["profiles"]["p"]["replicas"][engine.url]["inflight"])


def ask(gw: Gateway, **body: Any) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "m", "messages": [], **body}, timeout=30
    )


def events(answer: httpx.Response) -> list[Any]:
    lines = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


@pytest.mark.usefixtures("no_leaks")
def test_a_stream_that_stalls_midway_ends_with_an_error_event(gw: Gateway) -> None:
    answer = ask(gw, stream=True, fake_chunks=3, fake_chunk_delay=CHUNK + 1.5)
    got = events(answer)
    assert answer.status_code == 200 and got[0]["choices"], got
    assert got[-1]["error"]["message"].endswith("stopped sending."), got


@pytest.mark.usefixtures("no_leaks")
def test_a_stream_torn_mid_event_ends_with_an_error_event_not_half_an_event(gw: Gateway) -> None:
    answer = ask(gw, stream=True, fake_broken_sse=True)
    got = events(answer)  # every data line parses: the torn one was dropped
    assert len(got) == 2 and got[0]["choices"], got
    assert "in the middle of an event" in got[-1]["error"]["message"], got


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("stream", [True, False])
def test_a_reset_after_the_headers_is_a_502_when_no_other_replica_can_answer(
    gw: Gateway, stream: bool
) -> None:
    answer = ask(gw, stream=stream, fake_reset=True)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_unreachable"


@pytest.mark.usefixtures("no_leaks")
def test_an_answer_announced_over_the_limit_is_a_502_before_any_of_it(gw: Gateway) -> None:
    answer = ask(gw, fake_body_bytes=2 * LIMIT)
    assert answer.status_code == 502, answer.status_code
    assert answer.json()["error"]["code"] == "upstream_answer_too_large"


@pytest.mark.usefixtures("no_leaks")
def test_an_unannounced_answer_over_the_limit_is_cut_and_the_client_told_so(gw: Gateway) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        ask(gw, fake_body_bytes=4 * LIMIT, fake_chunked=True)  # an incomplete body, never a short "whole" one
    answer = ask(gw, fake_body_bytes=LIMIT // 2, fake_chunked=True)
    assert answer.status_code == 200 and len(answer.content) >= LIMIT // 2 - 64


@pytest.mark.usefixtures("no_leaks")
def test_a_stream_over_the_limit_ends_with_an_error_event(gw: Gateway) -> None:
    answer = ask(gw, stream=True, fake_chunks=20, fake_chunk_bytes=LIMIT // 8)
    got = events(answer)
    assert "LLMGW_MAX_RESPONSE_BYTES" in got[-1]["error"]["message"], got[-1]
    assert len(got) < 20


@pytest.mark.usefixtures("no_leaks")
def test_a_json_answer_that_never_ends_is_dropped_after_the_chunk_timeout(gw: Gateway) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        ask(gw, fake_never_close=True)


@pytest.mark.usefixtures("no_leaks")
def test_an_answer_nested_too_deep_to_read_for_its_usage_is_passed_on_as_it_came(gw: Gateway) -> None:
    # The gateway reads a JSON answer for its usage; one nested deeper than Python's parser
    # goes is still the engine's answer to relay, not the gateway's own 500.
    answer = ask(gw, fake_nest=10_000)
    assert answer.status_code == 200, answer.text[:200]
    assert answer.content.endswith(b"[" * 10_000 + b"]" * 10_000 + b"}")
    assert answer.headers["content-type"] == "application/json"
