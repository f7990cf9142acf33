"""The node agent's status socket (llmgw/node/run.py): connections to it go out without
Nagle's algorithm. With it on, each answer uvicorn wrote as a head and then a body waited
for the client's delayed ACK: every call to the agent took 44 ms instead of 1, twice on the
way to each on-demand start and once for every on-demand request's lease."""

from __future__ import annotations

import asyncio
import socket

from llmgw.node.run import bind_status
from tests.gateway.harness import free_port


def test_connections_to_the_agent_send_without_waiting_for_acks() -> None:
    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        sock = bind_status(f"127.0.0.1:{free_port()}")
        server = await asyncio.start_server(on_connect, sock=sock)
        host, port = sock.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            async with asyncio.timeout(5):
                return await seen
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(accepted_nodelay()) != 0, "Nagle's algorithm is on for the agent's connections"
