"""The Responses, Messages, rerank and token-counting endpoints through a real gateway, as
the official `openai` and `anthropic` clients speak them, in front of fake engines that
answer in llama-server's shapes: keys with limits, usage charged, the model renamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from harness import Engine, Gateway, gateway, key_digest, model, plan, profile, wait_until, write_plan

ADMIN = "admin-secret"
# One key per test that counts tokens, so each test reads only its own charges.
RESPONSES, RESPONSES_STREAM, MESSAGES, MESSAGES_STREAM, COUNTING = (
    "sk-responses",
    "sk-responses-stream",
    "sk-messages",
    "sk-messages-stream",
    "sk-counting",
)
NARROW = "sk-narrow"  # may use only the reranker
OTHER = "sk-other"  # for the tests that charge nothing they check


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine, engine_b: Engine) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("endpoints")
    path = tmp / "plan.json"
    doc = plan(
        [
            # Served under another name than the one clients use: every answer must be renamed.
            model("gemma", [profile([engine_a.url], "gemma-served")], aliases=["g"], max_output=64),
            model("base", [profile([engine_b.url], "base")], task="completion"),
            model("embed", [profile([engine_b.url], "embed")], task="embedding"),
            model("ranker", [profile([engine_b.url], "ranker-served")], task="rerank"),
        ]
    )
    write_plan(path, doc)
    keys = tmp / "keys.yaml"
    limited = "rpm: 1000, tpm: 100000"
    keys.write_text(
        "keys:\n"
        + "".join(
            f"  - {{name: {key.removeprefix('sk-')}, sha256: {key_digest(key)}, {limited}}}\n"
            for key in (RESPONSES, RESPONSES_STREAM, MESSAGES, MESSAGES_STREAM, COUNTING, OTHER)
        )
        + f"  - {{name: narrow, sha256: {key_digest(NARROW)}, models: [ranker], {limited}}}\n"
    )
    with gateway(path, LLMGW_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN) as gw:
        yield gw


def used(gw: Gateway, key: str) -> dict[str, int]:
    answer = httpx.get(
        f"{gw.url}/admin/keys/{key.removeprefix('sk-')}",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    last: dict[str, int] = answer.json()["last_minute"]
    return last


def charged(gw: Gateway, key: str, tokens: int, requests: int) -> None:
    """The key's last minute shows these requests and tokens (charged as each answer ends)."""
    wait_until(
        lambda: used(gw, key) == {"requests": requests, "tokens": tokens},
        10,
        f"{requests} requests and {tokens} tokens charged to {key}",
    )


def openai_client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)


