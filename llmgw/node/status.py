"""The agent's HTTP face: GET /status (JSON) and GET /metrics (Prometheus), open to anyone
who can reach them; POST /acquire and POST /release (docs/on-demand.md), for the gateway
only, with the bearer token in LLMGW_AGENT_TOKEN."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any

import falcon
import falcon.asgi
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.node.agent import Agent
from llmgw.node.leases import OnDemand, Refusal

# An acquire or release body is a line of JSON; anything bigger is not from the gateway.
BODY_LIMIT = 16 * 1024
WAIT_MAX_S = 3600.0
STATUS_WAIT_MAX_S = 60.0

STATES = (
    "idle",
    "pending",
    "downloading",
    "starting",
    "loading",
    "ready",
    "backoff",
    "failed",
    "stopping",
    "stopped",
)


class _AgentCollector(Collector):
    """Read at scrape time, so a replica the plan dropped leaves no stale series behind."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        labels = ["model", "profile", "endpoint", "state"]
        state = GaugeMetricFamily(
            "llmgw_node_replica_state", "1 for the state each replica is in.", labels=labels
        )
        restarts = CounterMetricFamily(
            "llmgw_node_replica_restarts", "Engine restarts after an exit or failure.", labels=labels[:3]
        )
        starts = CounterMetricFamily(
            "llmgw_node_replica_starts", "Engine processes this agent started.", labels=labels[:3]
        )
        evictions = CounterMetricFamily(
            "llmgw_node_replica_evictions",
            "Times an idle on-demand engine was stopped to make room for another.",
            labels=labels[:3],
        )
        idle_stops = CounterMetricFamily(
            "llmgw_node_replica_idle_stops",
            "Times an on-demand engine was stopped after its idle time without requests.",
            labels=labels[:3],
        )
        load = GaugeMetricFamily(
            "llmgw_node_replica_load_seconds",
            "The last start's seconds from launch to ready.",
            labels=labels[:3],
        )
        in_flight = GaugeMetricFamily(
            "llmgw_node_replica_in_flight", "Leases held on an on-demand engine.", labels=labels[:3]
        )
        for runner in self.agent.runners.values():
            want = runner.want
            base = [want.model.name, want.profile.name, want.replica.endpoint]
            for name in STATES:
                state.add_metric([*base, name], 1.0 if runner.state == name else 0.0)
            restarts.add_metric(base, runner.restarts)
            starts.add_metric(base, runner.starts)
            if runner.on_demand:
                evictions.add_metric(base, runner.evictions)
                idle_stops.add_metric(base, runner.idle_stops)
                in_flight.add_metric(base, len(runner.leases))
            if runner.load_s is not None:
                load.add_metric(base, runner.load_s)
        yield from (state, restarts, starts, evictions, idle_stops, load, in_flight)
        yield CounterMetricFamily(
            "llmgw_node_download_bytes",
            "Weight bytes downloaded by this agent.",
            value=self.agent.counters.download_bytes,
        )


class _Status:
    def __init__(self, agent: Agent, demand: OnDemand, token: str | None) -> None:
        self.agent = agent
        self.demand = demand
        self.token = token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        # ?after=N&wait=S: answer once the state has changed past count N (the `changes` of an
        # earlier answer), or after S seconds: a gateway learns of a swap as it happens.
        seen = req.get_param_as_int("after", min_value=0)
        if seen is not None:
            wait = req.get_param_as_float("wait", min_value=0.0, max_value=STATUS_WAIT_MAX_S) or 0.0
            if not math.isfinite(wait):
                # nan passes every comparison with the bounds: it was held 69 s past the cap.
                raise falcon.HTTPBadRequest(
                    description=f"wait must be a number of seconds from 0 to {STATUS_WAIT_MAX_S:g}."
                )
            await self.agent.counters.wait_past(seen, wait)
        resp.content_type = falcon.MEDIA_JSON
        document = {**self.agent.status(), "memory": self.demand.memory()}
        if self.token and _authorized(req, self.token):
            # The engines' keys, to the gateway alone: it asks with the token.
            document["credentials"] = self.agent.credentials()
        resp.data = json.dumps(document, indent=2).encode()


class _Denied(Refusal):
    status = 401


class _NoToken(Refusal):
    status = 403


def _authorized(req: falcon.asgi.Request, token: str) -> bool:
    given = (req.get_header("Authorization") or "").removeprefix("Bearer ").strip()
    # Constant time, so the answer's timing does not tell how much of a guess was right.
    return hmac.compare_digest(given.encode(), token.encode())


