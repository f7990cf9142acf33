"""The gateway's small endpoints: model listing, liveness, readiness, metrics, deploys."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi

from llmgw.errors import PlanError
from llmgw.gateway.errors import ApiError
from llmgw.gateway.pages.dashboard import render_key_page, render_keys_page, set_page_headers
from llmgw.gateway.request.access import bearer_token, check_model, usable_models
from llmgw.gateway.request.body import read_body
from llmgw.gateway.request.limits import Limits
from llmgw.gateway.request.limits_redis import SharedLimiter
from llmgw.gateway.schedule import Scheduler
from llmgw.gateway.state import metrics
from llmgw.gateway.state.keys import Keys, Tenant, rfc3339
from llmgw.gateway.state.loaded import Loaded
from llmgw.gateway.state.reload import PlanState, PlanWriteError
from llmgw.gateway.state.routes import DnsGroup, RouteTable
from llmgw.gateway.state.workers import Workers
from llmgw.plan import Plan, dump_plan


class Models:
    """GET /v1/models and GET /v1/models/{id} (a name or an alias)."""

    def __init__(self, loaded: Loaded | None = None) -> None:
        self.loaded = loaded

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        table, tenant = req.context.table, req.context.tenant
        on_demand = self.loaded is not None and any(m.listing.get("start") for m in table.models.values())
        if (tenant is None or tenant.models is None) and not on_demand:
            resp.data = table.listing_body
            return
        # A key limited to some models sees only those, as if the rest were not served: in the
        # list, and among each model's fallbacks.
        listing = [_fallbacks_for(m.listing, tenant, table) for m in usable_models(tenant, table)]
        if on_demand and self.loaded is not None:
            listing = with_loaded(listing, table.plan, self.loaded.loaded_now(table.plan))
        resp.data = json.dumps({"object": "list", "data": listing}).encode()

    async def on_get_item(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model_id: str) -> None:
        table, tenant = req.context.table, req.context.tenant
        model = table.lookup(model_id, tenant.may_use if tenant is not None else None)
        req.context.model = model.name
        check_model(tenant, model, table)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = table.model_bodies[model_id]


def _fallbacks_for(listing: Mapping[str, Any], tenant: Tenant | None, table: RouteTable) -> Mapping[str, Any]:
    """A model's listing with only the fallbacks the key may use, and none said when none is."""
    named = listing.get("fallbacks")
    if not named or tenant is None or tenant.models is None:
        return listing
    usable = []
    for name in named:
        try:
            other = table.lookup(name)  # by name or alias, as the catalogue may say
        except ApiError:
            continue
        if tenant.may_use(other.names()):
            usable.append(name)
    if usable == list(named):
        return listing
    trimmed = {k: v for k, v in listing.items() if k != "fallbacks"}
    return {**trimmed, "fallbacks": usable} if usable else trimmed


def with_loaded(listing: list[Any], plan: Plan, loaded: frozenset[str]) -> list[Any]:
    """Each on-demand model's listing saying whether it is loaded now (`"loaded": true`) or
    starts on its first request (`false`): a client then knows which answer will be slow."""
    endpoints = {
        m.name: {r.endpoint for p in m.profiles if p.on_demand for r in p.replicas} for m in plan.models
    }
    return [
        {**m, "loaded": bool(endpoints.get(m["id"], set()) & loaded)} if m.get("start") else m
        for m in listing
    ]


