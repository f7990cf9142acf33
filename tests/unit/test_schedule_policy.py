"""Who takes a free slot next (llmgw/gateway/schedule/policy.py), as properties."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.errors import UsageError
from llmgw.gateway.schedule.fair import FAIR
from llmgw.gateway.schedule.fifo import FIFO
from llmgw.gateway.schedule.policies import POLICIES, policy_named
from llmgw.gateway.schedule.policy import Ledger, Policy, Room, Waiter, grants

ENDPOINTS = ("http://a", "http://b", "http://c")


def waiter(n: int, key: str, band: int = 1, share: float = 1.0, cost: float = 1.0, since: float | None = None,
           candidates: tuple[str, ...] = ENDPOINTS) -> Waiter:  # fmt: skip
    return Waiter(f"w{n:04d}", key, band, share, float(n) if since is None else since, cost, candidates)


waiters = st.lists(
    st.builds(
        lambda n, key, band, share, cands: (n, key, band, share, cands),
        st.integers(0, 500),
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 2),
        st.sampled_from([1.0, 2.0, 3.0]),
        st.lists(st.sampled_from(ENDPOINTS), min_size=1, max_size=3, unique=True).map(tuple),
    ),
    max_size=40,
    unique_by=lambda t: t[0],
).map(lambda ts: [waiter(n, k, b, s, candidates=c) for n, k, b, s, c in ts])
free_slots = st.fixed_dictionaries({e: st.integers(0, 5) for e in ENDPOINTS})


@given(waiters, free_slots, st.sampled_from(sorted(POLICIES.values(), key=lambda p: p.name)))
def test_no_replica_is_given_more_than_its_free_slots(
    ws: list[Waiter], free: dict[str, int], policy: Policy
) -> None:
    before = dict(free)
    out = grants(ws, free, Ledger({}, {}), policy)
    given_to = Counter(endpoint for _, endpoint in out)
    for endpoint, n in given_to.items():
        assert n <= before[endpoint], f"{endpoint} was given {n} requests with {before[endpoint]} free"
    for w, endpoint in out:
        assert endpoint in w.candidates, "a request was sent to a replica it may not use"


@given(waiters, free_slots, st.sampled_from(sorted(POLICIES.values(), key=lambda p: p.name)))
def test_no_slot_is_left_idle_while_a_waiting_request_could_use_it(
    ws: list[Waiter], free: dict[str, int], policy: Policy
) -> None:
    out = grants(ws, free, Ledger({}, {}), policy)
    granted = {w.id for w, _ in out}
    for w in ws:
        if w.id not in granted:
            assert all(free[e] == 0 for e in w.candidates), f"{w.id} waits beside a free slot it could use"


@given(waiters, st.integers(1, 10))
def test_a_higher_band_always_goes_first(ws: list[Waiter], slots: int) -> None:
    out = grants(ws, {e: 0 for e in ENDPOINTS} | {"http://a": slots}, Ledger({}, {}), FAIR)
    bands = [w.band for w, _ in out]
    assert bands == sorted(bands, reverse=True)


@given(waiters, st.integers(1, 20))
def test_one_key_is_served_first_come_first_served(ws: list[Waiter], slots: int) -> None:
    same = [Waiter(w.id, w.key, 1, 1.0, w.since, 1.0, ENDPOINTS) for w in ws]
    out = grants(same, {"http://a": slots}, Ledger({}, {}), FAIR)
    for key in {w.key for w in same}:
        order = [w.since for w, _ in out if w.key == key]
        assert order == sorted(order), f"key {key} was served out of its order"


@given(waiters, st.integers(1, 20))
def test_fifo_serves_in_arrival_order_whoever_sent_it(ws: list[Waiter], slots: int) -> None:
    same = [Waiter(w.id, w.key, w.band, w.share, w.since, 1.0, ENDPOINTS) for w in ws]
    out = grants(same, {"http://a": slots}, Ledger({}, {}), FIFO)
    assert [w.since for w, _ in out] == sorted(w.since for w in same)[: len(out)]


def test_a_quiet_key_goes_before_a_flood_that_came_first() -> None:
    flood = [waiter(n, "flood") for n in range(32)]
    quiet = waiter(100, "quiet")
    ledger = Ledger({}, {})
    ledger.charge("flood", 4, 1)  # the flood has four in flight already
    ledger.joined("quiet", 1)
    out = grants([*flood, quiet], {"http://a": 1}, ledger, FAIR)
    assert out[0][0] is quiet


def test_shares_split_slots_in_their_ratio() -> None:
    ws = [waiter(n, "one", share=1) for n in range(100)] + [
        waiter(n + 100, "three", share=3) for n in range(100)
    ]
    out = grants(ws, {"http://a": 80}, Ledger({}, {}), FAIR)
    served = Counter(w.key for w, _ in out)
    assert served["three"] == 3 * served["one"], served


@settings(max_examples=50)
@given(st.integers(1, 50))
def test_a_key_back_from_idle_banks_no_credit(busy_for: int) -> None:
    ledger = Ledger({}, {})
    # "a" is served alone for a while; "b" was idle all that time.
    grants([waiter(n, "a") for n in range(busy_for)], {"http://a": busy_for}, ledger, FAIR)
    ledger.joined("b", 1)
    ws = [waiter(1000 + n, "a") for n in range(10)] + [waiter(2000 + n, "b") for n in range(10)]
    out = grants(ws, {"http://a": 10}, ledger, FAIR)
    served = Counter(w.key for w, _ in out)
    assert abs(served["a"] - served["b"]) <= 1, f"after idling, b took {served['b']} of 10 slots"


def room(
    in_use: dict[str, int], loaded: str | None, oldest: dict[str, float], now: float = 100.0
) -> dict[str, Room]:
    shared = Room(dict(in_use), loaded, oldest, now, patience=5.0)
    return {"http://a": shared, "http://b": shared}


def test_in_a_room_the_loaded_replica_is_served_before_a_swap() -> None:
    ws = [
        Waiter("b1", "k", 1, 1.0, 98.0, 1.0, ("http://b",)),
        Waiter("a1", "k", 1, 1.0, 99.0, 1.0, ("http://a",)),
    ]
    rooms = room({"http://a": 0}, "http://a", {"http://a": 99.0, "http://b": 98.0})
    out = grants(ws, {"http://a": 4, "http://b": 4}, Ledger({}, {}), FAIR, rooms)
    assert [w.id for w, _ in out] == ["a1"], "b was started while a, loaded, had a request waiting"


def test_in_a_room_a_request_that_waited_its_patience_drains_the_loaded_replica() -> None:
    ws = [
        Waiter("b1", "k", 1, 1.0, 90.0, 1.0, ("http://b",)),
        Waiter("a1", "k", 1, 1.0, 99.0, 1.0, ("http://a",)),
    ]
    busy = room({"http://a": 2}, "http://a", {"http://a": 99.0, "http://b": 90.0})
    assert grants(ws, {"http://a": 2, "http://b": 4}, Ledger({}, {}), FAIR, busy) == [], (
        "a took new requests while b had waited past its patience"
    )
    drained = room({"http://a": 0}, "http://a", {"http://a": 99.0, "http://b": 90.0})
    out = grants(ws, {"http://a": 4, "http://b": 4}, Ledger({}, {}), FAIR, drained)
    assert [w.id for w, _ in out] == ["b1"], "once a drained, b was not started"


def test_in_a_room_waits_count_from_when_the_loaded_replica_answered_not_through_its_load() -> None:
    ws = [
        Waiter("b1", "k", 1, 1.0, 70.0, 1.0, ("http://b",)),
        Waiter("a1", "k", 1, 1.0, 99.0, 1.0, ("http://a",)),
    ]
    for ready, granted in ((None, ["a1"]), (97.0, ["a1"]), (90.0, [])):
        # a swapped in at 70 and took 27 s to load: b's 30 s were mostly a's load.
        loading = room({"http://a": 1}, "http://a", {"http://a": 99.0, "http://b": 70.0})
        loading["http://a"].ready = ready
        out = grants(ws, {"http://a": 2, "http://b": 4}, Ledger({}, {}), FAIR, loading)
        assert [w.id for w, _ in out] == granted, f"a ready since {ready}: granted {out}"


def test_alternating_requests_in_a_room_cost_two_starts_not_one_each() -> None:
    ws = [
        Waiter(f"w{n:02d}", "k", 1, 1.0, 100.0 + n / 100, 1.0, ("http://a" if n % 2 == 0 else "http://b",))
        for n in range(12)
    ]
    loaded: list[str] = []
    shared = Room({}, None, {}, 100.2, patience=5.0)
    while ws:
        shared.in_use = {}  # the last turn's requests have finished
        shared.oldest = {}
        for w in ws:
            shared.oldest[w.candidates[0]] = min(w.since, shared.oldest.get(w.candidates[0], 1e9))
        out = grants(
            ws, {"http://a": 4, "http://b": 4}, Ledger({}, {}), FAIR, {"http://a": shared, "http://b": shared}
        )
        for w, endpoint in out:
            ws.remove(w)
            if not loaded or loaded[-1] != endpoint:
                loaded.append(endpoint)
    assert len(loaded) == 2, f"twelve alternating requests started {loaded}"


def test_a_policy_is_looked_up_by_the_name_llmgw_scheduler_gives() -> None:
    assert policy_named(" FIFO ") is FIFO and policy_named("fair") is FAIR


def test_an_unknown_scheduler_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(UsageError) as refused:
        policy_named("lottery")
    assert "LLMGW_SCHEDULER='lottery'" in str(refused.value)
    assert all(name in str(refused.value) for name in POLICIES)
