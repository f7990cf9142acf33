"""Clients that misbehave on purpose, against the real gateway: one that reads a large
stream slowly, ones that send a request a byte a second (slowloris), and ten thousand that
hold a kept-alive connection and say nothing more.

What a worker may hold for each is measured from its resident memory (/proc/PID/status),
and bench/clients.py prints the same figures.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator

import httpx
import pytest
from bad_clients import (
    Idle,
    SlowRead,
    ask,
    close_all,
    hold_idle,
    loopback_buffer_bound,
    open_fds,
    slow_read,
    stream_request,
    timed_fresh_requests,
    trickle,
    worst,
)
from harness import Engine, Gateway, gateway, model, plan, profile, write_plan

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
# What a worker may grow by per stream read slowly: the 1 MiB the engine connection
# queues before it stops reading, the 64 KiB the socket's write buffer takes before the
# server waits, and slack for the allocator. Each stream's queue moved into the write buffer
# in one go came to 2.4 MiB; buffering the stream instead, to tens of MiB.
PER_SLOW_STREAM = 1792 << 10
SLOW_STREAMS = 8  # several at once, so the allocator's noise is shared out
CLIENT_RCVBUF = 65536
PROMPT = 1.0  # seconds: an answer to a health check slower than this is a stalled worker


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("clients") / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    with gateway(
        path,
        workers=1,
        LLMGW_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
        LLMGW_BODY_TIMEOUT=str(BODY_TIMEOUT),
    ) as g:
        yield g


# A slow reader


@pytest.fixture(scope="module")
def slow(gw: Gateway, engine_a: Engine) -> SlowRead:
    """Eight clients each reading a 128 MiB stream at 512 KiB/s for 6 s, after a few streams
    read at full speed: those leave the worker's allocator at its working size, so what
    grows after is what the slow readers hold."""
    for _ in range(3):
        with httpx.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            content=stream_request("chat", 4 << 20).split(b"\r\n\r\n", 1)[1],
            headers={"Content-Type": "application/json"},
            timeout=30,
        ) as answer:
            for _ in answer.iter_raw():
                pass
    return slow_read(
        gw.url, "chat", engine_a, gw.worker_pids(), rate=512 << 10, streams=SLOW_STREAMS, rcvbuf=CLIENT_RCVBUF
    )


def test_a_slow_reader_holds_a_bounded_amount_of_the_workers_memory(slow: SlowRead) -> None:
    n = SLOW_STREAMS
    assert slow.read > n << 20, f"the readers got only {slow.read} bytes: the streams never flowed"
    assert slow.held / n <= PER_SLOW_STREAM, (
        f"the worker grew {slow.held / n / 2**20:.1f} MiB per stream while {n} clients each read "
        f"{slow.read / n / 2**20:.1f} MiB of a {slow.offered / n / 2**20:.0f} MiB stream: it buffers "
        "what the clients have not read"
    )


def test_a_slow_reader_holds_the_engine_back(slow: SlowRead) -> None:
    # Past what a reader took, the engine can only have filled the sockets' buffers on the
    # way and the gateway's bounded queue; without backpressure it sends all it was asked to.
    n = SLOW_STREAMS
    ahead = (slow.streamed - slow.read) / n
    bound = loopback_buffer_bound(CLIENT_RCVBUF) + PER_SLOW_STREAM
    assert ahead <= bound, (
        f"the engine sent {slow.streamed / n / 2**20:.1f} MiB of {slow.offered / n / 2**20:.0f} MiB per "
        f"stream while each client read {slow.read / n / 2**20:.1f} MiB: {ahead / 2**20:.1f} MiB ahead, "
        f"more than the {bound / 2**20:.0f} MiB the sockets and the gateway's queue may hold"
    )


# Slowloris


def test_headers_sent_a_byte_a_second_are_cut_off_at_the_header_timeout(gw: Gateway) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    answer, waited = asyncio.run(trickle(gw.url, head, limit=HEADER_TIMEOUT + 10))
    assert waited < HEADER_TIMEOUT + 2, f"headers trickled a byte a second held a connection {waited:.1f}s"
    assert answer.startswith(b"HTTP/1.1 408 "), f"cut off with {answer[:200]!r}, not a 408 saying why"


def test_a_body_sent_a_byte_a_second_is_cut_off_and_reaches_no_engine(gw: Gateway, engine_a: Engine) -> None:
    before = engine_a.stats()["requests"]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    body = b'{"model": "chat", "messages": [], "pad": "' + b"a" * 1000
    _, waited = asyncio.run(trickle(gw.url, body, head=head, limit=BODY_TIMEOUT + 10))
    # A byte a second never leaves the body timeout without a byte: only its rate shows
    # the client is holding the request open rather than uploading it.
    assert waited < BODY_TIMEOUT + 2, f"a body trickled a byte a second held its request {waited:.1f}s"
    assert engine_a.stats()["requests"] == before


def test_a_worker_with_slowloris_clients_answers_others_promptly(gw: Gateway) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"

    async def run() -> list[tuple[int, float]]:
        slowloris = [trickle(gw.url, head, limit=10) for _ in range(100)]
        slowloris += [trickle(gw.url, b"a" * 1000, head=post, limit=10) for _ in range(100)]
        tricklers = asyncio.gather(*slowloris)
        await asyncio.sleep(0.5)  # every trickler connected and sending
        others = await timed_fresh_requests(gw.url, 40)
        await tricklers
        return others

    others = asyncio.run(run())
    assert all(status == 200 for status, _ in others), others
    assert worst(others) < PROMPT, (
        f"with 200 slowloris clients on its one worker, a health check took {worst(others):.2f}s"
    )


# Ten thousand idle connections

IDLE = 10_000


def raise_fd_limit(needed: int) -> None:
    """Raise this process's open-file limit; a gateway started after inherits it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"{IDLE} connections need {needed} open files; the hard limit here is {hard}")
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    """Two workers, each allowed every idle connection: the kernel decides which worker
    accepts each one, and need not split them evenly."""
    raise_fd_limit(IDLE + 2000)
    path = tmp_path_factory.mktemp("idle") / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    with gateway(path, workers=2, LLMGW_MAX_CONNECTIONS=str(IDLE + 1000)) as g:
        yield g


