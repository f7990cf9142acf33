"""What is loaded where: which on-demand engines this worker takes as running now.

Two sources, the fresher first: each node's agent, asked every few seconds which engines are
ready (it knows what this worker's leases cannot: an eviction, another worker's or gateway's
start); and this worker's own leases (request/lease.py), which say an engine was answering
here lately. /v1/models and the dashboard say `loaded` from this.

It also keeps which agents are silent: an agent that does not answer a call within
LLMGW_AGENT_TIMEOUT is not asked for starts (request/lease.py passes its replicas over for
another node's) until it answers a /status poll, or a call, again.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from llmgw.gateway.state.reload import PlanState
from llmgw.plan import Plan

log = logging.getLogger("llmgw.gateway")


class Loaded:
    def __init__(self, agent_timeout: float = 2.0) -> None:
        self.agent_timeout = agent_timeout
        self.client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(agent_timeout))
        # Agents that did not answer their last call, and why, as a request's error says it.
        self.silent: dict[str, str] = {}
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
            answer = await self.client.get(agent.rstrip("/") + "/status")
        except httpx.TransportError as exc:
            self.lost(agent, exc)
            return
        except httpx.HTTPError:
            return
        self.back(agent)  # whatever it said, it answered
        try:
            replicas = answer.json()["replicas"]
            ready = frozenset(str(r["endpoint"]) for r in replicas if r.get("state") == "ready")
        except (ValueError, KeyError, TypeError):
            return  # unheard: its last answer goes stale, and this worker's own record decides
        self.heard[agent] = (time.monotonic(), ready)

    def lost(self, agent: str, exc: httpx.TransportError) -> str:
        """Take `agent` as silent after `exc`; why, as a sentence for a request's error."""
        if isinstance(exc, httpx.TimeoutException):
            kind = f"nothing within {self.agent_timeout:g}s"
        else:
            kind = type(exc).__name__
        if agent not in self.silent:
            log.warning(
                "agent at %s does not answer (%s): its on-demand replicas are passed over until it does",
                agent,
                kind,
            )
        why = self.silent[agent] = f"its node's agent at {agent} does not answer ({kind})."
        return why

    def back(self, agent: str) -> None:
        if self.silent.pop(agent, None) is not None:
            log.info("agent at %s answers again: its on-demand replicas may be started", agent)

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
