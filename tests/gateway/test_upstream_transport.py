"""The gateway's HTTP/1.1 transport to engines keeps httpx's behaviour where users meet it."""

from __future__ import annotations

import asyncio

import httpx

from llmgw.gateway.upstream import FastTransport

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"


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
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            for _ in range(3):
                response = await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
                statuses.append(response.status_code)
                assert response.json() == {"ok": True}
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
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            try:
                await client.post(f"http://127.0.0.1:{port}/v1/x", content=b"{}")
            except httpx.RemoteProtocolError:
                pass
            else:
                raise AssertionError("a hang-up before any answer must be an upstream error")
        server.close()

    asyncio.run(scenario())
