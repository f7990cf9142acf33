"""Clients that misbehave on purpose, and what they cost the gateway: shared by
tests/gateway/test_misbehaving_clients.py and bench/clients.py.

    slow_read        one streamed answer read at a slow, steady rate
    trickle          a request sent a byte at a time, until the server hangs up
    hold_idle        thousands of kept-alive connections, one request answered on each
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from harness import Engine

# What the fake engine pads each event to: about 2,000 events make a 128 MiB stream.
EVENT_BYTES = 65536


def rss_bytes(pids: set[int]) -> int:
    """The resident memory of these processes now, summed."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def stream_request(model: str, total_bytes: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [],
            "stream": True,
            "fake_chunks": total_bytes // EVENT_BYTES,
            "fake_chunk_bytes": EVENT_BYTES,
        }
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def loopback_buffer_bound(client_rcvbuf: int) -> int:
    """The most the kernel may hold between the engine and a slow reader: the engine's
    send buffer, the gateway's receive and send buffers (each grown by the kernel up to its
    tcp_wmem / tcp_rmem maximum), and the reader's receive buffer (doubled by the kernel)."""
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    return 2 * wmem + rmem + 2 * client_rcvbuf


@dataclass
class SlowRead:
    offered: int  # bytes the engine was asked to stream
    read: int  # bytes the reader took in
    streamed: int  # bytes of events the engine managed to write
    rss_before: int
    rss_peak: int
    seconds: float

    @property
    def held(self) -> int:
        """The growth of the workers' memory while the stream was read slowly."""
        return self.rss_peak - self.rss_before


def slow_read(
    url: str,
    model: str,
    engine: Engine,
    pids: set[int],
    offered: int = 128 << 20,
    rate: int = 1 << 20,
    seconds: float = 6.0,
    streams: int = 1,
    rcvbuf: int = 65536,
) -> SlowRead:
    """`streams` streams of `offered` bytes each, every one read at `rate` bytes a second
    for `seconds`, then dropped; the workers' memory sampled throughout."""
    sent_before = engine.stats()["streamed_bytes"]
    before = rss_bytes(pids)
    peak = before
    request = stream_request(model, offered)
    readers = []
    for _ in range(streams):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.connect(address(url))
        s.sendall(request)
        s.setblocking(False)
        readers.append(s)
    read = 0
    tick = 0.02
    per_tick = max(1, int(rate * tick))
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            for s in readers:
                # Up to a tick's worth, then wait: a steady trickle, as over a slow link.
                with contextlib.suppress(BlockingIOError):
                    read += len(s.recv(per_tick))
            peak = max(peak, rss_bytes(pids))
            time.sleep(tick)
        streamed = engine.stats()["streamed_bytes"] - sent_before
    finally:
        for s in readers:
            s.close()
    return SlowRead(offered * streams, read, streamed, before, peak, time.monotonic() - started)


async def trickle(
    url: str, data: bytes, head: bytes = b"", interval: float = 1.0, limit: float = 60.0
) -> tuple[bytes, float]:
    """Send `head` at once, then `data` one byte every `interval` seconds until the server
    hangs up: what it answered, and the seconds from the first trickled byte to the
    hang-up (`limit` if it never did)."""
    reader, writer = await asyncio.open_connection(*address(url))
    writer.write(head)
    answer = bytearray()

    async def listen() -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                answer.extend(chunk)

    listening = asyncio.ensure_future(listen())
    started = time.monotonic()
    try:
        for i in range(len(data)):
            if listening.done() or time.monotonic() - started > limit:
                break
            with contextlib.suppress(OSError):
                writer.write(data[i : i + 1])
                await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(listening), interval)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listening, max(0.0, limit - (time.monotonic() - started)))
        return bytes(answer), time.monotonic() - started
    finally:
        listening.cancel()
        writer.close()


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes = HEALTHZ) -> int:
    """Send one request on a kept-alive connection; the status of its answer, read whole
    (0 if the server hung up instead)."""
    status, _ = await answer_to(reader, writer, request)
    return status


async def answer_to(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes = HEALTHZ
) -> tuple[int, bytes]:
    """Send one request on a kept-alive connection: its answer's status and body."""
    writer.write(request)
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, OSError):
        return 0, b""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return int(head.split(b" ", 2)[1]), await reader.readexactly(length)


@dataclass
class Idle:
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    statuses: dict[int, int]  # status of each one's request → how many
    refusal: bytes  # the body of the last answer that was not a 200


async def hold_idle(url: str, count: int, batch: int = 500) -> Idle:
    """`count` connections, each with one request answered and then left open, idle.
    Opened a batch at a time: all at once would overflow the listen backlog, and the
    kernel would retry the dropped handshakes a second later."""
    idle = Idle([], {}, b"")

    async def one() -> None:
        reader, writer = await asyncio.open_connection(*address(url))
        status, body = await answer_to(reader, writer)
        idle.statuses[status] = idle.statuses.get(status, 0) + 1
        if status != 200:
            idle.refusal = body
        idle.connections.append((reader, writer))

    for start in range(0, count, batch):
        await asyncio.gather(*(one() for _ in range(min(batch, count - start))))
    return idle


def close_all(idle: Idle) -> None:
    for _, writer in idle.connections:
        writer.close()


async def timed_fresh_requests(url: str, count: int, pause: float = 0.05) -> list[tuple[int, float]]:
    """`count` requests, each on a new connection (so each may land on any worker): the
    status and seconds each took."""
    results = []
    for _ in range(count):
        started = time.monotonic()
        reader, writer = await asyncio.open_connection(*address(url))
        try:
            status = await ask(reader, writer)
        finally:
            writer.close()
        results.append((status, time.monotonic() - started))
        await asyncio.sleep(pause)
    return results


def worst(results: list[tuple[int, float]]) -> float:
    return max(seconds for _, seconds in results)
