"""Slots in use and requests waiting, held across every gateway instance on Redis (or Valkey),
when LLMGW_REDIS_URL names one: the same interface as store.py's, so N instances behind a
load balancer send a replica no more than its slots, and serve one line per model.

Per model, three hashes: its leases (id → replica, key, holder, when it lapses), its waiting
requests, and its keys' virtual service. The common cases are one Lua script each, one round
trip: taking a free slot when nobody waits, and giving one back when nobody waits. Anything
that runs the policy (policy.py) reads the model's hashes under WATCH, decides in Python,
and writes in MULTI/EXEC, which Redis applies only if no other instance changed them
meanwhile (else it is read and decided again): one decision for every instance, without a
second copy of the policy in Lua.

Instances are on other machines, so a dead holder is known only by its leases lapsing:
each worker renews its own every LEASE_TTL / 3 seconds.

On-demand replicas that take turns on a node (a Room, policy.py) share a hash naming the
loaded replica and when it first answered, and a set of the models with replicas in it; a
decision for one of those models reads (and WATCHes) the Room and its other models' lines
too, as the SQLite store reads them in its one transaction. Rooms need one Redis (or
Valkey) server, not a Cluster: their transaction spans several models' keys.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from llmgw.gateway.schedule.fair import FAIR
from llmgw.gateway.schedule.policy import Ledger, Policy, Room, Waiter, grants
from llmgw.gateway.schedule.store import LEASE_TTL, Ask, QueueFull, Store

log = logging.getLogger("llmgw.gateway")
PREFIX = "llmgw:schedule:"
_FLOOR = "\x00band:"
T = TypeVar("T")

# KEYS: waiting, leases. ARGV: now, id, lease (JSON), then endpoint, slots pairs in order.
# Nobody waiting and a candidate with a free slot: that slot, leased. Else '' (run the policy).
_TAKE = """
if redis.call('HLEN', KEYS[1]) > 0 then return '' end
local now = tonumber(ARGV[1])
local used = {}
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local lease = cjson.decode(all[i + 1])
  if lease.x < now then redis.call('HDEL', KEYS[2], all[i])
  else used[lease.e] = (used[lease.e] or 0) + 1 end
end
for i = 4, #ARGV, 2 do
  if (used[ARGV[i]] or 0) < tonumber(ARGV[i + 1]) then
    local lease = cjson.decode(ARGV[3])
    lease.e = ARGV[i]
    redis.call('HSET', KEYS[2], ARGV[2], cjson.encode(lease))
    return ARGV[i]
  end
end
return ''
"""

# KEYS: waiting, leases. ARGV: id. The lease freed; how many wait (then the policy runs).
_GIVE_BACK = """
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('HLEN', KEYS[1])
"""

# KEYS: waiting, leases. ARGV: until, ids. This worker's leases and places kept from lapsing.
_RENEW = """
for i = 2, #ARGV do
  for k = 1, 2 do
    local v = redis.call('HGET', KEYS[k], ARGV[i])
    if v then
      local entry = cjson.decode(v)
      entry.x = tonumber(ARGV[1])
      redis.call('HSET', KEYS[k], ARGV[i], cjson.encode(entry))
    end
  end
