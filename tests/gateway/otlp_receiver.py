"""An OTLP/HTTP trace receiver on loopback, as a collector would be: POST /v1/traces with an
ExportTraceServiceRequest in protobuf, decoded here into plain spans a test can read."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.conftest import serve_on_loopback


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, raw: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(raw)
        found = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.kind,
                            _attributes(s.attributes),
                            [(e.name, _attributes(e.attributes)) for e in s.events],
                            resource,
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def wait_for(self, check: Any, timeout: float = 30) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if check(s)]
            if found:
                return found
            time.sleep(0.1)
        with self.lock:
            names = [s.name for s in self.spans]
        raise AssertionError(f"no span as wanted within {timeout} s; received: {names}")


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            if self.path == "/v1/traces":
                receiver.take(raw)
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serve_on_loopback(Handler) as receiver.url:
        yield receiver
