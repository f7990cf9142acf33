"""Fit checks and placement for large generated fleets: seconds, and how the time grows.

    python bench/placement.py [--nodes 1000,2000,5000,10000] [--per-node 5]

For each fleet size N, a fleet of N nodes (a quarter with 8 GPUs, zones a-d, a few
agents that report no engines) and a catalogue of 5N replicas are built in memory, the
models already typed, so no YAML is read: what is timed is what `llmgw plan` does after
parsing. The fleet's own checks (names, addresses, ports), the lint rules (fit checks:
selectors, engines, memory) and placement are timed apart. Issue 13 asks for 10,000
nodes x 50,000 replicas. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import time
from pathlib import Path

# Runs from a checkout whether or not llmgw is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.compiler.catalogue import Entry  # noqa: E402
from llmgw.compiler.place import place  # noqa: E402
from llmgw.compiler.rules import run_rules  # noqa: E402
from llmgw.compiler.rules.context import Context  # noqa: E402
from llmgw.compiler.rules.fleet import fleet_problems  # noqa: E402
from llmgw.load import Document  # noqa: E402
from llmgw.model import Fleet, ModelSpec  # noqa: E402

ZONES = "abcd"


def fleet(nodes: int, rng: random.Random) -> Fleet:
    rows = []
    for j in range(nodes):
        gpu = j % 4 == 0
        row: dict[str, object] = {
            "name": f"node-{j:05d}",
            "address": f"10.{j // 62500}.{j // 250 % 250}.{j % 250 + 1}",
            "memory_gb": 512 if gpu else 256,
            "labels": {"pool": "gpu" if gpu else "cpu", "zone": ZONES[j // 4 % len(ZONES)]},
        }
        if rng.random() > 0.05:  # the rest are older agents that report nothing
            row["engines"] = ["vllm", "llamacpp"] if gpu else ["llamacpp"]
        if gpu:
            row["gpus"] = {"count": 8, "memory_gb": 80}
        rows.append(row)
    return Fleet.model_validate({"nodes": rows, "file": "fleet.yaml"})


def catalogue(replicas: int, rng: random.Random) -> list[Entry]:
    entries = []
    placed = 0
    i = 0
    while placed < replicas:
        gpu = i % 10 == 0
        count = min(rng.randint(1, 4), replicas - placed)
        selector = {"pool": "gpu" if gpu else "cpu"}
        if rng.random() < 0.3:
            selector["zone"] = rng.choice(ZONES)
        data = {
            "name": f"model-{i:06d}",
            "source": f"hf://org/model-{i}" if gpu else f"hf://org/model-{i}-GGUF/model-{i}-Q4_K_M.gguf",
            "weights_bytes": rng.randint(2, 40) * 1_000_000_000,
            "context_length": 8192,
            "replicas": count,
            "profiles": [
                {
                    "name": "gpu" if gpu else "cpu",
                    "engine": "vllm" if gpu else "llamacpp",
                    "args": ["--parallel", "2"],
                    "ctx_size": 16384,
                    "node_selector": selector,
                    **({"gpus": rng.choice([1, 1, 2])} if gpu else {}),
                }
            ],
        }
        doc = Document(f"catalog/model-{i:06d}.yaml", "", data)
        entries.append(Entry(doc, ModelSpec.model_validate(data), Path("catalog")))
        placed += count
        i += 1
    return entries


def measure(nodes: int, per_node: int) -> dict[str, float]:
    rng = random.Random(nodes)
    the_fleet = fleet(nodes, rng)
    entries = catalogue(nodes * per_node, rng)
    doc = Document("fleet.yaml", "", {})
    gc.collect()  # the garbage of building the catalogue is not what is timed
    t0 = time.perf_counter()
    problems = fleet_problems(the_fleet, doc)
    t1 = time.perf_counter()
    findings = run_rules(Context(entries, the_fleet))
    t2 = time.perf_counter()
    placement = place(entries, the_fleet)
    t3 = time.perf_counter()
    placed = sum(len(slots) for slots in placement.slots.values())
    short = sum(1 for f in placement.findings if f.rule == "placement")
    held = sum(s.node.memory_gb - s.free_gb for s in placement.nodes)
    used = held / sum(n.memory_gb for n in the_fleet.nodes)
    print(
        f"{nodes:>6} nodes, {nodes * per_node:>6} replicas: fleet checks {t1 - t0:6.2f} s, "
        f"fit checks {t2 - t1:6.2f} s, placement {t3 - t2:6.2f} s, total {t3 - t0:6.2f} s "
        f"({placed} placed, {short} models short, memory {used:.0%} used, "
        f"{len(problems) + len(findings)} findings)"
    )
    return {"fleet": t1 - t0, "rules": t2 - t1, "place": t3 - t2, "total": t3 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,2000,5000,10000")
    parser.add_argument("--per-node", type=int, default=5, help="replicas per node [5]")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    times = {n: measure(n, args.per_node) for n in sizes}
    small, large = sizes[0], sizes[-1]
    if large == small:
        return
    print(f"from {small:,} to {large:,} nodes ({large / small:g}x):")
    for part in ("fleet", "rules", "place", "total"):
        a, b = times[small][part], times[large][part]
        exponent = math.log(b / a) / math.log(large / small) if a > 0 and b > 0 else float("nan")
        print(
            f"  {part:<6} {a:7.3f} s -> {b:7.3f} s: {b / a if a else float('inf'):6.1f}x, "
            f"time ~ nodes^{exponent:.2f}"
        )


if __name__ == "__main__":
    main()