class Healthz:
    """GET /healthz: the process answers. Says nothing about the plan (see /readyz)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = b'{"status":"alive"}'


def check_metrics_token(token: str | None, authorization: str | None) -> None:
    """Nothing when no token is set (the default); else 401 unless `authorization` holds it.

    /metrics and /readyz show replica endpoints, worker pids and the refusal reasons, which
    name file paths: fine inside the cluster, not for whoever can reach the gateway.
    """
    if not token:
        return
    given = bearer_token(authorization) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(
            401,
            "This endpoint needs `Authorization: Bearer <LLMGW_METRICS_TOKEN>`; "
            "configure the scraper or probe to send it.",
            type="authentication_error",
            code="invalid_metrics_token",
        )


class Readyz:
    """GET /readyz: which plan this worker serves, since when, and any refused reload.

    Workers reload on their own, so the answer names the worker (its pid): a deploy has
    taken when every worker has said so, not when the first one does.
    """

    def __init__(
        self,
        state: PlanState,
        token: str | None = None,
        keys: Keys | None = None,
        limiter: Limits | None = None,
    ) -> None:
        self.state = state
        self.token = token
        self.keys = keys
        self.limiter = limiter
        self.workers: Workers | None = None  # set by the app: every worker's word

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        check_metrics_token(self.token, req.get_header("Authorization"))
        doc: dict[str, Any] = {
            "status": "ready",
            "pid": os.getpid(),
            # Tasks alive in this worker, this request's own included: a leak shows as a
            # count that grows with every misbehaving engine or client (tests watch it).
            "tasks": len(asyncio.all_tasks()),
        }
        if self.workers is None:
            doc |= self.describe()
        else:
            # Every worker's word (state/workers.py): which one answers is the kernel's choice.
            workers = self.workers.everyone()
            doc |= workers[str(os.getpid())]
            doc["workers"] = workers
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps(doc).encode()

    def describe(self) -> dict[str, Any]:
        """What this worker serves: its plan, last reload, keys and limits."""
        state = self.state
        doc: dict[str, Any] = {
            "digest": state.table.digest,
            "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.loaded_at)),
            "models": len(state.table.models),
            "last_reload": (
                {"result": "refused", "reason": state.refusal} if state.refusal else {"result": "loaded"}
            ),
        }
        keys = self.keys
        if keys is not None:
            # A refused keys file is a deploy that did not take, like a refused plan.
            doc["keys"] = (
                {"result": "refused", "reason": keys.refusal}
                if keys.refusal
                else {"result": "loaded", "count": len(keys.tenants)}
            )
        if isinstance(self.limiter, SharedLimiter):
            # Still ready while degraded: a limits store must not take the fleet down.
            doc["limits"] = self.limiter.status().document()
        elif self.limiter is not None:
            doc["limits"] = {"store": "sqlite", "state": "local"}
        if state.table.groups:
            doc["discovery"] = [_group_status(g) for g in state.table.groups.values()]
        return doc


def _group_status(group: DnsGroup) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": group.host,
        "endpoint": group.endpoint,
        "replicas": [r.endpoint for r in group.replicas],
        "draining": sorted(group.draining),
        "resolved_at": (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(group.resolved_at)) if group.resolved_at else None
        ),
    }
    if group.error:
        out["error"] = group.error
    return out


class Metrics:
    def __init__(
        self, state: PlanState, token: str | None = None, scheduler: Scheduler | None = None
    ) -> None:
        self.state = state
        self.token = token
        self.scheduler = scheduler

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        check_metrics_token(self.token, req.get_header("Authorization"))
        table = self.state.table
        if self.scheduler is not None:
            self.scheduler.record(table.slots(), table.models)
        resp.data, resp.content_type = metrics.exposition(table.every_replica(), table.models)


class AdminPlan:
    """GET /admin/plan: the served plan. POST: `llmgw deploy` sends one to check, write, serve."""

    def __init__(self, state: PlanState, token: str | None, limit: int) -> None:
        self.state = state
        self.token = token
        self.limit = limit

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        """The plan this worker serves: the deploy workflow plans with it as --previous, so
        replicas stay where they are."""
        self._authorize(req.get_header("Authorization"))
        resp.content_type = falcon.MEDIA_JSON
        resp.text = dump_plan(self.state.table.plan.doc)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        self._authorize(req.get_header("Authorization"))
        text = await read_body(
            req,
            self.limit,
            f"The plan is over the gateway's limit of {self.limit} bytes; raise LLMGW_MAX_BODY_BYTES.",
        )
        try:
            digest = await self.state.accept(text)
        except PlanError as exc:
            raise ApiError(
                422,
                f"Plan refused, the gateway still serves {self.state.table.digest}: {exc}",
                code="plan_refused",
            ) from None
        except PlanWriteError as exc:
            raise ApiError(
                500,
                f"Plan not deployed, the gateway still serves {self.state.table.digest}: {exc}",
                type="server_error",
                code="plan_not_written",
            ) from None
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps({"digest": digest}).encode()

    def _authorize(self, authorization: str | None) -> None:
        check_admin_token(self.token, authorization)


def check_admin_token(token: str | None, authorization: str | None) -> None:
    if not token:
        raise ApiError(
            403,
            "Admin endpoints are closed: start the gateway with LLMGW_ADMIN_TOKEN set to open them.",
            type="permission_error",
            code="admin_closed",
        )
    given = bearer_token(authorization) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(
            401,
            "Admin endpoints need `Authorization: Bearer <LLMGW_ADMIN_TOKEN>`.",
            type="authentication_error",
            code="invalid_admin_token",
        )


class AdminKeys:
    """GET /admin/keys and /admin/keys/{name}: each key's limits and usage, for whoever runs
    the gateway (admin token): the last minute as the limits count it, and totals since the
    gateway started, from its own metrics (summed over the workers)."""

    def __init__(self, keys: Keys | None, limiter: Limits | None, token: str | None) -> None:
        self.keys = keys
        self.limiter = limiter
        self.token = token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        check_admin_token(self.token, req.get_header("Authorization"))
        usage = metrics.usage_by_key()
        docs = [key_document(t, usage, self.limiter) for t in self._tenants()]
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps({"object": "list", "data": docs}).encode()

    async def on_get_item(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        check_admin_token(self.token, req.get_header("Authorization"))
        tenant = find_tenant(self.keys, name, "GET /admin/keys")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = json.dumps(key_document(tenant, metrics.usage_by_key(), self.limiter)).encode()

    def _tenants(self) -> list[Tenant]:
        return tenants(self.keys)


def tenants(keys: Keys | None) -> list[Tenant]:
    if keys is None:
        return []
    # The plain digest file's keys are one "anonymous" tenant: listed once.
    return list({t.name: t for t in keys.tenants.values()}.values())


def find_tenant(keys: Keys | None, name: str, listing: str) -> Tenant:
    tenant = next((t for t in tenants(keys) if t.name == name), None)
    if tenant is None:
        raise ApiError(404, f"There is no key named '{name}'; {listing} lists them.", code="key_not_found")
    return tenant


def key_document(
    tenant: Tenant, usage: dict[str, dict[str, float]], limiter: Limits | None
) -> dict[str, Any]:
    """A key's limits and usage by its name; never the key or its hash."""
    doc: dict[str, Any] = {
        "name": tenant.name,
        "models": list(tenant.models) if tenant.models is not None else None,
        "rpm": tenant.rpm,
        "tpm": tenant.tpm,
        "expires": tenant.expires.isoformat() if tenant.expires else None,
        "expired": tenant.expired(),
        "priority": tenant.priority,
        "share": tenant.share,
        "total": _totals(tenant, usage, limiter),
    }
    if limiter is not None and (tenant.rpm is not None or tenant.tpm is not None):
        requests, tokens = limiter.used(tenant)
        doc["last_minute"] = {"requests": requests, "tokens": tokens}
    spend = limiter.spent(tenant) if limiter is not None else None
    if spend is not None:
        doc["budget"] = {
            "tokens": spend.budget.tokens,
            "every": spend.budget.every,
            "used": spend.used,
            "remaining": max(0, spend.budget.tokens - spend.used),
            "resets": rfc3339(spend.reset),
        }
    return doc


