"""What the gateway reads from the Responses and Messages APIs: their usage, where their
events carry the model, and their prompt's lead for prefix routing."""

from __future__ import annotations

import json

from llmgw.gateway.request.prefix import prefix_key
from llmgw.gateway.request.rename import EventRename, renamed
from llmgw.gateway.request.usage import Meter


def _event(data: dict[str, object]) -> bytes:
    return json.dumps(data).encode()


def test_a_whole_response_or_message_is_metered_from_input_and_output_tokens() -> None:
    meter = Meter()
    meter.read(b'{"object": "response", "usage": {"input_tokens": 11, "output_tokens": 5}}')
    assert (meter.prompt, meter.completion) == (11, 5)


def test_a_streamed_response_is_metered_from_its_completed_event() -> None:
    meter = Meter()
    assert not meter.event(_event({"type": "response.created", "response": {"usage": None}}))
    assert not meter.seen
    completed = {"type": "response.completed", "response": {"usage": {"input_tokens": 9, "output_tokens": 4}}}
    assert not meter.event(_event(completed)), "the event is the client's: never taken out"
    assert (meter.prompt, meter.completion) == (9, 4)


def test_a_streamed_message_is_metered_from_message_start_then_message_delta() -> None:
    meter = Meter()
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}
    meter.event(_event(start))
    assert (meter.prompt, meter.completion) == (7, 1)
    meter.event(_event({"type": "message_delta", "usage": {"output_tokens": 12}}))
    assert (meter.prompt, meter.completion) == (7, 12), "the delta's output replaces the start's"


def test_anthropics_cached_input_counts_as_prompt_read() -> None:
    meter = Meter()
    meter.read(b'{"usage": {"input_tokens": 3, "cache_read_input_tokens": 40, "output_tokens": 2}}')
    assert meter.prompt == 43


def test_a_message_delta_before_any_start_is_not_usage() -> None:
    meter = Meter()
    meter.event(_event({"type": "message_delta", "usage": {"output_tokens": 12}}))
    assert not meter.seen, "without the input, the answer is charged its estimate instead"


def test_the_model_one_level_down_is_renamed_and_nothing_else_changes() -> None:
    start = b'{"type": "message_start", "message": {"id": "m", "model": "served", "content": []}}'
    assert renamed(start, b'"asked"', complete=True) == start.replace(b'"served"', b'"asked"')
    created = b'{"type":"response.created","response":{"model":"served","output":[]},"sequence_number":0}'
    assert renamed(created, b'"asked"', complete=True) == created.replace(b'"served"', b'"asked"')
    delta = b'{"type": "response.output_text.delta", "delta": "model"}'
    assert renamed(delta, b'"asked"', complete=True) == delta


def test_named_events_pass_whole_with_their_model_renamed() -> None:
    stream = b'event: message_start\ndata: {"type": "message_start", "message": {"model": "served"}}\n\n'
    out = EventRename("asked").feed(stream)
    assert out == stream.replace(b'"served"', b'"asked"')


def test_responses_and_messages_route_by_their_system_prompt_and_first_turns() -> None:
    a = prefix_key("responses", {"instructions": "be brief", "input": "hi"})
    assert a == prefix_key("responses", {"instructions": "be brief", "input": "hi", "model": "x"})
    assert a != prefix_key("responses", {"instructions": "be long", "input": "hi"})
    assert prefix_key("responses", {}) is None
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    m = prefix_key("messages", {"system": "be brief", "messages": turns})
    later = prefix_key(
        "messages", {"system": "be brief", "messages": [*turns, {"role": "user", "content": "?"}]}
    )
    assert m is not None and m == later, "a conversation's later turns go where its start is cached"
    assert prefix_key("messages", {"messages": []}) is None
