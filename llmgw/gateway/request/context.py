"""What one request carries from the key check to the access log line: falcon makes one per
request (`Request.context_type`), so every field a layer reads was declared here, where a
type checker sees it, rather than set on an open namespace by whichever layer came first."""

from __future__ import annotations

import falcon.asgi

from llmgw.gateway.request.limits import Spend
from llmgw.gateway.schedule import Ticket
from llmgw.gateway.state.keys import Tenant
from llmgw.gateway.state.routes import RouteTable


class RequestContext:
    """Set by access (start, id, table, api, tenant), then by the resource that serves it."""

    # The routes the request is served with, start to end, though a deploy swaps them midway;
    # set by access before any resource runs.
    table: RouteTable


    def __init__(self) -> None:
        self.start = 0.0  # perf_counter at the request's arrival
        self.request_id = ""  # empty until access has seen the request (falcon refused early)
        self.api = False  # a /v1 request: keys, limits, metrics and the access log apply
        self.tenant: Tenant | None = None
        self.model: str | None = None  # the name the client asked for
        self.replica: str | None = None  # the endpoint that answered
        self.ttfb: float | None = None  # seconds to the engine's first body byte
        self.streaming = False  # the relay writes the access log line at the answer's end
        self.prompt_estimate = 0  # tokens charged when an answer is cut before its usage came
        self.reservation: int | None = None  # the tokens its key's tpm holds until it settles
        self.ticket: Ticket | None = None  # its place in line for a slot (gateway/schedule/)
        self.band = 1  # its priority band when it waits (schedule/policy.py: BANDS)
        self.spend: Spend | None = None  # what it holds of its key's budget until it settles


class Request(falcon.asgi.Request):
    context_type = RequestContext
    context: RequestContext  # type: ignore[assignment]  # falcon declares its open Context


def context_of(req: falcon.asgi.Request) -> RequestContext:
    """The request's context, typed: every request the app makes is a `Request` above."""
    ctx = req.context
    assert isinstance(ctx, RequestContext), "the app is built with request_type=Request"
    return ctx
