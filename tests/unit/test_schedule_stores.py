"""The scheduler's shared state (llmgw/gateway/schedule/store.py and store_redis.py): both
stores hold a replica to its slots, grant a freed slot by the policy, and take back the
slots of a holder that died without giving them back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.gateway.schedule.policy import Waiter
from llmgw.gateway.schedule.queue import FLUSH_AFTER, Scheduler
from llmgw.gateway.schedule.store import LEASE_TTL, Ask, LocalStore, QueueFull, Store
from llmgw.gateway.schedule.store_redis import RedisStore
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "gateway"))
from redis_server import RedisServer, redis_server  # noqa: E402

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server: RedisServer
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(params=["local", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "local":
        made = LocalStore(tmp_path)
    else:
        made = RedisStore(request.getfixturevalue("redis_url"))
        made.redis.flushdb()
    yield made
    made.close()


_n = iter(range(10**9))


def ask(
    key: str, slots: dict[str, int], since: float | None = None, band: int = 1, per_key: int = 100
) -> Ask:
    n = next(_n)
    waiter = Waiter(f"t{n}", key, band, 1.0, time.time() if since is None else since, 1.0, tuple(slots))
    return Ask("m", waiter, slots, per_key)


def test_a_replica_is_given_no_more_than_its_slots(store: Store) -> None:
    granted = [store.ask(ask("k", {A: 2, B: 1}))[0] for _ in range(5)]
    assert granted[:3] == [A, A, B], "free slots are taken in routing's order"
    assert granted[3:] == [None, None], "with every slot taken, requests wait"


def test_a_slot_given_back_goes_to_the_key_with_least_service(store: Store) -> None:
    held = ask("flood", {A: 1})
    assert store.ask(held)[0] == A
    floods = [ask("flood", {A: 1}) for _ in range(3)]
    for f in floods:
        assert store.ask(f)[0] is None
    quiet = ask("quiet", {A: 1})
    assert store.ask(quiet)[0] is None
    woken = store.give_back("m", held.waiter.id)
    assert woken == [floods[0].waiter.id], "the first of the flood goes first: nobody was served yet"
    woken = store.give_back("m", floods[0].waiter.id)
    assert woken == [quiet.waiter.id], "then the quiet key, before the rest of the flood"
    assert store.granted("m", quiet.waiter.id) == A


def test_a_slot_given_back_while_nobody_waited_goes_to_one_who_waits_since(tmp_path: Path) -> None:
    """A worker frees a slot given back while nobody waited with its next write, and a request
    of its own that wants the same replica takes the slot over then; but not past a request
    that another worker queued meanwhile: that one goes first."""
    worker, other = LocalStore(tmp_path), LocalStore(tmp_path)
    first = ask("k", {A: 1})
    assert worker.ask(first)[0] == A
    assert worker.give_back("m", first.waiter.id) == [], "nobody waits: freed later"
    again = ask("k", {A: 1})
    assert worker.ask(again)[0] == A, "the next request takes the slot over"
    assert worker.in_use() == {A: 1}
    worker.give_back("m", again.waiter.id)
    queued = ask("other", {A: 1})
    assert other.ask(queued)[0] is None, "the lease given back is not freed yet"
    late = ask("k", {A: 1})
    endpoint, woken = worker.ask(late)
    assert endpoint is None, "a newcomer does not take over a slot someone waits for"
    assert woken == [queued.waiter.id]
    assert other.granted("m", queued.waiter.id) == A
    assert worker.in_use() == {A: 1}
    worker.close()
    other.close()


def test_a_slot_given_back_lazily_reaches_a_request_another_worker_queues_within_ms(
    tmp_path: Path,
) -> None:
    """The worker's timer frees a slot nobody took over: a request queued by another worker
    just after the give back is granted within a few milliseconds, not at the next write."""

    async def scenario() -> str | None:
        scheduler = Scheduler(LocalStore(tmp_path), wait=5.0, per_key=10)
        other = LocalStore(tmp_path)
        ticket = scheduler.ticket("m", "k", 1, 1.0, 1.0)
        assert await ticket.take({A: 1}) == A
        assert ticket.id is not None
        ticket.give_back(ticket.id)
        queued = ask("other", {A: 1})
        assert other.ask(queued)[0] is None, "the slot given back is kept for a moment"
        await asyncio.sleep(20 * FLUSH_AFTER)
        return other.granted("m", queued.waiter.id)

    assert asyncio.run(scenario()) == A


def test_a_high_band_goes_before_a_normal_flood(store: Store) -> None:
    held = ask("flood", {A: 1})
    store.ask(held)
    for _ in range(3):
        store.ask(ask("flood", {A: 1}))
    high = ask("vip", {A: 1}, band=2)
    store.ask(high)
    assert store.give_back("m", held.waiter.id) == [high.waiter.id]


def test_a_key_past_its_queue_is_refused_while_others_queue(store: Store) -> None:
    store.ask(ask("k", {A: 1}))
    for _ in range(2):
        assert store.ask(ask("k", {A: 1}, per_key=2))[0] is None
    with pytest.raises(QueueFull):
        store.ask(ask("k", {A: 1}, per_key=2))
    assert store.ask(ask("other", {A: 1}, per_key=2))[0] is None


def test_a_request_that_leaves_takes_no_slot(store: Store) -> None:
    held = ask("k", {A: 1})
    store.ask(held)
    leaver, next_one = ask("k", {A: 1}), ask("k", {A: 1})
    store.ask(leaver)
    store.ask(next_one)
    store.leave("m", leaver.waiter.id)
    assert store.give_back("m", held.waiter.id) == [next_one.waiter.id]
    assert store.granted("m", leaver.waiter.id) is None


def test_a_retry_keeps_its_place_in_line(store: Store) -> None:
    held = ask("k", {A: 1, B: 1})
    store.ask(held)
    store.ask(ask("k", {A: 1, B: 1}))
    first = time.time() - 10
    later = ask("k", {A: 1}, since=time.time())
    store.ask(later)
    retry = ask("k", {A: 1}, since=first)  # asked first, came back from a failed try on B
    store.ask(retry)
    assert store.give_back("m", held.waiter.id) == [retry.waiter.id]


_HOLDER = """
import sys, time
from pathlib import Path
from llmgw.gateway.schedule.policy import Waiter
from llmgw.gateway.schedule.store import Ask, LocalStore
from llmgw.gateway.schedule.store_redis import RedisStore
where = sys.argv[1]
store = RedisStore(where) if where.startswith("redis://") else LocalStore(Path(where))
for n in range(2):
    waiter = Waiter(f"dead{n}", "k", 1, 1.0, time.time(), 1.0, ("http://127.0.0.1:9001",))
    assert store.ask(Ask("m", waiter, {"http://127.0.0.1:9001": 2}, 100))[0]
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["local", "redis"])
def test_the_slots_of_a_killed_holder_come_back(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path) if kind == "local" else request.getfixturevalue("redis_url")
    store: Store = LocalStore(tmp_path) if kind == "local" else RedisStore(where)
    if isinstance(store, RedisStore):
        store.redis.flushdb()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), where], stdout=subprocess.PIPE, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        waiting = ask("k", {A: 2})
        assert store.ask(waiting)[0] is None, "both slots are held by the other process"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed = time.monotonic()
        # Locally the dead pid is seen at once; on Redis, when its leases lapse.
        deadline = killed + (2 if kind == "local" else LEASE_TTL + 3)
        while store.granted("m", waiting.waiter.id) is None and time.monotonic() < deadline:
            store.renew()  # the waiting worker's heartbeat keeps its place
            store.dispatch("m")
            time.sleep(0.1)
        assert store.granted("m", waiting.waiter.id) == A, "the killed holder's slot never came back"
    finally:
        if holder.poll() is None:
            holder.kill()
        store.close()


