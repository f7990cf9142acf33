"""On-demand replicas: started when the gateway acquires them, stopped for room or when idle.

docs/on-demand.md is the contract with the gateway. In short: an acquire starts the engine
if it is not running (concurrent acquires share one start), waits for its health check and
gives a lease; a lease is a request in flight, and an engine holding one is never stopped.
Before a start, room is made by memory: the least recently used on-demand engines without
leases are stopped until the new one fits beside the node's always-on replicas by the plan's
figures and by what the machine really has free (MemAvailable), since the plan's figures
alone once let a model start into a machine whose page cache and other tenants had taken it.

An acquire or release that cannot be done is a `Refusal`, answered to the gateway as HTTP
with the sentence and its fields (status.py):

    Refusal        400  a body the agent cannot read
      NotOnDemand    404  the endpoint is always on, or no replica of this node's plan
      NoRoom         409  it does not fit, or its GPUs are held by engines with leases
      EngineNotReady 503  it was not ready in time, or failed to start
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from llmgw.errors import ServiceError
from llmgw.node.agent import Agent
from llmgw.node.host import available_gb
from llmgw.node.runner import Runner

log = logging.getLogger("llmgw.node")


class Refusal(ServiceError):
    """An acquire or release that cannot be done, as the HTTP answer the gateway reads."""

    status = 400

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


class NotOnDemand(Refusal):
    status = 404


class NoRoom(Refusal):
    status = 409


class EngineNotReady(Refusal):
    status = 503


@dataclass(frozen=True)
class Granted:
    lease: str
    started: bool  # this acquire (or one it waited with) started the engine


@dataclass(frozen=True)
class LeasedEngine:
    """A running on-demand engine as making room sees it."""

    key: str
    name: str  # model/profile, for the sentences
    gb: float  # node memory by the plan; 0 for a GPU profile, whose figure is GPU memory
    gpu_ids: frozenset[int]
    busy: str  # why it cannot be stopped ("2 requests in flight"), or "" when it can
    last_used: float  # monotonic; least recently used goes first


def engines_to_stop(
    need: LeasedEngine, capacity_gb: float, running: list[LeasedEngine], free_gb: float | None
) -> list[LeasedEngine]:
    """The least recently used idle engines whose stopping lets `need` start, or NoRoom.

    Nothing is stopped unless stopping is enough: a refusal after an eviction would have
    cost a loaded model for nothing. Engines on the GPUs `need` is given go whatever their
    age, because vLLM takes its share of a GPU's whole memory, not its model's size.
    """
    chosen = [e for e in running if e.gpu_ids & need.gpu_ids]
    if held := [e for e in chosen if e.busy]:
        raise NoRoom(_holders(need, held, f"GPU {sorted(need.gpu_ids)} is held by"))
    room = capacity_gb - sum(e.gb for e in running) + sum(e.gb for e in chosen)
    free = None if free_gb is None or not need.gb else free_gb + sum(e.gb for e in chosen)

    def short() -> bool:
        return room < need.gb or (free is not None and free < need.gb)

    for engine in sorted((e for e in running if not e.busy and e not in chosen), key=lambda e: e.last_used):
        if not short():
            break
        chosen.append(engine)
        room += engine.gb
        free = None if free is None else free + engine.gb
    if short():
        raise NoRoom(_no_room(need, capacity_gb, running, room, free))
    return chosen


def _holders(need: LeasedEngine, held: list[LeasedEngine], lead: str) -> str:
    names = ", ".join(f"{e.name} ({e.gb:g} GB, {e.busy})" for e in held)
    return (
        f"no room for {need.name} on this node: {lead} {names}, which is never stopped while it "
        "has requests in flight. Try another replica, or ask again when its requests end."
    )


def _no_room(
    need: LeasedEngine, capacity_gb: float, running: list[LeasedEngine], room: float, free: float | None
) -> str:
    held = [e for e in running if e.busy]
    if room < need.gb:
        lead = (
            f"it needs {need.gb:g} GB of the {capacity_gb:g} GB the plan leaves beside the "
            "always-on replicas, and"
        )
        if held:
            return _holders(need, held, lead)
        return f"no room for {need.name} on this node: {lead} nothing else holds it."
    return (
        f"no room for {need.name} on this node: it needs {need.gb:g} GB and the machine has "
        f"{free or 0:.1f} GB available (MemAvailable) even with every idle on-demand engine stopped; "
        "other processes hold the rest. Free memory on this machine, or try another replica."
    )


class OnDemand:
    """Acquire, release, and the once-a-second look at leases and idle times."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.leases: dict[str, Runner] = {}
        # Held while the memory figures change (a start, a stop for room, an idle stop), so
        # two starts never both count the same free memory.
        self.room = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    def runner_for(self, endpoint: str) -> Runner:
        for runner in self.agent.runners.values():
            if runner.want.replica.endpoint == endpoint.rstrip("/"):
                if not runner.on_demand:
                    raise NotOnDemand(
                        f"{endpoint} is an always-on replica of this node: send requests to it directly."
                    )
                return runner
        raise NotOnDemand(
            f"{endpoint} is not a replica of node {self.agent.settings.node} in plan "
            f"{self.agent.plan.digest if self.agent.plan else '(none)'}; the gateway may follow another plan."
        )

    async def acquire(self, endpoint: str, wait_s: float) -> Granted:
        runner = self.runner_for(endpoint)
        if not runner.active and runner.backing_off():
            raise EngineNotReady(
                f"{runner.message} It is started again in {math.ceil(runner.backing_off())} s at the "
                "earliest; its fallbacks, if any, answer meanwhile.",
                state="failed",
                retry_in=math.ceil(runner.backing_off()),
            )
        runner.waiters += 1
        started = left = False
        try:
            if not runner.active:
                async with self.room:
                    if not runner.active:  # another acquire started it while this one waited
                        # A caller that does not wait may start an engine into free room,
                        # never stop a loaded one for it: a request whose client left at
                        # once cost a loaded model and served nothing.
                        await self._make_room(runner, evict=wait_s > 0)
                        runner.wake()
                        started = True
            if not await runner.wait_ready(wait_s):
                raise EngineNotReady(
                    runner.message or f"{runner.want.model.name} was not ready within {wait_s:g} s.",
                    state="failed" if runner.backing_off() else runner.state,
                )
            return Granted(self._lease(runner), started)
        except asyncio.CancelledError:  # the caller's connection closed (see status.py)
            left = True
            raise
        finally:
            runner.waiters -= 1
            if not runner.wanted and runner.state != "ready":
                # In a task of its own: a cancelled request must not cut the stop short.
                self._in_background(self._give_up(runner, left))

    async def _give_up(self, runner: Runner, left: bool) -> None:
        """The last caller of a start went without a lease. One that left (its client gone)
        abandons the start: a client that leaves starts nothing. A failure is not retried
        for nobody, and keeps its message. A start still loading when its caller's wait ran
        out keeps loading, since the gateway asks again; its idle time stops it if not."""
        async with self.room:
            if runner.wanted or not runner.active or runner.state == "ready":
                return
            if runner.state in ("failed", "backoff"):
                await runner.park(runner.message)
            elif left:
                log.info("%s: every caller left before it was ready; stopping it", runner.want.key)
                await runner.park("its start was abandoned: every caller left before it was ready")

    def _lease(self, runner: Runner) -> str:
        lease = secrets.token_urlsafe(16)
        runner.leases[lease] = time.monotonic() + self.agent.settings.lease_ttl_s
        self.leases[lease] = runner
        return lease

    def release(self, lease: str) -> None:
        """A lease unknown here (lapsed, or its replica replaced by a plan) is released already."""
        runner = self.leases.pop(lease, None)
        if runner is None:
            return
        runner.leases.pop(lease, None)
        if not runner.leases:
            runner.idle_since = time.monotonic()
            runner.last_used = time.time()

    async def _make_room(self, runner: Runner, evict: bool = True) -> None:
        need = _engine(runner)
        running = [
            _engine(r) for r in self.agent.runners.values() if r.on_demand and r.active and r is not runner
        ]
        victims = engines_to_stop(need, self.capacity_gb(), running, available_gb())
        if victims and not evict:
            names = ", ".join(v.name for v in victims)
            raise EngineNotReady(
                f"{need.name} is not started: it needs {names} stopped to make room, which is "
                "done only for a caller that waits; ask again with wait_s above 0.",
                state=runner.state,
            )
        for victim in victims:
            # Checked before each eviction: a caller gone while the lock was awaited (or
            # while an earlier engine stopped) must cost nobody a loaded model.
            _still_wanted()
            stopped = self.agent.runners[victim.key]
            log.info("%s evicted to make room for %s", stopped.want.key, runner.want.key)
            stopped.evictions += 1
            await stopped.park(f"evicted to make room for {runner.want.model.name}")

    def capacity_gb(self) -> float:
        """The node's memory less what its always-on replicas take, by the plan."""
        node = self.agent.plan.node(self.agent.settings.node) if self.agent.plan else None
        if node is None:
            return 0.0
        return float(node.memory_gb) - float(node.used.memory_gb)

    def memory(self) -> dict[str, float | None]:
        node = self.agent.plan.node(self.agent.settings.node) if self.agent.plan else None
        running = sum(_engine(r).gb for r in self.agent.runners.values() if r.on_demand and r.active)
        free = available_gb()
        return {
            "total_gb": float(node.memory_gb) if node else None,
            "always_on_gb": float(node.used.memory_gb) if node else None,
            "on_demand_gb": round(running, 3),
            "available_gb": None if free is None else round(free, 3),
        }

    async def tend(self) -> None:
        """Forever: lapse the leases their gateways never released, stop the idle engines."""
        while True:
            await asyncio.sleep(self.agent.settings.tick_s)
            self.lapse_leases()
            for runner in list(self.agent.runners.values()):
                if self._idle_for(runner) is not None:
                    await self._stop_idle(runner)

    def lapse_leases(self) -> None:
        now = time.monotonic()
        for lease, runner in list(self.leases.items()):
            if runner.leases.get(lease, 0.0) <= now:
                log.warning(
                    "%s: a lease lapsed after %g s unreleased (its gateway may have died)",
                    runner.want.key,
                    self.agent.settings.lease_ttl_s,
                )
                self.release(lease)

    def _idle_for(self, runner: Runner) -> float | None:
        """How long a running on-demand engine has been past its idle time, or None."""
        stop_after = runner.want.profile.idle_stop_s
        if not runner.on_demand or stop_after is None or not runner.active or runner.wanted:
            return None
        idle = time.monotonic() - runner.idle_since
        return idle if idle >= stop_after else None

    async def _stop_idle(self, runner: Runner) -> None:
        async with self.room:
            if self._idle_for(runner) is None:  # acquired while this waited for the lock
                return
            runner.idle_stops += 1
            await runner.park(f"stopped after {runner.want.profile.idle_stop_s} s without requests")

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _still_wanted() -> None:
    """Raise CancelledError when this acquire's caller has gone (its task is being
    cancelled, see status.py's CancelOnDisconnect), even if that was absorbed on the way."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _engine(runner: Runner) -> LeasedEngine:
    profile = runner.want.profile
    gb = float(profile.memory.gb) if profile.memory is not None else 0.0
    busy = ""
    if runner.leases:
        busy = f"{len(runner.leases)} request(s) in flight"
    elif runner.waiters:
        busy = f"starting for {runner.waiters} request(s)"
    return LeasedEngine(
        key=runner.want.key,
        name=f"{runner.want.model.name}/{profile.name}",
        gb=0.0 if profile.gpus else gb,
        gpu_ids=frozenset(runner.want.replica.gpu_ids),
        busy=busy,
        last_used=runner.idle_since,
    )
