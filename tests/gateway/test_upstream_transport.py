"""The gateway's HTTP/1.1 transport to engines keeps httpx's behaviour where users meet it."""

from __future__ import annotations

import asyncio
import json

import httpx

from llmgw.gateway.upstream import FastTransport, Reply, Target, Upstream

ANSWER = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


async def _post(upstream: Upstream, port: int) -> tuple[int, bytes]:
    """POST {} as the proxy does; the status and the whole body."""
    target = Target("http", ("127.0.0.1", port), f"http://127.0.0.1:{port}", "/v1/x")
    reply = await upstream.post(target, [], b"{}", {})
    try:
        return reply.status_code, b"".join([chunk async for chunk in reply.aiter_raw()])
    finally:
        await reply.aclose()


def _upstream() -> Upstream:
    return Upstream(FastTransport(), httpx.AsyncHTTPTransport())


async def _one_request_per_connection(counts: dict[str, int]) -> asyncio.Server:
    """An engine that answers one request per connection, then hangs up on the next one

    without answering: what an engine's idle timeout looks like when it fires just as
    the gateway reuses the connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["connections"] += 1
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body: {}
        writer.write(ANSWER)
        await writer.drain()
        try:
            await reader.readuntil(b"\r\n\r\n")  # the reused connection's next request
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_a_kept_alive_connection_the_engine_closed_is_retried_on_a_new_one():
    async def scenario() -> list[int]:
        counts = {"connections": 0}
        server = await _one_request_per_connection(counts)
        port = server.sockets[0].getsockname()[1]
        statuses = []
        upstream = _upstream()
        for _ in range(3):
            status, body = await _post(upstream, port)
            statuses.append(status)
            assert json.loads(body) == {"ok": True}
        await upstream.aclose()
        server.close()
        assert counts["connections"] == 3
        return statuses

    assert asyncio.run(scenario()) == [200, 200, 200]


def test_an_engine_that_hangs_up_on_a_new_connection_is_an_error_not_a_retry_loop():
    async def scenario() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        upstream = _upstream()
        try:
            await _post(upstream, port)
        except httpx.RemoteProtocolError:
            pass
        else:
            raise AssertionError("a hang-up before any answer must be an upstream error")
        await upstream.aclose()
        server.close()

    asyncio.run(scenario())


def test_an_answer_given_back_to_the_pool_does_not_take_the_next_one_for_its_own():
    # A 5xx is read whole and its connection given back before the proxy has decided
    # whether to pass it on; meanwhile the connection may carry another request's answer,
    # whose state is not the first answer's.
    async def scenario() -> None:
        answers = iter([b'{"n":1}', b'{"n":2}'])

        async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for body in answers:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n" + body)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(keep_alive, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target("http", ("127.0.0.1", port), f"http://127.0.0.1:{port}", "/v1/x")
        upstream = _upstream()
        first = await upstream.post(target, [], b"{}", {})
        assert isinstance(first, Reply)
        assert b"".join([chunk async for chunk in first.aiter_raw()]) == b'{"n":1}'
        assert first.body.finished()
        await first.aclose()
        second = await upstream.post(target, [], b"{}", {})
        assert isinstance(second, Reply)
        assert b"".join([chunk async for chunk in second.aiter_raw()]) == b'{"n":2}'
        assert second.body.finished()
        assert not first.body.finished(), "the first answer took the second's end for its own"
        await second.aclose()
        await upstream.aclose()
        server.close()

    asyncio.run(scenario())
