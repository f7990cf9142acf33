"""Background health checks: which replicas are in rotation, as this worker sees them.

llama.cpp and vLLM both answer GET /health, with 503 while the weights are still loading,
so "ready" is simply a 200. A replica leaves rotation after `failures` consecutive
failures, counting both probes and requests that could not connect, and comes back on
the first probe it answers: an engine that restarted is usable the moment it says so.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from llmgw.gateway.state import metrics
from llmgw.gateway.state.reload import PlanState
from llmgw.gateway.state.routes import Replica
from llmgw.gateway.upstream import Upstream

log = logging.getLogger("llmgw.gateway")
PROBES_AT_ONCE = 64


class Health:
    def __init__(self, upstream: Upstream, failures: int, timeout: float) -> None:
        self.upstream = upstream
        self.failures = failures
        self.timeout = timeout

    def failed(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        if replica.healthy and replica.failures >= self.failures:
            replica.healthy = False
            metrics.REPLICA_HEALTHY.labels(replica.endpoint).set(0)
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
