"""A small, fast stand-in for llama.cpp or vLLM that speaks enough of the OpenAI API, and
of the other APIs llama-server answers: Responses, Anthropic's Messages (and count_tokens),
rerank and /tokenize, in the shapes llama-server gives them.

Run as a subprocess: `python -m tests.gateway.fake_engine --host 127.0.0.2 --port 0 --name a`
prints `LISTENING host:port` once it accepts connections. The gateway tests and
bench/gateway.py both use it, so it is written on raw asyncio + httptools: a
framework here would make the "direct" figures of the bench measure the framework.

Each answer carries `system_fingerprint: <name>` and echoes the model it was sent, so a
test can tell which replica served it and under which name. A request can ask for
misbehaviour through body fields the gateway passes through untouched:

    fake_status       answer with this HTTP status and an OpenAI-shaped error
    fake_error        the error body to send with fake_status instead (an engine's own shape)
    fake_delay_first  seconds to wait before the response headers
    fake_delay_body   seconds between a stream's headers and its first chunk (vLLM sends
                      its headers before the prompt is processed)
    fake_chunks       number of streamed chunks (default 3)
    fake_chunk_delay  seconds between streamed chunks (or Responses and Messages events)
    fake_chunk_bytes  pad each streamed chunk's text to about this many bytes
    fake_hangup_after close the connection after this many streamed chunks (0: right
                      after the headers)
    fake_only         misbehave only on the engine of this name; others answer normally
    fake_content_type the Content-Type of a non-streamed answer (default application/json)
    fake_body_bytes   pad a non-streamed answer to about this many bytes
    fake_logprobs_bytes  give a non-streamed chat answer's choice logprobs of about this many
                      bytes, written before its usage (as top_logprobs make an answer huge)
    fake_nest         add a field to a non-streamed answer nested this many arrays deep
    fake_chunked      send a non-streamed answer chunked, without a Content-Length
    fake_never_close  send a non-streamed answer chunked and never end it
    fake_reset        reset the connection (TCP RST) right after the response headers
    fake_broken_sse   end a stream in the middle of an event, after one whole event
    stream_options    {"include_usage": true} ends a stream with a usage-only event, as
                      vLLM does (prompt 3 tokens, completion one per chunk)
    fake_linger       seconds between a stream's [DONE] event and the end of its body
    fake_model        the model an answer names, as a llama-server without --alias names
                      its weights file (default: the model it was sent)
    fake_bare_events  write a Responses stream as llama-server does: no sequence_number,
                      output_index or content_index, and a response.created without output

A stream waits for room in the socket before each event, as the servers real engines run
on do (uvicorn for vLLM, cpp-httplib's blocking writes for llama.cpp): a gateway that
stops reading holds the engine back, and `streamed_bytes` shows how far it got.

GET /fake/stats reports requests seen, streams whose client went away, models and
`max_tokens` seen, and the bytes of stream events written.
POST /fake/health with {"status": 503} changes what GET /health answers from then on.

Slots, as llama-server's `--parallel N`: started with `--parallel N --service-time S`, the
engine works on at most N API requests at once, each for S seconds (a request's own
`fake_service` overrides S), and queues the rest first come, first served. A request whose
client leaves gives its slot up, as llama-server cancels the task of a closed connection.
Stats then add `in_flight` (received, not yet answered: what the gateway sent it at once),
`max_in_flight`, and `served`: each request's `fake_tag` (the caller's label, "-" if none) in
the order work began on it. POST /fake/reset starts `max_in_flight` and `served` afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
from collections import deque
from typing import Any

import httptools

_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


class Engine:
    """State shared by every connection of one fake engine."""

    def __init__(
        self,
        name: str,
        health_status: int,
        fail_status: int | None,
        slots: int | None = None,
        service_s: float = 0.0,
    ) -> None:
        self.name = name
        self.health_status = health_status
        self.fail_status = fail_status
        # As llama-server's --api-key: /v1 answers only a request that carries it (/health
        # stays open). None: anyone who reaches the port.
        self.api_key: str | None = None
        self.refused = 0  # requests answered 401 for a missing or wrong key
        self.requests = 0
        self.disconnects = 0
        self.open = 0  # connections open now: what a test checks the gateway did not leak
        # Delayed or streamed answers still running. One whose client left is counted in
        # `disconnects` only when it next tries to write, which may be seconds later.
        self.answering = 0
        self.models_seen: list[str] = []
        self.max_tokens_seen: list[Any] = []
        self.streamed_bytes = 0
        self.last: dict[str, Any] | None = None  # the last API request, as it arrived
        self.traceparents: list[str] = []  # W3C trace context the requests carried
        self.slots = slots
        self.service_s = service_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.working = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.served: list[str] = []

    def arrived(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def reset(self) -> None:
        self.max_in_flight = self.in_flight
        self.served = []

    async def work(self, tag: str, seconds: float, gone: asyncio.Event) -> None:
        """Take a slot (waiting in arrival order for one), work `seconds` unless the client
        leaves first, and hand the slot to the next in line."""
        assert self.slots is not None
        if self.working < self.slots:
            self.working += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.append(turn)
            await turn  # the slot is handed over: `working` stays as it was
        try:
            if gone.is_set():
                return
            self.served.append(tag)
            try:
                await asyncio.wait_for(gone.wait(), seconds)
            except TimeoutError:
                pass
        finally:
            if self.waiting:
                self.waiting.popleft().set_result(None)
            else:
                self.working -= 1

    def stats(self) -> dict[str, Any]:
        return {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "served": self.served,
            "last": self.last,
            "name": self.name,
            "requests": self.requests,
            "disconnects": self.disconnects,
            "open": self.open,
            "answering": self.answering,
            "streamed_bytes": self.streamed_bytes,
            "models_seen": self.models_seen[-50:],
            "refused": self.refused,
            "max_tokens_seen": self.max_tokens_seen[-50:],
            "traceparents": self.traceparents[-50:],
        }


class _Connection(asyncio.Protocol):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.closed = False
        self.queue: list[tuple[str, bytes, bytes]] = []
        self.busy = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.gone = asyncio.Event()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.engine.open += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.gone.set()
        self.engine.open -= 1
        self.writable.set()  # a stream waiting for room learns the reader has gone

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _reset(self) -> None:
        # SO_LINGER 0 makes close() send a RST instead of a FIN: the peer sees
        # "connection reset", as when an engine process is killed mid-answer.
        assert self.transport is not None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.authorization = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"traceparent":
            self.engine.traceparents.append(value.decode())
        elif name.lower() == b"authorization":
            self.authorization = value

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        key = self.engine.api_key
        wrong = key is not None and self.authorization != b"Bearer " + key.encode()
        if wrong and self.url.startswith(b"/v1/"):
            self.engine.refused += 1
            self.url = b"/fake/unauthorized"
        self.queue.append((method, self.url, b"".join(self.body)))
        if not self.busy:
            self._drain()

    def _drain(self) -> None:
        # Fast path: plain answers are written synchronously, so the fake costs next to
        # nothing per request; only slow or streamed answers become tasks.
        while self.queue and not self.busy:
            method, url, body = self.queue.pop(0)
            slow = self._answer_now(method, url, body)
            if slow is not None:
                self.busy = True
                asyncio.get_running_loop().create_task(self._answer_later(slow))

    def _write(self, status: int, payload: bytes, content_type: bytes = b"application/json") -> None:
        assert self.transport is not None
        if self.closed:
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            status,
            _REASONS.get(status, b"Status"),
            content_type,
            len(payload),
        )
        self.transport.write(head + payload)

    def _answer_now(self, method: str, url: bytes, body: bytes) -> dict[str, Any] | None:
        path = url.split(b"?", 1)[0]
        engine = self.engine
        if method == "GET" and path == b"/health":
            self._write(
                engine.health_status,
                b'{"status":"ok"}'
                if engine.health_status == 200
                else b'{"error":{"message":"Loading model","code":503}}',
            )
            return None
        if path == b"/fake/unauthorized":
            self._write(401, b'{"error":{"message":"Invalid API Key","type":"authentication_error"}}')
            return None
        if method == "GET" and path == b"/fake/stats":
            self._write(200, json.dumps(engine.stats()).encode())
            return None
        if method == "POST" and path == b"/fake/reset":
            engine.reset()
            self._write(200, b"{}")
            return None
        if method == "POST" and path == b"/fake/health":
            engine.health_status = int(json.loads(body)["status"])
            self._write(200, b"{}")
            return None
        if method != "POST" or path not in _KINDS:
            self._write(404, b'{"error":{"message":"no such route","type":"not_found"}}')
            return None
        engine.requests += 1
        try:
            request = json.loads(body)
        except ValueError:
            self._write(400, b'{"error":{"message":"body is not JSON","type":"invalid_request_error"}}')
            return None
        model = str(request.get("model"))
        engine.models_seen.append(model)
        engine.max_tokens_seen.append(request.get("max_tokens"))
        if request.get("fake_only") not in (None, engine.name):
            request = {k: v for k, v in request.items() if not k.startswith("fake_")}
        status = request.get("fake_status") or engine.fail_status
        if status:
            error = request.get("fake_error") or {
                "error": {
                    "message": f"fake engine {engine.name} told to fail",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
            self._write(int(status), json.dumps(error).encode())
            return None
        kind = _KINDS[path]
        model = str(request.get("fake_model") or model)
        engine.last = {"kind": kind, "request": request}
        if engine.slots is not None:
            engine.arrived()
            return {"kind": kind, "model": model, "request": request, "slot": True}
        if request.get("stream") or request.get("fake_delay_first") or request.get("fake_delay_body"):
            return {"kind": kind, "model": model, "request": request}
        content_type = str(request.get("fake_content_type") or "application/json").encode()
        payload = _complete(kind, model, engine.name, request)
        if request.get("fake_body_bytes"):
            pad = max(0, int(request["fake_body_bytes"]) - len(payload) - 16)
            payload = payload[:-1] + b',"padding":"' + b"x" * pad + b'"}'
        if request.get("fake_nest"):
            depth = int(request["fake_nest"])
            payload = payload[:-1] + b',"nested":' + b"[" * depth + b"]" * depth + b"}"
        if request.get("fake_reset"):
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % len(payload)
            )
            self._reset()
            return None
        if request.get("fake_chunked") or request.get("fake_never_close"):
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for i in range(0, len(payload), 65536):
                part = payload[i : i + 65536]
                self.transport.write(b"%x\r\n%s\r\n" % (len(part), part))
            if request.get("fake_never_close"):
                self.busy = True  # nothing more on this connection: the answer never ends
                return None
            self.transport.write(b"0\r\n\r\n")
            return None
        self._write(200, payload, content_type)
        return None

    async def _answer_later(self, job: dict[str, Any]) -> None:
        self.engine.answering += 1
        try:
            request = job["request"]
            if job.get("slot"):
                seconds = float(request.get("fake_service") or self.engine.service_s)
                await self.engine.work(str(request.get("fake_tag") or "-"), seconds, self.gone)
            delay = float(request.get("fake_delay_first") or 0)
            if delay:
                await asyncio.sleep(delay)
            if not request.get("stream"):
                self._write(200, _complete(job["kind"], job["model"], self.engine.name, request))
                return
            await self._stream(job["kind"], job["model"], request)
        finally:
            self.engine.answering -= 1
            if job.get("slot"):
                self.engine.in_flight -= 1
            self.busy = False
            if not self.closed:
                self._drain()

    async def _stream(self, kind: str, model: str, request: dict[str, Any]) -> None:
        assert self.transport is not None
        if self.closed:
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        if request.get("fake_reset"):
            self._reset()
            return
        if request.get("fake_broken_sse"):
            whole = b"data: " + json.dumps(_chunk(kind, model, self.engine.name, 0)).encode() + b"\n\n"
            torn = b'data: {"id": "cmpl-fake", "choices": [{"delta'
            for part in (whole, torn):
                self.transport.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.transport.write(b"0\r\n\r\n")
            return
        if request.get("fake_delay_body"):
            await asyncio.sleep(float(request["fake_delay_body"]))
        if kind in _EVENTS:
            hangup = request.get("fake_hangup_after")
            events = _bare_response_events if request.get("fake_bare_events") else _EVENTS[kind]
            pause = float(request.get("fake_chunk_delay") or 0)
            for i, (name, data) in enumerate(events(model, int(request.get("fake_chunks") or 3))):
                if i and pause:
                    await asyncio.sleep(pause)
                await self.writable.wait()
                if self.closed:
                    self.engine.disconnects += 1
                    return
                if hangup is not None and i == int(hangup):
                    self.transport.close()
                    return
                event = b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps(data).encode())
                self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.engine.streamed_bytes += len(event)
            self.transport.write(b"0\r\n\r\n")
            return
        chunks = int(request.get("fake_chunks") or 3)
        pause = float(request.get("fake_chunk_delay") or 0)
        hangup = request.get("fake_hangup_after")
        padding = "x" * int(request.get("fake_chunk_bytes") or 0)
        for i in range(chunks):
            if i and pause:
                await asyncio.sleep(pause)
            await self.writable.wait()
            if self.closed:
                self.engine.disconnects += 1
                return
            if hangup is not None and i == int(hangup):
                self.transport.close()
                return
            data = _chunk(kind, model, self.engine.name, i, padding)
            event = b"data: " + json.dumps(data).encode() + b"\n\n"
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.engine.streamed_bytes += len(event)
        options = request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            # As vLLM does: one last event, with no choices, carrying the usage.
            usage = {"prompt_tokens": 3, "completion_tokens": chunks, "total_tokens": 3 + chunks}
            data = {**_chunk(kind, model, self.engine.name, 0), "choices": [], "usage": usage}
            event = b"data: " + json.dumps(data).encode() + b"\n\n"
            self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        done = b"data: [DONE]\n\n"
        linger = float(request.get("fake_linger") or 0)
        if linger:
            # The last event, then the body's end a while later: a client that closes on
            # [DONE] leaves before the engine's stream has ended.
            self.transport.write(b"%x\r\n%s\r\n" % (len(done), done))
            await asyncio.sleep(linger)
            if not self.closed:
                self.transport.write(b"0\r\n\r\n")
            return
        self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


_KINDS = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completion",
    b"/v1/embeddings": "embedding",
    b"/v1/responses": "responses",
    b"/v1/messages": "messages",
    b"/v1/messages/count_tokens": "count_tokens",
    b"/v1/rerank": "rerank",
    b"/tokenize": "tokenize",
}


def _response(model: str, text: str, status: str, output_tokens: int) -> dict[str, Any]:
    """A Responses API response object, as llama-server writes one."""
    output = []
    if text:
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant"}
        output.append({**item, "content": [part]})
    return {
        "id": "resp_fake",
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": 3,
            "output_tokens": output_tokens,
            "total_tokens": 3 + output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _message(model: str, text: str, output_tokens: int) -> dict[str, Any]:
    """An Anthropic Messages API message, as llama-server writes one."""
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": "end_turn" if text else None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": output_tokens},
    }


def _response_events(model: str, chunks: int) -> list[tuple[str, dict[str, Any]]]:
    text = "".join(f"tok{i} " for i in range(chunks))
    item = {"type": "message", "id": "msg_fake", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": _response(model, "", "in_progress", 0)}),
        ("response.in_progress", {"response": _response(model, "", "in_progress", 0)}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        (
            "response.content_part.added",
            {"item_id": "msg_fake", "output_index": 0, "content_index": 0, "part": part},
        ),
    ]
    for i in range(chunks):
        delta = {"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": f"tok{i} "}
        events.append(("response.output_text.delta", delta))
    where = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
    done = {**part, "text": text}
    events += [
        ("response.output_text.done", {**where, "text": text}),
        ("response.content_part.done", {**where, "part": done}),
        (
            "response.output_item.done",
            {"output_index": 0, "item": {**item, "status": "completed", "content": [done]}},
        ),
        ("response.completed", {"response": _response(model, text, "completed", chunks)}),
    ]
    return [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(events)]


def _message_events(model: str, chunks: int) -> list[tuple[str, dict[str, Any]]]:
    start = {**_message(model, "", 1), "content": []}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": start}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    for i in range(chunks):
        events.append(
            ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}})
        )
    events += [
        ("content_block_stop", {"index": 0}),
        (
            "message_delta",
            {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": chunks}},
        ),
        ("message_stop", {}),
    ]
    return [(name, {"type": name, **data}) for name, data in events]


def _bare_response_events(model: str, chunks: int) -> list[tuple[str, dict[str, Any]]]:
    """A Responses stream exactly as llama-server writes it (tools/server/server-task.cpp):
    the lifecycle's response holds only id, object and status, and no event says where it
    belongs in the output but by `item_id`."""
    text = "".join(f"tok{i} " for i in range(chunks))
    early = {"id": "resp_fake", "object": "response", "status": "in_progress"}
    item = {"content": [], "id": "msg_fake", "role": "assistant", "status": "in_progress", "type": "message"}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": early}),
        ("response.in_progress", {"response": early}),
        ("response.output_item.added", {"item": item}),
        ("response.content_part.added", {"item_id": "msg_fake", "part": {"type": "output_text", "text": ""}}),
    ]
    for i in range(chunks):
        events.append(("response.output_text.delta", {"item_id": "msg_fake", "delta": f"tok{i} "}))
    done = {**item, "status": "completed", "content": [part]}
    events += [
        ("response.output_text.done", {"item_id": "msg_fake", "text": text}),
        ("response.content_part.done", {"item_id": "msg_fake", "part": part}),
        ("response.output_item.done", {"item": done}),
        ("response.completed", {"response": _response(model, text, "completed", chunks)}),
    ]
    return [(name, {"type": name, **data}) for name, data in events]


_EVENTS = {"responses": _response_events, "messages": _message_events}


def _complete(kind: str, model: str, name: str, request: dict[str, Any]) -> bytes:
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    text = f"hello from {name}"
    if kind == "responses":
        return json.dumps(_response(model, text, "completed", 4)).encode()
    if kind == "messages":
        return json.dumps(_message(model, text, 4)).encode()
    if kind == "count_tokens":
        return json.dumps({"input_tokens": 3}).encode()
    if kind == "tokenize":
        content = str(request.get("content", ""))
        return json.dumps({"tokens": [ord(c) for c in content[:64]]}).encode()
    if kind == "rerank":
        # llama-server's answer: every document's index and score, best first, top_n of them.
        documents = request.get("documents")
        count = len(documents) if isinstance(documents, list) else 0
        scores = sorted(((1.0 - i / (count + 1), i) for i in range(count)), reverse=True)
        top = request.get("top_n")
        results = [{"index": i, "relevance_score": score} for score, i in scores][
            : top if isinstance(top, int) else None
        ]
        return json.dumps(
            {
                "model": model,
                "object": "list",
                "usage": {"prompt_tokens": 5 * count, "total_tokens": 5 * count},
                "results": results,
            }
        ).encode()
    if kind == "embedding":
        inputs = request.get("input")
        count = len(inputs) if isinstance(inputs, list) else 1
        return json.dumps(
            {
                "object": "list",
                "model": model,
                "system_fingerprint": name,
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.25, 0.5, 0.75]} for i in range(count)
                ],
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            }
        ).encode()
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": text},
        }
        obj = "chat.completion"
        if request.get("fake_logprobs_bytes"):
            # A token spelled "usage" among them, as a model may write: a value, not a key.
            entry = {"token": "usage", "logprob": -0.25, "bytes": [117], "top_logprobs": []}
            count = int(request["fake_logprobs_bytes"]) // len(json.dumps(entry))
            choice["logprobs"] = {"content": [entry] * count}
    else:
        choice = {"index": 0, "finish_reason": "stop", "text": text, "logprobs": None}
        obj = "text_completion"
    return json.dumps(
        {
            "id": "cmpl-fake",
            "object": obj,
            "created": 1700000000,
            "model": model,
            "system_fingerprint": name,
            "choices": [choice],
            "usage": usage,
        }
    ).encode()


def _chunk(kind: str, model: str, name: str, i: int, padding: str = "") -> dict[str, Any]:
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": f"tok{i} {padding}"},
            "finish_reason": None,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": f"tok{i} ", "finish_reason": None}
        obj = "text_completion"
    return {
        "id": "cmpl-fake",
        "object": obj,
        "created": 1700000000,
        "model": model,
        "system_fingerprint": name,
        "choices": [choice],
    }


async def serve(host: str, port: int, engine: Engine) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Connection(engine), host, port, backlog=1024)


async def _main(args: argparse.Namespace) -> None:
    engine = Engine(args.name, args.health, args.fail_status, args.parallel, args.service_time)
    server = await serve(args.host, args.port, engine)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"LISTENING {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--health", type=int, default=200, help="status GET /health answers")
    parser.add_argument("--fail-status", type=int, default=None, help="answer every API call so")
    parser.add_argument("--parallel", "-np", type=int, default=None, help="slots, as llama-server's")
    parser.add_argument("--service-time", type=float, default=0.0, help="seconds a request takes in a slot")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(_main(args))
    except ImportError:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
