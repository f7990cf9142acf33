"""The compiler against two floors, on the same generated files in the same run.

    python bench/compile.py [--models N] [--nodes M] [--repeat R] [--pr-models P]

N models (default 5,000) on M nodes (default 500) are written once; then, each timed
R times (best kept, the runs interleaved so a busy neighbour slows all of them alike):

- PyYAML's C loader (yaml.CSafeLoader) only parsing every file: the floor of reading YAML
  from Python at all;
- `check-jsonschema --schemafile schema/model.schema.json FILES`: a schema-only pass, as a
  command, process start included;
- llmgw lint + plan in this process (`lint()`, then the plan built and written), and
  `llmgw plan` as a command, process start included.

Then the time a pull request's lint job waits on: `llmgw lint` as a command over a
P-model catalogue (default 500), and over 10 models. Prints figures; asserts nothing.
Issue 12's targets: lint + plan within 3x of the YAML floor, and faster than
check-jsonschema.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# Runs from a checkout whether or not llmgw is installed.
sys.path.insert(0, str(REPO))

from llmgw.compiler.build import build_plan  # noqa: E402
from llmgw.compiler.lint import lint  # noqa: E402
from llmgw.plan import dump_plan  # noqa: E402

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
    catalog.mkdir(parents=True)
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


def timed(run: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def pyyaml_floor(files: list[Path]) -> None:
    for path in files:
        yaml.load(path.read_bytes().decode("utf-8"), Loader=yaml.CSafeLoader)


def check_jsonschema(files: list[Path]) -> None:
    tool = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or "check-jsonschema"
    proc = subprocess.run([tool, "--schemafile", str(REPO / "schema/model.schema.json"),
                           *map(str, files)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"check-jsonschema failed ({proc.returncode}): {proc.stdout[-500:]}{proc.stderr[-500:]}")


def lint_and_plan(catalog: Path, fleet: Path, out: Path) -> None:
    out.write_text(dump_plan(build_plan(lint(catalog, fleet))))


def llmgw_command(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`llmgw ARGS` as a user runs it: a new interpreter, imports and all."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "llmgw", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def best(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            times[name].append(timed(run))
    return {name: min(t) for name, t in times.items()}


def compile_floors(root: Path, models: int, nodes: int, repeat: int) -> None:
    catalog, fleet = write_catalogue(root / "big", models, nodes)
    files = sorted(catalog.iterdir())
    out = root / "plan.json"
    t = best({
        "pyyaml": lambda: pyyaml_floor(files),
        "check-jsonschema": lambda: check_jsonschema(files),
        "llmgw": lambda: lint_and_plan(catalog, fleet, out),
        "llmgw plan": lambda: llmgw_command("plan", catalog, "--fleet", fleet, "--out", out, cwd=root),
    }, repeat)
    result = lint(catalog, fleet)
    errors, warnings = result.counts()
    replicas = sum(s.replicas for s in result.placement.nodes)
    print(f"models {models}, nodes {nodes}: {replicas} replicas placed, {errors} errors, "
          f"{warnings} warnings, plan {out.stat().st_size / 1e6:.1f} MB; best of {repeat}")
    print(f"PyYAML CSafeLoader, parse only:            {t['pyyaml']:6.2f} s")
    print(f"check-jsonschema (a command):              {t['check-jsonschema']:6.2f} s")
    print(f"llmgw lint + plan (in this process):       {t['llmgw']:6.2f} s")
    print(f"llmgw plan (a command):                    {t['llmgw plan']:6.2f} s")
    print(f"lint + plan / PyYAML parse:                {t['llmgw'] / t['pyyaml']:6.2f} x  (target <= 3)")
    print(f"llmgw plan / check-jsonschema (commands):  {t['llmgw plan'] / t['check-jsonschema']:6.2f} x"
          "  (target <= 1)")
    print(f"lint + plan in process / check-jsonschema: {t['llmgw'] / t['check-jsonschema']:6.2f} x")
    # The worst case: every file has a finding, so every file's positions are read.
    for path in files:
        path.write_text(path.read_text().replace("max_output:", "max_ouptut:"))
    t0 = time.perf_counter()
    broken = lint(catalog, fleet)
    print(f"lint, every file with a finding:           {time.perf_counter() - t0:6.2f} s  "
          f"({broken.counts()[0]} errors)")


def pull_request_lint(root: Path, models: int, repeat: int) -> None:
    for n in (models, 10):
        catalog, fleet = write_catalogue(root / f"pr-{n}", n, 50)
        took = best({"lint": lambda c=catalog, f=fleet: llmgw_command("lint", c, "--fleet", f, cwd=root)},
                    repeat)["lint"]
        print(f"a pull request's `llmgw lint`, {n:>4} models x 50 nodes, process start included: "
              f"{took:5.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pr-models", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compile_floors(Path(tmp), args.models, args.nodes, args.repeat)
        pull_request_lint(Path(tmp), args.pr_models, args.repeat)


if __name__ == "__main__":
    main()
