"""The ASGI entry gunicorn loads: `llmgw.gateway.asgi:app`; settings come from the environment."""

from __future__ import annotations

from llmgw.gateway.app import create_app

app = create_app()
