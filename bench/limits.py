"""What rate limits add to a keyed request: counted in the instance's SQLite file, and on
Redis over loopback (LLMGW_REDIS_URL), in one run.

    .venv/bin/python bench/limits.py [--blocks 20] [--block-requests 300] [--calls 20000]

Two measures, each taking turns between the stores so a shared machine's drift falls on both:

- in the worker: one admission and one count of tokens (what a request with limits costs
  the limiter: `admit` as it arrives, `count` as its answer ends), called directly, p50/p99;
- through a gateway (one worker each, the same fake engine): a key with rpm and tpm, and
  one without, on a gateway counting in SQLite and on one counting on Redis; sequential
  requests on one kept-alive connection each. The added latency is the median over blocks
  of a target's p50 less that of the key without limits on the SQLite gateway, which costs
  no limiter anything, in the same turn (p99 likewise over every request). On Redis the key
  without limits still pays one round trip as its answer ends: its usage totals.

Needs redis-server (`apt-get install redis-server`); it is started on a loopback port with
nothing kept on disk, and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from gateway import BODY, _Client, in_turns, pct  # noqa: E402
from redis_server import redis_server  # noqa: E402

from llmgw.gateway.request.limits import LocalLimiter  # noqa: E402
from llmgw.gateway.request.limits_redis import SharedLimiter  # noqa: E402
from llmgw.gateway.state.keys import Tenant  # noqa: E402

FREE, LIMITED = "sk-free", "sk-limited"
# Limits no bench reaches: every request is admitted and counted, none refused.
RPM, TPM = 1_000_000_000, 1_000_000_000_000


def in_worker(limiters: dict[str, LocalLimiter], calls: int, blocks: int) -> dict[str, list[float]]:
    """Seconds per admit + count, per store, in blocks that take turns. A key of its own per
    block: a window holds a minute of one key's requests, not the whole bench's (SQLite sums
    the rows in the window at every admission, so its cost grows with them)."""
    times: dict[str, list[float]] = {name: [] for name in limiters}
    for block in range(blocks):
        tenant = Tenant(f"bench-{block}", None, RPM, TPM, None)
        for name in list(limiters) if block % 2 == 0 else list(reversed(limiters)):
            limiter, clock = limiters[name], time.perf_counter
            for _ in range(calls // blocks):
                start = clock()
                limiter.admit(tenant)
                limiter.count(tenant, 3, 4)
                times[name].append(clock() - start)
    return times


async def _keyed(url: str, key: str) -> _Client:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: _Client(host, "/v1/chat/completions"), host, int(port))
    client.head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {key}\r\ncontent-length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    return client


async def through_gateway(
    targets: dict[str, tuple[str, str]], blocks: int, per_block: int
) -> dict[str, list[list[float]]]:
    clients = {name: await _keyed(url, key) for name, (url, key) in targets.items()}
    # The warm-up also fills the pools, the SQLite file and Redis's script cache.
    return await in_turns(clients, blocks, per_block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20, help="taking turns, in each measure")
    parser.add_argument("--block-requests", type=int, default=300, help="sequential, per gateway block")
    parser.add_argument("--calls", type=int, default=20000, help="admit + count, per store, in the worker")
    args = parser.parse_args()
    try:
        import uvloop

        run: Callable[..., object] = uvloop.run
    except ImportError:
        run = asyncio.run

    with (
        tempfile.TemporaryDirectory() as tmp_name,
        redis_server(Path(tmp_name)) as redis,
        harness.engine("bench", "127.0.0.2") as engine,
    ):
        tmp = Path(tmp_name)
        limiters: dict[str, LocalLimiter] = {
            "sqlite": LocalLimiter(Path(tempfile.mkdtemp(dir=tmp))),
            "redis": SharedLimiter(redis.url, Path(tempfile.mkdtemp(dir=tmp))),
        }
        calls = in_worker(limiters, args.calls, args.blocks)
        plan_path = tmp / "plan.json"
        harness.write_plan(
            plan_path, harness.plan([harness.model("bench", [harness.profile([engine.url], "bench")])])
        )
        keys = tmp / "keys.yaml"
        keys.write_text(
            "keys:\n"
            f"  - {{name: free, sha256: {harness.key_digest(FREE)}}}\n"
            f"  - {{name: limited, sha256: {harness.key_digest(LIMITED)}, rpm: {RPM}, tpm: {TPM}}}\n"
        )
        env = {"LLMGW_ACCESS_LOG": "off", "LLMGW_KEYS_FILE": str(keys)}
        with (
            harness.gateway(plan_path, workers=1, **env) as sqlite_gw,
            harness.gateway(plan_path, workers=1, LLMGW_REDIS_URL=redis.url, **env) as redis_gw,
        ):
            targets = {
                "sqlite free": (sqlite_gw.url, FREE),
                "sqlite limited": (sqlite_gw.url, LIMITED),
                "redis free": (redis_gw.url, FREE),
                "redis limited": (redis_gw.url, LIMITED),
            }
            samples = run(through_gateway(targets, args.blocks, args.block_requests))
            assert isinstance(samples, dict)
    report(calls, samples)


def report(calls: dict[str, list[float]], samples: dict[str, list[list[float]]]) -> None:
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.3f} ms"

    print("in the worker: one admit + one count")
    for name, times in calls.items():
        print(f"  {name:<8} p50 {ms(statistics.median(times)):>10}   p99 {ms(pct(times, 0.99)):>10}")
    base = samples["sqlite free"]
    every_base = [t for block in base for t in block]
    print(
        "through a gateway, added to a key without limits on the SQLite gateway "
        f"(p50 {ms(statistics.median(every_base))}, p99 {ms(pct(every_base, 0.99))}):"
    )
    for name in ("sqlite limited", "redis free", "redis limited"):
        pairs = zip(samples[name], base, strict=True)
        added = statistics.median(statistics.median(got) - statistics.median(ref) for got, ref in pairs)
        every = [t for block in samples[name] for t in block]
        added_p99 = pct(every, 0.99) - pct(every_base, 0.99)
        print(f"  {name:<15} added p50 {ms(added):>10}   added p99 {ms(added_p99):>10}")
    print(
        f"redis − sqlite in the worker, p50: "
        f"{ms(statistics.median(calls['redis']) - statistics.median(calls['sqlite']))}"
    )


if __name__ == "__main__":
    main()