def test_ten_thousand_idle_keep_alive_connections_leave_others_answered_promptly(roomy: Gateway) -> None:
    async def run() -> tuple[dict[int, int], list[tuple[int, float]], list[int]]:
        idle = await hold_idle(roomy.url, IDLE)
        try:
            others = await timed_fresh_requests(roomy.url, 40)
            # The idle ones were held, not dropped: a sample asks again on its connection.
            again = [await ask(r, w) for r, w in idle.connections[:: IDLE // 50]]
        finally:
            close_all(idle)
        return idle.statuses, others, again

    statuses, others, again = asyncio.run(run())
    assert statuses == {200: IDLE}, statuses
    assert all(status == 200 for status, _ in others), others
    assert worst(others) < PROMPT, (
        f"with {IDLE} idle keep-alive connections open, a health check took {worst(others):.2f}s"
    )
    assert set(again) == {200}, f"idle kept-alive connections were dropped: {again}"


CAP = 1000


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    raise_fd_limit(IDLE + 2000)
    path = tmp_path_factory.mktemp("capped") / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    with gateway(path, workers=2, LLMGW_MAX_CONNECTIONS=str(CAP)) as g:
        yield g


def test_connections_past_each_workers_cap_are_answered_503_and_not_held(capped: Gateway) -> None:
    pids = capped.worker_pids()
    baseline = {pid: open_fds(pid) for pid in pids}

    async def run() -> tuple[Idle, dict[int, int]]:
        idle = await hold_idle(capped.url, 3 * CAP)
        try:
            await asyncio.sleep(0.5)  # the refused ones closed by the workers
            return idle, {pid: open_fds(pid) - baseline[pid] for pid in pids}
        finally:
            close_all(idle)

    idle, held = asyncio.run(run())
    statuses = idle.statuses
    assert set(statuses) <= {200, 503}, f"past the cap, answers other than 200 or 503: {statuses}"
    assert statuses.get(503), f"{3 * CAP} connections to 2 workers capped at {CAP} were all served"
    assert b"LLMGW_MAX_CONNECTIONS" in idle.refusal, f"a refused client was told only {idle.refusal!r}"
    over = {pid: n for pid, n in held.items() if n > CAP}
    assert not over, f"workers held more connections than LLMGW_MAX_CONNECTIONS={CAP}: {over}"