end
"""


class RedisStore:
    """Every instance's workers, on one Redis."""

    def __init__(self, url: str, timeout: float = 0.1, patience: float = 5.0, policy: Policy = FAIR) -> None:
        self.policy = policy
        self.patience = patience
        self.holder = f"{os.uname().nodename}:{os.getpid()}"
        self.redis = redis.Redis.from_url(
            url,
            # As the rate limits wait for it (LLMGW_REDIS_TIMEOUT), and never again: a Redis
            # that does not answer must cost a request at most that, then the local line.
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=30,
        )
        self._take = self.redis.register_script(_TAKE)
        self._give_back = self.redis.register_script(_GIVE_BACK)
        self._renew = self.redis.register_script(_RENEW)
        # What this worker holds or waits for, per model: what its heartbeat renews.
        self.mine: dict[str, set[str]] = {}
        # Those of them asked for replicas in a Room: giving one back may open the Room.
        self.roomed: set[str] = set()

    @staticmethod
    def _keys(model: str) -> tuple[str, str, str]:
        # One hash tag per model: a Redis Cluster keeps a model's three hashes on one shard.
        tag = f"{PREFIX}{{{model}}}:"
        return tag + "waiting", tag + "leases", tag + "service"

    def _lease(self, waiter: Waiter, endpoint: str, cost: float, holder: str, now: float) -> str:
        return json.dumps(
            {"e": endpoint, "k": waiter.key, "s": waiter.share, "c": cost, "h": holder, "x": now + LEASE_TTL}
        )

    def ask(self, ask: Ask) -> tuple[str | None, list[str]]:
        waiting, leases, _ = self._keys(ask.model)
        waiter, now = ask.waiter, time.time()
        pairs = [str(v) for e in waiter.candidates for v in (e, ask.slots[e])]
        roomed = bool(ask.rooms) and self.policy.uses_rooms
        if roomed:
            # A replica in a Room always asks the policy: its slot may not be open.
            self.roomed.add(waiter.id)
        else:
            lease = self._lease(waiter, "", 0.0, self.holder, now)
            taken = self._take(keys=[waiting, leases], args=[now, waiter.id, lease, *pairs])
            if taken:
                self.mine.setdefault(ask.model, set()).add(waiter.id)
                return taken.decode(), []
        granted = self._decide(ask.model, lambda state: state.join(ask, self.holder, now))
        self.mine.setdefault(ask.model, set()).add(waiter.id)
        mine = granted.pop(waiter.id, "")
        return mine or None, list(granted)

    def granted(self, model: str, id: str) -> str | None:
        found = self.redis.hget(self._keys(model)[1], id)
        return None if found is None else str(json.loads(found)["e"])

    def give_back(self, model: str, id: str, correction: float = 0.0) -> list[str]:
        waiting, leases, _ = self._keys(model)
        self._forget(model, id)
        if id in self.roomed:
            return self._free_in_room(model, id)
        if not self._give_back(keys=[waiting, leases], args=[id]):
            return []
        return list(self._decide(model, lambda state: None))

    def leave(self, model: str, id: str) -> list[str]:
        self._forget(model, id)
        if id in self.roomed:
            return self._free_in_room(model, id)
        return list(self._decide(model, lambda state: state.drop(id)))

    def _free_in_room(self, model: str, id: str) -> list[str]:
        """Free a request's place or slot in a Room; then the Room's other models may go."""
        self.roomed.discard(id)
        freed: set[str] = set()

        def release(state: _State) -> None:
            freed.update(state.release(id))

        granted = self._decide(model, release)
        for name in freed:
            for other in sorted(self._members(name) - {model}):
                granted |= self._decide(other, lambda state: None)
        return list(granted)

    def _members(self, room: str) -> set[str]:
        members: Iterable[bytes] = self.redis.smembers(_room_keys(room)[1])  # type: ignore[assignment]
        return {m.decode() for m in members}

    def dispatch(self, model: str) -> list[str]:
        return list(self._decide(model, lambda state: None))

    def correct(self, model: str, key: str, share: float, correction: float) -> None:
        self.redis.hincrbyfloat(self._keys(model)[2], key, correction / max(share, 1e-9))

    def renew(self) -> None:
        until = time.time() + LEASE_TTL
        for model, ids in list(self.mine.items()):
            if ids:
                waiting, leases, _ = self._keys(model)
                self._renew(keys=[waiting, leases], args=[until, *ids])

    pending = False  # every give_back is written at once

    def in_use(self, models: Iterable[str]) -> dict[str, int]:
        names = list(models)
        now = time.time()
        with self.redis.pipeline(transaction=False) as pipe:
            for model in names:
                pipe.hvals(self._keys(model)[1])
            answers = pipe.execute()
        used: dict[str, int] = {}
        for values in answers:
            for value in values:
                lease = json.loads(value)
                if lease["x"] >= now:
                    used[lease["e"]] = used.get(lease["e"], 0) + 1
        return used

    def waiting(self, models: Iterable[str]) -> dict[str, int]:
        names = list(models)
        with self.redis.pipeline(transaction=False) as pipe:
            for model in names:
                pipe.hlen(self._keys(model)[0])
            answers = pipe.execute()
        return {m: int(n) for m, n in zip(names, answers, strict=True) if n}

    def flush(self, given_before: float = math.inf) -> list[str]:
        return []

    def close(self) -> None:
        self.redis.close()

    def forget(self, model: str, id: str) -> None:
        """This worker renews the request's lease or place no more: on Redis it lapses within
        LEASE_TTL, whether or not it is ever given back."""
        self._forget(model, id)

    def _forget(self, model: str, id: str) -> None:
        ids = self.mine.get(model)
        if ids is not None:
            ids.discard(id)

    def _decide(self, model: str, change: Callable[[_State], None]) -> dict[str, str]:
        """Read the model's line under WATCH, `change` it, run the policy, and write it all
        at once; again if another instance wrote first. Waiting id → endpoint granted."""
        keys = self._keys(model)
        with self.redis.pipeline() as pipe:
            for _ in range(50):
                try:
                    pipe.watch(*keys)  # type: ignore[no-untyped-call]
                    state = _State(model, *(pipe.hgetall(k) for k in keys))
                    change(state)
                    now = time.time()
                    rooms = self._rooms(pipe, state, now) if self.policy.uses_rooms else None
                    granted = state.dispatch(now, self.policy, rooms)
                    pipe.multi()
                    state.write(pipe, keys)
                    if rooms is not None:
                        rooms.write(pipe, model, state.joined_rooms)
                    pipe.execute()
                    return granted
                except redis.WatchError:
                    continue
        raise redis.RedisError(f"the line of {model} kept changing under 50 tries")

    def _rooms(self, pipe: Any, state: _State, now: float) -> _Rooms | None:
        """The Rooms the model's line names, read under WATCH with their other models' lines:
        slots in use and the longest waits over every model, and the loaded replica."""
        names = state.rooms()
        if not names:
            return None
        rooms = _Rooms()
        for name in sorted(names):
            room_key, members_key = _room_keys(name)
            pipe.watch(room_key, members_key)
            loaded = {k.decode(): v.decode() for k, v in pipe.hgetall(room_key).items()}
            lines = [(state.waiting, state.leases)]
            for other in sorted({m.decode() for m in pipe.smembers(members_key)} - {state.model}):
                waiting, leases, _ = self._keys(other)
                pipe.watch(waiting, leases)
                lines.append(
                    (
                        {k.decode(): json.loads(v) for k, v in pipe.hgetall(waiting).items()},
                        {k.decode(): json.loads(v) for k, v in pipe.hgetall(leases).items()},
                    )
                )
            in_use: dict[str, int] = {}
            oldest: dict[str, float] = {}
            for waiting_line, lease_line in lines:
                for lease in lease_line.values():
                    if lease.get("r") == name and lease["x"] >= now:
                        in_use[lease["e"]] = in_use.get(lease["e"], 0) + 1
                for w in waiting_line.values():
                    for endpoint, r in w.get("r", {}).items():
                        if r == name and w["x"] >= now and w["t"] < oldest.get(endpoint, float("inf")):
                            oldest[endpoint] = float(w["t"])
            endpoint = loaded.get("loaded") or None
            room = Room(in_use, endpoint, oldest, now, self.patience)
            ready = loaded.get("ready", "")
            room.ready = float(ready) if ready else (None if endpoint else 0.0)
            if endpoint is not None and room.ready is None and (name, endpoint) in state.freed:
                room.ready = now  # its first slot given back: the engine has loaded
            rooms.rooms[name] = room
        return rooms


