"""A request's place in line for a replica's slot: taken before the request is sent, given
back when its answer ends, however it ends.

The request path asks one question, `Ticket.take`, with the candidates routing prefers;
the answer is the replica to send to, once one of them has a free slot and this request is
the one the policy picks (policy.py). A request that waits learns of its grant at once: from
an event when a slot is given back in its own worker, and through its worker's wake-up socket
when another worker of the instance grants it (wakeups.py); polling the store every 10-25 ms
is the floor, for a grant made by another instance. It waits at most LLMGW_QUEUE_WAIT
seconds (then 503), and a key may have at most LLMGW_QUEUE_PER_KEY requests waiting for a
model (past that, 429 at once). A client that leaves while waiting leaves the line.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from llmgw.gateway.errors import ApiError, echo
from llmgw.gateway.schedule.policy import BANDS, Waiter
from llmgw.gateway.schedule.rooms import rooms_of
from llmgw.gateway.schedule.store import LEASE_TTL, Ask, QueueFull, Store
from llmgw.gateway.schedule.wakeups import Wakeups
from llmgw.gateway.state import metrics
from llmgw.plan import Plan

log = logging.getLogger("llmgw.gateway")

# A waiter first looks for its grant this soon, then less often, up to POLL_MOST: grants
# made in its own worker wake it at once, so polling only finds those of other workers.
POLL_FIRST = 0.01
POLL_MOST = 0.025
# How often a waiter runs the policy itself, to take back the slots of a holder that died
# without giving them back (on another machine: only once their lease lapses).
DISPATCH_EVERY = 0.5
# A slot given back while nobody waits is freed with the worker's next write, or after it
# has lain unused this long (found by a timer of this period, so at most twice this): what
# another worker may wait for it at most, when it starts waiting just then.
FLUSH_AFTER = 0.002


class Scheduler:
    """This worker's side of the shared line: its waiting requests' events, and the
    heartbeat that keeps its leases."""

    def __init__(self, store: Store, wait: float, per_key: int, shared: Path | None = None) -> None:
        self.store = store
        self.wait = wait
        self.per_key = per_key
        self.events: dict[str, asyncio.Event] = {}
        self._ids = itertools.count()
        self._prefix = f"{os.getpid()}.{os.urandom(3).hex()}."
        # Other workers of this instance, woken at once when this one grants their requests.
        self.wakeups = Wakeups(shared, self._prefix, self._woken) if shared is not None else None
        self._flushing = False
        self._rooms: tuple[str, dict[str, str]] = ("", {})

    def ticket(self, model: str, key: str, band: int, share: float, cost: float) -> Ticket:
        return Ticket(self, model, key, band, share, max(1.0, cost), f"{self._prefix}{next(self._ids)}")

    def rooms(self, plan: Plan) -> dict[str, str]:
        """The plan's on-demand replicas that take turns on a node (rooms.py), by endpoint:
        worked out once per plan."""
        if self._rooms[0] != plan.digest:
            self._rooms = (plan.digest, rooms_of(plan))
        return self._rooms[1]

    def gave_back(self, woken: list[str]) -> None:
        """After a give_back: wake who it granted, and free a lazily given back lease soon."""
        self.wake(woken)
        if self.store.pending and not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_later(FLUSH_AFTER, self._flush)

    def _flush(self) -> None:
        # Only what has lain given back for FLUSH_AFTER: under a steady stream a lease given
        # back is mostly taken over by the worker's next request before then, which a timer
        # armed by an earlier lease had freed (a write, then another to take a slot again).
        self._flushing = False
        try:
            self.wake(self.store.flush(given_before=time.monotonic() - FLUSH_AFTER))
        except Exception:  # the next write frees them; a lease lapses in any case
            log.exception("could not free given back slots")
            return  # not again every 2 ms: the next give_back tries again
        if self.store.pending:
            self._flushing = True
            asyncio.get_running_loop().call_later(FLUSH_AFTER, self._flush)

    def record(self, slots: Mapping[str, int], models: Iterable[str]) -> None:
        """Set the slot gauges for /metrics from the store, as it is scraped: the store
        counts every worker's (and instance's) slots, which no worker's own gauge could."""
        try:
            used = self.store.in_use(models)
        except Exception:
            log.exception("could not read the slots in use for /metrics")
            return
        for endpoint, total in slots.items():
            metrics.labelled(metrics.SLOTS, endpoint).set(total)
            metrics.labelled(metrics.SLOTS_IN_USE, endpoint).set(used.get(endpoint, 0))

    def waiting(self, models: Iterable[str]) -> dict[str, int]:
        """Requests waiting per model, over every worker: the dashboard's figure."""
        try:
            return self.store.waiting(models)
        except Exception:
            log.exception("could not read the requests waiting for the dashboard")
            return {}

    def wake(self, ids: list[str]) -> None:
        if not ids:
            return
        self._woken(ids)
        if self.wakeups is not None:
            self.wakeups.send(ids)

    def _woken(self, ids: list[str]) -> None:
        for id in ids:
            event = self.events.get(id)
            if event is not None:
                event.set()

    async def watch(self) -> None:
        """Listen for grants made by other workers, and renew this worker's leases and places
        in line, until the worker stops."""
        if self.wakeups is not None:
            self.wakeups.listen(asyncio.get_running_loop())
        try:
            await self._renew()
        finally:
            if self.wakeups is not None:
                self.wakeups.close()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL / 3)
            try:
                # On the loop, not in a thread: the store's connection is the loop's, and a
                # renewal run beside a request's transaction broke both.
                self.store.renew()
            except Exception:  # the next beat tries again; a lease lapses only after three
                log.exception("could not renew this worker's slots")


