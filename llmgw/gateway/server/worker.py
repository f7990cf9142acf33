"""The gunicorn worker `llmgw serve` runs: uvicorn's, with limits on what a client may hold.

uvicorn's httptools protocol caps neither the size nor the number of request headers, and
times neither a connection that sends nothing nor a request that stops halfway: four
connections sending 10 MB of headers took a worker to 527 MB, and a connection that sent
half its headers stayed open for good. These limits are the server's business, not the
app's, so they live in the protocol the worker runs:

    request line and headers   LLMGW_MAX_HEADER_BYTES in all, LLMGW_MAX_HEADERS lines: else 431
    headers, from the first byte of a request (or the connection's opening) to their end:
                               LLMGW_HEADER_TIMEOUT: else 408 and the connection closed
    body                       at most LLMGW_BODY_TIMEOUT without a byte, and past that time
                               at least BODY_MIN_RATE bytes a second on average: else the
                               connection closed
    connections per worker     LLMGW_MAX_CONNECTIONS: past it, a request is answered 503 and
                               its connection closed
    an answer the client stops reading: once the socket's buffer is full, LLMGW_CHUNK_TIMEOUT
                               without room for more: the connection dropped

Idle time between requests on a kept-alive connection is gunicorn's --keep-alive, as before.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from llmgw.gateway.request.disconnect import GONE, STALLED, ClientGone
from llmgw.gateway.settings import Settings, settings_from_env

log = logging.getLogger("llmgw.gateway")


# Apache's mod_reqtimeout default. A body trickled a byte a second never went
# LLMGW_BODY_TIMEOUT without one, and held its request open for as long as the client
# liked (slowloris); an upload at any real speed never comes near this rate.
BODY_MIN_RATE = 500


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request that is over a limit."""


# asyncio's and uvloop's default high-water mark for a transport's write buffer.
_CORK_LIMIT = 65536


