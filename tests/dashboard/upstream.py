"""A stand-in replica that answers GET /health with 200 or 503, switchable from a test."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.conftest import QUICK_SHUTDOWN


class FakeUpstream:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.healthy = True
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ok = upstream.healthy
                body = b'{"status":"ok"}' if ok else b'{"status":"unavailable"}'
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs=QUICK_SHUTDOWN, daemon=True)
        self._thread.start()
        port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
