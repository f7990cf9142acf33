"""Lint + plan time for a generated catalogue: N models (default 5,000) on M nodes (default 500).

    python bench/compile.py [--models N] [--nodes M]

Prints figures; asserts nothing. Target on a 2-core machine: lint + plan of
5,000 models under 5 s.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

# Runs from a checkout whether or not llmgw is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.lint import lint  # noqa: E402
from llmgw.plan import build_plan, dump_plan  # noqa: E402

MODEL = """\
# yaml-language-server: $schema=../schema/model.schema.json
name: model-{i:05d}
description: Generated model {i} for the compile benchmark; chat of middling quality.
aliases: [alias-{i:05d}]
task: {task}
source: {source}
weights_bytes: {weights}
context_length: 8192
max_output: 2048
replicas: {replicas}
profiles:
  - name: {profile}
    engine: {engine}
    ctx_size: 16384
    args: [--parallel, "2"]
    node_selector: {{pool: {pool}}}
"""


def write_catalogue(root: Path, models: int, nodes: int, seed: int = 7) -> tuple[Path, Path]:
    rng = random.Random(seed)
    catalog = root / "catalog"
    catalog.mkdir()
    for i in range(models):
        gpu = i % 10 == 0
        (catalog / f"model-{i:05d}.yaml").write_text(MODEL.format(
            i=i,
            task=rng.choice(["chat", "completion", "embedding"]),
            source=(f"hf://org/model-{i}" if gpu else f"hf://org/model-{i}-GGUF/model-{i}-Q4_K_M.gguf"),
            weights=rng.randint(1, 8) * 1_000_000_000,
            replicas=1 if gpu else rng.randint(1, 3),
            profile="gpu" if gpu else "cpu",
            engine="vllm" if gpu else "llamacpp",
            pool="gpu" if gpu else "cpu",
        ))
    lines = ["nodes:"]
    for j in range(nodes):
        gpu = j % 4 == 0
        octets = f"127.{j // 250 + 1}.{j % 250}.1"
        lines += [
            f"  - name: node-{j:04d}",
            f"    address: {octets}",
            f"    memory_gb: {512 if gpu else 256}",
            f"    labels: {{pool: {'gpu' if gpu else 'cpu'}}}",
            f"    engines: [{'vllm, llamacpp' if gpu else 'llamacpp'}]",
        ]
        if gpu:
            lines.append("    gpus: {count: 8, memory_gb: 80}")
    fleet = root / "fleet.yaml"
    fleet.write_text("\n".join(lines) + "\n")
    return catalog, fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        catalog, fleet = write_catalogue(Path(tmp), args.models, args.nodes)
        t0 = time.perf_counter()
        result = lint(catalog, fleet)
        t1 = time.perf_counter()
        text = dump_plan(build_plan(result))
        t2 = time.perf_counter()
        # The worst case: every file has a finding, so every file's positions are read.
        for path in catalog.iterdir():
            path.write_text(path.read_text().replace("max_output:", "max_ouptut:"))
        t3 = time.perf_counter()
        broken = lint(catalog, fleet)
        t4 = time.perf_counter()
    errors, warnings = result.counts()
    replicas = sum(s.replicas for s in result.placement.nodes)
    print(f"models {args.models}, nodes {args.nodes}: {replicas} replicas placed, "
          f"{errors} errors, {warnings} warnings, plan {len(text) / 1e6:.1f} MB")
    print(f"lint (parse, schema, rules, placement): {t1 - t0:6.2f} s")
    print(f"plan (resolve, digest, serialise):      {t2 - t1:6.2f} s")
    print(f"lint + plan:                            {t2 - t0:6.2f} s  (target < 5 s on 2 cores)")
    print(f"lint, every file with a finding:        {t4 - t3:6.2f} s  ({broken.counts()[0]} errors)")


if __name__ == "__main__":
    main()