class _State:
    """One model's line as read under WATCH, and what is to change in it."""

    def __init__(
        self, model: str, waiting: dict[Any, Any], leases: dict[Any, Any], service: dict[Any, Any]
    ) -> None:
        self.model = model
        self.waiting = {k.decode(): json.loads(v) for k, v in waiting.items()}
        self.leases = {k.decode(): json.loads(v) for k, v in leases.items()}
        ledger = Ledger({}, {})
        for k, v in service.items():
            name = k.decode()
            if name.startswith(_FLOOR):
                ledger.floor[int(name[len(_FLOOR) :])] = float(v)
            else:
                ledger.service[name] = float(v)
        self.ledger = ledger
        self.put_waiting: dict[str, str] = {}
        self.del_waiting: set[str] = set()
        self.put_leases: dict[str, str] = {}
        self.del_leases: set[str] = set()
        self.joined_rooms: set[str] = set()  # Rooms this model is to be named a member of
        self.freed: set[tuple[str, str]] = set()  # (Room, endpoint) of a lease given back
        self.raised = False  # a key back from idle was raised to its band's floor: written

    def rooms(self) -> set[str]:
        """The Rooms its waiting requests and leases are in, and those it gave a slot back to."""
        named = {str(r) for w in self.waiting.values() for r in w.get("r", {}).values()}
        named |= {str(lease["r"]) for lease in self.leases.values() if lease.get("r")}
        return named | {room for room, _ in self.freed} | self.joined_rooms

    def release(self, id: str) -> set[str]:
        """Drop a request's place or lease; the Rooms it freed a slot or a place in."""
        lease = self.leases.get(id)
        entry = self.waiting.get(id)
        self.drop(id)
        if lease is not None and lease.get("r"):
            self.freed.add((str(lease["r"]), str(lease["e"])))
            return {str(lease["r"])}
        return {str(r) for r in (entry or {}).get("r", {}).values()}

    def join(self, ask: Ask, holder: str, now: float) -> None:
        waiter = ask.waiter
        theirs = [w for w in self.waiting.values() if w["k"] == waiter.key]
        if len(theirs) >= ask.per_key:
            raise QueueFull(len(theirs))
        if not any(w["b"] == waiter.band for w in theirs):
            self.raised |= self.ledger.joined(waiter.key, waiter.band)
        entry = {
            "k": waiter.key, "b": waiter.band, "s": waiter.share, "t": waiter.since, "c": waiter.cost,
            "slots": [[e, ask.slots[e]] for e in waiter.candidates], "h": holder, "x": now + LEASE_TTL,
        }  # fmt: skip
        if ask.rooms:
            entry["r"] = dict(ask.rooms)
            self.joined_rooms |= set(ask.rooms.values())
        self.waiting[waiter.id] = entry
        self.put_waiting[waiter.id] = json.dumps(entry)

    def drop(self, id: str) -> None:
        if self.waiting.pop(id, None) is not None:
            self.del_waiting.add(id)
        if self.leases.pop(id, None) is not None:
            self.del_leases.add(id)

    def dispatch(self, now: float, policy: Policy, rooms: _Rooms | None = None) -> dict[str, str]:
        for id in [i for i, w in self.waiting.items() if w["x"] < now]:
            self.drop(id)
        for id in [i for i, lease in self.leases.items() if lease["x"] < now]:
            self.drop(id)
        if not self.waiting:
            return {}
        slots: dict[str, int] = {}
        in_rooms: dict[str, str] = {}
        waiters = []
        for id, w in self.waiting.items():
            theirs = {str(e): int(n) for e, n in w["slots"]}
            slots.update(theirs)
            in_rooms.update(w.get("r", {}))
            waiters.append(
                Waiter(id, w["k"], int(w["b"]), float(w["s"]), float(w["t"]), float(w["c"]), tuple(theirs))
            )
        used: dict[str, int] = {}
        for lease in self.leases.values():
            used[lease["e"]] = used.get(lease["e"], 0) + 1
        free = {e: n - used.get(e, 0) for e, n in slots.items()}
        out: dict[str, str] = {}
        by_endpoint = rooms.by_endpoint() if rooms is not None and in_rooms else None
        for waiter, endpoint in grants(waiters, free, self.ledger, policy, by_endpoint):
            holder = self.waiting.pop(waiter.id)["h"]
            self.put_waiting.pop(waiter.id, None)
            self.del_waiting.add(waiter.id)
            lease = {"e": endpoint, "k": waiter.key, "s": waiter.share, "c": waiter.cost, "h": holder,
                     "x": now + LEASE_TTL}  # fmt: skip
            if endpoint in in_rooms:
                lease["r"] = in_rooms[endpoint]
            self.put_leases[waiter.id] = json.dumps(lease)
            out[waiter.id] = endpoint
        return out

    def write(self, pipe: Any, keys: tuple[str, str, str]) -> None:
        waiting, leases, service = keys
        if self.del_waiting:
            pipe.hdel(waiting, *self.del_waiting)
        if self.put_waiting:
            pipe.hset(waiting, mapping=self.put_waiting)
        if self.del_leases:
            pipe.hdel(leases, *self.del_leases)
        if self.put_leases:
            pipe.hset(leases, mapping=self.put_leases)
        if self.put_leases or self.raised:
            values = {**self.ledger.service, **{f"{_FLOOR}{b}": v for b, v in self.ledger.floor.items()}}
            pipe.hset(service, mapping=values)


