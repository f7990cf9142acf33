"""The gateway: serves a plan as one OpenAI-compatible endpoint. It reads only the plan.

config      settings from the environment
routing     route tables built once per plan: names, aliases, tiers, replicas
reload      the served plan, file watching, deploys
health      background health checks of replicas
proxy       the /v1 endpoints that go upstream
resources   listing, liveness, readiness, metrics, admin
access      request ids, API keys, access log
serve       `llmgw serve`: gunicorn with uvicorn workers
deploy      `llmgw deploy`: POST a plan to a gateway
"""

from __future__ import annotations

from llmgw.gateway.app import create_app

__all__ = ["create_app"]
