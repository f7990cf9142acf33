"""What a connection may hold of a worker: header size and count, how long headers and a
body may take, and how many connections there may be, through the real worker class.

One worker with small limits, so each is reached quickly and every connection lands on it.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from harness import Engine, Gateway, gateway, model, plan, profile, write_plan

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
MAX_HEADER_BYTES = 8192
MAX_HEADERS = 30
MAX_CONNECTIONS = 12


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("limits") / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    with gateway(
        path,
        workers=1,
        LLMGW_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
        LLMGW_BODY_TIMEOUT=str(BODY_TIMEOUT),
        LLMGW_MAX_HEADER_BYTES=str(MAX_HEADER_BYTES),
        LLMGW_MAX_HEADERS=str(MAX_HEADERS),
        LLMGW_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    ) as g:
        yield g


def connect(gw: Gateway) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=20)


def until_closed(s: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends before it closes the connection, and how long that took."""
    started = time.monotonic()
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            got += chunk
    return got, time.monotonic() - started


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(gw: Gateway) -> None:
    with connect(gw) as s:
        answer, waited = until_closed(s)
    assert status_of(answer) == 408, answer
    assert waited < HEADER_TIMEOUT + 3, f"an idle connection stayed open {waited:.1f}s"


def test_half_the_headers_is_closed_after_the_header_timeout(gw: Gateway) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer, waited = until_closed(s)
    assert status_of(answer) == 408, answer
    assert waited < HEADER_TIMEOUT + 3


def test_a_kept_alive_connections_next_request_has_the_whole_header_timeout_from_its_own_start(
    gw: Gateway,
) -> None:
    with connect(gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(HEADER_TIMEOUT * 0.75)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer, waited = until_closed(s)
    assert b"HTTP/1.1 408 " in answer, answer
    # Not cut short by the first request's clock, nor left open past its own.
    assert HEADER_TIMEOUT - 0.3 < waited < HEADER_TIMEOUT + 3, f"closed after {waited:.1f}s"


def test_half_a_body_is_closed_after_the_body_timeout_and_reaches_no_engine(
    gw: Gateway, engine_a: Engine
) -> None:
    before = engine_a.stats()["requests"]
    with connect(gw) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": "chat"'
        )
        _, waited = until_closed(s)
    assert waited < BODY_TIMEOUT + 3, f"a stalled upload held its connection {waited:.1f}s"
    assert engine_a.stats()["requests"] == before
    assert "Traceback" not in gw.log(), gw.log()[-3000:]


def test_headers_over_the_size_limit_are_431(gw: Gateway) -> None:
    with connect(gw) as s:
        with contextlib.suppress(OSError):  # the server may close before all is sent
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000_000 + b"\r\n\r\n")
        answer, _ = until_closed(s)
    assert status_of(answer) == 431, answer[:200]


def test_more_headers_than_the_limit_is_431(gw: Gateway) -> None:
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(100_000))
    with connect(gw) as s:
        with contextlib.suppress(OSError):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
        answer, _ = until_closed(s)
    assert status_of(answer) == 431, answer[:200]


def test_ordinary_requests_within_the_limits_are_served(gw: Gateway) -> None:
    headers = {"Cookie": "c" * 4000, **{f"X-H{i}": "v" for i in range(10)}}
    answer = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "chat", "messages": []}, headers=headers, timeout=30
    )
    assert answer.status_code == 200, answer.text
    with httpx.Client(timeout=30) as client:  # a kept-alive connection outlives the header timeout
        assert client.get(gw.url + "/healthz").status_code == 200
        time.sleep(HEADER_TIMEOUT + 0.5)
        assert client.get(gw.url + "/healthz").status_code == 200


def test_connections_past_the_cap_are_answered_503(gw: Gateway) -> None:
    held = [connect(gw) for _ in range(MAX_CONNECTIONS)]
    try:
        with connect(gw) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer, _ = until_closed(s)
        assert status_of(answer) == 503, answer[:200]
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200
