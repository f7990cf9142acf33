"""A node agent's on-demand side, as docs/on-demand.md draws it, for gateway tests: POST
/acquire starts a fake engine on the replica's planned port (once, however many ask at
once) and gives a lease; POST /release gives it back. It counts what it was asked."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.conftest import QUICK_SHUTDOWN

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: twenty answers ending together each give
    # their lease back on a new connection, and on a loaded machine those past the fifth
    # were reset before they were accepted (the gateway logged a ReadError for each, and
    # their leases were never given back). `llmgw node` listens with uvicorn's 2048.
    request_queue_size = 128
    daemon_threads = True


class StandInAgent:
    def __init__(
        self, token: str, load_s: float = 0.5, never_ready: bool = False, fails_to_start: str | None = None
    ) -> None:
        self.token = token
        # The agent's answer for an engine that died as it started: 503, state failed.
        self.fails_to_start = fails_to_start
        self.load_s = load_s
        self.never_ready = never_ready
        self.leases: set[str] = set()
        self.acquires = 0
        self.starts = 0
        self.waiters_gone = 0
        self.lock = threading.Lock()
        self.engines: dict[str, subprocess.Popen[str]] = {}
        self.ready: dict[str, threading.Event] = {}
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs=QUICK_SHUTDOWN, daemon=True).start()

    def _starting(self, endpoint: str) -> threading.Event:
        """Set once the engine at `endpoint` is ready; its start begun by the first to ask."""
        with self.lock:
            ready = self.ready.get(endpoint)
            if ready is None:
                ready = self.ready[endpoint] = threading.Event()
                threading.Thread(target=self._start, args=(endpoint, ready), daemon=True).start()
        return ready

    def _start(self, endpoint: str, ready: threading.Event) -> None:
        # Not under the lock: requests keep being answered (503, loading) meanwhile.
        port = endpoint.rsplit(":", 1)[1]
        with self.lock:
            self.starts += 1
        time.sleep(self.load_s)  # the engine loading its weights
        proc = subprocess.Popen(
            [sys.executable, str(FAKE_ENGINE), "--port", port, "--name", "on-demand"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.readline()  # LISTENING
        with self.lock:
            self.engines[endpoint] = proc
        ready.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any] | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.headers.get("authorization") != f"Bearer {agent.token}":
                    self._answer(401, {"message": "wrong token"})
                    return
                if self.path == "/release":
                    with agent.lock:
                        agent.leases.discard(body["lease"])
                    self._answer(204)
                    return
                with agent.lock:
                    agent.acquires += 1
                if agent.fails_to_start is not None:
                    self._answer(503, {"state": "failed", "message": agent.fails_to_start})
                    return
                if agent.never_ready:
                    deadline = time.monotonic() + float(body["wait_s"])
                    while time.monotonic() < deadline:
                        time.sleep(0.05)
                        try:  # a waiter that left: its connection reads as closed
                            self.connection.setblocking(False)
                            if self.connection.recv(1, 2) == b"":  # MSG_PEEK
                                agent.waiters_gone += 1
                                return
                        except BlockingIOError:
                            pass
                        finally:
                            self.connection.setblocking(True)
                    self._answer(503, {"state": "loading", "message": "still loading its weights"})
                    return
                # As the real agent does: the start goes on in the background, and the answer
                # comes when the engine is ready or `wait_s` is up, whichever is first.
                if not agent._starting(body["endpoint"]).wait(float(body["wait_s"])):
                    self._answer(503, {"state": "loading", "message": "still loading its weights"})
                    return
                lease = uuid.uuid4().hex
                with agent.lock:
                    agent.leases.add(lease)
                self._answer(200, {"lease": lease, "state": "ready", "started": True})

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        for proc in self.engines.values():
            proc.kill()
            proc.wait()
