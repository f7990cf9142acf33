"""OpenTelemetry traces of /v1 requests, by the GenAI semantic conventions, when asked for.

Configured only by the standard variables: OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns it on; OTEL_SERVICE_NAME (default `llmgw`),
OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER and OTEL_BSP_* are
read by the SDK as usual; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off.
Unset, no SDK is imported and every hook below is one global read: tracing costs nothing.

One span per request, `{operation} {model}` (`chat gemma`), started when the body is read
(`begin`) and ended with the access log line (`end`), so a stream's span lasts as long as
the stream and carries its final usage. The request path calls the hooks; the span is this
request's own (a context variable: each request runs in its own task), so no layer passes it.

A collector that is slow or down costs no request anything: spans go to a bounded queue
that a thread empties in batches; when it is full they are dropped and counted in
`llmgw_trace_spans_dropped`, as are spans an export failed to deliver.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from llmgw.gateway.api import APIS

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("llmgw.gateway")

# Request fields → the conventions' attributes, recorded when the client sent them.
_PARAMETERS = {
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",  # the Responses API's name
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
}
# The most a captured prompt or answer may add to a span: a span is held in memory until sent.
CONTENT_LIMIT = 16 * 1024

_span: ContextVar[Span | None] = ContextVar("llmgw_span", default=None)


class _Tracing:
    def __init__(self, tracer: Tracer, capture: bool) -> None:
        self.tracer = tracer
        self.capture = capture


# None: not looked at yet; False: off. Set up once per worker, at its first request, so the
# exporter's thread is the worker's own and never a forked copy of the master's.
_state: _Tracing | bool | None = None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _tracing() -> _Tracing | None:
    global _state
    if _state is None:
        _state = _set_up() if wanted() else False
    return _state if isinstance(_state, _Tracing) else None


def _set_up() -> _Tracing | bool:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError as exc:
        log.error(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK is not installed (%s); "
            "install llmgw[otel] for traces. Serving without them.",
            exc,
        )
        return False
    # The SDK reads the endpoint, headers, timeout, sampler and queue sizes from OTEL_*.
    name = os.environ.get("OTEL_SERVICE_NAME") or "llmgw"
    # Every attribute bounded, not only the queue's length: a 200 KB model name made a 200 KB
    # span, and with a collector that never answered, 300 of them grew a worker by 430 MB.
    limit = int(os.environ.get("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") or ATTRIBUTE_LIMIT)
    provider = TracerProvider(
        resource=Resource.create({"service.name": name}),
        span_limits=SpanLimits(max_attribute_length=limit),
    )
    exporter = cast(SpanExporter, _CountedExporter(OTLPSpanExporter()))
    provider.add_span_processor(cast(SpanProcessor, _Counted(BatchSpanProcessor(exporter))))
    capture = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() == "true"
    # Its own provider, not the global one: the gateway's spans go where OTEL_* says, whatever
    # else in the process may set up.
    return _Tracing(provider.get_tracer("llmgw"), capture)


def _dropped(reason: str, count: int) -> None:
    from llmgw.gateway.state import metrics

    metrics.labelled(metrics.SPANS_DROPPED, reason).inc(count)


class _CountedExporter:
    """The OTLP exporter, counting the spans of each batch it failed to deliver."""

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.exporter.export(spans)
        if result != SpanExportResult.SUCCESS:
            _dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.exporter.force_flush(timeout_millis))


class _Counted:
    """The batch processor, counting the spans its full queue drops (a slow collector)."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        inner = getattr(processor, "_batch_processor", None)
        self.queue = getattr(inner, "_queue", None)  # a bounded deque, in the SDKs this was written for

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: Any) -> None:
        queue = self.queue
        if queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
            _dropped("queue_full", 1)
        self.processor.on_end(span)

    def _on_ending(self, span: Any) -> None:
        on_ending = getattr(self.processor, "_on_ending", None)
        if on_ending is not None:
            on_ending(span)

    def shutdown(self) -> None:
        self.processor.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.processor.force_flush(timeout_millis))


