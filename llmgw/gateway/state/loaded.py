"""What is loaded where: which on-demand engines this worker takes as running now.

Two sources, the fresher first: each node's agent, followed by a /status that answers as soon
as an engine's state changes (it knows what this worker's leases cannot: an eviction, another
worker's or gateway's start); and this worker's own leases (request/lease.py), which say an
engine was answering here lately. /v1/models and the dashboard say `loaded` from this.

It also keeps each engine's credential (node/credentials.py): an agent tells it with its
/status to a caller that sends the agent's token, and the gateway sends it on every request to
the engine, so an engine answers the gateway alone.

It also keeps which agents are silent: an agent that does not answer a call within
LLMGW_AGENT_TIMEOUT is not asked for starts (request/lease.py passes its replicas over for
another node's) until it answers a /status poll, or a call, again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import httpx

from llmgw.gateway.state.reload import PlanState
from llmgw.plan import Plan
from llmgw.status import agent_urls
from llmgw.tokens import agent_tokens_from

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
        # Each engine's key by its endpoint, as the agents told them; the agents to ask.
        self.credentials: dict[str, str] = {}
        self.agents: frozenset[str] = frozenset()
        self.plan: Plan | None = None
        self._nodes: tuple[str, dict[str, str]] = ("", {})  # plan digest, agent URL → node
        self.tokens = agent_tokens_from(os.environ)

    def took(self, endpoint: str) -> None:
        """A lease on the engine at `endpoint` was granted to this worker."""
        self.leased[endpoint] = self.leased.get(endpoint, 0) + 1
        self.last_used[endpoint] = time.monotonic()

    def gave_back(self, endpoint: str) -> None:
        self.leased[endpoint] = max(0, self.leased.get(endpoint, 0) - 1)
        self.last_used[endpoint] = time.monotonic()

    async def watch(self, state: PlanState, interval: float) -> None:
        """Follow each on-demand node's agent: its /status answers at once when an engine's
        state changes, or after `interval` seconds when none did."""
        self.hear_every = interval
        following: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                agents = {n.agent for n in state.table.plan.nodes if n.agent}
                self.plan = state.table.plan
                for agent in following.keys() - agents:  # a plan without it
                    following.pop(agent).cancel()
                    self.heard.pop(agent, None)
                for agent in sorted(agents - following.keys()):
                    following[agent] = asyncio.get_running_loop().create_task(self._follow(agent, interval))
                await asyncio.sleep(min(interval, 1.0))
        finally:
            for task in following.values():
                task.cancel()

    async def _follow(self, agent: str, interval: float) -> None:
        seen: int | None = None
        while True:
            began = time.monotonic()
            seen = await self._hear(agent, seen, interval)
            if seen is None:  # no answer, or an agent that does not wait: ask again in a while
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))

    async def _hear(self, agent: str, seen: int | None, wait: float) -> int | None:
        """Ask `agent` which engines are ready, waiting up to `wait` s for a change past `seen`;
        the change count it answered with, or None."""
        url = agent.rstrip("/") + "/status"
        params = {} if seen is None else {"after": str(seen), "wait": f"{wait:g}"}
        try:
            # The wait is the agent's; only time beyond it counts against the agent.
            timeout = httpx.Timeout(self.agent_timeout, read=self.agent_timeout + (wait if params else 0.0))
            headers = self.headers_for(agent)
            answer = await self.client.get(url, params=params, timeout=timeout, headers=headers)
        except httpx.TransportError as exc:
            self.lost(agent, exc)
            return None
        except httpx.HTTPError:
            return None
        self.back(agent)  # whatever it said, it answered
        try:
            document = answer.json()
            replicas = document["replicas"]
            ready = frozenset(str(r["endpoint"]) for r in replicas if r.get("state") == "ready")
        except (ValueError, KeyError, TypeError):
            return None  # unheard: its last answer goes stale, and this worker's own record decides
        self.heard[agent] = (time.monotonic(), ready)
        keys = document.get("credentials")
        if isinstance(keys, dict):
            self.credentials.update({str(e): str(k) for e, k in keys.items() if isinstance(k, str)})
        changes = document.get("changes")
        return changes if isinstance(changes, int) and not isinstance(changes, bool) else None

    def headers_for(self, agent: str) -> dict[str, str]:
        """The Authorization an agent takes: its node's own token, else the one token."""
        token = self.tokens.for_node(self._node_of(agent))
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _node_of(self, agent: str) -> str | None:
        """The node whose agent listens at `agent`: worked out once per plan, not per call."""
        plan = self.plan
        if plan is None:
            return None
        if self._nodes[0] != plan.digest:
            urls = agent_urls(plan)
            by_agent = {(n.agent or urls[n.name]).rstrip("/"): n.name for n in reversed(plan.nodes)}
            self._nodes = (plan.digest, by_agent)
        return self._nodes[1].get(agent.rstrip("/"))

    def credential(self, endpoint: str) -> str | None:
        return self.credentials.get(endpoint)

    async def learn_credentials(self, endpoint: str) -> bool:
        """Ask every agent once for its engines' keys, as an engine refused the one this
        worker had (or it had none yet: a new plan, or an engine started since); whether a
        different key for `endpoint` is now known."""
        before = self.credentials.get(endpoint)
        if not self.tokens.any or self.plan is None:
            return False
        # Every node's agent, not only those with on-demand replicas the plan names: an
        # always-on engine has a key too, and the agent that started it knows it.
        agents = {n.agent for n in self.plan.nodes if n.agent} | set(agent_urls(self.plan).values())
        await asyncio.gather(*(self._hear(agent, None, 0.0) for agent in sorted(agents)))
        return self.credentials.get(endpoint) not in (None, before)

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