def band_of(priority: str | None, asked: str | None) -> int:
    """The band a request waits in: its key's, or lower when the request asks for lower
    (x-llmgw-priority); never higher. ApiError for a value that is not a band."""
    band = BANDS[priority or "normal"]
    if asked is None:
        return band
    wanted = BANDS.get(asked.strip().lower())
    if wanted is None:
        raise ApiError(
            400,
            f"x-llmgw-priority is {echo(asked)}; send high, normal or low (it can lower the key's "
            "priority for this request, never raise it).",
            param="x-llmgw-priority",
            code="invalid_priority",
        )
    return min(band, wanted)


class Ticket:
    """One request's place in line: its slot while it holds one, and when it first asked,
    which a retry on another replica keeps."""

    __slots__ = ("scheduler", "model", "key", "band", "share", "cost", "base", "tries", "id", "since",
                 "charged", "waited", "held")  # fmt: skip

    def __init__(
        self, scheduler: Scheduler, model: str, key: str, band: int, share: float, cost: float, base: str
    ) -> None:
        self.scheduler = scheduler
        self.model = model
        self.key = key
        self.band = band
        self.share = share
        self.cost = cost
        self.base = base
        self.tries = 0
        self.id: str | None = None  # the lease of the latest try
        self.held: set[str] = set()  # every lease not given back: a failed try's until it is dropped
        self.since = time.time()
        self.charged = 0.0  # service charged for it at its grant (none when nothing waited)
        self.waited = 0.0  # seconds spent waiting for slots, over every try

    async def take(self, slots: dict[str, int], rooms: dict[str, str] | None = None) -> str:
        """The endpoint of a free slot among `slots` (endpoint → slots it has, in routing's
        order), once it is this request's turn; ApiError 429 or 503 when it cannot be."""
        scheduler, store = self.scheduler, self.scheduler.store
        self.tries += 1
        id = f"{self.base}.{self.tries}"
        waiter = Waiter(id, self.key, self.band, self.share, self.since, self.cost, tuple(slots))
        try:
            endpoint, woken = store.ask(Ask(self.model, waiter, slots, scheduler.per_key, rooms or {}))
        except QueueFull as full:
            raise self._full(full.waiting) from None
        scheduler.wake(woken)
        if endpoint is not None:
            self.id = id
            self.held.add(id)
            return endpoint
        started = time.monotonic()
        waiting = metrics.labelled(metrics.QUEUE_WAITING, self.model, self.key)
        waiting.inc()
        try:
            endpoint = await self._wait(id, started)
        finally:
            waiting.dec()
            self.waited += time.monotonic() - started
            metrics.labelled(metrics.QUEUE_WAIT, self.model).observe(time.monotonic() - started)
        self.id = id
        self.held.add(id)
        self.charged = self.cost
        return endpoint

    async def _wait(self, id: str, started: float) -> str:
        scheduler, store = self.scheduler, self.scheduler.store
        event = scheduler.events[id] = asyncio.Event()
        deadline = started + scheduler.wait - self.waited
        pause = POLL_FIRST
        dispatched = started
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timeout()
                try:
                    async with asyncio.timeout(min(pause, left)):
                        await event.wait()
                except TimeoutError:
                    pass
                event.clear()
                endpoint = store.granted(self.model, id)
                if endpoint is not None:
                    return endpoint
                pause = min(pause * 1.5, POLL_MOST)
                if time.monotonic() - dispatched >= DISPATCH_EVERY:
                    dispatched = time.monotonic()
                    scheduler.wake(store.dispatch(self.model))
        except BaseException:
            # Gone (timed out, or the client left): out of line, and a slot granted just now
            # goes to the next in line.
            scheduler.wake(store.leave(self.model, id))
            raise
        finally:
            del scheduler.events[id]

    def give_back(self, id: str) -> None:
        """Free the slot taken under `id`, once: called as the answer ends, or as a try fails."""
        if id not in self.held:
            return  # given back already
        self.held.remove(id)
        if id == self.id:
            self.id = None
        try:
            self.scheduler.gave_back(self.scheduler.store.give_back(self.model, id))
        except Exception:  # an ended answer must not turn into an error; the lease lapses
            log.exception("could not give back slot %s of %s", id, self.model)

    def used(self, tokens: int) -> None:
        """The answer's real tokens: its key is charged the difference from the estimate
        its grant was charged (only a grant made while others waited was charged)."""
        if not self.charged or tokens <= 0 or tokens == self.charged:
            return
        correction, self.charged = tokens - self.charged, 0.0
        try:
            self.scheduler.store.correct(self.model, self.key, self.share, correction)
        except Exception:
            log.exception("could not charge %s's service for %s", self.key, self.model)

    def _timeout(self) -> ApiError:
        wait = self.scheduler.wait
        retry = str(max(1, min(30, math.ceil(wait / 4))))
        return ApiError(
            503,
            f"The model {self.model} was busy for {wait:g} s: every replica's slots were taken "
            "by requests ahead of this one. Retry in a little while, or ask the gateway's "
            "operator for more replicas (or a longer LLMGW_QUEUE_WAIT).",
            type="service_unavailable",
            code="queue_timeout",
            headers={"Retry-After": retry},
        )

    def _full(self, waiting: int) -> ApiError:
        limit = self.scheduler.per_key
        return ApiError(
            429,
            f"Key '{self.key}' already has {waiting} requests waiting for {self.model}, the most "
            f"one key may have waiting (LLMGW_QUEUE_PER_KEY={limit}); wait for some to be "
            "answered before sending more.",
            type="requests",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