@pytest.fixture(params=["local", "redis"])
def patient(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store whose Rooms have a patience of 0.3 s."""
    made: LocalStore | RedisStore
    if request.param == "local":
        made = LocalStore(tmp_path, patience=0.3)
    else:
        made = RedisStore(request.getfixturevalue("redis_url"), patience=0.3)
        made.redis.flushdb()
    yield made
    made.close()


def test_a_room_drains_the_loaded_replica_for_a_request_that_waited_its_patience(patient: Store) -> None:
    store = patient
    rooms = {A: "node:box", B: "node:box"}

    def on(endpoint: str, model: str) -> Ask:
        made = ask("k", {endpoint: 4})
        return Ask(model, made.waiter, made.slots, 100, {endpoint: rooms[endpoint]})

    warm, first, second = on(A, "a"), on(A, "a"), on(A, "a")
    assert store.ask(warm)[0] == A, "an empty room takes the first request"
    store.give_back("a", warm.waiter.id)  # a has loaded: b's wait counts from here
    assert store.ask(first)[0] == A
    lone = on(B, "b")
    assert store.ask(lone)[0] is None, "b waits while a has a request in flight"
    assert store.ask(second)[0] == A, "a, loaded, keeps taking requests within b's patience"
    time.sleep(0.35)
    late = on(A, "a")
    assert store.ask(late)[0] is None, "past b's patience a takes no new request"
    store.give_back("a", first.waiter.id)
    assert store.granted("b", lone.waiter.id) is None, "b started while a still had one in flight"
    assert store.give_back("a", second.waiter.id) == [lone.waiter.id], "a drained, b starts"
    assert store.granted("a", late.waiter.id) is None, "a restarted beside b"


def test_a_room_counts_no_wait_while_the_loaded_replica_is_still_loading(patient: Store) -> None:
    store = patient
    rooms = {A: "node:box", B: "node:box"}

    def on(endpoint: str, model: str) -> Ask:
        made = ask("k", {endpoint: 4})
        return Ask(model, made.waiter, made.slots, 100, {endpoint: rooms[endpoint]})

    first, lone = on(A, "a"), on(B, "b")
    assert store.ask(first)[0] == A
    assert store.ask(lone)[0] is None
    time.sleep(0.35)  # a's engine loading, its first request not yet answered
    assert store.ask(on(A, "a"))[0] == A, "b's wait through a's load ended a's turn before it began"


def test_slots_given_back_while_redis_is_frozen_are_free_once_it_answers(tmp_path: Path) -> None:
    """Two requests end while Redis is stopped (SIGSTOP: connections open, nothing answered).
    Their slots must not stay taken: once Redis answers, they are given back at the next
    heartbeat, and the worker never renews them meanwhile (so they would lapse regardless)."""
    from llmgw.gateway.schedule import store_redis
    from llmgw.gateway.schedule.store_redis import Shared

    (tmp_path / "redis").mkdir()
    (tmp_path / "local").mkdir()
    with redis_server(tmp_path / "redis") as server:
        store = Shared(RedisStore(server.url, timeout=0.2), LocalStore(tmp_path / "local"))
        slots = {A: 2}
        first, second = ask("k", slots), ask("k", slots)
        assert store.ask(first)[0] == A and store.ask(second)[0] == A
        server.proc.send_signal(signal.SIGSTOP)
        try:
            store.give_back("m", first.waiter.id)
            store.give_back("m", second.waiter.id)
            assert not store.shared.mine.get("m"), "the heartbeat still renews leases given back"
        finally:
            server.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + store_redis.RETRY_EVERY + 2
        while time.monotonic() < deadline and store.shared.in_use(["m"]):
            store.renew()  # the heartbeat's turn, every LEASE_TTL / 3 in a worker
            time.sleep(0.1)
        assert store.shared.in_use(["m"]) == {}, "a slot given back during the outage is still taken"
        assert store.ask(ask("k", slots))[0] == A, "a later request found no free slot"
        store.close()


def test_a_slot_freed_in_one_worker_wakes_the_request_waiting_in_another_without_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of one instance: the request waiting in the second is granted the slot the
    first gives back, and learns it from the first at once; polling, made too slow here to
    find it in the time allowed, plays no part."""
    from llmgw.gateway.schedule import queue

    monkeypatch.setattr(queue, "POLL_FIRST", 30.0)
    monkeypatch.setattr(queue, "POLL_MOST", 30.0)
    monkeypatch.setattr(queue, "DISPATCH_EVERY", 60.0)
    (tmp_path / "shared").mkdir()

    async def scenario() -> tuple[str, float]:
        first = Scheduler(LocalStore(tmp_path), wait=20.0, per_key=10, shared=tmp_path / "shared")
        second = Scheduler(LocalStore(tmp_path), wait=20.0, per_key=10, shared=tmp_path / "shared")
        watches = [asyncio.create_task(s.watch()) for s in (first, second)]
        await asyncio.sleep(0.05)  # both listening
        holder = first.ticket("m", "k", 1, 1.0, 1.0)
        assert await holder.take({A: 1}) == A
        waiter = second.ticket("m", "j", 1, 1.0, 1.0)
        waiting = asyncio.create_task(waiter.take({A: 1}))
        await asyncio.sleep(0.1)
        assert not waiting.done(), "the second request waits for the one slot"
        assert holder.id is not None
        freed = time.monotonic()
        holder.give_back(holder.id)
        endpoint = await asyncio.wait_for(waiting, 5.0)
        took = time.monotonic() - freed
        for task in watches:
            task.cancel()
        return endpoint, took

    endpoint, took = asyncio.run(scenario())
    assert endpoint == A and took < 5.0


def test_a_key_back_from_idle_during_a_busy_spell_starts_level_and_does_not_jump_the_line(
    store: Store,
) -> None:
    """docs/scheduling.md: a key returning from idle starts level with the keys being served.
    Its raise was kept only when the same call granted a slot, so a key that came back while
    every slot was busy kept its old, lower service and took every slot for a while."""
    slots = {A: 1}
    held = ask("busy", slots)
    assert store.ask(held)[0] == A
    for _ in range(10):  # "busy" is served ten times, one after another
        nxt = ask("busy", slots)
        store.ask(nxt)
        assert store.give_back("m", held.waiter.id) == [nxt.waiter.id]
        held = nxt
    waiting_busy = [ask("busy", slots) for _ in range(4)]
    for w in waiting_busy:
        assert store.ask(w)[0] is None
    back = [ask("back", slots) for _ in range(4)]  # back from idle while the slot is busy
    for w in back:
        assert store.ask(w)[0] is None
    order = []
    for _ in range(4):
        (granted,) = store.give_back("m", held.waiter.id)
        order.append("back" if granted in {w.waiter.id for w in back} else "busy")
        held = next(w for w in [*waiting_busy, *back] if w.waiter.id == granted)
    assert order.count("back") <= 2, f"the returning key took {order}: it jumped the line"
