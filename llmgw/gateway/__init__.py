"""The gateway: serves a plan as one OpenAI-compatible endpoint. It reads only the plan.

Its folders draw a request's path, from the socket to the engine and back:

server/     the process: `llmgw serve` (gunicorn), the worker's connection limits, settings
            from the environment, the app factory and the ASGI entry gunicorn loads
request/    one request's path: its typed context, access (request ids, keys, access log),
            reading and checking the body (body), a client's leaving (gone), routing (names,
            aliases, tiers, replicas), on-demand starts (demand), the retry loop (proxy), the
            relay of answers (relay), the upstream connection pool, limits (per instance in
            SQLite, or shared on Redis: limits_redis), usage
state/      what changes under the requests: the served plan and its reloads, DNS discovery,
            health checks, keys, outlier ejection, rates, metrics
pages/      what people read: listing, readiness and admin resources, the dashboard, OpenAPI
errors      the OpenAI-shaped error every layer raises; beneath all of them
deploy      `llmgw deploy`: the client that POSTs a plan to a gateway

Arrows run server → pages → request → state → errors; state never imports request's retry
loop or relay, and nothing here imports the compiler (load, rules, place, build).
"""

from __future__ import annotations

from llmgw.gateway.server.app import create_app

__all__ = ["create_app"]
