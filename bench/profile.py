"""Where a gateway worker's time goes, layer by layer, for the requests bench/gateway.py
sends one after another: a sampling profile of the one worker, grouped by the layer each
sample was in.

    .venv/bin/python bench/profile.py [--seconds 20] [--rate 500]

Needs py-spy (`.venv/bin/pip install py-spy`; no dependency of llmgw), which samples the
running worker from outside, so the gateway runs as it always does: gunicorn, one worker,
bench/gateway.py's plan and fake engine, the access log off. A sample is counted in the
innermost layer on its stack (a sample in SQLite called by the scheduler is the scheduler's),
and only samples where the worker was not idle are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateway"))
import harness  # noqa: E402
from gateway import _connect  # noqa: E402

# Innermost first: the first of these found walking a sample's stack from its leaf names it.
LAYERS = (
    ("llmgw/gateway/schedule/", "slot accounting (schedule/: the line, SQLite)"),
    ("prometheus_client", "metrics (prometheus_client)"),
    ("llmgw/gateway/upstream.py", "engine connection (upstream.py)"),
    ("llmgw/gateway/request/", "request path (keys, limits, routing, proxy, usage, access log)"),
    ("llmgw/gateway/state/", "request path (keys, limits, routing, proxy, usage, access log)"),
    ("falcon/", "Falcon"),
    ("llmgw/gateway/server/", "server: llmgw's worker protocol (timeouts, writes)"),
    ("uvicorn", "server: uvicorn, httptools, the event loop"),
    ("asyncio", "server: uvicorn, httptools, the event loop"),
    ("uvloop", "server: uvicorn, httptools, the event loop"),
)


def layer_of(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for marker, name in LAYERS:
            if marker in frame:
                return name
    return "other (Python's own, json, the standard library)"


async def sequential(url: str, seconds: float) -> int:
    client = await _connect(url, "/v1/chat/completions")
    end, done = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        await client.request()
        done += 1
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=500, help="samples a second")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("skipped: py-spy is not installed (.venv/bin/pip install py-spy)")
        return
    with tempfile.TemporaryDirectory() as tmp, harness.engine("bench", "127.0.0.2") as engine:
        plan_path = Path(tmp) / "plan.json"
        profile = harness.profile([engine.url], "bench", args=("--parallel", "64"))
        harness.write_plan(plan_path, harness.plan([harness.model("bench", [profile], max_output=4096)]))
        with harness.gateway(plan_path, workers=1, LLMGW_ACCESS_LOG="off") as gw:
            [worker] = gw.worker_pids()
            asyncio.run(sequential(gw.url, 3))  # warm
            stacks = Path(tmp) / "stacks.txt"
            argv = [spy, "record", "-p", str(worker), "-d", str(int(args.seconds)), "-r", str(args.rate)]
            sampling = subprocess.Popen(
                [*argv, "-f", "raw", "-o", str(stacks), "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            requests = asyncio.run(sequential(gw.url, args.seconds + 1))
            sampling.wait()
        counts: collections.Counter[str] = collections.Counter()
        for line in stacks.read_text().splitlines():
            stack, n = line.rsplit(" ", 1)
            counts[layer_of(stack)] += int(n)
    total = sum(counts.values())
    # The requests of the sampled seconds: the load ran a second longer than the sampling.
    sampled = requests * args.seconds / (args.seconds + 1)
    busy_ms = total / args.rate / sampled * 1000
    print(f"{requests} sequential requests in {args.seconds + 1:g} s, one worker; {total} busy samples")
    print(f"the worker busy {busy_ms:.3f} ms a request, of which:")
    for name, n in counts.most_common():
        print(f"  {100 * n / total:5.1f}%  {busy_ms * n / total:6.3f} ms  {name}")


if __name__ == "__main__":
    main()
