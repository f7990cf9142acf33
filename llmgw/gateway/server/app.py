"""The app factory: builds every part once per worker and wires the routes.

app = create_app()      # llmgw/gateway/server/asgi.py, the entry gunicorn loads
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import httpx

from llmgw.gateway.api import APIS
from llmgw.gateway.errors import ApiError, handle_api_error, handle_unexpected, serialize_http_error
from llmgw.gateway.pages.dashboard import DashboardSnapshot, add_dashboard_routes
from llmgw.gateway.pages.openapi import OpenApi
from llmgw.gateway.pages.resources import (
    AdminKeys,
    AdminPlan,
    DashboardKeys,
    Healthz,
    Metrics,
    Models,
    Readyz,
)
from llmgw.gateway.request.access import Access
from llmgw.gateway.request.context import Request
from llmgw.gateway.request.lease import Leases
from llmgw.gateway.request.limits import Limits, LocalLimiter, state_directory
from llmgw.gateway.request.limits_redis import SharedLimiter
from llmgw.gateway.request.proxy import Proxy
from llmgw.gateway.request.relay import AnswerCut
from llmgw.gateway.schedule import LocalStore, Scheduler, Store
from llmgw.gateway.schedule.policies import policy_named
from llmgw.gateway.schedule.store_redis import RedisStore, Shared
from llmgw.gateway.settings import Settings, settings_from_env
from llmgw.gateway.state.discovery import Discovery
from llmgw.gateway.state.fleet import FleetWatch
from llmgw.gateway.state.health import Health
from llmgw.gateway.state.keys import Keys, keys_from_settings
from llmgw.gateway.state.loaded import Loaded
from llmgw.gateway.state.outlier import Outliers, RetryBudget, replica_states
from llmgw.gateway.state.rates import Samples
from llmgw.gateway.state.reload import PlanState, settle_heap
from llmgw.gateway.state.routes import RouteTable
from llmgw.gateway.state.workers import Workers
from llmgw.gateway.upstream import FastTransport, Upstream

log = logging.getLogger("llmgw.gateway")


class BodyWatch:
    """The ASGI `receive`, noting a client that leaves before its body's last part.

    Falcon's request stream simply ends then, and what came reads like a whole body.
    """

    __slots__ = ("_receive", "done", "cut")

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.done = False
        self.cut = False

    async def receive(self) -> dict[str, Any]:
        event: dict[str, Any] = await self._receive()
        kind = event["type"]
        if kind == "http.request":
            self.done = not event.get("more_body", False)
        elif kind == "http.disconnect" and not self.done:
            self.cut = True
        return event


class _App(falcon.asgi.App):  # type: ignore[type-arg]  # falcon's App is generic in request/response types
    """Falcon's app, also handing the ASGI `receive` to resources through the scope.

    The proxy needs `receive` to notice a client that goes away mid-answer: falcon itself
    only notices that for its own SSE emitter, and then only after the next event arrives.
    """

    async def __call__(  # type: ignore[override]
        self, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        if scope["type"] != "http":
            scope["llmgw.receive"] = receive
            await super().__call__(scope, receive, send)
            return
        body = scope["llmgw.body"] = BodyWatch(receive)
        scope["llmgw.receive"] = body.receive
        try:
            await super().__call__(scope, body.receive, send)
        except AnswerCut:
            # The response is unfinished: returning now has the server close the
            # connection (and log that it did).
            pass


class Lifecycle:
    """Starts the plan and keys watchers and health checks with the worker; closes the engine
    connections after."""

    def __init__(
        self,
        state: PlanState,
        health: Health,
        upstream: Upstream,
        settings: Settings,
        keys: Keys | None,
        samples: Samples,
        loaded: Loaded,
        scheduler: Scheduler,
    ) -> None:
        self.loaded = loaded
        self.scheduler = scheduler
        self.fleet = FleetWatch(loaded.client)
        self.state = state
        self.keys = keys
        self.samples = samples
        self.health = health
        self.upstream = upstream
        self.settings = settings
        self.tasks: list[asyncio.Task[None]] = []
        self.workers: Workers | None = None

    async def process_startup(self, scope: Any, event: Any) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self.state.watch(self.settings.reload_interval)),
            loop.create_task(self.health.watch(self.state, self.settings.health_interval)),
            loop.create_task(Discovery(self.settings, self.health).watch(self.state)),
            loop.create_task(self.samples.watch()),
            # The agents' word on what is loaded, for /v1/models and the dashboard.
            loop.create_task(self.loaded.watch(self.state, max(1.0, self.settings.health_interval))),
            # What the agents run against the plan, for the dashboard's two words per model.
            loop.create_task(self.fleet.watch(self.state, max(2.0, self.settings.health_interval))),
            loop.create_task(self.scheduler.watch()),
        ]
        if self.keys is not None:
            self.tasks.append(loop.create_task(self.keys.watch(self.settings.reload_interval)))
        if self.workers is not None:
            # What /readyz says of this worker when another answers.
            self.tasks.append(loop.create_task(self.workers.watch(self.settings.reload_interval)))

    async def process_shutdown(self, scope: Any, event: Any) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.upstream.aclose()


_RATE_HEADERS = [
    f"x-ratelimit-{what}-{of}" for what in ("limit", "remaining", "reset") for of in ("requests", "tokens")
] + ["x-llmgw-budget-remaining-tokens", "x-llmgw-budget-reset", "x-llmgw-fallback"]


class _ApiCors(falcon.CORSMiddleware[Any, Any]):
    """CORS on the API (/v1/...) only: on every path, a page of an allowed origin could read
    /metrics, /readyz and the dashboard's status, which are for the operator."""

    def process_response(self, req: Any, resp: Any, resource: object, req_succeeded: bool) -> None:
        if req.path.startswith("/v1/"):
            super().process_response(req, resp, resource, req_succeeded)


