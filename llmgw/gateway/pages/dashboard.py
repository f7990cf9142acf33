"""The page at `GET /`: which of these models should I send this request to?

It reads only what the gateway already holds: the served plan, when this worker
loaded it, why the last reload was refused (if it was), and which replica
endpoints this worker has in rotation. Everything about a model comes from the
plan, which came from the catalogue, which people edit by hand; so the templates
go through Jinja2 with autoescape on, and a description containing `<script>`
is shown as text.

The plan-derived part (rows, profiles, endpoints) is built once per plan digest;
health is counted per request, because it is the one thing that changes while a
plan is served. `GET /dashboard/status.json` carries only that moving part, and
the page polls it so health updates without a reload.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from llmgw.gateway.pages.labels import (
    context_label,
    gb_label,
    median_label,
    rate_label,
    relative_age,
    seconds_label,
    utc_iso,
)
from llmgw.gateway.request.access import bearer_token
from llmgw.gateway.state.rates import Figures, ModelFigures
from llmgw.plan import Plan, PlanModel

__all__ = [
    "DashboardSnapshot",
    "add_dashboard_routes",
    "render_key_page",
    "render_keys_page",
    "render_page",
    "set_page_headers",
    "status_document",
]

_HERE = Path(__file__).parent
_TEMPLATES = _HERE / "templates"
_STATIC = _HERE / "static"

STATUS_PATH = "/dashboard/status.json"
STATIC_PREFIX = "/dashboard/static"
# How often the page asks for health. Health checks themselves run on their own
# interval in the gateway; polling faster than that would only repeat answers.
POLL_SECONDS = 5

# Escaping is the defence; this is the second one. The page runs only its own
# script file, so a description that somehow reached the page as markup still
# could not execute. `data:` icons keep Chromium from asking for /favicon.ico.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class DashboardSnapshot:
    """What the gateway knows right now, as one worker sees it."""

    plan: Plan
    loaded_at: float
    refusal: str | None
    healthy: Mapping[str, bool]
    # (model, profile) -> (hits, spills) of prefix routing, as this worker counted them.
    prefix: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # DNS names whose last lookup failed: their last answer still routes.
    discovery_errors: tuple[str, ...] = ()
    # Per replica endpoint: in rotation, ejected or on trial, and its ejection counts
    # (state/outlier.py: replica_states).
    replicas: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # Why the last keys file was refused, when it was (the old keys still work).
    keys_refusal: str | None = None
    # Why rate limits are counted on this instance alone, while LLMGW_REDIS_URL's Redis
    # does not answer (gateway.request.limits_redis).
    limits_degraded: str | None = None
    # The last minute per model, summed over every worker (gateway.rates); None before the
    # first reading.
    usage: Figures | None = None
    # On-demand replicas loaded now, by endpoint (state/loaded.py).
    loaded: frozenset[str] = frozenset()
    # Requests waiting for a replica's slot, per model, over every worker (gateway/schedule/).
    waiting: Mapping[str, int] = field(default_factory=dict)
    # Model → (sync, health) as `llmgw status` says them (state/fleet.py); absent until the
    # agents were first asked, and for a model no agent runs.
    fleet: Mapping[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileView:
    name: str
    engine: str
    external: bool
    endpoints: tuple[str, ...]
    routing: str
    on_demand: bool = False


@dataclass(frozen=True)
class ModelView:
    name: str
    aliases: tuple[str, ...]
    task: str
    context_length: int
    description: str | None
    file: str
    profiles: tuple[ProfileView, ...]
    fallbacks: tuple[str, ...] = ()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(e for p in self.profiles for e in p.endpoints)


@dataclass(frozen=True)
class OnDemandView:
    model: str
    endpoint: str
    memory_gb: float


@dataclass(frozen=True)
class NodeView:
    """A node's memory as the plan divides it: what its always-on replicas take, and the
    on-demand replicas that may be loaded beside them."""

    name: str
    memory_gb: float
    always_on_gb: float
    always_on: tuple[str, ...]  # model names
    on_demand: tuple[OnDemandView, ...]
    # "GPU memory" for a node with GPUs: its engines load into the cards, and the bar once
    # showed a GPU node's 256 GB of host memory, where its models do not live.
    what: str = "memory"

    @property
    def on_demand_models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.model for r in self.on_demand))


@dataclass(frozen=True)
class PlanView:
    """The part of the page that depends only on the plan."""

    digest: str
    models: tuple[ModelView, ...]
    nodes: tuple[NodeView, ...] = ()


def plan_view(plan: Plan) -> PlanView:
    return PlanView(
        digest=plan.digest,
        models=tuple(_model_view(m) for m in plan.models),
        nodes=_node_views(plan),
    )


def _node_views(plan: Plan) -> tuple[NodeView, ...]:
    always: dict[str, list[str]] = {n.name: [] for n in plan.nodes}
    lazy: dict[str, list[OnDemandView]] = {n.name: [] for n in plan.nodes}
    card_gb = {n.name: float(n.gpu_memory_gb) if n.gpus else 0.0 for n in plan.nodes}
    for m in plan.models:
        for p in m.profiles:
            for r in p.replicas:
                if r.node not in always:
                    continue
                if p.on_demand:
                    # A replica owns whole cards on a GPU node; elsewhere it takes its figure.
                    gb = float(p.memory.gb) if p.memory is not None else 0.0
                    gb = p.gpus * card_gb[r.node] if card_gb[r.node] else gb
                    lazy[r.node].append(OnDemandView(m.name, r.endpoint, gb))
                elif m.name not in always[r.node]:
                    always[r.node].append(m.name)
    return tuple(
        NodeView(
            name=n.name,
            memory_gb=n.gpus * card_gb[n.name] if n.gpus else float(n.memory_gb),
            always_on_gb=n.used.gpus * card_gb[n.name] if n.gpus else float(n.used.memory_gb),
            always_on=tuple(always[n.name]),
            on_demand=tuple(lazy[n.name]),
            what="GPU memory" if n.gpus else "memory",
        )
        for n in plan.nodes
    )


def node_document(node: NodeView, loaded: frozenset[str]) -> dict[str, Any]:
    """One node's memory bar and its models, as shown: the plan's figures for always-on, the
    on-demand replicas loaded now, and what is left."""
    loaded_gb = sum(r.memory_gb for r in node.on_demand if r.endpoint in loaded)
    total = node.memory_gb or 1.0
    free_gb = max(0.0, node.memory_gb - node.always_on_gb - loaded_gb)

    def share(gb: float) -> float:
        return round(min(100.0, max(0.0, 100.0 * gb / total)), 2)

    return {
        "memory_gb": node.memory_gb,
        "always_on_gb": node.always_on_gb,
        "loaded_gb": round(loaded_gb, 3),
        "free_gb": round(free_gb, 3),
        "bar": {
            "always": share(node.always_on_gb),
            "loaded": share(loaded_gb),
            "free": share(free_gb),
        },
        "label": (
            f"always on {gb_label(node.always_on_gb)} GB, loaded on demand {gb_label(loaded_gb)} GB, "
            f"free {gb_label(free_gb)} GB of {gb_label(node.memory_gb)} GB"
            + ("" if node.what == "memory" else f" {node.what}")
        ),
        "loaded": {
            model: any(r.endpoint in loaded for r in node.on_demand if r.model == model)
            for model in node.on_demand_models
        },
    }


def _model_view(model: PlanModel) -> ModelView:
    profiles = tuple(
        ProfileView(
            name=p.name,
            engine=p.engine,
            external=p.external,
            endpoints=tuple(r.endpoint for r in p.replicas),
            routing=p.routing or ("least-loaded" if model.task == "embedding" else "prefix"),
            on_demand=p.on_demand,
        )
        for p in model.profiles
    )
    return ModelView(
        name=model.name,
        aliases=model.aliases,
        task=model.task,
        context_length=model.context_length,
        # The schema forbids a blank description, but one in a plan written by hand would
        # otherwise read as "described with nothing"; treat it as absent.
        description=(model.description or "").strip() or None,
        file=model.file,
        profiles=profiles,
        fallbacks=model.fallbacks,
    )


def healthy_count(endpoints: tuple[str, ...], healthy: Mapping[str, bool]) -> int:
    # The snapshot lists every replica of the plan, and one not checked yet is in rotation
    # (unknown is not down), so it is True there. An endpoint missing from it is one this
    # worker does not route to at all, so it does not count.
    return sum(1 for e in endpoints if healthy.get(e, False))


def _prefix_counts(snapshot: DashboardSnapshot, model: str, profile: ProfileView) -> dict[str, int]:
    if profile.routing != "prefix":
        return {}
    hits, spills = snapshot.prefix.get((model, profile.name), (0, 0))
    return {"prefix_hits": hits, "prefix_spills": spills}


def _usage_row(figures: ModelFigures | None) -> dict[str, Any]:
    if figures is None or (figures.requests == 0 and figures.tokens_per_second == 0):
        return {"requests": 0, "rpm": "0", "latency": "–", "ttft": "–", "tokens_per_second": "0"}
    return {
        "requests": figures.requests,
        "rpm": rate_label(figures.rpm),
        "latency": median_label(figures.latency_median, figures.latency_over),
        "ttft": median_label(figures.ttft_median, figures.ttft_over),
        "tokens_per_second": rate_label(figures.tokens_per_second),
    }


def usage_document(
    usage: Figures | None, view: PlanView, waiting: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The usage table's cells, as shown: every model of the plan, in its order."""
    models = usage.models if usage is not None else {}
    waits = waiting or {}
    return {
        "window": None if usage is None else seconds_label(usage.seconds),
        "models": {
            m.name: {**_usage_row(models.get(m.name)), "waiting": waits.get(m.name, 0)} for m in view.models
        },
    }


