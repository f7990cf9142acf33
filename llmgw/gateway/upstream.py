"""The wire to the engines: plain HTTP/1.1 keep-alive, raising httpx's exception types.

httpx's default transport (httpcore on anyio, parsing with h11) spends about 0.35 ms of CPU
per request, and its pool slows as requests in flight grow; measured on a 2-core machine it
capped the whole gateway near 800 requests/s. Engines speak only plain HTTP/1.1 on the LAN,
so this transport does just that, on asyncio protocols with httptools (the parser uvicorn
already uses). Its errors and timeouts are httpx's, so the proxy treats an https endpoint
(through httpx's own transport) and a plain one alike.

The proxy and the health checks hand their requests to it directly (`Upstream.post`,
`Upstream.status`), not through httpx.AsyncClient: the client's cookie jar, auth and
redirect steps, and the Request and Response objects it builds, are nothing an engine needs,
and cost a fifth of the gateway's CPU per request in a profile.

    pool per (host, port): idle connections in a deque, newest first
    a response's bytes are queued by the protocol as they arrive; reading past 1 MiB
    unread pauses the socket, so a slow client slows the engine instead of filling memory
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, overload

import httptools
import httpx

_HIGH_WATER = 1 << 20


class _Connection(asyncio.Protocol):
    __slots__ = (
        "transport",
        "parser",
        "key",
        "chunks",
        "buffered",
        "waiter",
        "status",
        "headers",
        "headers_done",
        "complete",
        "error",
        "closed",
        "keep_alive",
    )

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.error: httpx.TransportError | None = None
        self._reset()

    def _reset(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the engine tried to upgrade the connection"))
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the engine sent malformed HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            kind = httpx.ReadError if self.headers_done else httpx.RemoteProtocolError
            self._fail(kind("the engine closed the connection before answering in full"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def wait(self, timeout: float | None) -> None:
        """Until the protocol has news; httpx.ReadTimeout after `timeout` seconds of none."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.buffered <= _HIGH_WATER // 2 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        return chunk


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("the engine sent nothing in time"))


class _Body(httpx.AsyncByteStream):
    def __init__(self, pool: FastTransport, conn: _Connection, read_timeout: float | None) -> None:
        self.pool = pool
        self.conn = conn
        self.read_timeout = read_timeout
        self.released = False

    def finished(self) -> bool:
        """Whether the answer has ended with nothing of it left to read."""
        # Once given back, the connection may already carry another request's answer.
        return not self.released and self.conn.complete and not self.conn.chunks

    # An iterator of its own rather than an async generator: the event loop keeps every
    # async generator in a weak set until it is finalized, for each request.
    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        conn = self.conn
        while True:
            if conn.chunks:
                return conn.take()
            if conn.complete:
                raise StopAsyncIteration
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.read_timeout)

    async def aclose(self) -> None:
        if self.released:
            return
        self.released = True
        conn = self.conn
        # An answer not read to its end leaves the connection mid-message: closing it is
        # also how the engine learns to stop generating.
        if conn.complete and conn.keep_alive and not conn.closed and not conn.chunks:
            self.pool.release(conn)
        else:
            conn.close()


def _head(
    method: bytes, raw_path: bytes, headers: list[tuple[bytes, bytes]], key: tuple[str, int], body: bytes
) -> bytes:
    lines = [b"%s %s HTTP/1.1\r\n" % (method, raw_path)]
    has_host = False
    for name, value in headers:
        lname = name.lower()
        if lname == b"host":
            has_host = True
        elif lname in (b"content-length", b"transfer-encoding", b"connection"):
            continue
        lines.append(b"%s: %s\r\n" % (name, value))
    if not has_host:
        lines.append(b"host: %s:%d\r\n" % (key[0].encode(), key[1]))
    if body or method in (b"POST", b"PUT", b"PATCH"):
        lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)


class Target:
    """Where one kind of request to one replica goes, parsed once when a plan is loaded:
    parsing URLs per replica (four each) was most of the time a 5,000-model plan took to
    load."""

    __slots__ = ("url", "scheme", "key", "raw_path")

    def __init__(self, scheme: str, key: tuple[str, int], origin: str, path: str) -> None:
        """`origin` is `scheme://host:port`; `path` everything after it."""
        self.scheme = scheme
        self.key = key
        self.url = origin + path
        self.raw_path = path.encode()

    def __str__(self) -> str:
        return self.url


