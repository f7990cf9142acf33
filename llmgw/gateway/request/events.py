"""A Responses stream's events, completed to OpenAI's shape where the engine left fields out.

llama-server writes the Responses API's events without `sequence_number`, `output_index` or
`content_index`, and its `response.created` without `output`. The openai SDK's
`client.responses.stream(...)` indexes its snapshot by those fields, so through a plain relay
the helper failed with a TypeError on the first delta. The fields can be worked out from the
stream itself, as OpenAI numbers them: events from 0 in the order sent, output items from 0
in the order added, content parts from 0 within their item. A field the engine did write is
kept, and the numbering goes on from it; an event that needs nothing goes out untouched.
"""

from __future__ import annotations

import json
from typing import Any

# Events that name their output item by `item_id`, and whether they also name a content part.
_IN_PART = frozenset(
    {
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
    }
)
_LIFECYCLE = frozenset({"response.created", "response.queued", "response.in_progress"})
_WITH_LOGPROBS = frozenset({"response.output_text.delta", "response.output_text.done"})


def _item_key(item: Any) -> str | None:
    """How later events name an item: its `id`, or a function call's `call_id` (llama-server
    gives a call no `id` and names it by `call_id` in its argument deltas)."""
    if not isinstance(item, dict):
        return None
    key = item.get("id") or item.get("call_id")
    return key if isinstance(key, str) else None


class ResponseEvents:
    """The numbering of one Responses stream, as its events pass."""

    def __init__(self, requested: str) -> None:
        self.requested = requested
        self.sequence = 0
        self.next_output = 0
        self.outputs: dict[str, int] = {}  # item key -> output_index
        self.parts: dict[str, int] = {}  # item key -> the content_index of its latest part

    def complete(self, body: bytes) -> bytes:
        """One event's JSON, with what was missing filled in; the same bytes when nothing was."""
        try:
            event = json.loads(body)
        except ValueError:
            return body
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            return body
        added = self._number(event) | self._place(event)
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() if added else body

    def _number(self, event: dict[str, Any]) -> bool:
        given = event.get("sequence_number")
        if isinstance(given, int):
            self.sequence = given + 1
            return False
        event["sequence_number"] = self.sequence
        self.sequence += 1
        return True

    def _place(self, event: dict[str, Any]) -> bool:
        kind = event["type"]
        before = len(event)
        response = event.get("response")
        if kind in _LIFECYCLE and isinstance(response, dict):
            fields = len(response)
            response.setdefault("output", [])
            response.setdefault("model", self.requested)
            return len(response) != fields
        if kind in ("response.output_item.added", "response.output_item.done"):
            self._item(event)
        elif isinstance(event.get("item_id"), str):
            event.setdefault("output_index", self.outputs.get(event["item_id"], max(self.next_output - 1, 0)))
            if kind in _IN_PART:
                self._part(event)
        if kind in _WITH_LOGPROBS:
            event.setdefault("logprobs", [])
        return len(event) != before

    def _item(self, event: dict[str, Any]) -> None:
        key = _item_key(event.get("item"))
        given = event.get("output_index")
        if event["type"] == "response.output_item.added":
            index = given if isinstance(given, int) else self.next_output
            self.next_output = max(self.next_output, index + 1)
            if key is not None:
                self.outputs[key] = index
        else:
            index = given if isinstance(given, int) else self.outputs.get(key or "", self.next_output)
        event.setdefault("output_index", index)

    def _part(self, event: dict[str, Any]) -> None:
        item = event["item_id"]
        given = event.get("content_index")
        if event["type"] == "response.content_part.added":
            index = given if isinstance(given, int) else self.parts.get(item, -1) + 1
            self.parts[item] = index
        else:
            index = given if isinstance(given, int) else self.parts.get(item, 0)
        event.setdefault("content_index", index)