# What a client sends that a span repeats (a model name, stop sequences) is cut to this, and
# a list to MAX_LIST items; any attribute, captured content included, to ATTRIBUTE_LIMIT
# characters (OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT overrides it).
NAME_CHARS = 256
MAX_LIST = 16
ATTRIBUTE_LIMIT = 16384


def _short(text: str) -> str:
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS] + "…"


def begin(
    kind: str, requested: str, request: Mapping[str, Any], headers: Mapping[str, str], key: str | None
) -> None:
    """Start this request's span, continuing the client's trace when it sent a traceparent."""
    tracing = _tracing()
    if tracing is None:
        return
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    operation = APIS[kind].trace_operation if kind in APIS else kind
    requested = _short(requested)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": requested,
    }
    for field, name in _PARAMETERS.items():
        value = request.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attributes[name] = value
    stop = request.get("stop")
    if isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        stops = [stop] if isinstance(stop, str) else stop
        attributes["gen_ai.request.stop_sequences"] = [_short(s) for s in stops[:MAX_LIST]]
    if key is not None:
        attributes["llmgw.key"] = key  # the key's name from keys.yaml, never the key
    if tracing.capture:
        said = request.get("messages", request.get("input", request.get("prompt")))
        attributes["gen_ai.input.messages"] = _content(said)
    span = tracing.tracer.start_span(
        f"{operation} {requested}", context=extract(headers), kind=SpanKind.SERVER, attributes=attributes
    )
    _span.set(span)


def propagation() -> list[tuple[bytes, bytes]]:
    """The headers that carry the trace on to the engine, with this request's span as parent."""
    span = _span.get()
    if span is None:
        return []
    from opentelemetry.propagate import inject
    from opentelemetry.trace import set_span_in_context

    carrier: dict[str, str] = {}
    inject(carrier, context=set_span_in_context(span))
    return [(k.encode(), v.encode()) for k, v in carrier.items()]


def served_by(endpoint: str, model: str) -> None:
    """The replica that answered, as the conventions' server.address and server.port."""
    span = _span.get()
    if span is None:
        return
    where = urlsplit(endpoint)
    span.set_attribute("gen_ai.response.model", model)
    if where.hostname:
        span.set_attribute("server.address", where.hostname)
    if where.port:
        span.set_attribute("server.port", where.port)


def retried(endpoint: str, why: str) -> None:
    """Another replica is asked, because the last one did not answer."""
    span = _span.get()
    if span is not None:
        span.add_event("llmgw.retry", {"llmgw.replica": endpoint, "llmgw.retry.reason": why})


@contextmanager
def waiting(what: str, endpoint: str) -> Iterator[None]:
    """A child span for time the request spends waiting (an engine to load, a slot)."""
    span = _span.get()
    tracing = _tracing() if span is not None else None
    if span is None or tracing is None:
        yield
        return
    from opentelemetry.trace import set_span_in_context

    child = tracing.tracer.start_span(
        f"wait {what}", context=set_span_in_context(span), attributes={"llmgw.replica": endpoint}
    )
    try:
        yield
    except BaseException as exc:
        child.set_attribute("error.type", type(exc).__name__)
        raise
    finally:
        child.end()


def usage(prompt: int, completion: int | None) -> None:
    """The token counts the answer carried (for a stream, its final usage)."""
    span = _span.get()
    if span is None:
        return
    span.set_attribute("gen_ai.usage.input_tokens", prompt)
    if completion is not None:
        span.set_attribute("gen_ai.usage.output_tokens", completion)


def answer(parsed: Any) -> None:
    """A whole answer's identity and, when content is captured, what it said."""
    span = _span.get()
    if span is None or not isinstance(parsed, dict):
        return
    if isinstance(parsed.get("id"), str):
        span.set_attribute("gen_ai.response.id", parsed["id"])
    tracing = _tracing()
    if tracing is not None and tracing.capture:
        said = parsed.get("choices", parsed.get("output", parsed.get("content")))
        span.set_attribute("gen_ai.output.messages", _content(said))


def end(status: int, error: str | None = None) -> None:
    """End this request's span with the status the client got."""
    span = _span.get()
    if span is None:
        return
    _span.set(None)
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        span.set_attribute("error.type", error or str(status))
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR))
    span.end(time.time_ns())


def _content(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…"
