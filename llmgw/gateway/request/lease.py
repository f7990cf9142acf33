"""An on-demand replica's lease: ask the node's agent to start the engine, hold the request meanwhile.

A request for an on-demand replica first takes a lease from the replica's agent
(docs/on-demand.md): the agent starts the engine if it is idle, making room by stopping idle
ones, and answers once the engine is ready. The lease counts the request in flight on the
agent's side, which is how the agent knows never to stop an engine that is answering; it is
given back when the answer ends, however it ends, through the request's `InFlight` hold.

An agent that stops answering (its machine gone dark) costs one request at most
LLMGW_AGENT_TIMEOUT beyond the wait it asked for; from then on the agent is taken as silent
and not asked for starts, so requests go to another node that can serve the model, until
the agent answers its /status poll again.

The wait is bounded by LLMGW_LOAD_TIMEOUT. How many wait is the scheduler's to bound: a
request asks for a lease only once it holds one of the replica's slots (gateway/schedule/),
so the rest wait in their keys' queues (LLMGW_QUEUE_PER_KEY, LLMGW_QUEUE_WAIT). The queue of
its own this path had per model (LLMGW_MAX_HELD) let one key fill it and every other key's
request for the model be refused.

Each lease taken and given back is noted in state/loaded.py, which says what is loaded where.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import httpx

from llmgw.errors import ServiceError
from llmgw.gateway.errors import ApiError
from llmgw.gateway.state import metrics
from llmgw.gateway.state.loaded import Loaded
from llmgw.gateway.state.routes import Replica

log = logging.getLogger("llmgw.gateway")

# Each call to the agent waits at most this long, so a client that leaves is noticed, and a
# 409 (no room yet) is asked again, at least this often.
ASK_EVERY_S = 10.0
BUSY_RETRY_S = 1.0


class AgentSilent(ServiceError):
    """The replica's agent does not answer: another node's replica may be asked instead."""


class EngineFailed(ServiceError):
    """The replica's engine failed to start, and its agent waits out a backoff before trying
    again: another replica, or the model's fallback, is asked instead of waiting for it."""