def _profile_health(snapshot: DashboardSnapshot, profile: ProfileView) -> dict[str, Any]:
    """How many of a profile's replicas take requests now. An on-demand replica whose engine
    is stopped is not counted healthy but `stopped`: the dashboard said "Healthy 1/1" of a
    model nothing had loaded, and the first request then waited for a whole engine load."""
    endpoints = profile.endpoints
    stopped = [e for e in endpoints if e not in snapshot.loaded] if profile.on_demand else []
    return {
        "healthy": healthy_count(tuple(e for e in endpoints if e not in stopped), snapshot.healthy),
        "placed": len(endpoints),
        **({"stopped": len(stopped)} if profile.on_demand else {}),
    }


def status_document(snapshot: DashboardSnapshot, view: PlanView, now: float) -> dict[str, Any]:
    """The JSON the page polls: health per model and profile, plus the reload state."""
    models: dict[str, Any] = {}
    for m in view.models:
        words = snapshot.fleet.get(m.name)
        profiles = {p.name: _profile_health(snapshot, p) for p in m.profiles}
        models[m.name] = {
            **({"sync": words[0], "fleet_health": words[1]} if words else {}),
            "healthy": sum(h["healthy"] for h in profiles.values()),
            "placed": len(m.endpoints),
            **(
                {"stopped": sum(h.get("stopped", 0) for h in profiles.values())}
                if any(p.on_demand for p in m.profiles)
                else {}
            ),
            "profiles": {
                p.name: {
                    **profiles[p.name],
                    "routing": p.routing,
                    "replicas": {e: snapshot.replicas[e] for e in p.endpoints if e in snapshot.replicas},
                    **_prefix_counts(snapshot, m.name, p),
                }
                for p in m.profiles
            },
        }
    return {
        "digest": view.digest,
        "loaded_at": snapshot.loaded_at,
        "loaded_at_utc": utc_iso(snapshot.loaded_at),
        "age": relative_age(now - snapshot.loaded_at),
        "refusal": snapshot.refusal,
        "keys_refusal": snapshot.keys_refusal,
        "limits_degraded": snapshot.limits_degraded,
        "discovery_errors": list(snapshot.discovery_errors),
        "models": models,
        "nodes": {n.name: node_document(n, snapshot.loaded) for n in view.nodes},
        "usage": usage_document(snapshot.usage, view, snapshot.waiting),
        # Which worker answered: each keeps its own health view, and tests check that
        # every worker says the same about the plan.
        "worker": os.getpid(),
    }