class Reply:
    """An engine's answer as the proxy reads it: status, headers, and the body's chunks.

    What httpx.Response offers that the proxy uses, and no more: building a Response (and
    its Request, URL and Headers) cost more CPU than the bytes it carried.
    """

    __slots__ = ("status_code", "headers", "body")

    def __init__(self, status_code: int, headers: RawHeaders, body: _Body) -> None:
        self.status_code = status_code
        self.headers = headers
        self.body = body

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.body.__aiter__()

    async def aclose(self) -> None:
        await self.body.aclose()


class RawHeaders:
    """Response headers as they came, looked up without regard to case."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = name.encode("ascii")
        for key, value in self.raw:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return default


class FastTransport:
    def __init__(self, max_idle_per_host: int = 256) -> None:
        self.max_idle = max_idle_per_host
        self.idle: dict[tuple[str, int], deque[_Connection]] = {}

    async def request(
        self,
        method: bytes,
        key: tuple[str, int],
        raw_path: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        connect_timeout: float | None,
        read_timeout: float | None,
    ) -> Reply:
        """Send one request; the answer once its headers are here."""
        head = _head(method, raw_path, headers, key, body)
        conn, reused = await self._acquire(key, connect_timeout)
        try:
            await self._exchange(conn, head, body, read_timeout)
        except httpx.RemoteProtocolError:
            conn.close()
            if not reused or conn.status or conn.headers:
                raise
            # An engine may close an idle kept-alive connection just as a request is
            # written on it (llama.cpp and vLLM both time idle connections out). Nothing
            # was answered, so nothing was done: send it once more on a new connection,
            # rather than count a healthy replica as failing.
            conn, _ = await self._acquire(key, connect_timeout, fresh=True)
            try:
                await self._exchange(conn, head, body, read_timeout)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()
            raise
        return Reply(conn.status, RawHeaders(conn.headers), _Body(self, conn, read_timeout))

    async def _exchange(
        self, conn: _Connection, head: bytes, body: bytes, read_timeout: float | None
    ) -> None:
        """Write the request and wait for the response's headers."""
        assert conn.transport is not None
        conn.transport.write(head + body)
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait(read_timeout)

    async def _acquire(
        self, key: tuple[str, int], timeout: float | None, fresh: bool = False
    ) -> tuple[_Connection, bool]:
        """A connection to `key`, and whether it is a kept-alive one being reused."""
        idle = self.idle.get(key)
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                conn._reset()
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(key), key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn, False

    def release(self, conn: _Connection) -> None:
        idle = self.idle.setdefault(conn.key, deque())
        if len(idle) >= self.max_idle:
            conn.close()
            return
        idle.append(conn)

    async def aclose(self) -> None:
        for idle in self.idle.values():
            while idle:
                idle.pop().close()


class Upstream:
    """Sends the proxy's requests: over the fast transport for plain http (engines on the
    LAN), through httpx's own transport for https (an external endpoint)."""

    __slots__ = ("plain", "secure")

    def __init__(self, plain: FastTransport, secure: httpx.AsyncBaseTransport) -> None:
        self.plain = plain
        self.secure = secure

    async def post(
        self, target: Target, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: dict[str, Any]
    ) -> Reply | httpx.Response:
        if target.scheme == "http":
            return await self.plain.request(
                b"POST",
                target.key,
                target.raw_path,
                headers,
                body,
                timeouts.get("connect"),
                timeouts.get("read"),
            )
        request = httpx.Request(
            "POST", target.url, headers=headers, content=body, extensions={"timeout": timeouts}
        )
        response = await self.secure.handle_async_request(request)
        response.request = request
        return response

    async def status(self, target: Target, timeout: float) -> int:
        """GET `target` and read its answer through; its status. httpx errors as they come,
        and httpx.TimeoutException when the whole exchange takes over `timeout` seconds."""
        try:
            async with asyncio.timeout(timeout):
                if target.scheme != "http":
                    request = httpx.Request("GET", target.url)
                    answer: Reply | httpx.Response = await self.secure.handle_async_request(request)
                else:
                    answer = await self.plain.request(
                        b"GET", target.key, target.raw_path, [], b"", None, None
                    )
                try:
                    async for _ in answer.aiter_raw():
                        pass
                finally:
                    await answer.aclose()
        except TimeoutError:
            raise httpx.TimeoutException(f"no answer from {target} within {timeout:g}s") from None
        return answer.status_code

    async def aclose(self) -> None:
        await self.plain.aclose()
        await self.secure.aclose()
