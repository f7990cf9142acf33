"""A loopback stand-in for the Hugging Face hub and for a plain HTTPS file server.

It answers what `hf_hub_download` asks (HEAD for the commit, ETag and size; GET with Range)
and plain GETs of /files/NAME, and it can misbehave: cut the first download halfway, refuse
a repository (401), or not have a file (404). Every request's Range header is kept, so a
test can see that a download resumed instead of starting over.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.conftest import QUICK_SHUTDOWN

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self, files: dict[str, bytes], private: tuple[str, ...] = ()) -> None:
        self.files = files  # "org/repo/file.gguf" or "files/NAME" -> bytes
        self.private = private  # repository ids that answer 401
        self.cut_next = 0  # cut this many downloads halfway
        self.ranges: list[str | None] = []
        self.ignore_range = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs=QUICK_SHUTDOWN, daemon=True)

    def __enter__(self) -> Hub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?", 1)[0].lstrip("/")
        key = path.replace("/resolve/main/", "/", 1)
        repo = "/".join(key.split("/")[:2])
        if repo in self.private:
            return self._error(h, 401, "RepoNotFound", "Invalid credentials in Authorization header")
        data = self.files.get(key)
        if data is None:
            return self._error(h, 404, "EntryNotFound", f"{key} does not exist on this hub")
        etag = hashlib.sha256(data).hexdigest()
        start = 0
        wanted = h.headers.get("Range")
        if body:
            self.ranges.append(wanted)
        if wanted and not self.ignore_range:
            start = int(wanted.removeprefix("bytes=").split("-")[0])
        part = data[start:]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Content-Length", str(len(part)))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        if self.cut_next:
            self.cut_next -= 1
            h.wfile.write(part[: len(part) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)  # the link drops mid-file
            return
        h.wfile.write(part)

    @staticmethod
    def _error(h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
