"""A replica's in-flight count: one owner, counted once, given back once."""

from __future__ import annotations

from llmgw.gateway.state.routes import Replica


def test_a_hold_counts_one_request_until_it_is_released() -> None:
    replica = Replica("http://127.0.0.1:9")
    first, second = replica.hold(), replica.hold()
    assert replica.inflight == 2
    first.release()
    assert replica.inflight == 1
    second.release()
    assert replica.inflight == 0


def test_releasing_twice_takes_the_request_off_once() -> None:
    # An answer can be ended by more than one path (refused as too large, then closed);
    # counted off twice, the replica would look idler than it is and draw more requests.
    replica = Replica("http://127.0.0.1:9")
    other = replica.hold()
    hold = replica.hold()
    hold.release()
    hold.release()
    assert replica.inflight == 1, "the other request still in flight was counted off too"
    other.release()
    assert replica.inflight == 0
