"""A TCP relay on loopback that a test can silence: a link between two machines going quiet.

A dead process on loopback refuses connections at once; a machine that loses power or its
network does not: its peer's connects hang or are accepted by a middlebox, and bytes already
on the way stop. This relay makes that second kind of failure on one machine:

    relay = SilentRelay(("127.0.0.2", 8080))   # forwards 127.0.0.1:relay.port there
    relay.silence()   # open connections stop forwarding mid-stream, keeping their sockets;
                      # new ones are accepted and never answered
    relay.restore()   # forwards again; connections made while silent are closed

It runs its own event loop in a thread, so a test's blocking client calls do not stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class SilentRelay:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self.silent = False
        self.accepted = 0
        self._held: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, host, 0), self._loop
        ).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://{host}:{self.port}"

    def silence(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "silent", True)

    def restore(self) -> None:
        def back() -> None:
            self.silent = False
            for writer in self._held:
                writer.close()
            self._held.clear()

        self._loop.call_soon_threadsafe(back)

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for writer in self._held:
                writer.close()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.silent:
            await self._swallow(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _swallow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Accepted, read, never answered: what a peer behind a dead link looks like."""
        self._held.add(writer)
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        self._held.discard(writer)
        writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                # Stalled: the bytes are held, never sent, and the socket stays open.
                while self.silent:
                    await asyncio.sleep(0.02)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


@contextlib.contextmanager
def silent_relay(target: tuple[str, int]) -> Iterator[SilentRelay]:
    relay = SilentRelay(target)
    try:
        yield relay
    finally:
        relay.close()
