"""How many tokens an answer used, read from the engine's `usage` as the answer passes.

A streamed answer says so only if asked (`stream_options.include_usage`), in one last event
with no choices; the gateway asks on every stream, and takes that event out again when the
client did not ask for it, since a client that did not expect an event without choices may
fail on it (some read `choices[0]` of every event).
"""

from __future__ import annotations

import json
import math
from typing import Any

# A whole (non-streamed) answer is kept to read its usage only up to this size: embeddings of
# long batches run to megabytes, and their usage is then estimated instead.
_KEEP = 4 << 20


def prompt_estimate(body: bytes) -> int:
    """Tokens a request's prompt is charged when no usage arrives: about 4 bytes a token,
    as for English text, counting the JSON around it too (so never under)."""
    return max(1, math.ceil(len(body) / 4))


class Meter:
    """The usage one answer reports, and whether its usage-only event is to be kept."""

    def __init__(self, strip_usage_event: bool = False) -> None:
        self.strip = strip_usage_event
        self.prompt: int | None = None
        self.completion: int | None = None
        self.whole = False  # a whole JSON answer, read at its end (else an event stream)
        self.events = 0  # JSON events seen: a cut stream's tokens are estimated from them
        self._parts: list[bytes] | None = []
        self._kept = 0

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
        if not isinstance(data, dict) or not self._note(data.get("usage")):
            return False
        return self.strip and data.get("choices") == []

    def part(self, chunk: bytes) -> None:
        """A chunk of a whole JSON answer."""
        if self._parts is None:
            return
        self._kept += len(chunk)
        if self._kept > _KEEP:
            self._parts = None
            return
        self._parts.append(chunk)

    def finish(self) -> None:
        """A whole JSON answer is complete: read its usage."""
        if not self._parts:
            return
        parts, self._parts = self._parts, None
        self.read(b"".join(parts))

    def read(self, answer: bytes) -> Any:
        """Read the usage of a whole JSON answer; the answer as parsed (None if it is not
        JSON, or too long to keep)."""
        self._parts = None
        if len(answer) > _KEEP:
            return None
        try:
            data = json.loads(answer)
        except (ValueError, RecursionError):  # still the engine's answer, passed on as it came
            return None
        if isinstance(data, dict):
            self._note(data.get("usage"))
        return data

    def _note(self, usage: Any) -> bool:
        if not isinstance(usage, dict):
            return False
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int):
            return False
        self.prompt = prompt
        # Embeddings report no completion tokens: none were written.
        self.completion = completion if isinstance(completion, int) else 0
        return True
