"""What the gateway costs: the same requests, straight to a fake engine and through llmgw.

    /work/venv/bin/python bench/gateway.py [--seconds 5] [--connections 64] [--workers 2]

Measures, in one run and against the same fast fake engine (tests/gateway/fake_engine.py):
latency at one connection (sequential requests) and throughput at many connections, first
direct and then through a real gateway (gunicorn + uvicorn workers), and prints the latency
the gateway adds at p50 and p99 and the ratio of throughputs. The load generator is a raw
asyncio HTTP/1.1 client with keep-alive, so it spends as little CPU as it can: on a 2-core
machine it, the engine and the gateway share the cores, so figures are pessimistic for the
gateway compared with a gateway on its own machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402

BODY = json.dumps(
    {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
).encode()


class _Client(asyncio.Protocol):
    """One keep-alive connection; `request()` sends one POST and waits for its whole answer."""

    def __init__(self, host: str, path: str) -> None:
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    async def request(self) -> int:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(self.head)
        return await self.done


async def _connect(url: str, path: str) -> _Client:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: _Client(host, path), host, int(port))
    return client


async def latencies(url: str, path: str, count: int) -> list[float]:
    client = await _connect(url, path)
    for _ in range(200):  # warm up: connection pools, caches, branch predictors
        await client.request()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        status = await client.request()
        times.append(time.perf_counter() - start)
        if status != 200:
            raise SystemExit(f"bench request answered {status}")
    assert client.transport is not None
    client.transport.close()
    return times


async def throughput(url: str, path: str, connections: int, seconds: float) -> float:
    clients = [await _connect(url, path) for _ in range(connections)]
    done = 0
    errors = 0
    stop_at = 0.0

    async def run(client: _Client) -> None:
        nonlocal done, errors
        while time.perf_counter() < stop_at:
            if await client.request() == 200:
                done += 1
            else:
                errors += 1

    stop_at = time.perf_counter() + 1.0  # warm up for a second, not counted
    await asyncio.gather(*(run(c) for c in clients))
    done = 0
    start = time.perf_counter()
    stop_at = start + seconds
    await asyncio.gather(*(run(c) for c in clients))
    elapsed = time.perf_counter() - start
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    if errors:
        raise SystemExit(f"{errors} bench requests failed")
    return done / elapsed


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def measure(url: str, args: argparse.Namespace) -> dict[str, float]:
    path = "/v1/chat/completions"
    lat = await latencies(url, path, args.requests)
    rps = await throughput(url, path, args.connections, args.seconds)
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "mean": statistics.fmean(lat), "rps": rps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3000, help="sequential, for latency")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="medians are reported")
    parser.add_argument(
        "--access-log", action="store_true", help="keep the JSON access log on (written to a file)"
    )
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run

    with tempfile.TemporaryDirectory() as tmp, harness.engine("bench", "127.0.0.2") as engine:
        plan_path = Path(tmp) / "plan.json"
        harness.write_plan(
            plan_path,
            harness.plan([harness.model("bench", [harness.profile([engine.url], "bench")], max_output=4096)]),
        )
        env = {} if args.access_log else {"LLMGW_ACCESS_LOG": "off"}
        with harness.gateway(plan_path, workers=args.workers, **env) as gw:
            # Rounds alternate direct and gateway, and the median of each figure is kept:
            # on a shared 2-core machine any one run can land beside someone's test suite.
            rounds = [
                (run(measure(engine.url, args)), run(measure(gw.url, args))) for _ in range(args.rounds)
            ]
    direct = {k: statistics.median(r[0][k] for r in rounds) for k in rounds[0][0]}
    through = {k: statistics.median(r[1][k] for r in rounds) for k in rounds[0][1]}

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.3f} ms"

    print(f"{'':24}{'direct':>12}{'gateway':>12}{'added':>12}")
    for key in ("p50", "p99", "mean"):
        print(
            f"latency {key:<16}{ms(direct[key]):>12}{ms(through[key]):>12}"
            f"{ms(through[key] - direct[key]):>12}"
        )
    print(
        f"throughput ({args.connections} conn){direct['rps']:>9.0f}/s{through['rps']:>10.0f}/s"
        f"{through['rps'] / direct['rps']:>11.2f}x"
    )
    print(
        f"gateway: {args.workers} worker(s), access log "
        f"{'on' if args.access_log else 'off'}; medians of {args.rounds} rounds; "
        f"machine: {os.cpu_count()} cores"
    )
    print(f"rounds (gateway rps): {[round(r[1]['rps']) for r in rounds]}")


if __name__ == "__main__":
    main()
