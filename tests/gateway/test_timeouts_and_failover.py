"""Timeouts, retries and weights, through a gateway whose health checks stay out of the way.

Health checks run once a minute here and take a replica out only after 100 failures, so
what a test sees is the request path's own doing: a dead replica is still tried (502, not
503), and a replica that misbehaved once is still first in line.
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import Engine, Gateway, dead_endpoint, gateway, model, plan, profile, wait_until, write_plan

FIRST_BYTE = 1
CHUNK = 3


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine) -> Iterator[Gateway]:
    a, b = engine_a.url, engine_b.url
    doc = plan(
        [
            model("plain", [profile([b], "plain")]),
            model(
                "tiered",
                [
                    profile([a], "tiered", priority=10, name="first"),
                    profile([b], "tiered", priority=20, name="second"),
                ],
            ),
            model("nowhere", [profile([dead_endpoint("127.0.0.5"), dead_endpoint("127.0.0.6")], "nowhere")]),
            model(
                "weighted",
                [
                    profile([a], "weighted", priority=10, weight=3, name="heavy"),
                    profile([b], "weighted", priority=10, weight=1, name="light"),
                ],
            ),
            model(
                "standby",
                [
                    profile([a], "standby", priority=10, weight=1, name="main"),
                    profile([b], "standby", priority=10, weight=0, name="standby"),
                ],
            ),
        ]
    )
    path = tmp_path_factory.mktemp("timeouts") / "plan.json"
    write_plan(path, doc)
    with gateway(
        path,
        LLMGW_FIRST_BYTE_TIMEOUT=str(FIRST_BYTE),
        LLMGW_CHUNK_TIMEOUT=str(CHUNK),
        LLMGW_HEALTH_INTERVAL="60",
        LLMGW_HEALTH_FAILURES="100",
    ) as g:
        yield g


def stream(gw: Gateway, model_name: str, **fake: Any) -> httpx.Response:
    body = {"model": model_name, "messages": [], "stream": True, **fake}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)


def events(answer: httpx.Response) -> list[Any]:
    lines = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


# --- the two clocks ------------------------------------------------------------------------


def test_chunks_further_apart_than_the_first_byte_timeout_pass_within_the_chunk_timeout(gw: Gateway) -> None:
    answer = stream(gw, "plain", fake_chunks=2, fake_chunk_delay=1.8)
    assert answer.status_code == 200, answer.text
    got = events(answer)
    assert got[-1] == "[DONE]" and len(got) == 3, (
        f"a {FIRST_BYTE}s first-byte timeout cut a stream whose chunks were within the "
        f"{CHUNK}s chunk timeout: {got}"
    )


def test_headers_without_a_first_chunk_in_time_are_a_clean_504(gw: Gateway) -> None:
    # vLLM sends its headers at once and its first chunk after the prompt is processed.
    answer = stream(gw, "plain", fake_delay_body=2.5)
    assert answer.status_code == 504, f"the client got {answer.status_code}: {answer.text[:300]}"
    assert answer.json()["error"]["code"] == "upstream_timeout"


def test_the_first_byte_allowance_covers_headers_and_first_chunk_together(gw: Gateway) -> None:
    # Each wait alone is under the allowance; together they are over it.
    answer = stream(gw, "plain", fake_delay_first=0.8, fake_delay_body=0.8)
    assert answer.status_code == 504, "the first byte may take up to twice LLMGW_FIRST_BYTE_TIMEOUT"


# --- retries -------------------------------------------------------------------------------


def test_a_replica_that_hangs_up_before_its_first_byte_is_retried_on_the_next(gw: Gateway) -> None:
    answer = stream(gw, "tiered", fake_hangup_after=0, fake_only="a")
    assert answer.status_code == 200, answer.text
    got = events(answer)
    assert got[-1] == "[DONE]"
    assert all(e["system_fingerprint"] == "b" for e in got[:-1]), got


def test_nothing_is_retried_after_the_first_byte(gw: Gateway, engine_a: Engine, engine_b: Engine) -> None:
    a_before, b_before = engine_a.stats()["requests"], engine_b.stats()["requests"]
    answer = stream(gw, "tiered", fake_hangup_after=1, fake_only="a")
    got = events(answer)
    assert got[0]["system_fingerprint"] == "a", got
    assert "error" in got[-1], f"the client must learn the answer was cut off: {got}"
    assert engine_a.stats()["requests"] == a_before + 1
    assert engine_b.stats()["requests"] == b_before, "a client that already has tokens got a second answer"


def test_every_replica_unreachable_is_502(gw: Gateway) -> None:
    for _ in range(3):
        answer = stream(gw, "nowhere")
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "upstream_unreachable"


def test_every_replica_answering_502_is_502(gw: Gateway) -> None:
    answer = stream(gw, "tiered", fake_status=502)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_unreachable"


def test_every_replica_answering_500_passes_on_the_engines_own_error(gw: Gateway) -> None:
    answer = stream(gw, "tiered", fake_status=500)
    assert answer.status_code == 500, answer.text
    assert "told to fail" in answer.json()["error"]["message"], "the engine's words are the useful ones"


# --- weights -------------------------------------------------------------------------------


def served_by(gw: Gateway, model_name: str, times: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for _ in range(times):
            answer = client.post(gw.url + "/v1/chat/completions", json={"model": model_name, "messages": []})
            assert answer.status_code == 200, answer.text
            seen[answer.json()["system_fingerprint"]] += 1
    return seen


def test_profiles_of_one_priority_share_requests_by_weight(gw: Gateway) -> None:
    seen = served_by(gw, "weighted", 200)
    # 3:1 expects 150 of 200 on a; the band is over four standard deviations wide.
    assert 124 <= seen["a"] <= 176, f"weights 3 and 1 split requests {dict(seen)}"


def test_a_weight_zero_profile_gets_nothing_while_the_others_are_healthy(gw: Gateway) -> None:
    seen = served_by(gw, "standby", 60)
    assert seen == Counter(a=60), f"weight 0 is a standby, yet it served {dict(seen)}"


# --- clients --------------------------------------------------------------------------------


def test_a_client_that_never_reads_its_stream_frees_the_engine(gw: Gateway, engine_b: Engine) -> None:
    # The 504 tests above leave answers the engine goes on sleeping in, and each counts its
    # disconnect only when it wakes, up to 2.5 s later: counted during this test, one passed
    # the wait below at once, and the client left after 24 ms (a 499, but no stall).
    wait_until(lambda: engine_b.stats()["answering"] == 0, 10, "the engine to end earlier tests' answers")
    before = engine_b.stats()["disconnects"]
    seen = len(gw.access_lines())
    # About 30 MB over 30 s, far more than the sockets between here and the engine hold.
    body = json.dumps(
        {"model": "plain", "messages": [], "stream": True, "fake_chunks": 3000,
         "fake_chunk_delay": 0.01, "fake_chunk_bytes": 10_000}
    ).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        # Read nothing. The engine must learn the answer is not wanted within about the
        # chunk timeout of the client's socket filling up, not when its 30 s are over.
        wait_until(
            lambda: engine_b.stats()["disconnects"] > before,
            CHUNK + 15,
            "the engine's connection to close while the client reads nothing",
        )
    lines = [line for line in gw.access_lines()[seen:] if line.get("model") == "plain"]
    assert lines and lines[-1]["status"] == 499, lines
    assert "read nothing for" in gw.log()
