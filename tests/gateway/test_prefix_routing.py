"""Prefix-aware routing through the real gateway: a conversation goes back to the replica that
holds its prefix, distinct prefixes spread, a hot prefix spills past the load bound, and a
replica leaving moves only its own prefixes. The fake engines say which of them answered."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from harness import Engine, Gateway, engine, gateway, model, plan, profile, write_plan

from llmgw.plan import Plan

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.5", "127.0.0.6")


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Engine]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(engine(f"r{i}", host)) for i, host in enumerate(HOSTS)]


def chat_plan(urls: list[str], routing: Literal["prefix", "least-loaded"] | None = None) -> Plan:
    return plan(
        [
            model("chat", [profile(urls, "chat", routing=routing)]),
            model("embed", [profile(urls, "embed")], task="embedding"),
        ]
    )


@pytest.fixture
def served(tmp_path: Path, engines: list[Engine]) -> Iterator[Gateway]:
    path = tmp_path / "plan.json"
    write_plan(path, chat_plan([e.url for e in engines]))
    with gateway(path) as gw:
        yield gw


def conversation(system: str, turns: int) -> list[dict[str, str]]:
    """Turn `turns` of a chat: every earlier message again, then the new question."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "question 0"}]
    for i in range(1, turns + 1):
        messages += [
            {"role": "assistant", "content": f"answer {i - 1}"},
            {"role": "user", "content": f"question {i}"},
        ]
    return messages


def who_answers(gw: Gateway, messages: list[dict[str, str]], **extra: Any) -> str:
    answer = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "chat", "messages": messages, **extra}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["system_fingerprint"])


def test_every_turn_of_a_conversation_goes_to_the_same_replica(served: Gateway) -> None:
    # Each request may reach either worker: they must agree on the replica.
    for system in ("You are terse.", "You are a pirate.", "You translate to French."):
        replicas = {who_answers(served, conversation(system, turns)) for turns in range(6)}
        assert len(replicas) == 1, f"the turns of one conversation went to {replicas}"


def test_distinct_prefixes_spread_over_the_replicas(served: Gateway) -> None:
    counts = Counter(who_answers(served, conversation(f"System prompt number {i}.", 0)) for i in range(80))
    assert set(counts) == {"r0", "r1", "r2", "r3"}, counts
    assert max(counts.values()) <= 0.45 * 80, f"one replica took too many prefixes: {counts}"


def test_a_hot_prefix_spills_past_the_load_bound(served: Gateway) -> None:
    hot = conversation("The one system prompt everybody uses.", 1)
    home = who_answers(served, hot)
    # Slow answers, all at once: the prefix's own replica is soon over the bound.
    with ThreadPoolExecutor(16) as pool:
        answered = list(pool.map(lambda _: who_answers(served, hot, fake_delay_first=0.5), range(16)))
    counts = Counter(answered)
    assert len(counts) >= 3, f"a hot prefix stayed on too few replicas: {counts}"
    assert counts[home] == max(counts.values()), f"its own replica ({home}) took the most: {counts}"
    metrics = httpx.get(served.url + "/metrics", timeout=10).text
    spills = [
        line
        for line in metrics.splitlines()
        if line.startswith("llmgw_prefix_routes_total{") and 'result="spill"' in line
    ]
    assert spills and float(spills[0].rsplit(" ", 1)[1]) > 0, metrics
    assert who_answers(served, hot) == home, "once the rush is over the prefix goes home again"


def test_a_replica_leaving_moves_only_its_own_prefixes(served: Gateway, engines: list[Engine]) -> None:
    prompts = [conversation(f"Prompt {i}", 0) for i in range(40)]
    before = [who_answers(served, p) for p in prompts]
    gone = Counter(before).most_common(1)[0][0]
    remaining = [e.url for e in engines if e.name != gone]
    new = chat_plan(remaining)
    write_plan(served.plan_path, new)
    served.every_worker(lambda ready: ready["digest"] == new.digest, 8, "the plan without one replica")
    after = [who_answers(served, p) for p in prompts]
    for old, now in zip(before, after, strict=True):
        if old != gone:
            assert now == old, "a prefix whose replica stayed must not move"
        else:
            assert now != gone
    assert any(old == gone for old in before)


def test_least_loaded_routing_and_embeddings_ignore_the_prefix(tmp_path: Path, engines: list[Engine]) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, chat_plan([e.url for e in engines], routing="least-loaded"))
    with gateway(path, workers=1) as gw:
        same = conversation("One prompt.", 0)
        replicas = {who_answers(gw, same) for _ in range(12)}
        assert len(replicas) >= 3, "least-loaded takes turns among idle replicas"
        embedded = {
            httpx.post(gw.url + "/v1/embeddings", json={"model": "embed", "input": "same text"}, timeout=30)
            .json()
            .get("system_fingerprint")
            for _ in range(12)
        }
        assert len(embedded) >= 3, embedded
