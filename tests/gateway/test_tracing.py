"""Traces by the OpenTelemetry GenAI conventions, from the real gunicorn gateway to an OTLP/HTTP
receiver in the test: one span per request named `{operation} {model}`, its attributes, the
client's trace continued and carried on to the engine, and a dead collector costing nothing."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import (
    ROOT,
    Engine,
    Gateway,
    dead_endpoint,
    gateway,
    key_digest,
    model,
    plan,
    profile,
    write_plan,
)
from otlp_receiver import Receiver, Span, otlp_receiver

KEY, SLOW_KEY = "sk-trace-team", "sk-trace-once"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


def _plan(tmp: Path, engine_a: Engine, engine_b: Engine, engine_failing: Engine) -> Path:
    path = tmp / "plan.json"
    write_plan(
        path,
        plan(
            [
                model("gemma", [profile([engine_a.url], "gemma-served")], aliases=["g"]),
                model("base", [profile([engine_b.url], "base")], task="completion"),
                model("embed", [profile([engine_b.url], "embed")], task="embedding"),
                model("broken", [profile([engine_failing.url], "broken")]),
            ]
        ),
    )
    keys = tmp / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: team, sha256: {key_digest(KEY)}}}\n"
        f"  - {{name: once, sha256: {key_digest(SLOW_KEY)}, rpm: 1}}\n"
    )
    return path


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
    receiver: Receiver,
    engine_a: Engine,
    engine_b: Engine,
    engine_failing: Engine,
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("tracing")
    path = _plan(tmp, engine_a, engine_b, engine_failing)
    with gateway(
        path,
        LLMGW_KEYS_FILE=str(tmp / "keys.yaml"),
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    ) as gw:
        yield gw


def post(gw: Gateway, path: str, body: dict[str, object], key: str = KEY) -> tuple[httpx.Response, str, str]:
    """POST with a traceparent of a fresh trace: its trace and parent span ids, to find the span."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    answer = httpx.post(
        gw.url + path,
        json=body,
        headers={"Authorization": f"Bearer {key}", "traceparent": f"00-{trace_id}-{parent}-01"},
        timeout=30,
    )
    return answer, trace_id, parent


def span_of(receiver: Receiver, trace_id: str) -> Span:
    [span] = receiver.wait_for(lambda s: s.trace_id == trace_id and not s.name.startswith("wait "))
    return span


def test_a_chat_is_one_span_with_the_conventions_attributes_in_the_clients_trace(
    traced: Gateway, receiver: Receiver, engine_a: Engine
) -> None:
    body = {
        "model": "g",
        "messages": [{"role": "user", "content": "secret prompt"}],
        "max_tokens": 10,
        "temperature": 0.5,
        "top_p": 0.9,
    }
    answer, trace_id, parent = post(traced, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    span = span_of(receiver, trace_id)
    assert span.name == "chat g", "named {operation} {model as sent}"
    assert span.parent_span_id == parent, "the client's trace is continued"
    usage = answer.json()["usage"]
    assert span.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "g",
        "gen_ai.request.max_tokens": 10,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.response.model": "gemma",
        "gen_ai.response.id": answer.json()["id"],
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "server.address": "127.0.0.2",
        "server.port": int(engine_a.url.rsplit(":", 1)[1]),
        "llmgw.key": "team",
        "http.response.status_code": 200,
    }
    assert span.resource["service.name"] == "llmgw"
    assert "secret prompt" not in json.dumps(span.attributes), "content only when asked for"
    assert KEY not in json.dumps(span.attributes)
    # The engine's request carries the trace on, with the gateway's span as its parent.
    carried = [t for t in engine_a.stats()["traceparents"] if t.split("-")[1] == trace_id]
    assert carried == [f"00-{trace_id}-{span.span_id}-01"]


def test_a_streams_span_carries_its_final_usage(traced: Gateway, receiver: Receiver) -> None:
    body = {
        "model": "gemma",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    answer, trace_id, _ = post(traced, "/v1/chat/completions", body)
    assert answer.status_code == 200
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
    span = span_of(receiver, trace_id)
    assert span.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/v1/completions", {"model": "base", "prompt": "once upon"}, "text_completion base"),
        ("/v1/embeddings", {"model": "embed", "input": "a"}, "embeddings embed"),
        ("/v1/messages", {"model": "gemma", "max_tokens": 5, "messages": []}, "chat gemma"),
        ("/v1/responses", {"model": "gemma", "input": "hi"}, "chat gemma"),
    ],
)
def test_each_api_is_named_by_its_operation(
    traced: Gateway, receiver: Receiver, path: str, body: dict[str, object], name: str
) -> None:
    answer, trace_id, _ = post(traced, path, body)
    assert answer.status_code == 200, answer.text
    span = span_of(receiver, trace_id)
    assert span.name == name
    assert span.attributes["gen_ai.operation.name"] == name.split()[0]


