"""Thousands of streamed answers at once: what the gateway adds to each, and what it holds.

    .venv/bin/python bench/streams.py [--streams 2000] [--interval 0.05] [--seconds 30] [--workers 2]

A fake engine (tests/gateway/fake_engine.py) streams one token event every `--interval`
seconds for `--seconds`, to `--streams` clients at once: first straight to the engine, then
through a real gateway with `--workers` workers. The streams start spread over `--ramp`
seconds (a crowd arriving, not one instant), and each client records when its headers and
first event came, and the gap before every later event. Printed, for both runs:

    streams completed ([DONE] and every event) and dropped
    time to first event, p50 and p99, and what the gateway added to the p99
    gap between events, p50 and p99, and what the gateway added to the p99
    the gateway workers' resident memory with no stream open and with every stream open,
    and the difference per open stream

The load generator, the fake engine and the gateway share the machine's cores, so on a
2-core machine the figures are the gateway's under contention, not on a machine of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402


class _Stream(asyncio.Protocol):
    """One streamed request on its own connection, timing what arrives."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.parser = httptools.HttpResponseParser(self)
        self.sent = 0.0
        self.first: float | None = None
        self.last = 0.0
        self.gaps: list[float] = []
        self.events = 0
        self.done_seen = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sent = time.perf_counter()
        transport.write(self.head)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(exc)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        now = time.perf_counter()
        count = body.count(b"\n\n")
        if b"data: [DONE]" in body:
            self.done_seen = True
            count -= 1
        if count <= 0:
            return
        if self.first is None:
            self.first = now - self.sent
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.events += count

    def on_message_complete(self) -> None:
        self._end(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("closed before the answer's end"))

    def _end(self, exc: BaseException | None) -> None:
        if self.finished.done():
            return
        if exc is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(exc)


async def run_streams(url: str, args: argparse.Namespace, sample: object) -> dict[str, object]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    events = round(args.seconds / args.interval)
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "fake_chunks": events,
            "fake_chunk_delay": args.interval,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body
    loop = asyncio.get_running_loop()
    streams: list[_Stream] = []
    failures: list[str] = []

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        stream = _Stream(head)
        streams.append(stream)
        try:
            await loop.create_connection(lambda: stream, host, int(port))
            await stream.finished
        except Exception as exc:  # noqa: BLE001  # a failed stream is a figure, not a crash
            failures.append(type(exc).__name__)

    gap = args.ramp / args.streams
    tasks = [loop.create_task(one(i * gap)) for i in range(args.streams)]
    # Every stream is open from the end of the ramp until about `seconds` after its start.
    await asyncio.sleep(args.ramp + min(args.seconds / 2, 10))
    held = sample() if callable(sample) else None
    await asyncio.gather(*tasks)
    complete = [s for s in streams if s.status == 200 and s.done_seen and s.events == events]
    firsts = [s.first for s in streams if s.first is not None]
    gaps = [g for s in streams for g in s.gaps]
    return {
        "complete": len(complete),
        "dropped": args.streams - len(complete),
        "failures": sorted(set(failures)),
        "first_p50": pct(firsts, 0.5),
        "first_p99": pct(firsts, 0.99),
        "gap_p50": pct(gaps, 0.5),
        "gap_p99": pct(gaps, 0.99),
        "held": held,
    }


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def rss_bytes(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between token events")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each stream")
    parser.add_argument("--ramp", type=float, default=5.0, help="streams start spread over this long")
    parser.add_argument("--workers", type=int, default=2)
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
        direct = run(run_streams(engine.url, args, None))
        with harness.gateway(plan_path, workers=args.workers, LLMGW_ACCESS_LOG="off") as gw:
            workers = gw.worker_pids()
            idle = rss_bytes(workers)
            through = run(run_streams(gw.url, args, lambda: rss_bytes(workers)))

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.1f} ms"

    print(
        f"{args.streams} streams, an event every {args.interval * 1000:.0f} ms for {args.seconds:g} s, "
        f"started over {args.ramp:g} s; gateway: {args.workers} workers; machine: {os.cpu_count()} cores"
    )
    print(f"{'':28}{'direct':>12}{'gateway':>12}{'added':>12}")
    print(f"{'streams completed':28}{direct['complete']:>12}{through['complete']:>12}")
    print(f"{'streams dropped':28}{direct['dropped']:>12}{through['dropped']:>12}")
    for key, label in (
        ("first_p50", "time to first event, p50"),
        ("first_p99", "time to first event, p99"),
        ("gap_p50", "gap between events, p50"),
        ("gap_p99", "gap between events, p99"),
    ):
        d, g = float(direct[key]), float(through[key])  # type: ignore[arg-type]
        print(f"{label:28}{ms(d):>12}{ms(g):>12}{ms(g - d):>12}")
    held = through["held"]
    if isinstance(held, int):
        per = (held - idle) / args.streams
        print(
            f"gateway RSS: {idle / 2**20:.0f} MiB idle, {held / 2**20:.0f} MiB with every stream open: "
            f"{per / 1024:.1f} KiB per open stream"
        )
    for name, figures in (("direct", direct), ("gateway", through)):
        if figures["failures"]:
            print(f"{name} failures: {figures['failures']}")


if __name__ == "__main__":
    main()
