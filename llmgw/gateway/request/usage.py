"""How many tokens an answer used, read from the engine's `usage` as the answer passes.

A streamed answer says so only if asked (`stream_options.include_usage`), in one last event
with no choices; the gateway asks on every stream, and takes that event out again when the
client did not ask for it, since a client that did not expect an event without choices may
fail on it (some read `choices[0]` of every event).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# A whole (non-streamed) answer is kept to be parsed only up to this size. Past it (embeddings
# of long batches, an answer with `top_logprobs`) only its first and last bytes are kept and
# searched for its usage: an answer of 4,003 tokens with logprobs passes 4 MiB, and was once
# charged as 34 because its usage went unread.
_KEEP = 4 << 20
# Usage is an object of a few numbers near an answer's start (llama-server's embeddings) or
# end (every chat and completion answer): this much of each end holds it many times over.
_ENDS = 64 << 10
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*\{')


def prompt_estimate(body: bytes) -> int:
    """Tokens a request's prompt is charged when no usage arrives: about 4 bytes a token,
    as for English text, counting the JSON around it too (so never under)."""
    return max(1, math.ceil(len(body) / 4))


# The events of the Responses and Messages APIs that carry usage, and where in them it is:
# Responses says it once, in its last event's response; Messages gives the input tokens as
# the message starts and the output tokens (so far, then in all) in its message_delta.
_USAGE_IN = {"response.completed": "response", "response.incomplete": "response", "message_start": "message"}


class Meter:
    """The usage one answer reports, and whether its usage-only event is to be kept.

    Usage comes in two shapes: OpenAI's chat and completions say `prompt_tokens` and
    `completion_tokens`; the Responses and Messages APIs say `input_tokens` and
    `output_tokens`. Both count the same way toward a key's tpm.
    """

    def __init__(self, strip_usage_event: bool = False, free: bool = False) -> None:
        self.strip = strip_usage_event
        # A token count, not a generation: it counts toward a key's rpm, never its tpm.
        self.free = free
        self.prompt: int | None = None
        self.completion: int | None = None
        self.whole = False  # a whole JSON answer, read at its end (else an event stream)
        self.events = 0  # JSON events seen: a cut stream's tokens are estimated from them
        # The usage read counts the whole answer: a whole JSON answer's, a stream's last
        # word. Messages' message_start says 1 output token as the answer starts; a stream
        # cut after it was charged that 1 for all it had relayed.
        self.final = False
        self._parts: list[bytes] | None = []
        self._kept = 0
        self._head = b""  # past _KEEP: the answer's first and last bytes, for its usage
        self._tail = bytearray()

    @property
    def seen(self) -> bool:
        return self.prompt is not None

    def event(self, body: bytes) -> bool:
        """Read one event's JSON; True when the event is to be taken out of the stream."""
        self.events += 1
        # vLLM, asked for usage, writes `"usage": null` in every event but the last: only an
        # event that may carry numbers is worth parsing.
        if b'"usage"' not in body or b'"usage":null' in body or b'"usage": null' in body:
            return False
        try:
            data = json.loads(body)
        except ValueError:
            return False
        if not isinstance(data, dict):
            return False
        kind = data.get("type")
        if kind in _USAGE_IN:
            inner = data.get(_USAGE_IN[kind])
            if self._note(inner.get("usage") if isinstance(inner, dict) else None):
                self.final = kind != "message_start"
            return False
        if kind == "message_delta":
            self.final = self._note(data.get("usage"), later=True) or self.final
            return False
        if not self._note(data.get("usage")):
            return False
        # vLLM's continuous usage is in every event, counting the answer so far: only the
        # usage-only event, or the one that ends a choice, counts all of it.
        choices = data.get("choices")
        self.final = choices == [] or (
            isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
        )
        return self.strip and choices == []

    def relayed(self) -> int:
        """The output tokens a stream is charged: its usage when that counts the whole
        answer; else, cut short, at least an estimate of what it relayed (each event about
        a token), whatever an earlier event said."""
        if self.final:
            return self.completion or 0
        return max(self.completion or 0, self.events)

    def part(self, chunk: bytes) -> None:
        """A chunk of a whole JSON answer."""
        self._kept += len(chunk)
        if self._parts is None:  # past _KEEP: only its last bytes are kept
            self._tail += chunk
            del self._tail[:-_ENDS]
            return
        self._parts.append(chunk)
        if self._kept > _KEEP:
            whole = b"".join(self._parts)
            self._parts = None
            self._head, self._tail = whole[:_ENDS], bytearray(whole[-_ENDS:])

    def finish(self) -> None:
        """A whole JSON answer is complete: read its usage."""
        if self._head:
            head, tail = self._head, bytes(self._tail)
            self._head, self._tail = b"", bytearray()
            self._note_found(head, tail)
            return
        if not self._parts:
            return
        parts, self._parts = self._parts, None
        self.read(b"".join(parts))

    def read(self, answer: bytes) -> Any:
        """Read the usage of a whole JSON answer; the answer as parsed (None if it is not
        JSON, or too long to parse: its usage is then searched for at its ends)."""
        self._parts = None
        if len(answer) > _KEEP:
            self._note_found(answer[:_ENDS], answer[-_ENDS:])
            return None
        try:
            data = json.loads(answer)
        except (ValueError, RecursionError):  # still the engine's answer, passed on as it came
            return None
        if isinstance(data, dict):
            self.final = self._note(data.get("usage"))
        return data

    def _note_found(self, head: bytes, tail: bytes) -> None:
        """The usage of an answer too long to parse, found at its end (or else its start).

        A `"usage":` with its quotes bare is a key, never text: within a JSON string a
        quote is escaped. The last one in the tail is the top level's, written after the
        choices; the first in the head, before the data (llama-server's embeddings).
        """
        found = [m.end() - 1 for m in _USAGE_KEY.finditer(tail)][::-1]
        for text, at in [(tail, a) for a in found] + [(head, m.end() - 1) for m in _USAGE_KEY.finditer(head)]:
            try:
                usage, _ = _RAW.raw_decode(text[at : at + _ENDS].decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                continue  # cut by the end kept: the next one
            if self._note(usage):
                self.final = True
                return

    def _note(self, usage: Any, later: bool = False) -> bool:
        """Take a usage object; `later` for one that may give only the output so far, after
        an earlier event gave the input (Messages' message_delta)."""
        if not isinstance(usage, dict):
            return False
        prompt = _tokens(usage, "prompt_tokens", "input_tokens")
        completion = _tokens(usage, "completion_tokens", "output_tokens")
        if prompt is None and not (later and self.prompt is not None):
            return False
        if prompt is not None:
            # Anthropic counts the prompt's cached part apart from `input_tokens`: it was
            # read all the same.
            prompt += sum(
                v
                for k in ("cache_read_input_tokens", "cache_creation_input_tokens")
                if isinstance(v := usage.get(k), int) and not isinstance(v, bool)
            )
            self.prompt = prompt
        # Embeddings report no completion tokens: none were written.
        if completion is not None:
            self.completion = completion
        elif self.completion is None:
            self.completion = 0
        return True


_RAW = json.JSONDecoder()


def _tokens(usage: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