class _Views:
    """Plan views by digest. A worker serves one plan at a time, and a reload
    swaps it; keeping the last few covers requests that straddle a reload."""

    KEEP = 4

    def __init__(self) -> None:
        self._by_digest: dict[str, PlanView] = {}

    def get(self, plan: Plan) -> PlanView:
        digest = plan.digest
        view = self._by_digest.get(digest)
        if view is not None and digest:
            return view
        view = plan_view(plan)
        if digest:
            while len(self._by_digest) >= self.KEEP:
                del self._by_digest[next(iter(self._by_digest))]
            self._by_digest[digest] = view
        return view


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(_TEMPLATES),
        autoescape=True,  # every template, whatever its extension
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["context_label"] = context_label
    return env


_ENV = _environment()
_VIEWS = _Views()


@functools.cache
def _asset_version(name: str) -> str:
    return hashlib.sha256((_STATIC / name).read_bytes()).hexdigest()[:12]


def render_page(
    snapshot: DashboardSnapshot,
    now: float | None = None,
    view: PlanView | None = None,
    engines_shown: bool = True,
) -> str:
    """The whole page as HTML, with health as of this call."""
    now = time.time() if now is None else now
    view = view or _VIEWS.get(snapshot.plan)
    status = status_document(snapshot, view, now)
    if not engines_shown:
        status = without_engines(status)
    return _ENV.get_template("dashboard.html").render(
        view=view,
        status=status,
        refusal=snapshot.refusal,
        keys_refusal=snapshot.keys_refusal,
        limits_degraded=snapshot.limits_degraded,
        discovery_errors=status["discovery_errors"],
        loaded_at_utc=status["loaded_at_utc"],
        age=status["age"],
        status_path=STATUS_PATH,
        poll_ms=POLL_SECONDS * 1000,
        static_prefix=STATIC_PREFIX,
        css_version=_asset_version("dashboard.css"),
        js_version=_asset_version("dashboard.js"),
    )