def _authorize(req: falcon.asgi.Request, token: str | None) -> None:
    if not token:
        raise _NoToken(
            "this agent takes no control calls: set LLMGW_AGENT_TOKEN in its environment (and the "
            "same token in the gateway's), then restart it."
        )
    if not _authorized(req, token):
        raise _Denied("send Authorization: Bearer with this agent's LLMGW_AGENT_TOKEN.")


async def _body(req: falcon.asgi.Request) -> dict[str, Any]:
    raw = await req.stream.read(BODY_LIMIT + 1)
    if len(raw) > BODY_LIMIT:
        raise Refusal(
            f"the body is over {BODY_LIMIT} bytes; send one JSON object as docs/on-demand.md shows."
        )
    try:
        doc = json.loads(raw or b"null")
    except ValueError:
        raise Refusal("the body is not JSON; send one JSON object as docs/on-demand.md shows.") from None
    if not isinstance(doc, dict):
        raise Refusal("the body must be a JSON object, as docs/on-demand.md shows.")
    return doc


class _Acquire:
    def __init__(self, demand: OnDemand, token: str | None) -> None:
        self.demand = demand
        self.token = token

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        _authorize(req, self.token)
        doc = await _body(req)
        endpoint, wait_s = doc.get("endpoint"), doc.get("wait_s", 120)
        if not isinstance(endpoint, str) or not endpoint:
            raise Refusal('"endpoint" must be the replica\'s endpoint as the plan gives it, a string.')
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not 0 <= wait_s <= WAIT_MAX_S:
            raise Refusal(f'"wait_s" must be a number of seconds from 0 to {WAIT_MAX_S:g}.')
        granted = await self.demand.acquire(endpoint, float(wait_s))
        resp.media = {"lease": granted.lease, "state": "ready", "started": granted.started}


class _Release:
    def __init__(self, demand: OnDemand, token: str | None) -> None:
        self.demand = demand
        self.token = token

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        _authorize(req, self.token)
        lease = (await _body(req)).get("lease")
        if not isinstance(lease, str):
            raise Refusal('"lease" must be the lease id an acquire answered with, a string.')
        self.demand.release(lease)
        resp.status = falcon.HTTP_204


async def _refused(
    req: falcon.asgi.Request, resp: falcon.asgi.Response, error: Refusal, params: dict[str, Any]
) -> None:
    resp.status = error.status
    resp.media = {**error.fields, "message": error.message}


class _Metrics:
    def __init__(self, agent: Agent) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_AgentCollector(agent))

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.data = generate_latest(self.registry)


Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Coroutine[Any, Any, None]]


class CancelOnDisconnect:
    """Cancels a POST whose client has gone before its answer began.

    uvicorn tells an app that its client left only through receive(), which nobody calls
    once the body is read; an acquire waiting for an engine's start must know, because the
    contract is that a client who leaves starts nothing. So the body is read here (bounded),
    handed on, and receive() watched for the disconnect while the request is handled.
    """

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more and len(body) <= BODY_LIMIT:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body"))
        if more:  # over the limit: the rest is never read, and _body says why
            body = body[: BODY_LIMIT + 1]
        await self._handle(scope, receive, send, bytes(body))

    async def _handle(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        gone = asyncio.Event()
        answered = False
        handed = False

        async def replay() -> Mapping[str, Any]:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def answer(message: Message) -> None:
            nonlocal answered
            answered = True
            await send(message)

        handling: asyncio.Task[None] = asyncio.get_running_loop().create_task(self.app(scope, replay, answer))

        async def watch() -> None:
            await receive()  # returns at the disconnect, or once the answer is complete
            gone.set()
            if not answered:
                handling.cancel()

        watching = asyncio.get_running_loop().create_task(watch())
        try:
            await asyncio.wait({handling})
        finally:
            watching.cancel()
            handling.cancel()  # nothing once it is done; if this request was cancelled, it goes too
        if not handling.cancelled():
            handling.result()


def create_status_app(agent: Agent, demand: OnDemand | None = None, token: str | None = None) -> App:
    demand = demand or OnDemand(agent)
    app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response] = falcon.asgi.App()
    app.add_route("/status", _Status(agent, demand, token))
    app.add_route("/metrics", _Metrics(agent))
    app.add_route("/acquire", _Acquire(demand, token))
    app.add_route("/release", _Release(demand, token))
    app.add_error_handler(Refusal, _refused)
    return CancelOnDisconnect(app)