class Leases:
    """This worker's leases of on-demand engines from their agents."""

    def __init__(
        self,
        load_timeout: float,
        loaded: Loaded,
        token: str | None = None,
        agent_timeout: float = 2.0,
    ) -> None:
        self.load_timeout = load_timeout
        self.loaded = loaded
        self.token = token  # one token for every agent; None: each node's (loaded.headers_for)
        self.agent_timeout = agent_timeout
        self.client = httpx.AsyncClient(trust_env=False, timeout=agent_timeout)
        self.releases: set[asyncio.Task[None]] = set()

    def _headers(self, agent: str) -> dict[str, str]:
        if self.token is not None:
            return {"Authorization": f"Bearer {self.token}"}
        return self.loaded.headers_for(agent)

    async def lease(self, model: str, replica: Replica) -> str:
        """The lease id once the replica's engine is ready; ApiError when it cannot be had."""
        lease = await self._lease(model, replica)
        self.loaded.took(replica.endpoint)
        return lease

    async def _lease(self, model: str, replica: Replica) -> str:
        assert replica.agent is not None
        silent = self.loaded.silent.get(replica.agent)
        if silent is not None:
            raise AgentSilent(silent)
        started = time.monotonic()
        # First without waiting: a running engine answers at once, and a request to it is
        # not held. An idle one starts on this call (the agent keeps loading it), and the
        # request then waits for it.
        lease, said, _ = await self._ask(model, replica, 0.0)
        if lease is not None:
            return lease
        metrics.labelled(metrics.HELD, model).inc()
        try:
            return await self._wait(model, replica, started, said)
        finally:
            metrics.labelled(metrics.HELD, model).dec()
            metrics.labelled(metrics.LOAD_WAIT, model).observe(time.monotonic() - started)

    async def _wait(self, model: str, replica: Replica, started: float, said: str) -> str:
        while True:
            left = self.load_timeout - (time.monotonic() - started)
            if left <= 0:
                raise ApiError(
                    503,
                    f"{model} did not become ready within {self.load_timeout:g}s on {replica.endpoint} "
                    f"(its agent says: {said}). Retry later; the agent's /status and log say more.",
                    type="service_unavailable",
                    code="model_loading",
                    headers={"Retry-After": str(max(1, math.ceil(self.load_timeout / 4)))},
                )
            wait = min(left, ASK_EVERY_S)
            lease, said, no_room = await self._ask(model, replica, wait)
            if lease is not None:
                return lease
            if no_room:  # answered at once: wait for a busy engine to finish before asking again
                await asyncio.sleep(min(BUSY_RETRY_S, max(left - wait, 0.0)) or BUSY_RETRY_S)

    async def _ask(self, model: str, replica: Replica, wait: float) -> tuple[str | None, str, bool]:
        """One acquire: the lease when ready; else None, what the agent said, and whether it
        said there is no room yet (409) rather than still loading (503). ApiError when asking
        again cannot help."""
        agent = replica.agent
        assert agent is not None
        try:
            answer = await self.client.post(
                f"{replica.agent}/acquire",
                json={"endpoint": replica.endpoint, "wait_s": wait},
                headers=self._headers(agent),
                # The agent answers within `wait`; past that, and the allowance, it is silent.
                timeout=httpx.Timeout(wait + self.agent_timeout, connect=self.agent_timeout),
            )
        except httpx.TransportError as exc:
            raise AgentSilent(self.loaded.lost(agent, exc)) from None
        except httpx.HTTPError as exc:
            raise ApiError(
                502,
                f"{model} starts on demand, and its node's agent at {replica.agent} cannot be "
                f"reached ({type(exc).__name__}); start `llmgw node` there, bound where the "
                "gateway reaches it (--status-bind).",
                type="upstream_error",
                code="agent_unreachable",
            ) from None
        self.loaded.back(agent)
        body = _json(answer)
        if answer.status_code == 200 and isinstance(body.get("lease"), str):
            return str(body["lease"]), "", False
        said = str(body.get("message") or body.get("state") or f"HTTP {answer.status_code}")
        if answer.status_code == 503 and body.get("state") == "failed":
            raise EngineFailed(said)
        if answer.status_code in (503, 409):
            return None, said, answer.status_code == 409
        if answer.status_code in (401, 403):
            raise ApiError(
                502,
                f"the agent at {replica.agent} refused to start {model} ({said}); give the "
                "gateway the agent's token (LLMGW_AGENT_TOKEN, or its node's line in "
                "LLMGW_AGENT_TOKENS_FILE).",
                type="upstream_error",
                code="agent_refused",
            )
        raise ApiError(
            502,
            f"the agent at {replica.agent} answered {answer.status_code} when asked to start "
            f"{model}: {said}",
            type="upstream_error",
            code="agent_refused",
        )

    def release(self, replica: Replica, lease: str) -> None:
        """Give the lease back without making the answer wait for it."""
        self.loaded.gave_back(replica.endpoint)
        task = asyncio.get_running_loop().create_task(self._release(replica, lease))
        self.releases.add(task)
        task.add_done_callback(self.releases.discard)

    async def _release(self, replica: Replica, lease: str) -> None:
        try:
            await self.client.post(
                f"{replica.agent}/release", json={"lease": lease}, headers=self._headers(replica.agent or "")
            )
        except httpx.HTTPError as exc:
            # The agent lets a lease lapse on its own (LLMGW_LEASE_TTL): the engine is only
            # kept from its idle stop that long.
            log.warning("could not give lease %s back to %s: %r", lease, replica.agent, exc)

    async def aclose(self) -> None:
        await asyncio.gather(*self.releases, return_exceptions=True)
        await self.client.aclose()


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
