"""Background health checks: which replicas are in rotation, as this worker sees them.

llama.cpp and vLLM both answer GET /health, with 503 while the weights are still loading,
so "ready" is simply a 200. A replica leaves rotation after `failures` consecutive
failures, counting both probes and requests that could not connect, and comes back on
the first probe it answers: an engine that restarted is usable the moment it says so.

A replica that goes silent (a machine that lost power or its network: connects hang, or
are accepted and never answered) is marked down within a few seconds, not `failures`
rounds later: a probe that fails is asked again at once, RECHECK_S apart, until the
replica answers or is out. Requests already waiting on it for their first byte are then
cut (see `waiting`), and the proxy sends them to another replica: nothing has reached
their clients, and the silent replica would hold them for the whole first-byte allowance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import httpx

from llmgw.gateway.state import metrics
from llmgw.gateway.state.reload import PlanState
from llmgw.gateway.state.routes import Replica
from llmgw.gateway.upstream import Upstream

log = logging.getLogger("llmgw.gateway")
PROBES_AT_ONCE = 64
RECHECK_S = 0.25
RECHECKS = 5


class Health:
    def __init__(self, upstream: Upstream, failures: int, timeout: float) -> None:
        self.upstream = upstream
        self.failures = failures
        self.timeout = timeout
        # The first-byte clocks of requests waiting on each replica (by endpoint): run out
        # at once when it is marked down.
        self.clocks: dict[str, set[asyncio.Timeout]] = {}

    @contextlib.contextmanager
    def waiting(self, replica: Replica, clock: asyncio.Timeout) -> Iterator[None]:
        """While a request waits on `replica` for its first byte: `clock` runs out should the
        replica be marked down meanwhile."""
        clocks = self.clocks.setdefault(replica.endpoint, set())
        clocks.add(clock)
        try:
            yield
        finally:
            clocks.discard(clock)

    def failed(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        if replica.healthy and replica.failures >= self.failures:
            replica.healthy = False
            metrics.REPLICA_HEALTHY.labels(replica.endpoint).set(0)
            for clock in self.clocks.pop(replica.endpoint, ()):
                clock.reschedule(asyncio.get_running_loop().time())
            log.warning(
                "replica %s out of rotation after %d failures: %s",
                replica.endpoint,
                replica.failures,
                why,
            )

    def answered(self, replica: Replica) -> None:
        replica.failures = 0
        if not replica.healthy:
            replica.healthy = True
            metrics.REPLICA_HEALTHY.labels(replica.endpoint).set(1)
            log.info("replica %s back in rotation", replica.endpoint)

    async def probe(self, replica: Replica) -> None:
        await self._probe(replica)
        # Failing but still in rotation: asked again now, not a round later, so a silent
        # replica is out after `failures` probes' timeouts rather than `failures` rounds.
        # A few times at most: a plan asking for many failures must not hold up the round.
        for _ in range(min(self.failures, RECHECKS) - 1):
            if not (replica.healthy and replica.failures):
                return
            await asyncio.sleep(RECHECK_S)
            await self._probe(replica)

    async def _probe(self, replica: Replica) -> None:
        try:
            status = await self.upstream.status(replica.health_url, self.timeout)
        except httpx.HTTPError as exc:
            self.failed(replica, f"GET /health failed: {type(exc).__name__}")
            return
        if status == 200:
            self.answered(replica)
        else:
            self.failed(replica, f"GET /health answered {status}")

    async def watch(self, state: PlanState, interval: float) -> None:
        while True:
            try:
                # An on-demand replica is down while idle by design; its agent says when it runs.
                await self.round([r for r in state.table.every_replica().values() if r.agent is None])
            except Exception:  # a bug in one round must not stop checking for good
                log.exception("health check round failed")
            await asyncio.sleep(interval)

    async def round(self, replicas: list[Replica]) -> None:
        """Probe every replica once, a bounded number at a time: a 5,000-model plan's
        10,000 probes started at once queued every other event behind them, and /readyz
        took seconds to answer."""
        queue = iter(replicas)

        async def prober() -> None:
            for replica in queue:
                await self.probe(replica)

        await asyncio.gather(*(prober() for _ in range(min(PROBES_AT_ONCE, len(replicas)))))
