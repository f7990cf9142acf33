"""`llmgw status` against agents that misbehave: deeply nested JSON, a byte every half second,
and an endless answer. Each is one sentence in the report, within the timeout, and reading
stops at a bound: before, a RecursionError traceback, a wait past 45 s with a 5 s timeout, and
856 MB of memory for a 400 MB answer."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from llmgw.status import ask_agents

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"


@contextlib.contextmanager
def agent(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):
                    answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def nested(conn: socket.socket) -> None:
    body = b'{"replicas": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    conn.sendall(HEAD + b"content-length: %d\r\n\r\n" % len(body) + body)


def drip(conn: socket.socket) -> None:
    conn.sendall(HEAD + b"content-length: 1000\r\n\r\n")
    for _ in range(200):
        conn.sendall(b" ")
        time.sleep(0.5)


def endless(conn: socket.socket) -> None:
    conn.sendall(HEAD + b"transfer-encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    for _ in range(20_000):  # 1.3 GB, were it all read
        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))


@pytest.mark.parametrize("misbehaving", [nested, drip, endless], ids=["nested", "drip", "endless"])
def test_a_misbehaving_agent_is_one_sentence_within_the_timeout(
    misbehaving: Callable[[socket.socket], None],
) -> None:
    with agent(misbehaving) as url:
        reports = asyncio.run(asyncio.wait_for(ask_agents({"node-a": url}, timeout_s=2.0), 20))
    report = reports["node-a"]
    assert report.replicas is None and report.error, report
    assert url in report.error