def _room_keys(room: str) -> tuple[str, str]:
    """A Room's hash (its loaded replica, and when that first answered) and its models' set."""
    tag = f"{PREFIX}room:{{{room}}}"
    return tag, tag + ":models"


class _Rooms:
    """The Rooms one decision read, to run the policy in and to write back as they ended."""

    def __init__(self) -> None:
        self.rooms: dict[str, Room] = {}

    def by_endpoint(self) -> dict[str, Room]:
        out: dict[str, Room] = {}
        for room in self.rooms.values():
            for endpoint in {*room.in_use, *room.oldest, *([room.loaded] if room.loaded else [])}:
                out[endpoint] = room
        return out

    def write(self, pipe: Any, model: str, joined: set[str]) -> None:
        """The Rooms as the decision left them; `model` named a member of those it `joined`."""
        for name, room in self.rooms.items():
            room_key, members_key = _room_keys(name)
            if room.loaded is not None:
                ready = "" if room.ready is None else repr(room.ready)
                pipe.hset(room_key, mapping={"loaded": room.loaded, "ready": ready})
            if name in joined:
                pipe.sadd(members_key, model)


# Redis unreachable: this instance's workers schedule among themselves, on their SQLite file,
# and Redis is asked again this many seconds later rather than at every request.
RETRY_EVERY = 3.0


