"""Rate limits and usage per key: held across workers, said as OpenAI says them, counted
from the engines' usage."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harness import (
    Engine,
    Gateway,
    ask_as,
    at_once,
    gateway,
    key_digest,
    model,
    plan,
    profile,
    wait_until,
    write_plan,
)

from llmgw.gateway.request.limits import FILE_NAME

BURST, TOKENS, METERED, HANGUP, MANY = "sk-burst", "sk-tokens", "sk-metered", "sk-hangup", "sk-many"
ADMIN = "admin-secret"
PATIENT = "sk-patient"
RESERVED, SCOPED = "sk-reserved", "sk-scoped"
APP_ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("limits")
    path = tmp / "plan.json"
    write_plan(
        path,
        plan(
            [
                model("chat", [profile([engine_a.url], "chat")]),
                model("capped", [profile([engine_a.url], "capped")], max_output=100),
                model("secret-model", [profile([engine_a.url], "secret-model")]),
            ]
        ),
    )
    keys = tmp / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: burst, sha256: {key_digest(BURST)}, rpm: 30}}\n"
        f"  - {{name: tokens, sha256: {key_digest(TOKENS)}, tpm: 20}}\n"
        f"  - {{name: metered, sha256: {key_digest(METERED)}}}\n"
        f"  - {{name: hangup, sha256: {key_digest(HANGUP)}}}\n"
        f"  - {{name: many, sha256: {key_digest(MANY)}, rpm: 1000}}\n"
        f"  - {{name: patient, sha256: {key_digest(PATIENT)}, rpm: 1}}\n"
        f"  - {{name: reserved, sha256: {key_digest(RESERVED)}, tpm: 300}}\n"
        f"  - {{name: scoped, sha256: {key_digest(SCOPED)}, models: [chat, capped]}}\n"
    )
    with gateway(
        path, LLMGW_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN, LLMGW_CORS_ORIGINS=APP_ORIGIN
    ) as gw:
        yield gw


def test_requests_per_minute_hold_across_workers_under_concurrent_load(served: Gateway) -> None:
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(10):
            status = ask_as(served, BURST, stream=len(statuses) % 2 == 0).status_code
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = statuses.count(200)
    assert 29 <= admitted <= 31, f"rpm 30 let {admitted} of {len(statuses)} through: {sorted(set(statuses))}"
    assert statuses.count(429) == len(statuses) - admitted


def test_a_429_is_in_openais_shape_with_retry_after_and_ratelimit_headers(served: Gateway) -> None:
    wait_until(lambda: ask_as(served, BURST).status_code == 429, 10, "the burst key to be over its limit")
    answer = ask_as(served, BURST)
    assert answer.status_code == 429
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert "'burst'" in error["message"] and "30 requests per minute" in error["message"]
    retry = int(answer.headers["retry-after"])
    assert 1 <= retry <= 60
    assert answer.headers["x-ratelimit-limit-requests"] == "30"
    assert answer.headers["x-ratelimit-remaining-requests"] == "0"
    assert re.fullmatch(r"(\d+m)?\d+s|\d+ms", answer.headers["x-ratelimit-reset-requests"])


def test_the_openai_client_reads_the_429(served: Gateway) -> None:
    wait_until(lambda: ask_as(served, BURST).status_code == 429, 10, "the burst key to be over its limit")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=BURST, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 429
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "30"


def test_an_admitted_request_says_what_is_left(served: Gateway) -> None:
    answer = ask_as(served, MANY)
    assert answer.status_code == 200
    assert answer.headers["x-ratelimit-limit-requests"] == "1000"
    assert int(answer.headers["x-ratelimit-remaining-requests"]) < 1000


def test_tokens_per_minute_count_the_engines_usage(served: Gateway) -> None:
    # Each answer uses 7 tokens (3 + 4): admitted at 0, 7 and 14 used; refused at 21.
    statuses = [ask_as(served, TOKENS).status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429], statuses
    answer = ask_as(served, TOKENS)
    assert answer.json()["error"]["type"] == "tokens"
    assert answer.headers["x-ratelimit-limit-tokens"] == "20"
    assert answer.headers["x-ratelimit-remaining-tokens"] == "0"


def metric(gw: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def events(answer: httpx.Response) -> list[dict[str, object]]:
    return [
        json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
    ]


def test_a_stream_is_counted_and_its_usage_event_kept_from_a_client_that_did_not_ask(
    served: Gateway,
) -> None:
    answer = ask_as(served, METERED, stream=True)
    assert answer.status_code == 200
    got = events(answer)
    assert got and all(e["choices"] for e in got), f"a usage-only event reached the client: {got}"
    assert answer.text.rstrip().endswith("data: [DONE]")
    wait_until(
        lambda: metric(served, "llmgw_tokens_total", key="metered", kind="completion") == 3,
        10,
        "the stream's 3 completion tokens to be counted",
    )
    assert metric(served, "llmgw_tokens_total", key="metered", kind="prompt") == 3


def test_a_client_that_asked_for_usage_gets_it(served: Gateway) -> None:
    answer = ask_as(served, METERED, stream=True, stream_options={"include_usage": True})
    last = events(answer)[-1]
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6
    }


def test_requests_are_counted_per_model_key_and_status(served: Gateway) -> None:
    before = metric(served, "llmgw_requests_total", model="chat", key="metered", status="200")
    ask_as(served, METERED)
    wait_until(
        lambda: metric(served, "llmgw_requests_total", model="chat", key="metered", status="200")
        == before + 1,
        10,
        "the request to be counted under its key",
    )
    assert metric(served, "llmgw_rate_limited_total", key="burst", limit="requests") > 0


def test_a_client_that_hangs_up_midway_is_charged_its_prompt_estimate(served: Gateway) -> None:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "x" * 400}],
        "stream": True,
        "fake_chunks": 50,
        "fake_chunk_delay": 0.1,
    }
    with httpx.Client(timeout=30) as client, client.stream(
        "POST",
        served.url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {HANGUP}"},
    ) as answer:
        assert answer.status_code == 200
        next(answer.iter_raw())  # one chunk, then away
    wait_until(
        lambda: metric(served, "llmgw_tokens_total", key="hangup", kind="prompt") >= 100,
        10,
        "the prompt estimate (over 400 bytes: at least 100 tokens) to be charged",
    )
    # One chunk reached the client before it left: about a token, charged as relayed.
    wait_until(
        lambda: metric(served, "llmgw_tokens_total", key="hangup", kind="completion") >= 1,
        10,
        "the events relayed before the hang-up to be charged as completion tokens",
    )


def test_concurrent_requests_reserve_their_maximum_so_tpm_holds(served: Gateway) -> None:
    # Each request may write 100 tokens (the model's max_output): reserved at admission,
    # three fill the key's 300 while they run, and the rest are refused. Counted only at
    # the end, all twenty were let in.
    statuses = at_once(20, lambda: ask_as(served, RESERVED, model="capped", fake_delay_first=1.5).status_code)
    admitted = statuses.count(200)
    assert 1 <= admitted <= 4, f"tpm 300 with 100-token answers let {admitted} of 20 through"
    assert statuses.count(429) == 20 - admitted, statuses


def test_a_404s_hint_names_only_models_the_key_may_use(served: Gateway) -> None:
    answer = ask_as(served, SCOPED, model="secret-modle")
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "secret-model" not in message, f"the 404 named a model the key may not use: {message}"
    answer = ask_as(served, METERED, model="secret-modle")
    assert "secret-model" in answer.json()["error"]["message"], "an unscoped key is still helped"


def test_admin_keys_shows_a_keys_limits_and_usage(served: Gateway) -> None:
    assert ask_as(served, MANY).status_code == 200
    admin = {"Authorization": f"Bearer {ADMIN}"}

    def doc() -> Any:
        answer = httpx.get(served.url + "/admin/keys/many", headers=admin, timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()

    wait_until(lambda: doc()["total"].get("requests", 0) >= 1, 10, "the key's requests in its totals")
    got = doc()
    assert (got["name"], got["rpm"], got["tpm"], got["models"]) == ("many", 1000, None, None)
    assert got["last_minute"]["requests"] >= 1
    listed = httpx.get(served.url + "/admin/keys", headers=admin, timeout=10).json()["data"]
    assert {k["name"] for k in listed} == {
        "burst", "tokens", "metered", "hangup", "many", "patient", "reserved", "scoped"
    }
    assert httpx.get(served.url + "/admin/keys", timeout=10).status_code == 401
    assert httpx.get(served.url + "/admin/keys/nobody", headers=admin, timeout=10).status_code == 404


def test_the_openai_clients_retry_waits_as_retry_after_says_and_then_succeeds(served: Gateway) -> None:
    # rpm 1: the window frees 60s after the first request. Asked again 3s before that,
    # the gateway says Retry-After: 3, and the client's own retry gets through. (The client
    # honours Retry-After only up to 60s, so the request must be most of a minute old.)
    started = time.monotonic()
    assert ask_as(served, PATIENT).status_code == 200
    age_the_keys_last_minute(served, "patient", started + 57 - time.monotonic())
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=PATIENT, max_retries=1)
    asked = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    waited = time.monotonic() - asked
    assert raw.http_response.status_code == 200
    assert raw.retries_taken == 1, "the first try was refused 429 and the retry got through"
    assert 1.5 <= waited <= 10, f"the client waited {waited:.1f}s; Retry-After said about 3"


def age_the_keys_last_minute(gw: Gateway, name: str, seconds: float) -> None:
    """As if `seconds` had passed for the key's limits: its counted requests made that much
    older, in the file where the workers count them (limits.py). Waiting the minute out
    took 57 s of the suite; the gateway still reads its own clock and computes Retry-After."""
    counts = Path(gw.env["PROMETHEUS_MULTIPROC_DIR"]) / FILE_NAME
    with contextlib.closing(sqlite3.connect(counts, timeout=10)) as db, db:
        moved = db.execute("UPDATE used SET at = at - ? WHERE key = ?", (max(0.0, seconds), name))
        assert moved.rowcount >= 1, f"no requests of {name!r} counted in {counts}"


def test_a_listed_origins_page_may_call_the_api_with_its_preflight_needing_no_key(served: Gateway) -> None:
    preflight = httpx.options(
        served.url + "/v1/chat/completions",
        headers={
            "Origin": APP_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
        timeout=10,
    )
    assert preflight.status_code == 200, f"the browser's preflight was refused: {preflight.text}"
    assert preflight.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    answer = httpx.post(
        served.url + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {MANY}", "Origin": APP_ORIGIN},
        timeout=30,
    )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "x-ratelimit-remaining-requests" in answer.headers["access-control-expose-headers"].lower()
    other = httpx.get(served.url + "/v1/models", headers={"Origin": "https://evil.example"}, timeout=10)
    assert "access-control-allow-origin" not in other.headers, "an origin not listed was allowed"


@pytest.mark.parametrize("path", ["/metrics", "/readyz", "/dashboard/status.json"])
def test_cors_is_only_for_the_api_never_the_operators_pages(served: Gateway, path: str) -> None:
    # A page of an allowed origin reads the API; /metrics, /readyz and the dashboard's
    # status are the operator's, and once were readable from that page too.
    origin = {"Origin": APP_ORIGIN}
    answer = httpx.get(served.url + path, headers=origin, timeout=10)
    assert answer.status_code < 500, answer.text
    assert "access-control-allow-origin" not in answer.headers, f"{path} is readable from {APP_ORIGIN}"
    preflight = httpx.options(
        served.url + path, headers={**origin, "Access-Control-Request-Method": "GET"}, timeout=10
    )
    assert "access-control-allow-origin" not in preflight.headers, f"{path}'s preflight allowed {APP_ORIGIN}"
    api = httpx.get(
        served.url + "/v1/models", headers={**origin, "Authorization": f"Bearer {MANY}"}, timeout=10
    )
    assert api.headers.get("access-control-allow-origin") == APP_ORIGIN, "the API itself keeps CORS"
