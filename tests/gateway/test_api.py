"""The /v1 API through a real gateway (gunicorn, two workers) in front of fake engines."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from harness import (
    DIGEST_HEADER,
    Engine,
    Gateway,
    dead_endpoint,
    engine,
    gateway,
    model,
    plan,
    profile,
    wait_until,
    write_plan,
)


@pytest.fixture(scope="module")
def engine_loading() -> Iterator[Engine]:
    """Answers /health 503, as llama.cpp and vLLM do while the weights load."""
    with engine("loading", "127.0.0.9", "--health", "503") as e:
        yield e


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory,
    engine_a: Engine,
    engine_b: Engine,
    engine_failing: Engine,
    engine_loading: Engine,
) -> Iterator[Gateway]:
    a, b = engine_a.url, engine_b.url
    doc = plan(
        [
            model(
                "chat-a",
                [profile([a], "served-a")],
                aliases=["alias-a"],
                max_output=100,
                description="A chat model for tests.",
            ),
            model("plain", [profile([b], "plain")]),
            model("embed", [profile([a], "embed-x")], task="embedding"),
            model("base", [profile([b], "base")], task="completion"),
            model("failover", [profile([dead_endpoint("127.0.0.5"), a], "failover")]),
            model("failover-5xx", [profile([engine_failing.url, b], "failover-5xx")]),
            model(
                "tiered",
                [
                    profile([dead_endpoint("127.0.0.6")], "tiered", priority=10, name="gpu"),
                    profile([b], "tiered-cpu", priority=20, name="cpu"),
                ],
            ),
            model("nowhere", [profile([dead_endpoint("127.0.0.7")], "nowhere")]),
            model("org/model", [profile([a], "org/model")]),
            model("spread", [profile([a, b], "spread", routing="least-loaded")]),
            model("loading", [profile([engine_loading.url], "loading")]),
        ]
    )
    path = tmp_path_factory.mktemp("api") / "plan.json"
    write_plan(path, doc)
    with gateway(
        path, LLMGW_MAX_BODY_BYTES="65536", LLMGW_FIRST_BYTE_TIMEOUT="1.5", LLMGW_CHUNK_TIMEOUT="1.5"
    ) as g:
        g.env["digest"] = doc.digest
        yield g


def post(gw: Gateway, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(gw.url + path, json=body, timeout=30, **kw)


def chat(model_name: str, **extra: Any) -> dict[str, Any]:
    return {"model": model_name, "messages": [{"role": "user", "content": "hi"}], **extra}


def error_of(answer: httpx.Response) -> dict[str, Any]:
    body = answer.json()
    assert set(body) == {"error"}, f"not an OpenAI error: {body}"
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in answer.text
    return body["error"]


# --- listing -------------------------------------------------------------------------------


def test_models_lists_every_model_with_its_limits(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/models", timeout=10)
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert set(by_id) >= {"chat-a", "plain", "embed", "base"}
    described = by_id["chat-a"]
    assert described["object"] == "model"
    assert described["description"] == "A chat model for tests."
    assert described["max_output"] == 100
    assert described["aliases"] == ["alias-a"]
    assert described["context_length"] == 8192
    assert isinstance(described["created"], int) and described["owned_by"]


def test_an_undescribed_model_has_no_description_key_at_all(gw: Gateway) -> None:
    plain = httpx.get(gw.url + "/v1/models/plain", timeout=10).json()
    assert "description" not in plain, "clients would show an empty description"
    assert "max_output" not in plain


def test_a_model_is_found_by_its_alias(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/models/alias-a", timeout=10)
    assert answer.status_code == 200
    assert answer.json()["id"] == "chat-a"


def test_an_unknown_model_id_is_404_naming_the_closest(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/models/chat-b", timeout=10)
    assert answer.status_code == 404
    assert "chat-a" in error_of(answer)["message"]


def test_a_model_whose_name_holds_a_slash_is_found(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/models/org/model", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "org/model"
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    assert client.models.retrieve("org/model").id == "org/model"
    missing = httpx.get(gw.url + "/v1/models/org/modle", timeout=10)
    assert missing.status_code == 404
    assert "'org/model'" in error_of(missing)["message"], "the 404 names the closest model"


def test_an_unknown_path_under_v1_is_not_told_the_api_is_under_v1(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/nothing", timeout=10)
    assert answer.status_code == 404
    message = error_of(answer)["message"]
    assert "under /v1" not in message and "/v1/chat/completions" in message


def test_v1_itself_is_answered_as_part_of_the_api(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1", timeout=10)
    assert answer.status_code == 404
    assert answer.headers.get(DIGEST_HEADER) == gw.env["digest"]
    message = error_of(answer)["message"]
    assert "under /v1" not in message and "/v1/chat/completions" in message, message


# --- proxying ------------------------------------------------------------------------------


def test_chat_by_alias_reaches_the_replica_under_its_served_name(gw: Gateway, engine_a: Engine) -> None:
    answer = post(gw, "/v1/chat/completions", chat("alias-a"))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["system_fingerprint"] == "a"
    assert engine_a.stats()["models_seen"][-1] == "served-a", "the engine must be sent the name it serves"
    assert body["model"] == "alias-a", "the answer names the model the client asked for"
    assert body["choices"][0]["message"]["content"] == "hello from a"


def test_completions_and_embeddings_are_proxied(gw: Gateway, engine_a: Engine) -> None:
    done = post(gw, "/v1/completions", {"model": "base", "prompt": "once upon"})
    assert done.status_code == 200 and done.json()["object"] == "text_completion"
    embedded = post(gw, "/v1/embeddings", {"model": "embed", "input": ["x", "y"]})
    assert embedded.status_code == 200
    assert len(embedded.json()["data"]) == 2
    assert engine_a.stats()["models_seen"][-1] == "embed-x"


def test_streamed_chunks_arrive_as_the_engine_sends_them(gw: Gateway) -> None:
    body = chat("plain", stream=True, fake_chunks=3, fake_chunk_delay=0.6)
    arrivals: list[float] = []
    start = time.monotonic()
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 4, "three chunks and [DONE]"
    # The engine spaces chunks 0.6 s apart; a buffering gateway would deliver them together.
    assert arrivals[1] - arrivals[0] > 0.3 and arrivals[2] - arrivals[1] > 0.3, arrivals


def test_a_client_that_leaves_mid_stream_cancels_the_upstream_request(gw: Gateway, engine_b: Engine) -> None:
    before = engine_b.stats()["disconnects"]
    body = chat("plain", stream=True, fake_chunks=100, fake_chunk_delay=0.1)
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first token
    wait_until(
        lambda: engine_b.stats()["disconnects"] > before, 8, "the engine to see its stream's client go away"
    )


# --- routing and failover ------------------------------------------------------------------


def test_one_request_at_a_time_still_reaches_every_replica(gw: Gateway) -> None:
    # Least-loaded routing: each worker takes its turns on its own; of six requests one
    # worker gets at least three, and those must not all go to the first replica.
    seen = set()
    for _ in range(6):
        with httpx.Client(timeout=30) as fresh:
            answer = fresh.post(gw.url + "/v1/chat/completions", json=chat("spread"))
        assert answer.status_code == 200, answer.text
        seen.add(answer.json()["system_fingerprint"])
    assert seen == {"a", "b"}


def test_a_dead_replica_is_skipped_and_no_request_fails(gw: Gateway) -> None:
    for _ in range(10):
        answer = post(gw, "/v1/chat/completions", chat("failover"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["system_fingerprint"] == "a"


def test_a_replica_answering_500_is_retried_on_another(gw: Gateway) -> None:
    for _ in range(10):
        answer = post(gw, "/v1/chat/completions", chat("failover-5xx"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["system_fingerprint"] == "b"


def test_the_next_priority_serves_when_the_first_is_down(gw: Gateway, engine_b: Engine) -> None:
    answer = post(gw, "/v1/chat/completions", chat("tiered"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["system_fingerprint"] == "b"
    assert engine_b.stats()["models_seen"][-1] == "tiered-cpu"


def test_an_unreachable_model_is_502_then_503_with_retry_after(gw: Gateway) -> None:
    first = post(gw, "/v1/chat/completions", chat("nowhere"))
    assert first.status_code in (502, 503), first.text
    error_of(first)

    def out_of_rotation() -> httpx.Response | None:
        answers = [post(gw, "/v1/chat/completions", chat("nowhere")) for _ in range(6)]
        return answers[-1] if all(a.status_code == 503 for a in answers) else None

    answer = wait_until(out_of_rotation, 15, "health checks to take the replica out")
    assert int(answer.headers["Retry-After"]) >= 1
    assert "nowhere" in error_of(answer)["message"]


def test_a_replica_still_loading_is_out_of_rotation_until_its_health_says_200(
    gw: Gateway, engine_loading: Engine
) -> None:
    def answers(expected: int) -> httpx.Response | None:
        # Several in a row, so both workers have had their say.
        got = [post(gw, "/v1/chat/completions", chat("loading")) for _ in range(6)]
        return got[-1] if all(a.status_code == expected for a in got) else None

    loading = wait_until(lambda: answers(503), 15, "/health 503 to take the replica out of rotation")
    assert int(loading.headers["Retry-After"]) >= 1
    assert error_of(loading)["code"] == "no_healthy_replica"
    httpx.post(engine_loading.url + "/fake/health", json={"status": 200}, timeout=10)
    back = wait_until(lambda: answers(200), 15, "/health 200 to bring the replica back")
    assert back.json()["system_fingerprint"] == "loading"


def test_an_engine_slow_to_start_answering_is_504(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain", fake_delay_first=4))
    assert answer.status_code == 504
    assert "LLMGW_FIRST_BYTE_TIMEOUT" in error_of(answer)["message"]


def test_a_stream_that_stalls_ends_with_an_error_event(gw: Gateway) -> None:
    body = chat("plain", stream=True, fake_chunks=3, fake_chunk_delay=4)
    answer = post(gw, "/v1/chat/completions", body)
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    assert events[0]["choices"], "the first chunk is passed on"
    assert "error" in events[-1], f"the client must learn the answer was cut off: {events}"


# --- request errors ------------------------------------------------------------------------


def test_an_unknown_model_is_404_naming_the_closest(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("chat-b"))
    assert answer.status_code == 404
    error = error_of(answer)
    assert "chat-a" in error["message"] and error["param"] == "model"


def test_an_unknown_model_like_none_served_is_404_naming_some_that_are(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("zzzzzz"))
    assert answer.status_code == 404
    message = error_of(answer)["message"]
    assert "'chat-a'" in message and "more" in message, f"the 404 gives nothing to try instead: {message}"


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b'{"messages": []}'])
def test_a_missing_or_malformed_body_is_400(gw: Gateway, content: bytes) -> None:
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        content=content,
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    error_of(answer)


def test_a_body_over_the_limit_is_413(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain", padding="x" * 70000))
    assert answer.status_code == 413
    assert "65536" in error_of(answer)["message"]


def test_max_tokens_over_the_models_limit_is_400_naming_it(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("chat-a", max_tokens=500))
    assert answer.status_code == 400
    error = error_of(answer)
    assert "100" in error["message"] and error["param"] == "max_tokens"
    assert post(gw, "/v1/chat/completions", chat("chat-a", max_tokens=100)).status_code == 200


def test_a_request_without_a_limit_reaches_the_engine_with_the_models_max_output(
    gw: Gateway, engine_a: Engine
) -> None:
    answer = post(gw, "/v1/chat/completions", chat("chat-a", ignore_eos=True))
    assert answer.status_code == 200
    sent = engine_a.stats()["max_tokens_seen"][-1]
    assert sent == 100, f"the engine was asked for {sent} tokens at most, not the model's max_output 100"
    post(gw, "/v1/chat/completions", chat("chat-a", max_tokens=7))
    assert engine_a.stats()["max_tokens_seen"][-1] == 7, "the client's own limit must be kept"


@pytest.mark.parametrize("stream", [1, "true", {}])
def test_a_stream_that_is_not_a_boolean_is_400(gw: Gateway, stream: Any) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain", stream=stream))
    assert answer.status_code == 400
    error = error_of(answer)
    assert error["param"] == "stream" and "true or false" in error["message"], error


def test_a_model_that_is_not_a_string_is_400_saying_so(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", {**chat("plain"), "model": 5})
    assert answer.status_code == 400
    message = error_of(answer)["message"]
    assert "must be a string" in message and "has no" not in message, message


def test_an_engine_answering_503_while_it_loads_is_503_with_retry_after_not_502(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain", fake_status=503))
    assert answer.status_code == 503, f"a loading engine was reported as {answer.status_code}: {answer.text}"
    assert int(answer.headers["Retry-After"]) >= 1
    error = error_of(answer)
    assert error["code"] == "model_not_ready" and "not ready yet" in error["message"], error


def test_a_stream_the_client_read_to_its_end_is_logged_200_not_499(gw: Gateway) -> None:
    body = chat("plain", stream=True, fake_linger=1.0)
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": "read-to-done"}
    ) as answer:
        for line in answer.iter_lines():
            if line == "data: [DONE]":
                break  # everything read: the client goes, as the openai client does
    line = wait_until(
        lambda: next((r for r in gw.access_lines() if r.get("request_id") == "read-to-done"), None),
        10,
        "the stream's access log line",
    )
    assert line["status"] == 200, f"a stream read to its end was logged {line['status']}"


# The engines' own words for a prompt over the context, as they send them.
LLAMA_OVER_CONTEXT = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 9000,
        "n_ctx": 8192,
    }
}
VLLM_OVER_CONTEXT = {
    "object": "error",
    "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 "
    "tokens (9000 in the messages, 0 in the completion). Please reduce the length of the messages "
    "or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.mark.parametrize("engine_error", [LLAMA_OVER_CONTEXT, VLLM_OVER_CONTEXT], ids=["llama", "vllm"])
def test_a_prompt_over_the_context_is_openais_context_length_exceeded(
    gw: Gateway, engine_error: dict[str, Any]
) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain", fake_status=400, fake_error=engine_error))
    assert answer.status_code == 400
    error = error_of(answer)
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    ), error
    assert "maximum context length is 8192 tokens" in error["message"], error["message"]


def test_an_embedding_model_on_the_chat_endpoint_is_400(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("embed"))
    assert answer.status_code == 400
    message = error_of(answer)["message"]
    assert "/v1/embeddings" in message and "is an embedding model" in message, message


def test_cors_is_off_unless_the_operator_lists_origins(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v1/models", headers={"Origin": "https://app.example.com"}, timeout=10)
    assert "access-control-allow-origin" not in answer.headers


def test_an_unknown_path_answers_in_openais_shape(gw: Gateway) -> None:
    answer = httpx.get(gw.url + "/v2/nothing", timeout=10)
    assert answer.status_code == 404
    error_of(answer)


def test_admin_is_closed_without_a_token(gw: Gateway) -> None:
    answer = httpx.post(gw.url + "/admin/plan", content=b"{}", timeout=10)
    assert answer.status_code == 403
    assert "LLMGW_ADMIN_TOKEN" in error_of(answer)["message"]


# --- headers, logs, probes, metrics --------------------------------------------------------


def test_every_v1_answer_carries_the_plan_digest(gw: Gateway) -> None:
    for answer in (
        httpx.get(gw.url + "/v1/models", timeout=10),
        post(gw, "/v1/chat/completions", chat("plain")),
        post(gw, "/v1/chat/completions", chat("no-such-model")),
    ):
        assert answer.headers[DIGEST_HEADER] == gw.env["digest"]


def test_request_ids_are_honoured_generated_and_logged(gw: Gateway) -> None:
    answer = post(gw, "/v1/chat/completions", chat("plain"), headers={"X-Request-Id": "req-42"})
    assert answer.headers["X-Request-Id"] == "req-42"
    generated = post(gw, "/v1/chat/completions", chat("plain")).headers["X-Request-Id"]
    assert generated and generated != "req-42"

    def logged() -> dict[str, Any] | None:
        return next((r for r in gw.access_lines() if r.get("request_id") == "req-42"), None)

    line = wait_until(logged, 10, "the access log line for req-42")
    assert line["model"] == "plain" and line["status"] == 200
    assert line["replica"].startswith("http://127.0.0.3:")
    assert line["duration_ms"] >= line["ttfb_ms"] >= 0


def test_probes_say_alive_and_which_plan_is_served(gw: Gateway) -> None:
    assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200
    ready = httpx.get(gw.url + "/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["digest"] == gw.env["digest"]
    assert ready.json()["loaded_at"]
    assert ready.json()["pid"] in gw.worker_pids(), "names the worker that answered"


def test_metrics_count_requests_errors_and_the_plan(gw: Gateway) -> None:
    post(gw, "/v1/chat/completions", chat("plain"))
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    assert 'llmgw_requests_total{key="-",model="plain",status="200"}' in text
    assert "llmgw_request_duration_seconds_bucket" in text
    assert "llmgw_time_to_first_byte_seconds_bucket" in text
    assert f'llmgw_plan_info{{digest="{gw.env["digest"]}"' in text
    assert "llmgw_replica_healthy" in text


def test_metrics_count_upstream_errors(gw: Gateway) -> None:
    post(gw, "/v1/chat/completions", chat("failover-5xx"))
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    assert "llmgw_upstream_errors_total" in text


def test_the_dashboard_is_served_without_an_api_key_and_shows_the_plan(gw: Gateway) -> None:
    page = httpx.get(gw.url + "/", timeout=10)
    assert page.status_code == 200 and "chat-a" in page.text
    status = httpx.get(gw.url + "/dashboard/status.json", timeout=10)
    assert status.status_code == 200
    assert gw.env["digest"] in status.text