def test_failures_carry_error_type(traced: Gateway, receiver: Receiver) -> None:
    answer, trace_id, _ = post(traced, "/v1/chat/completions", {"model": "broken", "messages": []})
    assert answer.status_code == 500
    assert span_of(receiver, trace_id).attributes["error.type"] == "500"
    statuses = []
    for _ in range(3):
        body = {"model": "gemma", "messages": []}
        answer, trace_id, _ = post(traced, "/v1/chat/completions", body, SLOW_KEY)
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            break
    assert statuses[-1] == 429, statuses
    span = span_of(receiver, trace_id)
    assert span.attributes["error.type"] == "429" and span.attributes["llmgw.key"] == "once"


def test_messages_are_recorded_only_when_asked_for(
    tmp_path: Path, receiver: Receiver, engine_a: Engine, engine_b: Engine, engine_failing: Engine
) -> None:
    path = _plan(tmp_path, engine_a, engine_b, engine_failing)
    with gateway(
        path,
        workers=1,
        LLMGW_KEYS_FILE=str(tmp_path / "keys.yaml"),
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url + "/v1/traces",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_SERVICE_NAME="edge-gateway",
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
    ) as gw:
        body = {"model": "gemma", "messages": [{"role": "user", "content": "the words asked"}]}
        answer, trace_id, _ = post(gw, "/v1/chat/completions", body)
        assert answer.status_code == 200
        span = span_of(receiver, trace_id)
    assert "the words asked" in span.attributes["gen_ai.input.messages"]
    assert answer.json()["choices"][0]["message"]["content"] in span.attributes["gen_ai.output.messages"]
    assert span.resource["service.name"] == "edge-gateway"


def test_a_dead_collector_fails_no_request_and_counts_what_it_lost(
    tmp_path: Path, engine_a: Engine, engine_b: Engine, engine_failing: Engine
) -> None:
    path = _plan(tmp_path, engine_a, engine_b, engine_failing)
    with gateway(
        path,
        workers=1,
        LLMGW_KEYS_FILE=str(tmp_path / "keys.yaml"),
        OTEL_EXPORTER_OTLP_ENDPOINT=dead_endpoint(),
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
    ) as gw:
        started = time.monotonic()
        for _ in range(20):
            answer, _, _ = post(gw, "/v1/chat/completions", {"model": "gemma", "messages": []})
            assert answer.status_code == 200, answer.text
        assert time.monotonic() - started < 15, "requests waited on the collector"

        def lost() -> float:
            text = httpx.get(gw.url + "/metrics", timeout=10).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("llmgw_trace_spans_dropped_total{")
            )

        deadline = time.monotonic() + 30
        while lost() == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert lost() > 0, "spans the collector never took are counted"


def test_without_otel_variables_the_sdk_is_never_imported() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys\n"
        "OURS = ('opentelemetry.sdk.trace', 'opentelemetry.exporter', 'opentelemetry.propagate')\n"
        "from llmgw.gateway.state import tracing\n"
        "tracing.begin('chat', 'm', {}, {}, None)\n"
        "tracing.served_by('http://127.0.0.1:1', 'm')\n"
        "tracing.end(200)\n"
        "assert tracing.propagation() == []\n"
        # Not opentelemetry.sdk as a whole: redis-py imports its metrics part when installed.
        "print(sorted(m for m in sys.modules if m.startswith(OURS)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_what_a_client_sends_is_cut_short_in_spans(traced: Gateway, receiver: Receiver) -> None:
    """A 200 KB model name made a 200 KB span name, and 100,000 stop sequences a 500 KB span:
    with a collector that never answered, 300 such requests grew a worker by 430 MB."""
    answer, trace_id, _ = post(traced, "/v1/chat/completions", {"model": "m" * 200_000, "messages": []})
    assert answer.status_code == 404
    span = span_of(receiver, trace_id)
    assert len(span.name) < 400 and len(str(span.attributes["gen_ai.request.model"])) < 400
    answer, trace_id, _ = post(
        traced,
        "/v1/chat/completions",
        {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "stop": ["x"] * 100_000},
    )
    stops = span_of(receiver, trace_id).attributes.get("gen_ai.request.stop_sequences")
    assert stops is not None and len(stops) <= 16, len(stops or [])
