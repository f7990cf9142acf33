"""A long run and a big reload under load: does the gateway hold still, and drop nothing?

    .venv/bin/python bench/soak.py [--requests 100000] [--models 1000] [--rate 500] [--workers 2]

Soak: `--requests` non-streamed chat requests (one in ten streamed) through a real gateway
with `--workers` workers, from 32 keep-alive connections. The workers' resident memory and
open file descriptors are read at the start (after a warm-up), the middle and the end, and
printed with the change from start to end.

Reload: the gateway serves a plan of `--models` models while a client sends `--rate`
requests a second; the plan file is replaced by one where every model has moved to another
replica, and the bench prints the requests that failed (anything but 200) and the seconds
from the replacement until every worker serves the new plan.

The load generator, the fake engines and the gateway share the machine, so on 2 cores the
rate a run reaches is the machine's, not the gateway's alone.
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
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402

from llmgw.plan import Plan  # noqa: E402

CHAT = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


def process_figures(pids: set[int]) -> tuple[float, int]:
    """Resident MiB and open file descriptors, summed over `pids`."""
    rss, fds = 0.0, 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 1024
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return rss, fds


async def soak(url: str, total: int, pids: set[int]) -> dict[str, Any]:
    figures: dict[str, tuple[float, int]] = {}
    failed = 0
    sent = 0
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one(i: int) -> None:
            nonlocal failed
            body = {**CHAT, "stream": True} if i % 10 == 0 else CHAT
            answer = await client.post("/v1/chat/completions", json=body)
            if answer.status_code != 200:
                failed += 1

        async def worker() -> None:
            nonlocal sent
            while sent < total:
                i = sent
                sent += 1
                await one(i)
                if i == 1000:
                    figures["start"] = process_figures(pids)
                elif i == total // 2:
                    figures["middle"] = process_figures(pids)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(32)))
        elapsed = time.perf_counter() - started
    figures["end"] = process_figures(pids)
    return {"figures": figures, "failed": failed, "rate": total / elapsed}


def moved_plan(models: int, engines: list[str], shift: int) -> Plan:
    docs = [harness.model("bench", [harness.profile(engines, "bench")])]
    for i in range(models - 1):
        endpoint = engines[(i + shift) % len(engines)]
        docs.append(harness.model(f"model-{i:04d}", [harness.profile([endpoint], f"model-{i:04d}")]))
    return harness.plan(docs)


async def steady(url: str, rate: float, stop: asyncio.Event) -> tuple[int, int, list[str]]:
    sent = failed = 0
    reasons: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int) -> None:
            nonlocal failed
            model = "bench" if i % 2 else f"model-{i % 997:04d}"
            try:
                answer = await client.post("/v1/chat/completions", json={**CHAT, "model": model})
                if answer.status_code != 200:
                    failed += 1
                    reasons.append(f"{answer.status_code}: {answer.text[:120]}")
            except httpx.HTTPError as exc:
                failed += 1
                reasons.append(type(exc).__name__)

        tasks = []
        start = time.perf_counter()
        while not stop.is_set():
            due = start + sent / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.create_task(one(sent)))
            sent += 1
        await asyncio.gather(*tasks)
    return sent, failed, reasons


async def reload_under_load(gw: harness.Gateway, second: Plan, rate: float) -> dict[str, Any]:
    stop = asyncio.Event()
    load = asyncio.create_task(steady(gw.url, rate, stop))
    await asyncio.sleep(3)
    started = time.perf_counter()
    harness.write_plan(gw.plan_path, second)
    await asyncio.to_thread(gw.every_worker, lambda r: r["digest"] == second.digest, 60, "the new plan")
    took = time.perf_counter() - started
    await asyncio.sleep(3)
    stop.set()
    sent, failed, reasons = await load
    return {"took": took, "sent": sent, "failed": failed, "reasons": sorted(set(reasons))[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    with (
        tempfile.TemporaryDirectory() as tmp,
        harness.engine("a", "127.0.0.2") as a,
        harness.engine("b", "127.0.0.3") as b,
    ):
        plan_path = Path(tmp) / "plan.json"
        engines = [a.url, b.url]
        harness.write_plan(plan_path, moved_plan(args.models, engines, 0))
        env = {"LLMGW_ACCESS_LOG": "off", "LLMGW_HEALTH_INTERVAL": "2", "LLMGW_RELOAD_INTERVAL": "0.5"}
        with harness.gateway(plan_path, workers=args.workers, **env) as gw:
            pids = gw.worker_pids()
            soaked = run(soak(gw.url, args.requests, pids))
            second = moved_plan(args.models, engines, 1)
            reloaded = run(reload_under_load(gw, second, args.rate))

    figures = soaked["figures"]
    print(
        f"soak: {args.requests} requests through {args.workers} workers at {soaked['rate']:.0f}/s, "
        f"{soaked['failed']} failed"
    )
    for when in ("start", "middle", "end"):
        rss, fds = figures[when]
        print(f"  {when:<7} RSS {rss:7.1f} MiB   open fds {fds}")
    (rss0, fd0), (rss1, fd1) = figures["start"], figures["end"]
    print(f"  change  RSS {100 * (rss1 - rss0) / rss0:+.1f}%   open fds {fd1 - fd0:+d}")
    print(
        f"reload: {args.models}-model plan replaced while serving {args.rate:.0f} requests/s: "
        f"{reloaded['failed']} of {reloaded['sent']} requests failed; every worker served the new "
        f"plan {reloaded['took']:.2f} s after the file was replaced"
    )
    if reloaded["reasons"]:
        print("  failures: " + json.dumps(reloaded["reasons"]))
    print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