def _cors(settings: Settings) -> list[falcon.CORSMiddleware[Any, Any]]:
    """Falcon's CORS middleware for the origins LLMGW_CORS_ORIGINS lists; none when unset."""
    origins = settings.cors_origins
    if not origins:
        return []
    return [
        _ApiCors(
            allow_origins="*" if "*" in origins else list(origins),
            # What an OpenAI client in a page reads besides the body.
            expose_headers=[*_RATE_HEADERS, "Retry-After", "X-Request-Id"],
        )
    ]


def create_app(
    settings: Settings | None = None,
) -> falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]:
    settings = settings or settings_from_env()
    _log_to_stderr()
    keys = keys_from_settings(settings.keys_file, settings.api_keys_file)
    state = PlanState(settings.plan_path)
    # External endpoints may be https; those take httpx's own transport.
    upstream = Upstream(FastTransport(), httpx.AsyncHTTPTransport(retries=0, trust_env=False))
    health = Health(
        upstream,
        settings.health_failures,
        timeout=settings.health_timeout,
    )
    access = Access(state, keys, settings.access_log)
    shared = _shared_directory()
    limiter = _limiter(settings, shared)
    samples = Samples(shared)

    loaded = Loaded(settings.agent_timeout)
    leases = Leases(settings.load_timeout, loaded, agent_timeout=settings.agent_timeout)
    scheduler = _scheduler(settings, shared)
    lifecycle = Lifecycle(state, health, upstream, settings, keys, samples, loaded, scheduler)
    app = _App(request_type=Request, middleware=[*_cors(settings), lifecycle, access])
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(ApiError, handle_api_error)
    app.set_error_serializer(serialize_http_error)

    # One of each per worker, shared by every endpoint: a replica failing chat requests is
    # the same replica failing completions.
    outliers = Outliers(settings.eject_after, settings.eject_time, settings.eject_max_time)
    budget = RetryBudget(settings.retry_budget, settings.retry_floor)
    models = Models(loaded)
    app.add_route("/v1/models", models)
    # `path`, because names may hold a slash (org/model, as vLLM serves them).
    app.add_route("/v1/models/{model_id:path}", models, suffix="item")
    for kind, api in APIS.items():
        app.add_route(
            api.path,
            Proxy(kind, upstream, health, settings, access, outliers, budget, limiter, leases, scheduler),
        )
    app.add_route("/healthz", Healthz())
    app.add_route("/openapi.json", OpenApi())
    readyz = Readyz(state, settings.metrics_token, keys, limiter)
    readyz.workers = lifecycle.workers = Workers(shared, readyz.describe)
    app.add_route("/readyz", readyz)
    app.add_route("/metrics", Metrics(state, settings.metrics_token, scheduler))
    app.add_route("/admin/plan", AdminPlan(state, settings.admin_token, settings.max_body_bytes))
    admin_keys = AdminKeys(keys, limiter, settings.admin_token)
    app.add_route("/admin/keys", admin_keys)
    app.add_route("/admin/keys/{name}", admin_keys, suffix="item")
    key_pages = DashboardKeys(keys, limiter, settings.admin_token)
    app.add_route("/dashboard/keys", key_pages)
    app.add_route("/dashboard/keys/{name}", key_pages, suffix="item")
    _add_dashboard(
        app, state, keys, samples, loaded, settings.metrics_token, limiter, lifecycle.fleet, scheduler
    )
    settle_heap()
    return app


