"""Slots in use and requests waiting, held across every worker of one gateway instance.

The interface every store has (`Store`), and the local one: one SQLite file (WAL) in the
directory the workers already share for metrics and limits, as request/limits.py counts
rates. Each change is one short write transaction (BEGIN IMMEDIATE), which serialises the
workers, so two of them never both take a replica's last slot. store_redis.py holds the
same over every instance.

What is kept:
- a lease per slot in use: its replica, the worker that holds it, and when it lapses. The
  holding worker renews its leases every few seconds; a worker that dies stops renewing, and
  here, on one machine, its leases are taken back at once when its pid is gone;
- a row per waiting request, with its candidates and what each may hold;
- each key's virtual service per model (policy.Ledger).

While anyone waits for a model, its slots are granted only by the policy, run inside the
transaction that frees one or queues a request, so the order is one order for every worker.
A waiting request learns of its grant by finding a lease under its own id. While nobody
waits, a request takes the first free slot routing prefers, or takes over the lease its
worker's last request gave back (`_take_over`: one read, no write).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from llmgw.errors import ServiceError
from llmgw.gateway.schedule.fair import FAIR
from llmgw.gateway.schedule.policy import Ledger, Policy, Room, Waiter, grants
from llmgw.gateway.state.workers import alive

FILE_NAME = "llmgw-schedule.sqlite"
# A lease lapses this long after its holder last renewed it: a worker renews every third of
# it, so a lease outlives a dead worker on another machine by at most this much.
LEASE_TTL = 6.0
# The virtual floor of each band is kept as a key no tenant can have (names are [A-Za-z0-9._-]).
_FLOOR = "\x00band:"


class QueueFull(ServiceError):
    """The key already has as many requests waiting for the model as it may."""

    def __init__(self, waiting: int) -> None:
        super().__init__(waiting)
        self.waiting = waiting


@dataclass(frozen=True)
class Ask:
    """One request asking for a slot of `model` on one of `slots` (endpoint → slots it has,
    in routing's order of preference)."""

    model: str
    waiter: Waiter
    slots: Mapping[str, int]
    per_key: int  # waiting requests the key may have for the model; past it, QueueFull
    rooms: Mapping[str, str] = field(default_factory=dict)  # endpoint → its Room's name, if any


class Store(Protocol):
    """What the scheduler needs of shared state; every call is atomic for every worker."""

    def ask(self, ask: Ask) -> tuple[str | None, list[str]]:
        """The endpoint granted to this request now, or None when it waits (queued); and the
        ids of other requests granted meanwhile. QueueFull when it may not wait."""
        ...

    def granted(self, model: str, id: str) -> str | None:
        """The endpoint a waiting request was granted, if it was."""
        ...

    def give_back(self, model: str, id: str, correction: float = 0.0) -> list[str]:
        """Free a lease (charging its key `correction` more service); the ids granted."""
        ...

    def leave(self, model: str, id: str) -> list[str]:
        """A waiting request gives up: unqueued, and a lease granted meanwhile freed."""
        ...

    def dispatch(self, model: str) -> list[str]:
        """Reclaim lapsed leases and grant what is free; the ids granted."""
        ...

    def correct(self, model: str, key: str, share: float, correction: float) -> None:
        """Charge a key's service what its answer really cost beyond the estimate."""
        ...

    def renew(self) -> None:
        """Keep this worker's leases and waiting requests from lapsing."""
        ...

    @property
    def pending(self) -> bool:
        """Leases given back but not yet freed: `flush` frees them."""
        ...

    def flush(self, given_before: float = math.inf) -> list[str]:
        """Free what was given back lazily before `given_before` (time.monotonic()); the
        ids granted."""
        ...

    def in_use(self, models: Iterable[str]) -> dict[str, int]:
        """Slots in use per endpoint, over every worker (and instance)."""
        ...

    def waiting(self, models: Iterable[str]) -> dict[str, int]:
        """Requests waiting per model, over every worker (and instance)."""
        ...

    def close(self) -> None: ...


def encode_slots(slots: Mapping[str, int], rooms: Mapping[str, str]) -> str:
    return "\n".join(f"{n} {endpoint} {rooms.get(endpoint, '')}".rstrip() for endpoint, n in slots.items())


def decode_slots(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """Endpoint → slots, and endpoint → room, as `encode_slots` wrote them."""
    slots: dict[str, int] = {}
    rooms: dict[str, str] = {}
    for line in text.split("\n"):
        n, endpoint, *room = line.split(" ")
        slots[endpoint] = int(n)
        if room:
            rooms[endpoint] = room[0]
    return slots, rooms


def _rooms_text(rooms: Mapping[str, str]) -> str:
    # "|a|b|": found again with LIKE '%|a|%'
    return "|" + "|".join(sorted(set(rooms.values()))) + "|" if rooms else ""


class LocalStore:
    """The workers of one instance, on one SQLite file in their shared directory."""

    def __init__(self, directory: Path, policy: Policy = FAIR, patience: float = 5.0) -> None:
        self.policy = policy
        self.patience = patience
        self.pid = os.getpid()
        self.db = sqlite3.connect(
            directory / FILE_NAME, timeout=5.0, isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")  # a crash loses leases that would lapse anyway
        for statement in _SCHEMA:
            self.db.execute(statement)
        self.lock = os.open(directory / (FILE_NAME + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        # Leases given back while nobody waited for their model, freed with this worker's next
        # write (or by `flush`, once one has lain there FLUSH_AFTER): one transaction per
        # request instead of two, when nothing waits; someone waiting frees them at once.
        # Lease id → its model, when it was given back, and its replica if a request may take
        # it over ("" if not).
        self.later: dict[str, tuple[str, float, str]] = {}
        # Request id → (its lease's id, the replica) for the leases this worker's requests took
        # while nobody waited, outside a Room: a later request that would take a slot of the
        # same replica takes such a lease over from `later`, instead of freeing it and counting
        # the replica's slots. Such a lease is charged nobody's service (a grant while nobody
        # waits costs nothing), so its row keeps its first request's id.
        self.fast: dict[str, tuple[str, str]] = {}

    @property
    def pending(self) -> bool:
        return bool(self.later)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, the workers taking turns on a lock file first: SQLite's own
        wait for a busy file sleeps 1 ms, then 2, then 5, blocking the worker's loop each
        time, where a flock wakes the next worker as soon as the 30 us transaction ends."""
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    def ask(self, ask: Ask) -> tuple[str | None, list[str]]:
        waiter = ask.waiter
        now = time.time()
        if self.later and not (ask.rooms and self.policy.uses_rooms) and self._take_over(ask):
            return waiter.candidates[0], []
        with self._write() as db:
            woken = self._free_later(now)
            if not (ask.rooms and self.policy.uses_rooms) and not self._anyone_waits(ask.model):
                # Nobody waits for the model: the first candidate with a free slot, if any. (A
                # replica in a Room always asks the policy: its slot may not be open.)
                free = self._free(ask.slots)
                for endpoint in waiter.candidates:
                    if free.get(endpoint, 0) > 0:
                        self._lease(ask.model, waiter, endpoint, 0.0, self.pid, now, "")
                        if not ask.rooms:
                            self.fast[waiter.id] = (waiter.id, endpoint)
                        return endpoint, list(woken)
            mine, in_band = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(band = ?), 0) FROM waiting WHERE model = ? AND key = ?",
                (waiter.band, ask.model, waiter.key),
            ).fetchone()
            if mine >= ask.per_key:
                raise QueueFull(mine)
            ledger = self._ledger(ask.model)
            raised = not in_band and ledger.joined(waiter.key, waiter.band)
            db.execute(
                "INSERT INTO waiting VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    waiter.id, ask.model, waiter.key, waiter.band, waiter.share, waiter.since,
                    waiter.cost, encode_slots(ask.slots, ask.rooms), self.pid, now + LEASE_TTL,
                    _rooms_text(ask.rooms),
                ),
            )  # fmt: skip
            granted = woken | self._dispatch(ask.model, ledger, now)
            if raised:
                # Kept whatever was granted: saved only with a grant, a key that came back
                # while every slot was busy kept its old, lower service and jumped the line.
                self._save(ask.model, ledger, (waiter.key,))
        mine = granted.pop(waiter.id, "")
        return mine or None, list(granted)

    def granted(self, model: str, id: str) -> str | None:
        row = self.db.execute("SELECT endpoint FROM lease WHERE id = ?", (id,)).fetchone()
        return None if row is None else str(row[0])

    def give_back(self, model: str, id: str, correction: float = 0.0) -> list[str]:
        id, endpoint = self.fast.pop(id, (id, ""))
        if not correction and not self._anyone_waits(model):
            self.later[id] = (model, time.monotonic(), endpoint)
            return []
        return self._free_lease(model, id, correction, unqueue=False)

    def _take_over(self, ask: Ask) -> bool:
        """Hand a lease given back lazily to this request, when it is of the replica routing
        prefers above all and nobody waits for the model: what freeing it and taking a slot
        would have done, with one read instead of a transaction of seven statements."""
        waiter, model = ask.waiter, ask.model
        first = waiter.candidates[0]
        given = [id for id, (m, _, e) in self.later.items() if m == model and e == first]
        if not given:
            return False
        # Read, not written: a request another worker queues after this read waits behind
        # this one, as if it had come a moment later. The lease may have lapsed (a worker
        # stalled past LEASE_TTL) and been taken back: then the policy decides.
        (free,) = self.db.execute(
            "SELECT EXISTS (SELECT 1 FROM lease WHERE id = ?) AND NOT EXISTS "
            "(SELECT 1 FROM waiting WHERE model = ?)",
            (given[0], model),
        ).fetchone()
        if not free:
            return False
        del self.later[given[0]]
        self.fast[waiter.id] = (given[0], first)
        return True

    def flush(self, given_before: float = math.inf) -> list[str]:
        """Free the leases given back while nobody waited, if any was given back before
        `given_before` (with every other); the ids granted."""
        if not any(when <= given_before for _, when, _ in self.later.values()):
            return []
        with self._write():
            return list(self._free_later(time.time()))

    def _anyone_waits(self, model: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM waiting WHERE model = ? LIMIT 1", (model,)).fetchone() is not None
        )

    def leave(self, model: str, id: str) -> list[str]:
        return self._free_lease(model, id, 0.0, unqueue=True)

    def _free_lease(self, model: str, id: str, correction: float, unqueue: bool) -> list[str]:
        with self._write() as db:
            woken = self._free_later(time.time())
            if unqueue:
                db.execute("DELETE FROM waiting WHERE id = ?", (id,))
            row = db.execute(
                "DELETE FROM lease WHERE id = ? RETURNING key, share, cost, room, endpoint", (id,)
            ).fetchone()
            granted: dict[str, str] = {}
            if row is not None:
                key, share, cost, room, endpoint = row
                self._ready(room, endpoint)
                ledger: Ledger | None = None
                if cost and correction:
                    ledger = self._ledger(model)
                    ledger.charge(key, correction, share)
                    self._save(model, ledger, (key,))
                if self._anyone_waits(model):
                    granted = self._dispatch(model, ledger or self._ledger(model), time.time())
                if room:  # its Room may now be open to another model's replica
                    granted |= self._dispatch_room(room, model)
        return list(woken | granted)

    def dispatch(self, model: str) -> list[str]:
        with self._write():
            now = time.time()
            return list(self._free_later(now) | self._dispatch(model, self._ledger(model), now))

    def correct(self, model: str, key: str, share: float, correction: float) -> None:
        with self._write():
            ledger = self._ledger(model)
            ledger.charge(key, correction, share)
            self._save(model, ledger, (key,))

    def renew(self) -> None:
        until = time.time() + LEASE_TTL
        with self._write() as db:
            db.execute("UPDATE lease SET expires = ? WHERE pid = ?", (until, self.pid))
            db.execute("UPDATE waiting SET expires = ? WHERE pid = ?", (until, self.pid))

    def in_use(self, models: Iterable[str] = ()) -> dict[str, int]:
        """Slots in use per endpoint, over every worker."""
        return {
            str(e): int(n)
            for e, n in self.db.execute("SELECT endpoint, COUNT(*) FROM lease GROUP BY endpoint")
        }

    def waiting(self, models: Iterable[str] = ()) -> dict[str, int]:
        """Requests waiting per model, over every worker."""
        return {
            str(m): int(n) for m, n in self.db.execute("SELECT model, COUNT(*) FROM waiting GROUP BY model")
        }

    def close(self) -> None:
        self.db.close()
        os.close(self.lock)

    # Inside a transaction from here on.

    def _free_later(self, now: float) -> dict[str, str]:
        """Free the leases `give_back` left for this write; grant them to whoever waits now."""
        if not self.later:
            return {}
        later, self.later = self.later, {}
        for id in later:
            freed = self.db.execute("DELETE FROM lease WHERE id = ? RETURNING room, endpoint", (id,))
            for room, endpoint in freed.fetchall():
                self._ready(room, endpoint)
        granted: dict[str, str] = {}
        for model in {m for m, _, _ in later.values()}:
            if self._anyone_waits(model):
                granted |= self._dispatch(model, self._ledger(model), now)
        return granted

    def _free(self, slots: Mapping[str, int]) -> dict[str, int]:
        marks = ",".join("?" * len(slots))
        used = dict(
            self.db.execute(
                f"SELECT endpoint, COUNT(*) FROM lease WHERE endpoint IN ({marks}) GROUP BY endpoint",  # noqa: S608
                tuple(slots),
            ).fetchall()
        )
        return {e: n - used.get(e, 0) for e, n in slots.items()}

    def _lease(
        self, model: str, waiter: Waiter, endpoint: str, cost: float, pid: int, now: float, room: str
    ) -> None:
        self.db.execute(
            "INSERT INTO lease VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (waiter.id, model, endpoint, waiter.key, waiter.share, cost, pid, now + LEASE_TTL, room),
        )
        if room:  # a swap: the newly loaded replica is not ready until it gives a slot back
            self.db.execute(
                "INSERT INTO loaded VALUES (?, ?, NULL) ON CONFLICT (room) DO UPDATE SET "
                "endpoint = excluded.endpoint, ready = NULL WHERE endpoint != excluded.endpoint",
                (room, endpoint),
            )

    def _ready(self, room: str, endpoint: str) -> None:
        """A slot of `endpoint` given back: if it is its Room's loaded replica, it has loaded."""
        if room:
            self.db.execute(
                "UPDATE loaded SET ready = ? WHERE room = ? AND endpoint = ? AND ready IS NULL",
                (time.time(), room, endpoint),
            )

    def _dispatch_room(self, room: str, besides: str) -> dict[str, str]:
        """Dispatch the other models waiting for a replica in `room`."""
        models = self.db.execute(
            "SELECT DISTINCT model FROM waiting WHERE rooms LIKE ? AND model != ?", (f"%|{room}|%", besides)
        ).fetchall()
        granted: dict[str, str] = {}
        for (model,) in models:
            granted |= self._dispatch(model, self._ledger(model), time.time())
        return granted

    def _rooms(self, names: set[str], now: float) -> dict[str, Room]:
        """The Rooms named, by each endpoint in them: slots in use, the loaded replica, and
        the longest wait for each replica over every model."""
        out: dict[str, Room] = {}
        db = self.db
        for name in names:
            in_use = dict(
                db.execute("SELECT endpoint, COUNT(*) FROM lease WHERE room = ? GROUP BY endpoint", (name,))
            )
            loaded = db.execute("SELECT endpoint, ready FROM loaded WHERE room = ?", (name,)).fetchone()
            oldest: dict[str, float] = {}
            for text, since in db.execute(
                "SELECT slots, since FROM waiting WHERE rooms LIKE ?", (f"%|{name}|%",)
            ):
                for endpoint, r in decode_slots(text)[1].items():
                    if r == name and since < oldest.get(endpoint, math.inf):
                        oldest[endpoint] = since
            room = Room(in_use, loaded[0] if loaded else None, oldest, now, self.patience)
            room.ready = loaded[1] if loaded else 0.0
            for endpoint in {*in_use, *oldest, *([loaded[0]] if loaded else [])}:
                out[endpoint] = room
        return out

    def _ledger(self, model: str) -> Ledger:
        service: dict[str, float] = {}
        floor: dict[int, float] = {}
        for key, value in self.db.execute("SELECT key, v FROM service WHERE model = ?", (model,)):
            if key.startswith(_FLOOR):
                floor[int(key[len(_FLOOR) :])] = value
            else:
                service[key] = value
        return Ledger(service, floor)

    def _save(self, model: str, ledger: Ledger, keys: Iterable[str] | None = None) -> None:
        rows = [(model, k, v) for k, v in ledger.service.items() if keys is None or k in keys]
        if keys is None:
            rows += [(model, f"{_FLOOR}{band}", v) for band, v in ledger.floor.items()]
        self.db.executemany("INSERT OR REPLACE INTO service VALUES (?, ?, ?)", rows)

    def _reap(self, now: float) -> None:
        db = self.db
        db.execute("DELETE FROM lease WHERE expires < ?", (now,))
        db.execute("DELETE FROM waiting WHERE expires < ?", (now,))
        pids = {p for (p,) in db.execute("SELECT pid FROM lease UNION SELECT pid FROM waiting")}
        for pid in pids:
            if pid != self.pid and not alive(pid):
                # A worker killed outright (OOM, kill -9) gave nothing back: its slots are free now.
                db.execute("DELETE FROM lease WHERE pid = ?", (pid,))
                db.execute("DELETE FROM waiting WHERE pid = ?", (pid,))

    def _dispatch(self, model: str, ledger: Ledger, now: float) -> dict[str, str]:
        """Grant what is free to what waits for `model`: waiting id → endpoint."""
        db = self.db
        self._reap(now)
        rows = db.execute(
            "SELECT id, key, band, share, since, cost, slots, pid FROM waiting WHERE model = ?", (model,)
        ).fetchall()
        if not rows:
            return {}
        slots: dict[str, int] = {}
        in_rooms: dict[str, str] = {}
        waiters: list[Waiter] = []
        pids: dict[str, int] = {}
        for id, key, band, share, since, cost, text, pid in rows:
            theirs, rooms = decode_slots(text)
            slots.update(theirs)
            in_rooms.update(rooms)
            waiters.append(Waiter(id, key, band, share, since, cost, tuple(theirs)))
            pids[id] = pid
        free = self._free(slots)
        out: dict[str, str] = {}
        by_endpoint = (
            self._rooms(set(in_rooms.values()), now) if in_rooms and self.policy.uses_rooms else None
        )
        for waiter, endpoint in grants(waiters, free, ledger, self.policy, by_endpoint):
            db.execute("DELETE FROM waiting WHERE id = ?", (waiter.id,))
            self._lease(
                model, waiter, endpoint, waiter.cost, pids[waiter.id], now, in_rooms.get(endpoint, "")
            )
            out[waiter.id] = endpoint
        if out:
            self._save(model, ledger)
        return out


# A lease table holds a row per slot in use, a few hundred at most: scanned, it needs no index,
# and each index was one more page written by every request's transaction.
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lease (id TEXT PRIMARY KEY, model TEXT NOT NULL, "
    "endpoint TEXT NOT NULL, key TEXT NOT NULL, share REAL NOT NULL, cost REAL NOT NULL, "
    "pid INTEGER NOT NULL, expires REAL NOT NULL, room TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS waiting (id TEXT PRIMARY KEY, model TEXT NOT NULL, key TEXT NOT NULL, "
    "band INTEGER NOT NULL, share REAL NOT NULL, since REAL NOT NULL, cost REAL NOT NULL, "
    "slots TEXT NOT NULL, pid INTEGER NOT NULL, expires REAL NOT NULL, rooms TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loaded (room TEXT PRIMARY KEY, endpoint TEXT NOT NULL, ready REAL)",
    "CREATE INDEX IF NOT EXISTS waiting_model_key ON waiting (model, key)",
    "CREATE TABLE IF NOT EXISTS service (model TEXT NOT NULL, key TEXT NOT NULL, v REAL NOT NULL, "
    "PRIMARY KEY (model, key))",
)
