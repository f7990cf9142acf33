"""Fair scheduling (issue 34): what a quiet key waits beside a flood, how evenly keys of equal
share are served however many connections each opens, and how many engine starts
interleaved on-demand requests cost; the fair scheduler beside LLMGW_SCHEDULER=fifo, in one run.

    .venv/bin/python bench/fairness.py [--service 0.05] [--quiet 40] [--seconds 5] [--on-demand 100]

Everything listens on 127.0.0.1; every figure comes from the real gateway (gunicorn, two
workers) in front of stand-in engines with slots, so it measures the scheduler, not a model:

- quiet key: one engine with `--parallel 2`, each request taking --service seconds. A key
  asks one request at a time (--quiet of them): alone; beside a key keeping 32 in flight
  with the fair scheduler; and beside the same flood with fifo (first come, first served
  across keys, still two at a time). p50 and p99 of what the client waited, in seconds and
  in service times.
- Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when every key is served alike, 1/n
  when one takes all. Two keys of equal share flood with 4 and 24 connections for --seconds;
  x is what the engine began for each.
- on-demand: the real node agent (`llmgw node`) with stand-in llama-servers (a 0.3 s load,
  --service per request), two on-demand models in room for one. Eight clients send
  --on-demand requests between them, alternating a, b, a, b; the figure is engine starts
  per 100 requests (one start per request is the most; the fewest is one per model).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gateway"))
sys.path.insert(0, str(ROOT))
import busy  # noqa: E402
import harness  # noqa: E402

from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin  # noqa: E402

SCHEDULERS = ("fair", "fifo")
TOKEN = "bench-fairness"


def quiet_key(tmp: Path, service: float, count: int) -> dict[str, list[float]]:
    """The quiet key's waits: alone, and beside a flood of 32 under each scheduler."""
    waits: dict[str, list[float]] = {}
    with busy.slots(2, "127.0.0.7", service) as engine:
        for scheduler in SCHEDULERS:
            folder = Path(tempfile.mkdtemp(dir=tmp))
            with busy.served(folder, engine, 2, LLMGW_SCHEDULER=scheduler, LLMGW_ACCESS_LOG="off") as gw:
                if scheduler == "fair":
                    waits["alone"] = busy.timed(gw, "quiet", count)
                with busy.flood(gw, "flood", 32) as load:
                    full = busy.served_count(engine) + 40
                    harness.wait_until(lambda: busy.served_count(engine) >= full, 60, "the flood")  # noqa: B023
                    # fifo makes each wait ~16 service times: fewer samples, the same run length.
                    waits[scheduler] = busy.timed(gw, "quiet", count if scheduler == "fair" else count // 4)
                if load.failures:
                    print(f"  ({scheduler}: {len(load.failures)} flood requests failed: {load.failures[0]})")
    return waits


def jain(values: list[int]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 0.0


def equal_shares(tmp: Path, service: float, seconds: float) -> dict[str, Counter[str]]:
    """What the engine began for two keys of equal share, 4 and 24 connections, per scheduler."""
    began: dict[str, Counter[str]] = {}
    with busy.slots(2, "127.0.0.8", service) as engine:
        for scheduler in SCHEDULERS:
            folder = Path(tempfile.mkdtemp(dir=tmp))
            with (
                busy.served(folder, engine, 2, LLMGW_SCHEDULER=scheduler, LLMGW_ACCESS_LOG="off") as gw,
                busy.flood(gw, "few", 4),
                busy.flood(gw, "many", 24),
            ):
                time.sleep(1.5)  # both queues full
                before = Counter(busy.stats(engine)["served"])
                time.sleep(seconds)
                after = Counter(busy.stats(engine)["served"])
            began[scheduler] = Counter({key: after[key] - before[key] for key in ("few", "many")})
    return began


def on_demand(tmp: Path, service: float, requests: int) -> dict[str, tuple[int, float, float, int]]:
    """Engine starts, seconds taken, the slowest answer and failures for `requests` alternating between two
    on-demand models that do not fit together, per scheduler."""
    results: dict[str, tuple[int, float, float, int]] = {}
    for scheduler in SCHEDULERS:
        root = Path(tempfile.mkdtemp(dir=tmp))
        fleet = Fleet(root / "fleet", others=False, memory_gb=0.8)
        env = {"LLMGW_AGENT_TOKEN": TOKEN, "STAND_IN_LOAD_S": "0.3", "STAND_IN_SERVICE_S": str(service)}
        agent = Agent(fleet, stand_in_bin(root / "bin", "llama-server"), **env)
        fleet.agent_at(agent.status_url)
        fleet.plan({f"{m}.yaml": _on_demand(m) for m in ("a", "b")})
        agent.start()
        try:
            gw_env = {"LLMGW_AGENT_TOKEN": TOKEN, "LLMGW_SCHEDULER": scheduler, "LLMGW_ACCESS_LOG": "off"}
            with harness.gateway(fleet.plan_path, **gw_env) as gw:
                results[scheduler] = _interleaved(gw.url, agent, requests)
        finally:
            agent.stop()
    return results


def _on_demand(name: str) -> str:
    """A model of 0.5 GB (two do not fit in the node's 0.8) started when asked for."""
    text = chat_model(name, '["--parallel", "2"]').replace("min_memory_gb: 0.1", "min_memory_gb: 0.5")
    return text + "    start: on-demand\n"


def _interleaved(url: str, agent: Agent, requests: int) -> tuple[int, float, float, int]:
    names = itertools.cycle(("a", "b"))
    lock = threading.Lock()
    failures = 0
    slowest = 0.0

    def one(_: int) -> None:
        nonlocal failures, slowest
        with lock:
            name = next(names)
        body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        began = time.monotonic()
        try:
            ok = httpx.post(url + "/v1/chat/completions", json=body, timeout=180).status_code == 200
        except httpx.HTTPError:
            ok = False
        with lock:
            failures += not ok
            slowest = max(slowest, time.monotonic() - began)

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(requests)))
    took = time.monotonic() - start
    starts = sum(r["starts"] for r in agent.replicas().values())
    return starts, took, slowest, failures


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service", type=float, default=0.05, help="seconds a request takes in a slot")
    parser.add_argument("--quiet", type=int, default=40, help="the quiet key's requests, one at a time")
    parser.add_argument("--seconds", type=float, default=5, help="of flooding, for the fairness index")
    parser.add_argument("--on-demand", type=int, default=100, help="interleaved on-demand requests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        waits = quiet_key(tmp, args.service, args.quiet)
        began = equal_shares(tmp, args.service, args.seconds)
        starts = on_demand(tmp, args.service, args.on_demand)
    report(args, waits, began, starts)


def report(
    args: argparse.Namespace,
    waits: dict[str, list[float]],
    began: dict[str, Counter[str]],
    starts: dict[str, tuple[int, float, float, int]],
) -> None:
    service = args.service
    print(f"stand-in engine: --parallel 2, {service * 1000:.0f} ms a request; gateway: 2 workers")
    print(f"\nthe quiet key, one request at a time ({args.quiet}; a quarter as many beside fifo)")
    print(f"  {'':<28}{'p50':>9}{'p99':>9}{'p50/S':>8}{'p99/S':>8}")
    rows = {"alone": "alone", "fair": "beside 32 in flight, fair", "fifo": "beside 32 in flight, fifo"}
    for key, label in rows.items():
        p50, p99 = statistics.median(waits[key]), pct(waits[key], 0.99)
        print(f"  {label:<28}{p50:>8.3f}s{p99:>8.3f}s{p50 / service:>8.1f}{p99 / service:>8.1f}")
    print(f"\nequal shares, 4 and 24 connections, {args.seconds:g} s of flood: requests begun")
    print(f"  {'':<8}{'4 conns':>9}{'24 conns':>10}{'Jain':>7}")
    for scheduler, counts in began.items():
        few, many = counts["few"], counts["many"]
        print(f"  {scheduler:<8}{few:>9}{many:>10}{jain([few, many]):>7.2f}")
    print(f"\non-demand, two models in room for one, {args.on_demand} requests alternating a, b (8 clients)")
    print(f"  {'':<8}{'starts':>7}{'per 100':>9}{'took':>8}{'slowest':>9}{'failed':>8}")
    for scheduler, (count, took, slowest, failed) in starts.items():
        per = count * 100 / args.on_demand
        print(f"  {scheduler:<8}{count:>7}{per:>9.1f}{took:>7.1f}s{slowest:>8.1f}s{failed:>8}")


if __name__ == "__main__":
    main()
