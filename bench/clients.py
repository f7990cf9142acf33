"""Misbehaving clients: what each costs the gateway, measured on a real one.

    .venv/bin/python bench/clients.py [--workers 2] [--slow-readers 20] [--idle 10000]
                                      [--header-timeout 2] [--body-timeout 2]

A fake engine (tests/gateway/fake_engine.py) behind a real gateway with `--workers` workers.
Printed, one block each:

    slow readers   `--slow-readers` clients at once, each asking for a 128 MiB stream and
                   reading it at `--rate` bytes/s for `--seconds`: the workers' memory
                   growth per stream, and how far the engine got ahead of each reader (the
                   sockets' buffers on the way, and the gateway's bounded queue)
    idle           `--idle` kept-alive connections, one request answered on each, then left
                   open: the workers' memory per connection, and the slowest of 40 health
                   checks on fresh connections meanwhile
    slowloris      headers, then a body, sent a byte a second: seconds until the gateway
                   hangs up, beside the timeout it was given

Memory is resident memory from /proc/PID/status, summed over the workers. The engine, the
clients and the gateway share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402
from bad_clients import (  # noqa: E402
    close_all,
    hold_idle,
    rss_bytes,
    slow_read,
    timed_fresh_requests,
    trickle,
    worst,
)


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def bench_slow_readers(gw: harness.Gateway, engine: harness.Engine, args: argparse.Namespace) -> None:
    # A few streams at full speed first, so the allocator is at its working size.
    for _ in range(3):
        slow_read(gw.url, "chat", engine, gw.worker_pids(), offered=8 << 20, rate=1 << 30, seconds=0.5)
    result = slow_read(
        gw.url,
        "chat",
        engine,
        gw.worker_pids(),
        rate=args.rate,
        seconds=args.seconds,
        streams=args.slow_readers,
    )
    n = args.slow_readers
    print(
        f"slow readers: {n} streams of {mib(result.offered / n)} read at {mib(args.rate)}/s for "
        f"{args.seconds:g}s; each reader got {mib(result.read / n)}\n"
        f"  workers' memory: +{mib(result.held)} in all, {mib(result.held / n)} per stream\n"
        f"  engine ahead of its reader: {mib((result.streamed - result.read) / n)} per stream "
        f"(it sent {mib(result.streamed / n)} of {mib(result.offered / n)})"
    )


def bench_idle(gw: harness.Gateway, args: argparse.Namespace) -> None:
    async def run() -> None:
        pids = gw.worker_pids()
        before = rss_bytes(pids)
        idle = await hold_idle(gw.url, args.idle)
        try:
            held = rss_bytes(pids) - before
            others = await timed_fresh_requests(gw.url, 40)
        finally:
            close_all(idle)
        print(
            f"idle: {args.idle} kept-alive connections, answers {json.dumps(idle.statuses)}\n"
            f"  workers' memory: +{mib(held)} in all, {held / args.idle / 1024:.1f} KiB per connection\n"
            f"  meanwhile, the slowest of 40 health checks on new connections: {worst(others) * 1000:.0f} ms"
        )

    asyncio.run(run())


def bench_slowloris(gw: harness.Gateway, args: argparse.Namespace) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000 + b"\r\n\r\n"
    answer, headers_cut = asyncio.run(trickle(gw.url, head, limit=args.header_timeout + 30))
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    _, body_cut = asyncio.run(trickle(gw.url, b"a" * 100000, head=post, limit=args.body_timeout + 30))
    print(
        "slowloris, a byte a second:\n"
        f"  headers: cut off after {headers_cut:.1f}s ({answer[:12].decode(errors='replace')}); "
        f"LLMGW_HEADER_TIMEOUT={args.header_timeout:g}\n"
        f"  body:    cut off after {body_cut:.1f}s; LLMGW_BODY_TIMEOUT={args.body_timeout:g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slow-readers", type=int, default=20, help="streams read slowly at once")
    parser.add_argument("--rate", type=int, default=256 << 10, help="bytes/s each slow reader reads")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the slow readers read")
    parser.add_argument("--idle", type=int, default=10_000, help="idle kept-alive connections")
    parser.add_argument("--header-timeout", type=float, default=2.0)
    parser.add_argument("--body-timeout", type=float, default=2.0)
    args = parser.parse_args()

    # Each idle connection is a file on both ends; the gateway inherits this limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = args.idle + 2000
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            sys.exit(f"--idle {args.idle} needs {needed} open files; the hard limit is {hard}: ask fewer.")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))

    with tempfile.TemporaryDirectory() as tmp, harness.engine("bench", "127.0.0.2") as engine:
        path = Path(tmp) / "plan.json"
        harness.write_plan(
            path, harness.plan([harness.model("chat", [harness.profile([engine.url], "chat")])])
        )
        with harness.gateway(
            path,
            workers=args.workers,
            LLMGW_HEADER_TIMEOUT=str(args.header_timeout),
            LLMGW_BODY_TIMEOUT=str(args.body_timeout),
            LLMGW_MAX_CONNECTIONS=str(args.idle + 1000),
        ) as gw:
            bench_slow_readers(gw, engine, args)
            bench_idle(gw, args)
            bench_slowloris(gw, args)


if __name__ == "__main__":
    main()