class _Corked:
    """A connection's transport that joins the writes of one turn of the event loop into one
    send. uvicorn writes a response's headers and then each part of its body as it gets them,
    and each write was a system call of its own: for a short JSON answer, two where one does.
    Whatever is written goes out when the response is complete (`flush`), at the end of the
    turn, at `close`, or once past _CORK_LIMIT.
    """

    __slots__ = ("_real", "_loop", "_pending", "_size")

    def __init__(self, real: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._real = real
        self._loop = loop
        self._pending: list[bytes] | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._pending is None:
            self._pending = [data]
            self._size = len(data)
            self._loop.call_soon(self.flush)
        else:
            self._pending.append(data)
            self._size += len(data)
        if self._size > _CORK_LIMIT:
            # The server pauses a response when the transport's buffer fills, and the
            # transport sees nothing held here: a stream for a slow reader moved the engine
            # connection's whole queue (1 MiB) here in one turn, doubling what it held.
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._real.is_closing():
            self._real.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._real.close()

    def abort(self) -> None:
        self._pending = None
        self._real.abort()

    def get_write_buffer_size(self) -> int:
        return self._real.get_write_buffer_size() + sum(map(len, self._pending or ()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    # Set per worker by `limited_protocol`, from the settings.
    max_header_bytes = 65536
    max_headers = 100
    header_timeout = 10.0
    body_timeout = 30.0
    write_timeout = 60.0
    max_connections = 4096

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._corked = _Corked(transport, self.loop)
        self.transport = self._corked  # type: ignore[assignment]
        self._write_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_lines = 0
        self._refusal: tuple[int, str] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._expire: Callable[[], None] | None = None
        self._body_started = 0.0
        self._body_bytes = 0
        # A connection that never sends a byte is held to the same limit as half a header.
        self._arm(self.header_timeout, self._header_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            # A timer left armed would keep this closed connection in memory until it fired.
            self._timer.cancel()
            self._timer = None
        if self._write_timer is not None:
            self._write_timer.cancel()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            gone = cycle.scope.get(GONE)
            if isinstance(gone, ClientGone):
                gone.notify()

    # Flow control. The server waits for room in the socket before each write, without
    # limit: three clients that asked for a stream and never read it held their engine
    # connections (and so the engines' generation slots) open long after the chunk
    # timeout. Timed here, where the wait starts and ends, rather than around every write
    # the app makes: that cost a timer per write, most of which never waits.
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_expired)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()

    def _write_expired(self) -> None:
        self._write_timer = None
        if self.cycle is not None:
            self.cycle.scope[STALLED] = self.write_timeout  # type: ignore[literal-required]
        # abort, not close: close would wait to flush what the client is not reading. The
        # app hears `http.disconnect`, and the proxy drops the engine's connection.
        self.transport.abort()

    # Parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._head_lines = 0
        self._arm(self.header_timeout, self._header_expired)

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), 1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._body_started = self.loop.time()
        self._body_bytes = 0
        self._arm(self.body_timeout, self._body_expired)
        if len(self.connections) > self.max_connections or len(self.tasks) >= self.max_connections:
            # uvicorn's own cap (limit_concurrency) answers a bare "Service Unavailable": a
            # client could not tell what to do about it. The request runs as any other, with
            # the refusal for its app.
            app, self.app = self.app, self._at_capacity
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        if self.cycle is not None:
            # Before the app runs: uvicorn only starts its task here, and runs it later.
            self.cycle.scope[GONE] = ClientGone()  # type: ignore[literal-required]

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        now = self.loop.time()
        keeping_up = self._body_started + self.body_timeout + self._body_bytes / BODY_MIN_RATE
        self._arm(min(self.body_timeout, keeping_up - now), self._body_expired)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # The answer's last part is written: it goes out now. Nothing else of it can join the
        # send, and waiting for the end of the loop's turn added that turn to every answer.
        self._corked.flush()
        super().on_response_complete()

    # Limits
    def _count(self, size: int, lines: int) -> None:
        self._head_bytes += size
        self._head_lines += lines
        if self._head_bytes > self.max_header_bytes:
            self._refusal = (431, f"Request headers over {self.max_header_bytes} bytes.")
        elif self._head_lines > self.max_headers:
            self._refusal = (431, f"More than {self.max_headers} request headers.")
        else:
            return
        # httptools wraps this in an HttpParserError, which uvicorn answers with
        # `send_400_response`: overridden below to send the refusal instead.
        raise _Refused

    def send_400_response(self, msg: str) -> None:
        status, message = self._refusal or (400, msg)
        self._refusal = None
        self._disarm()
        self._answer_and_close(status, message)

    def _header_expired(self) -> None:
        self._answer_and_close(408, f"Request headers not received within {self.header_timeout:g}s.")

    def _body_expired(self) -> None:
        if self.flow.read_paused:
            # The app has not asked for more yet: the wait is not the client's, and neither
            # is the fall in its rate.
            self._body_started = self.loop.time()
            self._body_bytes = 0
            self._arm(self.body_timeout, self._body_expired)
            return
        # The app is reading this body: closing tells it the body was cut short, and it
        # answers (to no one) and logs that.
        self.transport.close()

    async def _at_capacity(self, scope: Any, receive: Any, send: Any) -> None:
        log.warning(
            "refused a request: this worker has its limit of %d connections open (LLMGW_MAX_CONNECTIONS)",
            self.max_connections,
        )
        body = (
            f"This gateway worker has its limit of {self.max_connections} connections open "
            "(LLMGW_MAX_CONNECTIONS); retry in a moment, on a new connection."
        ).encode("ascii")
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"%d" % len(body)),
            (b"retry-after", b"1"),
            (b"connection", b"close"),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _answer_and_close(self, status: int, message: str) -> None:
        if self.transport.is_closing():
            return
        body = message.encode("ascii")
        self.transport.write(
            STATUS_LINE[status]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: %d\r\nconnection: close\r\nx-content-type-options: nosniff\r\n\r\n"
            % len(body)
            + body
        )
        self.transport.close()

    # One lazy timer per connection: each phase of a request moves its deadline, and the
    # timer, when it fires, follows the deadline if it has moved on. Setting and cancelling
    # a timer at each phase, for limits that almost never expire, was a third of what these
    # protections added to each answer's latency (measured on an app that answers at once).
    def _arm(self, seconds: float, then: Callable[[], None]) -> None:
        self._deadline = self.loop.time() + seconds
        self._expire = then
        if self._timer is not None:
            if self._timer.when() <= self._deadline:
                return  # it fires first, and then follows the deadline
            self._timer.cancel()
        self._timer = self.loop.call_at(self._deadline, self._expired)

    def _disarm(self) -> None:
        self._expire = None  # the timer, if armed, fires and finds nothing due

    def _expired(self) -> None:
        self._timer = None
        then = self._expire
        if then is None:
            return
        if self.loop.time() < self._deadline:
            self._timer = self.loop.call_at(self._deadline, self._expired)
            return
        self._expire = None
        then()


def limited_protocol(settings: Settings) -> type[LimitedHttpToolsProtocol]:
    """The protocol class with this worker's limits."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {
            "max_header_bytes": settings.max_header_bytes,
            "max_headers": settings.max_headers,
            "header_timeout": settings.header_timeout,
            "body_timeout": settings.body_timeout,
            "write_timeout": settings.chunk_timeout,
            "max_connections": settings.max_connections,
        },
    )


class Worker(UvicornWorker):  # type: ignore[misc]
    """uvicorn's gunicorn worker, running the limited protocol and capping connections."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = settings_from_env()
        self.CONFIG_KWARGS = {
            **UvicornWorker.CONFIG_KWARGS,
            "http": limited_protocol(settings),
        }
        super().__init__(*args, **kwargs)

    async def _serve(self) -> None:
        # uvicorn_worker's own, but for SIGQUIT: gunicorn's master sends it for a quick stop
        # (when it gets SIGINT or SIGQUIT), and uvicorn_worker took it only as "no longer
        # alive" while its server ran on; the master waited out its graceful timeout (120 s)
        # and killed the workers, logging "Perhaps out of memory?". A quick stop stops now;
        # SIGTERM still lets answers in flight finish.
        self.config.app = self.wsgi
        server = Server(config=self.config)
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, _stop_now, server)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)


def _stop_now(server: Server) -> None:
    server.should_exit = True
    server.force_exit = True
