"""Which waiting request takes a free slot next: a pure function of what waits, what is free
and the `Policy` that orders them.

A policy is an object chosen by name (LLMGW_SCHEDULER, looked up in schedule/policies.py), one
module each: fair.py (shares and priorities, the default) and fifo.py (arrival order, the
reference bench/fairness.py compares against). Both stores take one and ask it only what it
decides: which placeable request goes first, and whether on-demand rooms shape its grants.
Everything else here (candidates, rooms, the ledger's service and floors) holds under any policy.

On-demand replicas that share a node with room for one of them at a time form a `Room`: a
slot of one is open only while no other in the room has a slot in use, since granting it
makes the node's agent stop the other to start this one. What waits for the loaded replica
is served first, so bursts alternating A, B cost a few swaps, not one each; but once a
request for another replica has waited `patience`, the loaded one gets no new slots, its
requests in flight finish, and the other is started: nobody waits past the patience and one
drain, however steady the loaded model's stream.

A request may be placed only on its own candidates (the replicas routing prefers, minus
those a retry already tried), so the best request that cannot be placed does not block one
behind it that can: a slot is never left idle while something waiting could use it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

BANDS = {"high": 2, "normal": 1, "low": 0}


@dataclass(frozen=True)
class Waiter:
    """One request waiting for a slot."""

    id: str
    key: str
    band: int
    share: float
    since: float  # when it first asked: kept across retries, so a retry keeps its place
    cost: float  # charged to its key's service when it is granted a slot
    candidates: tuple[str, ...]  # endpoints, routing's preference first


@dataclass
class Ledger:
    """One model's virtual service: per key, and each band's floor (the start of the last
    grant), below which a key that comes back from idle is raised."""

    service: MutableMapping[str, float]
    floor: MutableMapping[int, float]

    def joined(self, key: str, band: int) -> bool:
        """A key starts waiting after having nothing waiting in `band`; whether it was raised,
        which the store must keep whether or not a slot is granted now."""
        floor = self.floor.get(band, 0.0)
        if self.service.get(key, 0.0) < floor:
            self.service[key] = floor
            return True
        return False

    def charge(self, key: str, cost: float, share: float) -> None:
        self.service[key] = self.service.get(key, 0.0) + cost / max(share, 1e-9)


@dataclass
class Room:
    """On-demand replicas on one node with room for one of them at a time."""

    in_use: MutableMapping[str, int]  # endpoint → its slots in use now
    loaded: str | None  # the replica granted a slot last: the one its agent has running
    oldest: Mapping[str, float]  # endpoint → when its longest-waiting request first asked
    now: float
    patience: float
    # When the loaded replica first gave a slot back in its turn: its engine had loaded. Waits
    # count from then, not through the load: a load longer than `patience` would otherwise
    # end every turn as soon as it began, a start for every request or two.
    ready: float | None = 0.0

    def _waited_long(self, since: float) -> bool:
        return self.ready is not None and self.now - max(since, self.ready) >= self.patience

    def open_to(self, endpoint: str) -> bool:
        """Whether a slot of `endpoint` may be granted now."""
        if any(n > 0 for e, n in self.in_use.items() if e != endpoint):
            return False  # another is running with requests: it must drain first
        starving = any(e != endpoint and self._waited_long(t) for e, t in self.oldest.items())
        if self.in_use.get(endpoint, 0) > 0 or endpoint == self.loaded or self.loaded is None:
            return not starving
        # A swap: only when the loaded one has nobody waiting, or this one has waited long.
        mine = self.oldest.get(endpoint)
        return self.loaded not in self.oldest or (mine is not None and self._waited_long(mine))

    def granted(self, endpoint: str) -> None:
        self.in_use[endpoint] = self.in_use.get(endpoint, 0) + 1
        if endpoint != self.loaded:
            self.ready = None
        self.loaded = endpoint


class Policy(ABC):
    """The order in which waiting requests take free slots. A new policy is one module with a
    subclass of this, and one line in schedule/policies.py."""

    name: ClassVar[str]
    summary: ClassVar[str]  # for the sentence that refuses an unknown LLMGW_SCHEDULER
    # Whether on-demand replicas that share a node's room are granted as a `Room` (the loaded
    # one first, others after `patience`), rather than in the policy's own order.
    uses_rooms: ClassVar[bool]

    @abstractmethod
    def first(self, placed: Sequence[tuple[Waiter, str]], ledger: Ledger) -> tuple[Waiter, str]:
        """The request granted next among those that can be placed, each with its endpoint;
        `placed` is in arrival order."""


def grants(
    waiting: Iterable[Waiter],
    free: MutableMapping[str, int],
    ledger: Ledger,
    policy: Policy,
    rooms: Mapping[str, Room] | None = None,
) -> list[tuple[Waiter, str]]:
    """Who gets which free slot, in the order granted; `free`, `ledger` and `rooms` (by
    endpoint, for the replicas in one) are updated."""
    left = sorted(waiting, key=lambda w: (w.since, w.id))
    out: list[tuple[Waiter, str]] = []
    while left and any(n > 0 for n in free.values()):
        placed = [(w, e) for w in left if (e := _first_free(w, free, rooms)) is not None]
        if not placed:
            break
        waiter, endpoint = policy.first(placed, ledger)
        free[endpoint] -= 1
        if rooms and endpoint in rooms:
            rooms[endpoint].granted(endpoint)
        start = ledger.service.get(waiter.key, 0.0)
        if start > ledger.floor.get(waiter.band, 0.0):
            ledger.floor[waiter.band] = start
        ledger.charge(waiter.key, waiter.cost, waiter.share)
        left.remove(waiter)
        out.append((waiter, endpoint))
    return out


def _first_free(waiter: Waiter, free: Mapping[str, int], rooms: Mapping[str, Room] | None) -> str | None:
    for endpoint in waiter.candidates:
        if free.get(endpoint, 0) > 0 and (
            not rooms or endpoint not in rooms or rooms[endpoint].open_to(endpoint)
        ):
            return endpoint
    return None
