"""What is loaded where: which on-demand engines this worker takes as running now.

Two sources, the fresher first: each node's agent, asked every few seconds which engines are
ready (it knows what this worker's leases cannot: an eviction, another worker's or gateway's
start); and this worker's own leases (request/lease.py), which say an engine was answering
here lately. /v1/models and the dashboard say `loaded` from this.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from llmgw.gateway.state.reload import PlanState
from llmgw.plan import Plan


class Loaded:
    def __init__(self) -> None:
        self.client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(2.0))
        # What this worker knows of which on-demand engines are loaded: leases it holds per
        # endpoint, and when it last took or gave one back. The agent stops an engine only
        # after its idle time without requests (or to make room), so an engine leased within
        # that time is taken as loaded: what /v1/models and the dashboard say.
        self.leased: dict[str, int] = {}
        self.last_used: dict[str, float] = {}
        # What each node's agent said is ready, and when: it knows what this worker's leases
        # cannot, an eviction and another worker's (or gateway's) start. Used while fresh.
        self.heard: dict[str, tuple[float, frozenset[str]]] = {}
        self.hear_every = 2.0

    def took(self, endpoint: str) -> None:
        """A lease on the engine at `endpoint` was granted to this worker."""
        self.leased[endpoint] = self.leased.get(endpoint, 0) + 1
        self.last_used[endpoint] = time.monotonic()

    def gave_back(self, endpoint: str) -> None:
        self.leased[endpoint] = max(0, self.leased.get(endpoint, 0) - 1)
        self.last_used[endpoint] = time.monotonic()

    async def watch(self, state: PlanState, interval: float) -> None:
        """Ask each on-demand node's agent, every `interval` seconds, which engines are ready."""
        self.hear_every = interval
        while True:
            agents = {n.agent for n in state.table.plan.nodes if n.agent}
            await asyncio.gather(*(self._hear(a) for a in sorted(agents)))
            await asyncio.sleep(interval)

    async def _hear(self, agent: str) -> None:
        try:
            answer = await self.client.get(agent.rstrip("/") + "/status", timeout=2.0)
            replicas = answer.json()["replicas"]
            ready = frozenset(str(r["endpoint"]) for r in replicas if r.get("state") == "ready")
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return  # unheard: its last answer goes stale, and this worker's own record decides
        self.heard[agent] = (time.monotonic(), ready)

    def loaded(self, endpoint: str, idle_stop_s: float | None, agent: str | None = None) -> bool:
        """Whether the on-demand engine at `endpoint` is loaded: answering a request of this
        worker's now, or ready by its agent's last answer while that is fresh; without a
        fresh answer, used by this worker within its idle time."""
        if self.leased.get(endpoint, 0) > 0:
            return True
        heard = self.heard.get(agent) if agent else None
        if heard is not None and time.monotonic() - heard[0] < 3 * self.hear_every:
            return endpoint in heard[1]
        used = self.last_used.get(endpoint)
        return used is not None and time.monotonic() - used < (idle_stop_s or 0)

    def loaded_now(self, plan: Plan) -> frozenset[str]:
        """The plan's on-demand replicas loaded now, by endpoint."""
        agents = {n.name: n.agent for n in plan.nodes}
        return frozenset(
            r.endpoint
            for m in plan.models
            for p in m.profiles
            if p.on_demand
            for r in p.replicas
            if self.loaded(r.endpoint, p.idle_stop_s, agents.get(r.node or ""))
        )

    async def aclose(self) -> None:
        await self.client.aclose()
