"""Who may call, which request is which, and what became of it.

One middleware object: it names each request (X-Request-Id, honoured or made up, and
returned), checks API keys on /v1 and notes whose key it is (`ctx.tenant`), stamps the
plan digest on every /v1 answer, and writes the access log and request metrics. A streamed
answer is logged by the proxy when its last byte has gone, since only then are its duration
and outcome known.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from itertools import count
from typing import Any

import falcon.asgi

from llmgw.gateway.errors import ApiError
from llmgw.gateway.request.context import context_of
from llmgw.gateway.state import metrics, tracing
from llmgw.gateway.state.keys import Keys, Tenant
from llmgw.gateway.state.reload import PlanState
from llmgw.gateway.state.routes import Model, RouteTable

DIGEST_HEADER = "X-Llmgw-Plan-Digest"
access_log = logging.getLogger("llmgw.access")


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of `Authorization: Bearer X`; the scheme is case-insensitive (RFC 7235),
    and clients do send `bearer`."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credentials.strip()


def _credentials(req: falcon.asgi.Request) -> str | None:
    """The key a request carries: OpenAI's clients send it as a bearer token, Anthropic's
    as `x-api-key`; the bearer token wins when both come."""
    bearer = bearer_token(req.get_header("Authorization"))
    if bearer:
        return bearer
    return (req.get_header("x-api-key") or "").strip() or None


def is_api_path(path: str) -> bool:
    """Whether a path is under /v1 as the router reads it: empty segments do not count.

    A raw `startswith("/v1/")` let `//v1/chat/completions` (and `/%2Fv1/...`, which the
    server decodes to the same) reach the API with no key, since falcon's router drops
    empty segments. Matched routes are checked again by their template (`process_resource`).
    """
    segments = [segment for segment in path.split("/") if segment]
    return bool(segments) and segments[0] == "v1"


def _plausible_id(value: str) -> bool:
    return 0 < len(value) <= 128 and value.isascii() and value.isprintable() and " " not in value


class Access:
    def __init__(self, state: PlanState, keys: Keys | None, log_lines: bool) -> None:
        self.state = state
        self.keys = keys
        self.log_lines = log_lines
        # Process-unique prefix plus a counter: unique across workers, and far cheaper per
        # request than a uuid4.
        self._prefix = os.urandom(6).hex() + "-"
        self._ids = count(1)

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        ctx = context_of(req)
        ctx.start = time.perf_counter()
        given = req.get_header("X-Request-Id")
        ctx.request_id = given if given and _plausible_id(given) else f"{self._prefix}{next(self._ids)}"
        ctx.table = self.state.table
        ctx.api = is_api_path(req.path)
        # A browser's CORS preflight never carries the key (the spec forbids it), and it
        # serves nothing: refused, no page could call the gateway with one.
        if _preflight(req):
            return
        if ctx.api and self.keys is not None:
            ctx.tenant = self._check_key(_credentials(req))

    async def process_resource(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, params: Any
    ) -> None:
        # The route that matched decides, whatever spelling of the path reached it: no
        # request gets to a /v1 resource without the same key check as /v1 itself.
        if req.context.api or not is_api_path(req.uri_template or "") or _preflight(req):
            return
        req.context.api = True
        if self.keys is not None:
            req.context.tenant = self._check_key(_credentials(req))

    def _check_key(self, key: str | None) -> Tenant:
        assert self.keys is not None
        if not key:
            raise ApiError(
                401,
                "This gateway needs an API key: send `Authorization: Bearer KEY` "
                "(or `x-api-key: KEY`, as Anthropic's clients do).",
                type="authentication_error",
                code="missing_api_key",
            )
        digest = hashlib.sha256(key.encode()).hexdigest()
        tenant = self.keys.tenants.get(digest)
        if tenant is None:
            raise ApiError(
                401,
                "That API key is not one this gateway accepts; ask its operator for a key.",
                type="authentication_error",
                code="invalid_api_key",
            )
        if tenant.expired():
            raise ApiError(
                401,
                f"The API key '{tenant.name}' expired on {tenant.expires}; ask the gateway's "
                "operator to extend it in keys.yaml or for a new key.",
                type="authentication_error",
                code="expired_api_key",
            )
        return tenant

    async def process_response(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, ok: bool
    ) -> None:
        # Browsers must take each answer for the type it says: an engine's text guessed to
        # be HTML would run as a page of the gateway's origin, beside the dashboard.
        resp.set_header("X-Content-Type-Options", "nosniff")
        ctx = context_of(req)
        if not ctx.request_id:  # process_request never ran (falcon refused early)
            return
        resp.set_header("X-Request-Id", ctx.request_id)
        if ctx.api:
            resp.set_header(DIGEST_HEADER, ctx.table.digest)
        if not ctx.streaming:
            self.finish(req, resp.status_code)

    def finish(self, req: falcon.asgi.Request, status: int) -> None:
        ctx = context_of(req)
        duration = time.perf_counter() - ctx.start
        tracing.end(status)
        if ctx.api:
            model = ctx.model or "unknown"
            tenant = ctx.tenant
            metrics.labelled(metrics.REQUESTS, model, str(status), tenant.name if tenant else "-").inc()
            # Timed only when an engine was asked: the gateway's own refusals (a 429, a 503
            # while an engine loads) take no time, and once pulled the usage table's median
            # latency toward zero while the engines were slow.
            if ctx.replica is not None:
                metrics.labelled(metrics.LATENCY, model).observe(duration)
            if ctx.ttfb is not None:
                metrics.labelled(metrics.FIRST_BYTE, model).observe(ctx.ttfb)
        if not self.log_lines:
            return
        access_log.info(
            json.dumps(
                {
                    "time": round(time.time(), 3),
                    "request_id": ctx.request_id,
                    "method": req.method,
                    "path": req.path,
                    "model": ctx.model,
                    # The key's name from keys.yaml, never the key.
                    "key": ctx.tenant.name if ctx.tenant is not None else None,
                    "replica": ctx.replica,
                    "status": status,
                    "duration_ms": round(duration * 1000, 3),
                    "ttfb_ms": None if ctx.ttfb is None else round(ctx.ttfb * 1000, 3),
                }
            )
        )


def _preflight(req: falcon.asgi.Request) -> bool:
    return req.method == "OPTIONS" and req.get_header("Access-Control-Request-Method") is not None


def usable_models(tenant: Tenant | None, table: RouteTable) -> list[Model]:
    """The served models a key may use, in the plan's order."""
    models = list(table.models.values())
    if tenant is None or tenant.models is None:
        return models
    return [m for m in models if tenant.may_use(m.names())]


def check_model(tenant: Tenant | None, model: Model, table: RouteTable) -> None:
    """403 naming the models the key may use, unless it may use `model`."""
    if tenant is None or tenant.may_use(model.names()):
        return
    names = [f"'{m.name}'" for m in usable_models(tenant, table)]
    may = ", ".join(names) if names else "none of the models served now"
    raise ApiError(
        403,
        f"The API key '{tenant.name}' may not use '{model.name}'; it may use {may}. Ask the "
        "gateway's operator to add the model to the key's `models` in keys.yaml.",
        type="permission_error",
        param="model",
        code="model_not_allowed",
    )