def _add_dashboard(
    app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response],
    state: PlanState,
    keys: Keys | None,
    samples: Samples,
    loaded: Loaded,
    metrics_token: str | None,
    limiter: Limits | None,
    fleet: FleetWatch,
    scheduler: Scheduler,
) -> None:
    def snapshot() -> DashboardSnapshot:
        table = state.table
        limits = limiter.status() if isinstance(limiter, SharedLimiter) else None
        return DashboardSnapshot(
            plan=table.plan,
            loaded_at=state.loaded_at,
            refusal=state.refusal,
            keys_refusal=keys.refusal if keys is not None else None,
            limits_degraded=limits.reason if limits is not None else None,
            usage=samples.figures(),
            loaded=loaded.loaded_now(table.plan),
            fleet=fleet.words(table.plan.digest),
            waiting=scheduler.waiting(table.models),
            healthy=_healthy(table),
            discovery_errors=tuple(g.error for g in table.groups.values() if g.error),
            replicas=replica_states(table.every_replica().values()),
            prefix={
                (m.name, p.name): (p.prefix.hits, p.prefix.spills)
                for m in table.models.values()
                for tier in m.tiers
                for p in tier
            },
        )

    add_dashboard_routes(app, snapshot, metrics_token)


def _limiter(settings: Settings, shared: Path) -> Limits | None:
    """Only named keys (keys.yaml) have limits. With LLMGW_REDIS_URL every instance counts
    them on Redis; without, this instance's workers in their shared directory."""
    if settings.keys_file is None:
        return None
    # Budget spend and usage totals outlive the gateway: not in the metrics folder `llmgw
    # serve` makes in the temp dir and deletes at exit, which once forgot every key's usage.
    state = state_directory()
    if settings.redis_url:
        return SharedLimiter(settings.redis_url, shared, settings.redis_timeout, state=state)
    return LocalLimiter(shared, state)


def _scheduler(settings: Settings, shared: Path) -> Scheduler:
    """Slots and lines shared by this instance's workers (its shared directory), and with
    LLMGW_REDIS_URL by every instance."""
    policy = policy_named(settings.scheduler)
    # How long a request for an on-demand model not loaded waits beside a loaded one in its
    # Room before the loaded one is drained for it: well within LLMGW_QUEUE_WAIT.
    patience = min(5.0, settings.queue_wait / 4)
    store: Store = LocalStore(shared, policy, patience)
    if settings.redis_url:
        store = Shared(RedisStore(settings.redis_url, settings.redis_timeout, patience, policy), store)
    return Scheduler(store, settings.queue_wait, settings.queue_per_key, shared)


def _healthy(table: RouteTable) -> dict[str, bool]:
    healthy = {endpoint: r.healthy for endpoint, r in table.replicas.items()}
    # The dashboard lists the plan's endpoints: a DNS name is up while an address it lists is.
    for endpoint, group in table.groups.items():
        healthy[endpoint] = any(r.healthy for r in group.replicas)
    return healthy


def _shared_directory() -> Path:
    """Where the workers of this gateway keep what they share: the metrics directory
    `llmgw serve` makes for them (or the operator set); a directory of its own for a lone
    process run without it."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(directory) if directory else Path(tempfile.mkdtemp(prefix="llmgw-limits-"))


def _log_to_stderr() -> None:
    # gunicorn configures only its own loggers; ours would otherwise go nowhere.
    for name, fmt in (
        ("llmgw.access", "%(message)s"),
        ("llmgw.gateway", "%(asctime)s [%(process)d] %(levelname)s %(message)s"),
    ):
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
