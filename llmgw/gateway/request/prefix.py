"""The prompt's prefix key: which part of a request decides its replica under prefix routing.

The route table (state/routes.py) ranks replicas for a key; this says what the key is, from
the request's body, so every later turn of a conversation lands where its start is cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from llmgw.gateway.api import APIS

# How much of a prompt decides its replica: enough to cover a system prompt and the first
# turn, so every later turn of a conversation, which repeats them, lands where they are cached.
PREFIX_CHARS = 2048
PREFIX_MESSAGES = 2


def prefix_key(kind: str, request: Mapping[str, Any]) -> int | None:
    """A stable 64-bit hash of the prompt's leading part; None when there is none to reuse.

    Stable across workers and restarts (blake2b, not Python's salted `hash`): two workers
    must send the same conversation to the same replica.
    """
    api = APIS.get(kind)
    if api is None:
        return None
    if api.prompt == "messages":
        messages = request.get(api.prompt_fields[0])
        if not isinstance(messages, list) or not messages:
            return None
        # Each message's own beginning: a long shared system prompt must not crowd the first
        # question out of the key, or every conversation under that prompt (and its load)
        # would land on one replica; each conversation still keeps to its own.
        text = json.dumps([_head(m) for m in messages[:PREFIX_MESSAGES]], sort_keys=True, ensure_ascii=False)
    elif api.prompt == "lead":
        system, turns = api.prompt_fields
        lead = _lead(request.get(system), request.get(turns))
        if lead is None:
            return None
        text = lead
    elif api.prompt == "text":
        prompt = request.get(api.prompt_fields[0])
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            return None
        text = prompt[:PREFIX_CHARS]
    else:
        return None
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest(), "big")


def _lead(system: Any, turns: Any) -> str | None:
    """The key's text for the Responses and Messages APIs: their system prompt (a string,
    or Anthropic's list of blocks) beside the first turns, each cut as chat's are."""
    if isinstance(system, str):
        system = system[:PREFIX_CHARS]
    elif isinstance(system, list):
        system = [_head(block) for block in system[:PREFIX_MESSAGES]]
    if isinstance(turns, str):
        turns = turns[:PREFIX_CHARS]
    elif isinstance(turns, list):
        turns = [_head(turn) for turn in turns[:PREFIX_MESSAGES]]
    else:
        turns = None
    if not system and not turns:
        return None
    return json.dumps([system, turns], sort_keys=True, ensure_ascii=False)


def _head(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("text"), str):  # a content block
        return {**message, "text": message["text"][:PREFIX_CHARS]}
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return {**message, "content": message["content"][:PREFIX_CHARS]}
    return message