def _totals(tenant: Tenant, usage: dict[str, dict[str, float]], limiter: Limits | None) -> dict[str, int]:
    """Summed over every instance on Redis, or as this instance's state file keeps them (over
    restarts); while Redis is away, this instance's own metrics (summed over its workers)."""
    kept = limiter.totals(tenant.name) if limiter is not None else None
    if kept is not None:
        return kept
    return {k: int(v) for k, v in sorted(usage.get(tenant.name, {}).items())}


class DashboardKeys:
    """GET /dashboard/keys and /dashboard/keys/{name}: the same as /admin/keys, as pages a
    person reads (admin token, as a Bearer header like every admin endpoint), with a key's
    usage per model."""

    def __init__(self, keys: Keys | None, limiter: Limits | None, token: str | None) -> None:
        self.keys = keys
        self.limiter = limiter
        self.token = token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        check_admin_token(self.token, req.get_header("Authorization"))
        usage = metrics.usage_by_key()
        resp.text = render_keys_page([key_document(t, usage, self.limiter) for t in tenants(self.keys)])
        set_page_headers(resp)

    async def on_get_item(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        check_admin_token(self.token, req.get_header("Authorization"))
        tenant = find_tenant(self.keys, name, "/dashboard/keys")
        doc = key_document(tenant, metrics.usage_by_key(), self.limiter)
        resp.text = render_key_page(doc, metrics.usage_of_key(tenant.name))
        set_page_headers(resp)