def anthropic_client(gw: Gateway, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def engine_saw(engine: Engine) -> dict[str, Any]:
    last: dict[str, Any] = engine.stats()["last"]
    return last


# --- Responses -------------------------------------------------------------------------------


def test_responses_create_answers_under_the_clients_name_and_charges_its_usage(
    served: Gateway, engine_a: Engine
) -> None:
    answer = openai_client(served, RESPONSES).responses.create(model="g", input="hi", max_output_tokens=32)
    assert answer.model == "g", "the engine's served name reached the client"
    assert answer.output_text == "hello from a"
    assert answer.usage is not None and (answer.usage.input_tokens, answer.usage.output_tokens) == (3, 4)
    assert engine_saw(engine_a)["request"]["model"] == "gemma-served"
    charged(served, RESPONSES, tokens=7, requests=1)


def test_a_streamed_response_arrives_event_by_event_renamed_and_charged(served: Gateway) -> None:
    stream = openai_client(served, RESPONSES_STREAM).responses.create(model="g", input="hi", stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    wrapped = [e.response for e in events if hasattr(e, "response")]
    assert [r.model for r in wrapped] == ["g", "g", "g"], "an event named the engine's model"
    done = events[-1].response  # type: ignore[union-attr]
    assert done.output_text == "tok0 tok1 tok2 "
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (3, 3)
    charged(served, RESPONSES_STREAM, tokens=6, requests=1)

    def logged() -> dict[str, Any] | None:
        return next((r for r in served.access_lines() if r.get("key") == "responses-stream"), None)

    line = wait_until(logged, 10, "the stream's access log line")
    assert (line["path"], line["model"], line["status"]) == ("/v1/responses", "gemma", 200)


BARE = {"fake_bare_events": True}  # the engine writes Responses events as llama-server does


def test_the_stream_helper_reads_llama_servers_bare_events_to_a_final_response(served: Gateway) -> None:
    client = openai_client(served, OTHER)
    with client.responses.stream(model="g", input="hi", extra_body=BARE) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["tok0 ", "tok1 ", "tok2 "]
    assert final.output_text == "tok0 tok1 tok2 " and final.model == "g"


def test_bare_events_arrive_numbered_as_openais(served: Gateway) -> None:
    client = openai_client(served, OTHER)
    events = list(client.responses.create(model="g", input="hi", stream=True, extra_body=BARE))
    assert [e.sequence_number for e in events] == list(range(len(events))), "numbered from 0 in order"
    placed = [e for e in events if e.type.startswith(("response.output", "response.content_part"))]
    assert {(e.type, e.output_index) for e in placed} == {(e.type, 0) for e in placed}
    parts = [e for e in placed if hasattr(e, "content_index")]
    assert parts and all(e.content_index == 0 for e in parts)
    assert events[0].response.output == [] and events[0].response.model == "g"  # type: ignore[union-attr]


def test_each_api_without_a_limit_gets_the_models_max_output_in_its_own_field(
    served: Gateway, engine_a: Engine
) -> None:
    openai_client(served, OTHER).responses.create(model="g", input="hi")
    sent = engine_saw(engine_a)["request"]
    assert sent.get("max_output_tokens") == 64 and "max_tokens" not in sent, sent
    tokenized = httpx.post(
        served.url + "/v1/tokenize",
        json={"model": "g", "content": "hi"},
        headers={"Authorization": f"Bearer {OTHER}"},
        timeout=10,
    )
    assert tokenized.status_code == 200, tokenized.text
    counted = engine_saw(engine_a)["request"]
    assert "max_tokens" not in counted and "max_output_tokens" not in counted, "counting generates nothing"


def test_a_response_over_max_output_is_refused_before_the_engine(served: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(served, OTHER).responses.create(model="g", input="hi", max_output_tokens=65)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "max_tokens_exceeded"
    assert error["param"] == "max_output_tokens" and "64" in error["message"]


# --- Messages --------------------------------------------------------------------------------


def test_messages_create_answers_under_the_clients_name_and_charges_its_usage(served: Gateway) -> None:
    message = anthropic_client(served, MESSAGES).messages.create(
        model="g", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.model == "g"
    assert [block.text for block in message.content if block.type == "text"] == ["hello from a"]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 4)
    charged(served, MESSAGES, tokens=7, requests=1)


def test_a_streamed_message_arrives_event_by_event_renamed_and_charged(served: Gateway) -> None:
    client = anthropic_client(served, MESSAGES_STREAM)
    with client.messages.stream(
        model="g", max_tokens=32, system="be brief", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    raw = [e.type for e in events if e.type not in ("text",)]
    assert raw == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0].message.model == "g"  # type: ignore[union-attr]
    assert final.model == "g" and final.content[0].text == "tok0 tok1 tok2 "  # type: ignore[union-attr]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 3)
    charged(served, MESSAGES_STREAM, tokens=6, requests=1)


def test_a_response_stream_the_engine_breaks_off_ends_with_the_responses_apis_error_event(
    served: Gateway,
) -> None:
    stream = openai_client(served, OTHER).responses.create(
        model="g", input="hi", stream=True, extra_body={"fake_hangup_after": 2}
    )
    events = list(stream)
    assert events[-1].type == "error", [e.type for e in events]
    assert "broke the connection" in events[-1].message
    assert all(e.type != "error" for e in events[:-1])


def test_a_message_stream_the_engine_breaks_off_ends_with_an_error_event_in_anthropics_shape(
    served: Gateway,
) -> None:
    body = {"model": "g", "max_tokens": 8, "messages": [], "stream": True, "fake_hangup_after": 3}
    with httpx.stream(
        "POST", served.url + "/v1/messages", json=body, headers={"x-api-key": OTHER}, timeout=10
    ) as answer:
        text = answer.read().decode()
    assert answer.status_code == 200
    events = [e for e in text.split("\n\n") if e.strip()]
    assert [e.split("\n")[0] for e in events] == [
        "event: message_start",
        "event: content_block_start",
        "event: content_block_delta",
        "event: error",
    ]
    error = json.loads(events[-1].split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "broke the connection" in error["error"]["message"]


def test_count_tokens_counts_toward_rpm_but_not_tpm(served: Gateway, engine_a: Engine) -> None:
    client = anthropic_client(served, COUNTING)
    counted = client.messages.count_tokens(model="g", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 3
    tokens = httpx.post(
        served.url + "/v1/tokenize",
        json={"model": "g", "content": "hi"},
        headers={"Authorization": f"Bearer {COUNTING}"},
        timeout=10,
    )
    assert tokens.status_code == 200, tokens.text
    assert tokens.json() == {"tokens": [104, 105]}
    assert engine_saw(engine_a)["kind"] == "tokenize"
    charged(served, COUNTING, tokens=0, requests=2)


def test_a_message_for_a_model_the_key_may_not_use_is_403_in_anthropics_shape(served: Gateway) -> None:
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        anthropic_client(served, NARROW).messages.create(
            model="g", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "permission_error"
    assert "'narrow' may not use 'gemma'" in body["error"]["message"]


def test_a_message_for_an_unknown_model_is_404_in_anthropics_shape(served: Gateway) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        anthropic_client(served, OTHER).messages.create(
            model="gemmma", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    body = caught.value.body
    assert body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": body["error"]["message"]},
    }
    assert "did you mean 'gemma'?" in body["error"]["message"]


def test_messages_without_a_key_are_401_in_anthropics_shape_and_name_x_api_key(served: Gateway) -> None:
    answer = httpx.post(served.url + "/v1/messages", json={"model": "g"}, timeout=10)
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in answer.json()["error"]["message"]


def test_a_message_over_max_output_is_400_in_anthropics_shape(served: Gateway) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(served, OTHER).messages.create(
            model="g", max_tokens=65, messages=[{"role": "user", "content": "hi"}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"


# --- rerank and the wrong endpoint -----------------------------------------------------------


def test_rerank_passes_llama_servers_body_and_answer_renamed(served: Gateway, engine_b: Engine) -> None:
    answer = httpx.post(
        served.url + "/v1/rerank",
        json={
            "model": "ranker",
            "query": "what is a panda?",
            "documents": ["hi", "a bear", "it is"],
            "top_n": 2,
        },
        headers={"x-api-key": NARROW},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "ranker"
    assert [r["index"] for r in body["results"]] == [0, 1]
    assert all(isinstance(r["relevance_score"], float) for r in body["results"])
    seen = engine_saw(engine_b)
    assert (seen["kind"], seen["request"]["model"]) == ("rerank", "ranker-served")


def test_a_chat_model_is_refused_on_rerank_and_a_reranker_on_chat(served: Gateway) -> None:
    headers = {"Authorization": f"Bearer {OTHER}"}
    wrong = httpx.post(
        served.url + "/v1/rerank",
        json={"model": "g", "query": "q", "documents": ["d"]},
        headers=headers,
        timeout=10,
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "wrong_endpoint"
    assert "/v1/responses" in wrong.json()["error"]["message"]
    ranker = httpx.post(
        served.url + "/v1/messages",
        json={"model": "ranker", "max_tokens": 8, "messages": []},
        headers={"x-api-key": NARROW},
        timeout=10,
    )
    assert ranker.status_code == 400
    assert ranker.json()["error"]["type"] == "invalid_request_error"
    assert "POST /v1/rerank" in ranker.json()["error"]["message"]


def test_models_say_which_endpoints_each_model_answers(served: Gateway) -> None:
    listed = httpx.get(served.url + "/v1/models", headers={"x-api-key": OTHER}, timeout=10).json()
    endpoints = {m["id"]: m["endpoints"] for m in listed["data"]}
    assert endpoints == {
        "gemma": [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/tokenize",
        ],
        "base": ["/v1/completions", "/v1/tokenize"],
        "embed": ["/v1/embeddings"],
        "ranker": ["/v1/rerank"],
    }
