"""Answers name the model the client asked for, not the one the engine reports.

An engine names itself in every answer's `model` field, and what it says is its own
business: a llama-server started without `--alias` reports the path of its weights file,
which then reached every client. The gateway rewrites that field, in a whole JSON answer
and in each event of a streamed one, to the name (or alias) the request gave.

Only the top-level `model` of an object is touched, and only its value's bytes: the rest
of the answer goes out as the engine wrote it. The Responses and Messages APIs' events
carry the answer one level down (`response.created`'s `response`, `message_start`'s
`message`): a `model` there is renamed too. The field comes first or early in what
llama.cpp and vLLM write, so an answer is read only as far as that field; one whose field
is not within the first `_LOOK_AHEAD` bytes is passed on unchanged rather than held.
"""

from __future__ import annotations

import json
import re

from llmgw.gateway.request.events import ResponseEvents
from llmgw.gateway.request.usage import Meter

_LOOK_AHEAD = 1 << 20
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _More(Exception):
    """The text ends before the field could be found: more of it may tell."""


def model_span(text: str, complete: bool) -> tuple[int, int] | None:
    """Where the top-level `model` string's value (quotes included) is in a JSON object's
    text; None when there is none, or the text is not a JSON object. `_More` when the text
    may be cut short (`complete` false) and the field may still come."""
    try:
        return _walk(text)
    except _More:
        if complete:
            return None
        raise


# The fields whose object may hold the model, in the events of the Responses and Messages APIs.
_WRAPPERS = ("response", "message")


def _walk(text: str, at: int = 0, nested: bool = True) -> tuple[int, int] | None:
    at = _skip(text, at)
    if text[at] != "{":
        return None
    at = _skip(text, at + 1)
    if text[at] == "}":
        return None
    while True:
        if text[at] != '"':
            return None
        key, at = _decode(text, at, key=True)
        at = _skip(text, at)
        if text[at] != ":":
            return None
        start = _skip(text, at + 1)
        if nested and key in _WRAPPERS and text[start] == "{":
            inner = _walk(text, start, nested=False)
            if inner is not None:
                return inner
        value, stop = _decode(text, start)
        at = _skip(text, stop)  # a number may be cut short: only what follows it says not
        if key == "model" and isinstance(value, str):
            return start, stop
        if text[at] != ",":  # "}": the object ends without the field
            return None
        at = _skip(text, at + 1)


def _skip(text: str, at: int) -> int:
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    if at >= len(text):
        raise _More
    return at


def _decode(text: str, at: int, key: bool = False) -> tuple[object, int]:
    try:
        if key:
            return json.decoder.scanstring(text, at + 1)  # type: ignore[attr-defined,no-any-return]
        return _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        # Cut short or not JSON: the same to a reader that has only part of the text; a
        # complete text that fails here is passed on unchanged.
        raise _More from None


def renamed(data: bytes, name: bytes, complete: bool) -> bytes | None:
    """`data` with its top-level model value replaced by `name` (a JSON string); None when
    more data is needed first. Unchanged when there is no such field."""
    text = data.decode("utf-8", "surrogateescape")  # a multi-byte character may be cut short
    try:
        span = model_span(text, complete)
    except _More:
        return None
    if span is None:
        return data
    start, stop = span
    before = len(text[:start].encode("utf-8", "surrogateescape"))
    after = before + len(text[start:stop].encode("utf-8", "surrogateescape"))
    return data[:before] + name + data[after:]


class JsonRename:
    """A whole JSON answer, in the chunks it arrives in, with its model renamed."""

    def __init__(self, requested: str) -> None:
        self.name = json.dumps(requested).encode()
        self.held = b""
        self.done = False
        self.growth = 0  # bytes added (or, if negative, removed) by the rename

    def feed(self, chunk: bytes) -> bytes:
        if self.done:
            return chunk
        held = self.held + chunk
        out = renamed(held, self.name, complete=len(held) > _LOOK_AHEAD)
        if out is None:
            self.held = held
            return b""
        self.held = b""
        self.done = True
        self.growth = len(out) - len(held)
        return out

    def flush(self) -> bytes:
        """What is still held when the answer ends."""
        if self.done:
            return b""
        self.done = True
        held, self.held = self.held, b""
        out = renamed(held, self.name, complete=True) or held
        self.growth = len(out) - len(held)
        return out


class EventRename:
    """A server-sent event stream, with the model renamed in each `data:` line of JSON.

    Lines are passed on whole: a part of a line is held until its end arrives, which an
    event's reader waits for anyway.
    """

    def __init__(self, requested: str, meter: Meter | None = None, responses: bool = False) -> None:
        self.name = json.dumps(requested).encode()
        self.held = b""
        self.meter = meter
        # The Responses API's events, numbered where the engine did not (see events.py).
        self.responses = ResponseEvents(requested) if responses else None
        self._dropped = False  # the last data line was taken out: so goes the blank line after it

    def feed(self, chunk: bytes) -> bytes:
        data = self.held + chunk
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > _LOOK_AHEAD:  # no line this long is an event worth holding
            cut = len(data)
        self.held = data[cut:]
        if not cut:
            return b""
        return b"".join(self._line(line) for line in data[:cut].splitlines(keepends=True))

    def flush(self) -> bytes:
        rest, self.held = self.held, b""
        return self._line(rest) if rest else b""

    def _line(self, line: bytes) -> bytes:
        if self._dropped:
            self._dropped = False
            if not line.strip():
                return b""
        if not line.startswith(b"data:"):
            return line
        head = 6 if line.startswith(b"data: ") else 5
        body = line[head:]
        if not body.lstrip().startswith(b"{"):
            return line
        if self.meter is not None and self.meter.event(body):
            self._dropped = True
            return b""
        if self.responses is not None:
            text = body.rstrip(b"\r\n")
            body = self.responses.complete(text) + body[len(text) :]
        out = renamed(body, self.name, complete=True)
        return line[:head] + (body if out is None else out)
