"""What a slot costs a request when nothing waits: taking one and giving it back on the
local store (llmgw/gateway/schedule/store.py: the SQLite file one instance's workers
share), beside a reference run in the same turns: one empty write transaction on a file of
its own, taken in turn on a lock file as the store's are. The ratio is the figure to hold:
what a slot costs in empty transactions, whatever the machine. Twice: requests that take
over the slot the one before gave back (one replica, or routing's same first choice), and
requests whose routing turns to the other replica each time, which cannot.

    .venv/bin/python bench/slots.py [--requests 5000] [--turns 7]

With redis-server installed (`apt-get install redis-server`; started on a loopback port,
keeping nothing), the same on the Redis store of several instances, beside one PING in the
same turns: what a slot costs there in round trips.

The same in bench/gateway.py is part of the gateway's added latency, where it is too small
beside the noise of a loaded 2-core machine to read.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))

from llmgw.gateway.schedule.policy import Waiter  # noqa: E402
from llmgw.gateway.schedule.store import Ask, LocalStore, Store  # noqa: E402
from llmgw.gateway.schedule.store_redis import RedisStore  # noqa: E402

ENDPOINTS = {"http://127.0.0.1:9001": 4, "http://127.0.0.1:9002": 4}


def slots(store: Store, requests: int, turning: bool = False) -> float:
    """Microseconds per request: a slot taken, then given back. `turning`: routing prefers
    the other replica each time, so no request takes over the slot the one before gave back."""
    began = time.perf_counter()
    order = tuple(ENDPOINTS)
    for n in range(requests):
        candidates = order[::-1] if turning and n % 2 else order
        waiter = Waiter(f"r{n}", "key", 1, 1.0, time.time(), 1.0, candidates)
        endpoint, _ = store.ask(Ask("chat", waiter, ENDPOINTS, 100))
        assert endpoint is not None
        store.give_back("chat", waiter.id)
    store.flush()
    return (time.perf_counter() - began) / requests * 1e6


def empty_writes(directory: Path, requests: int) -> float:
    """Microseconds per empty write transaction, taken in turn as the store takes its own."""
    db = sqlite3.connect(directory / "reference.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=OFF")
    lock = os.open(directory / "reference.lock", os.O_RDWR | os.O_CREAT, 0o600)
    began = time.perf_counter()
    for _ in range(requests):
        fcntl.flock(lock, fcntl.LOCK_EX)
        db.execute("BEGIN IMMEDIATE")
        db.execute("COMMIT")
        fcntl.flock(lock, fcntl.LOCK_UN)
    took = (time.perf_counter() - began) / requests * 1e6
    os.close(lock)
    db.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--turns", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        store = LocalStore(directory)
        slots(store, 200)  # warm: the first statements are prepared
        slots(store, 200, turning=True)
        taken, turning, reference = [], [], []
        for _ in range(args.turns):
            taken.append(slots(store, args.requests))
            turning.append(slots(store, args.requests, turning=True))
            reference.append(empty_writes(directory, args.requests))
        store.close()
    slot, turned, empty = (statistics.median(t) for t in (taken, turning, reference))
    print(f"{args.turns} turns of {args.requests} requests, median of the turns:")
    print(f"  a slot taken and given back            {slot:7.1f} us  {slot / empty:5.2f} empty transactions")
    print(f"  the same, routing turning each time    {turned:7.1f} us  {turned / empty:5.2f}")
    print(f"  one empty write transaction            {empty:7.1f} us")
    on_redis(args.requests, args.turns)


def pings(store: RedisStore, requests: int) -> float:
    began = time.perf_counter()
    for _ in range(requests):
        store.redis.ping()
    return (time.perf_counter() - began) / requests * 1e6


def on_redis(requests: int, turns: int) -> None:
    import shutil

    if shutil.which("redis-server") is None:
        print("Redis: redis-server not installed (apt-get install redis-server)")
        return
    from redis_server import redis_server

    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as server:
        store = RedisStore(server.url, timeout=1.0)
        slots(store, 200)
        taken, reference = [], []
        for _ in range(turns):
            taken.append(slots(store, requests // 5))
            reference.append(pings(store, requests // 5))
        store.close()
    slot, ping = statistics.median(taken), statistics.median(reference)
    print(f"Redis on loopback, {turns} turns of {requests // 5} requests:")
    print(f"  a slot taken and given back            {slot:7.1f} us  {slot / ping:5.2f} round trips")
    print(f"  one PING                               {ping:7.1f} us")


if __name__ == "__main__":
    main()