def without_engines(status: dict[str, Any]) -> dict[str, Any]:
    """The status for a caller without the metrics token: how many replicas are in rotation,
    but no engine's address or state, nor the DNS names discovery failed on. The token hides
    them on /metrics and /readyz; shown here, it hid nothing."""
    models = {
        name: {
            **m,
            "profiles": {p: {**ph, "replicas": {}} for p, ph in m["profiles"].items()},
        }
        for name, m in status["models"].items()
    }
    return {**status, "models": models, "discovery_errors": [], "engines_hidden": True}


def engines_shown(token: str | None, authorization: str | None) -> bool:
    """Whether this caller may see engines: always when no metrics token is set."""
    if not token:
        return True
    given = bearer_token(authorization) or ""
    return hmac.compare_digest(given.encode(), token.encode())


def render_keys_page(keys: list[Mapping[str, Any]]) -> str:
    """GET /dashboard/keys: every key by name (never the key), its limits and its totals."""
    return _ENV.get_template("keys.html").render(
        keys=keys, static_prefix=STATIC_PREFIX, css_version=_asset_version("dashboard.css")
    )


def render_key_page(key: Mapping[str, Any], by_model: Mapping[str, Mapping[str, float]]) -> str:
    """GET /dashboard/keys/NAME: one key's models, limits, expiry and usage."""
    rows: list[dict[str, Any]] = [
        {
            "model": model,
            "requests": int(u.get("requests", 0)),
            "prompt_tokens": int(u.get("prompt_tokens", 0)),
            "completion_tokens": int(u.get("completion_tokens", 0)),
        }
        for model, u in sorted(by_model.items())
    ]
    total = {f: sum(r[f] for r in rows) for f in ("requests", "prompt_tokens", "completion_tokens")}
    return _ENV.get_template("key.html").render(
        key=key,
        rows=rows,
        total=total,
        static_prefix=STATIC_PREFIX,
        css_version=_asset_version("dashboard.css"),
    )