class Shared:
    """Redis while it answers; this instance's own store while it does not, so a Redis
    outage costs the fleet its shared line (each instance then holds each replica to its
    slots alone), never its answers. Each request's lease stays where it was taken."""

    def __init__(self, shared: RedisStore, local: Store) -> None:
        self.shared = shared
        self.local = local
        self.where: dict[str, Store] = {}
        # What each request waiting on Redis asked: asked again of the local line, in its
        # place (its first arrival), should Redis stop answering while it waits.
        self.asks: dict[str, Ask] = {}
        self.down_until = 0.0
        self.reason: str | None = None
        # Leases and places given up while Redis did not answer: given back when it answers
        # again (they lapse within LEASE_TTL anyway, being renewed no more). Once, a give-back
        # skipped during a 2.5 s outage left its lease renewed by the heartbeat for good: the
        # replica's slots stayed taken with its engine idle, and every later request got 503.
        self.owed: dict[str, tuple[str, float, bool]] = {}  # id → model, correction, left

    def _store(self, id: str) -> Store:
        return self.where.get(id, self.shared)

    def _guard(self, call: Callable[[], T], fallback: Callable[[], T]) -> T:
        if time.monotonic() < self.down_until:
            return fallback()
        try:
            result = call()
        except QueueFull:
            raise  # the key's answer, not Redis failing
        except Exception as exc:  # noqa: BLE001 - down, frozen, or answering nonsense: all one to a request
            self.down_until = time.monotonic() + RETRY_EVERY
            if self.reason is None:
                log.error("scheduling on this instance alone: Redis failed (%s)", type(exc).__name__)
            self.reason = f"Redis failed ({type(exc).__name__})"
            return fallback()
        self.reason = None
        return result

    def ask(self, ask: Ask) -> tuple[str | None, list[str]]:
        def on(store: Store) -> Callable[[], tuple[str | None, list[str]]]:
            def run() -> tuple[str | None, list[str]]:
                self.where[ask.waiter.id] = store
                endpoint, woken = store.ask(ask)
                if endpoint is None and store is self.shared:
                    self.asks[ask.waiter.id] = ask
                return endpoint, woken

            return run

        return self._guard(on(self.shared), on(self.local))

    def granted(self, model: str, id: str) -> str | None:
        if self.where.get(id) is self.local:
            return self.local.granted(model, id)
        found = self._guard(lambda: self.shared.granted(model, id), lambda: self._moved(id))
        if found is not None:
            self.asks.pop(id, None)
        return found

    def _moved(self, id: str) -> str | None:
        """A request waiting on Redis while Redis fails: it joins the local line instead, in
        its place, rather than wait out LLMGW_QUEUE_WAIT for a grant that cannot come."""
        ask = self.asks.pop(id, None)
        if ask is None:
            return None
        self.where[id] = self.local
        try:
            return self.local.ask(ask)[0]
        except QueueFull:
            return None

    def give_back(self, model: str, id: str, correction: float = 0.0) -> list[str]:
        store = self.where.pop(id, self.shared)
        self.asks.pop(id, None)
        if store is self.local:
            return store.give_back(model, id, correction)
        return self._settle(model, id, correction, left=False)

    def leave(self, model: str, id: str) -> list[str]:
        store = self.where.pop(id, self.shared)
        self.asks.pop(id, None)
        if store is self.local:
            return store.leave(model, id)
        return self._settle(model, id, 0.0, left=True)

    def _settle(self, model: str, id: str, correction: float, left: bool) -> list[str]:
        """Give a Redis lease or place back now, or owe it until Redis answers."""
        self.shared.forget(model, id)

        def owe() -> list[str]:
            self.owed[id] = (model, correction, left)
            return []

        def run() -> list[str]:
            if left:
                return self.shared.leave(model, id)
            return self.shared.give_back(model, id, correction)

        return self._guard(run, owe)

    def _pay(self) -> list[str]:
        """Give back what was owed while Redis was out; the ids granted meanwhile."""
        granted: list[str] = []
        for id, (model, correction, left) in list(self.owed.items()):
            del self.owed[id]
            before = self.down_until
            granted += self._settle(model, id, correction, left)
            if self.down_until != before:  # Redis failed again: the rest wait for next time
                break
        return granted

    def dispatch(self, model: str) -> list[str]:
        paid = self._pay() if self.owed and time.monotonic() >= self.down_until else []
        return paid + self.local.dispatch(model) + self._guard(lambda: self.shared.dispatch(model), list)

    def correct(self, model: str, key: str, share: float, correction: float) -> None:
        self._guard(lambda: self.shared.correct(model, key, share, correction), lambda: None)

    @property
    def pending(self) -> bool:
        return self.local.pending

    def flush(self, given_before: float = math.inf) -> list[str]:
        return self.local.flush(given_before)

    def in_use(self, models: Iterable[str]) -> dict[str, int]:
        names = list(models)
        local = self.local.in_use(names)
        shared: dict[str, int] = self._guard(lambda: self.shared.in_use(names), lambda: {})
        return {e: local.get(e, 0) + shared.get(e, 0) for e in {*local, *shared}}

    def waiting(self, models: Iterable[str]) -> dict[str, int]:
        names = list(models)
        local = self.local.waiting(names)
        shared: dict[str, int] = self._guard(lambda: self.shared.waiting(names), lambda: {})
        return {m: local.get(m, 0) + shared.get(m, 0) for m in {*local, *shared}}

    def renew(self) -> None:
        self.local.renew()
        self._guard(self.shared.renew, lambda: None)
        if self.owed and time.monotonic() >= self.down_until:
            self._pay()

    def close(self) -> None:
        self.shared.close()
        self.local.close()
