"""How long `llmgw serve` takes to be ready with a large plan, and to reload one.

    .venv/bin/python bench/startup.py [--models 5000] [--workers 2]

Builds a plan of `--models` chat models, each with two replicas on loopback addresses where
nothing listens (so health checks fail at once, as on a fleet still booting), starts a real
gateway (gunicorn, `--workers` uvicorn workers) and prints the seconds until every worker's
/readyz names the plan; then replaces the plan file with one naming other replicas and
prints the seconds until every worker serves it. Also the plan's size, and each worker's
resident memory once it is serving.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402

from llmgw.plan import Plan  # noqa: E402


def build(models: int, port_base: int) -> Plan:
    docs = []
    for i in range(models):
        # 127.0.0.0/8 only: the gateway health-checks whatever a plan names.
        endpoints = [f"http://127.0.{(i >> 8) & 255}.{i & 255 or 1}:{port_base + k}" for k in range(2)]
        docs.append(
            harness.model(
                f"model-{i:05d}",
                [harness.profile(endpoints, f"model-{i:05d}")],
                aliases=[f"alias-{i:05d}"],
                description=f"Generated model {i} for the startup benchmark.",
            )
        )
    return harness.plan(docs)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = Path(tmp) / "plan.json"
        first = build(args.models, 9)
        harness.write_plan(plan_path, first)
        size = plan_path.stat().st_size
        start = time.perf_counter()
        # `gateway()` returns once every worker's /readyz names the plan's digest.
        with harness.gateway(plan_path, workers=args.workers, LLMGW_ACCESS_LOG="off") as gw:
            ready = time.perf_counter() - start
            memory = {pid: rss_mib(pid) for pid in gw.worker_pids()}
            second = build(args.models, 19)
            start = time.perf_counter()
            harness.write_plan(plan_path, second)
            gw.every_worker(lambda r: r["digest"] == second.digest, 60, "the new plan")
            reloaded = time.perf_counter() - start
    print(f"plan: {args.models} models, {2 * args.models} replicas, {size / 2**20:.1f} MiB of JSON")
    print(f"llmgw serve ready (every one of {args.workers} workers serving it): {ready:.2f} s")
    print(f"plan file replaced -> every worker serving the new plan: {reloaded:.2f} s")
    print("worker RSS: " + ", ".join(f"{mib:.0f} MiB" for mib in memory.values()))
    print(f"machine: {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
