"""The gateway: serves a plan as one OpenAI-compatible endpoint. It reads only the plan.

Its folders draw a request's path, from the socket to the engine and back, each importing
only the ones below it (tests/unit/test_boundaries.py holds it):

server/     the process: `llmgw serve` (gunicorn), the worker's connection limits, the app
            factory and the ASGI entry gunicorn loads
pages/      what people read: listing, readiness and admin resources, the dashboard, OpenAPI
request/    one request's path: its typed context, access (request ids, keys, access log),
            reading and checking the body (body), a client's leaving (disconnect), its place in
            line for a slot (slot_ticket), the prompt's
            prefix key (prefix), an on-demand engine's lease from its agent (lease), the
            retry loop (proxy), the relay of answers (relay), limits (per instance in SQLite,
            or shared on Redis: limits_redis), usage
schedule/   slots per replica, a line per model and key, shares and priorities; the order
            is a policy chosen by name (fair, fifo), the state local or on Redis
state/      what changes under the requests: the served plan and its reloads, the route table
            (routes: names, aliases, tiers, replicas), DNS discovery, health checks, keys,
            what is loaded where (loaded), outlier ejection, rates, metrics

Beneath them all, shared by every room:

settings    configuration, read once from the environment when a worker starts
upstream    the connection pool to the engines
api         one row per API kind: path, tasks, length fields, usage, error shape
errors      the OpenAI-shaped error every layer raises

Arrows run server → pages → request → schedule → state → shared, never back up; nothing
here imports the compiler (llmgw/compiler/) or the GitOps tools (llmgw/gitops/, where
`llmgw deploy`'s client lives).
"""

from __future__ import annotations

from llmgw.gateway.server.app import create_app

__all__ = ["create_app"]
