"""The ASGI entry gunicorn loads: `llmgw.gateway.server.asgi:app`; settings come from the environment."""

from __future__ import annotations

from gunicorn.errors import AppImportError

from llmgw.errors import LlmgwError
from llmgw.gateway.server.app import create_app

try:
    app = create_app()
except LlmgwError as exc:
    # gunicorn prints an AppImportError as its one line and stops, where any other error
    # is a traceback from every worker it boots. `llmgw serve` checks the same things
    # first; this is for a gateway started by gunicorn directly, or a file changed since.
    raise AppImportError(f"llmgw: {exc}") from None
