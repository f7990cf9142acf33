"""The least a proxy on the gateway's stack can cost: bench/gateway.py's floor.

Falcon's ASGI app on uvicorn's own gunicorn worker, handing each POST to the engine over the
gateway's own transport and answering with what came back. Nothing else: no keys, routing,
limits, retries, metrics, renaming or access log. Whatever the gateway costs above this is
the price of what it does; what this costs is the price of the server it runs on.

    LLMGW_FLOOR_ENGINE=HOST:PORT gunicorn --chdir bench proxy_floor:app -k uvicorn_worker.UvicornWorker
"""

from __future__ import annotations

import os

import falcon
import falcon.asgi

from llmgw.gateway.upstream import FastTransport

_host, _, _port = os.environ.get("LLMGW_FLOOR_ENGINE", "127.0.0.1:0").rpartition(":")
_ENGINE = (_host, int(_port))
_HEADERS = [(b"content-type", b"application/json")]
_transport = FastTransport()


class _Forward:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await req.stream.read()
        reply = await _transport.request(b"POST", _ENGINE, req.path.encode(), _HEADERS, body, 5.0, 30.0)
        try:
            resp.data = b"".join([chunk async for chunk in reply.aiter_raw()])
        finally:
            await reply.aclose()
        resp.status = reply.status_code
        resp.content_type = falcon.MEDIA_JSON


app = falcon.asgi.App()
app.add_route("/v1/chat/completions", _Forward())