def set_page_headers(resp: falcon.asgi.Response) -> None:
    resp.content_type = falcon.MEDIA_HTML
    resp.cache_control = ["no-cache"]
    resp.set_header("Content-Security-Policy", _CSP)
    resp.set_header("X-Content-Type-Options", "nosniff")


class _PageResource:
    def __init__(self, snapshot: Callable[[], DashboardSnapshot], views: _Views, token: str | None) -> None:
        self._snapshot = snapshot
        self._views = views
        self._token = token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        snap = self._snapshot()
        shown = engines_shown(self._token, req.get_header("Authorization"))
        resp.text = render_page(snap, view=self._views.get(snap.plan), engines_shown=shown)
        set_page_headers(resp)


class _StatusResource:
    def __init__(self, snapshot: Callable[[], DashboardSnapshot], views: _Views, token: str | None) -> None:
        self._snapshot = snapshot
        self._views = views
        self._token = token

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        snap = self._snapshot()
        status = status_document(snap, self._views.get(snap.plan), time.time())
        if not engines_shown(self._token, req.get_header("Authorization")):
            status = without_engines(status)
        resp.media = status
        resp.cache_control = ["no-store"]


@dataclass(frozen=True)
class _Asset:
    body: bytes
    content_type: str
    etag: str


class _StaticResource:
    """The page's own CSS and script, read once at start-up and kept in memory."""

    TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}

    def __init__(self, directory: Path) -> None:
        self._assets: dict[str, _Asset] = {}
        for path in sorted(directory.iterdir()):
            content_type = self.TYPES.get(path.suffix)
            if content_type is None:
                continue
            body = path.read_bytes()
            etag = hashlib.sha256(body).hexdigest()[:16]
            self._assets[path.name] = _Asset(body, content_type, etag)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        asset = self._assets.get(name)
        if asset is None:
            raise falcon.HTTPNotFound(
                description=f"The dashboard has no asset named {name!r}; "
                f"its assets are {', '.join(sorted(self._assets))}."
            )
        resp.etag = asset.etag
        # URLs carry ?v=<content hash>, so a changed file is a new URL.
        resp.cache_control = ["public", "max-age=86400"]
        if req.if_none_match and any(t == asset.etag for t in req.if_none_match):
            resp.status = falcon.HTTP_304
            return
        resp.content_type = asset.content_type
        resp.data = asset.body


def add_dashboard_routes(
    app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response],
    snapshot: Callable[[], DashboardSnapshot],
    metrics_token: str | None = None,
) -> None:
    """Mount the page at GET / and GET /dashboard, its status JSON and its static assets;
    engines are shown only to callers with `metrics_token`, when one is set."""
    views = _Views()
    page = _PageResource(snapshot, views, metrics_token)
    app.add_route("/", page)
    # Error messages point people at /dashboard; it is the same page.
    app.add_route("/dashboard", page)
    app.add_route(STATUS_PATH, _StatusResource(snapshot, views, metrics_token))
    app.add_route(STATIC_PREFIX + "/{name}", _StaticResource(_STATIC))
