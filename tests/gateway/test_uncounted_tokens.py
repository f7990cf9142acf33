"""Tokens that must not go uncounted (issue 35): a cut stream on every API, a reservation
read from the length field the engine really obeys, and the usage of an answer too big to
keep whole."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from harness import (
    Engine,
    Gateway,
    ask_as,
    at_once,
    gateway,
    key_digest,
    model,
    plan,
    profile,
    wait_until,
    write_plan,
)

CUT, BURST, LARGE = "sk-cut", "sk-burst", "sk-large"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("uncounted")
    path = tmp / "plan.json"
    write_plan(path, plan([model("chat", [profile([engine_a.url], "chat")])]))
    keys = tmp / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - {{name: cut, sha256: {key_digest(CUT)}}}\n"
        f"  - {{name: burst, sha256: {key_digest(BURST)}, tpm: 1000}}\n"
        f"  - {{name: large, sha256: {key_digest(LARGE)}}}\n"
    )
    with gateway(path, LLMGW_KEYS_FILE=str(keys)) as gw:
        yield gw


def completion_tokens(gw: Gateway, key: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("llmgw_tokens_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            if labels.get("key") == key and labels.get("kind") == "completion":
                total += float(line.rsplit(" ", 1)[1])
    return total


_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
    "/v1/messages": {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
}


def deltas(text: str) -> int:
    """The tokens a client read: one per delta event of any API's stream."""
    return len(re.findall(r'": ?"tok\d+ ', text))


@pytest.mark.parametrize("path", list(_BODIES))
def test_a_stream_the_engine_cuts_short_is_charged_at_least_what_it_relayed(
    served: Gateway, path: str
) -> None:
    before = completion_tokens(served, "cut")
    body = {"model": "chat", "stream": True, "fake_chunks": 40, "fake_hangup_after": 30, **_BODIES[path]}
    answer = httpx.post(served.url + path, json=body, headers={"Authorization": f"Bearer {CUT}"}, timeout=30)
    assert answer.status_code == 200
    relayed = deltas(answer.text)
    assert relayed >= 20, f"the stream relayed only {relayed} tokens before the cut:\n{answer.text[:2000]}"
    wait_until(
        lambda: completion_tokens(served, "cut") - before >= relayed,
        10,
        f"the {relayed} tokens {path} relayed before the engine cut it to be charged "
        f"(charged {completion_tokens(served, 'cut') - before:g})",
    )


def test_a_messages_stream_the_client_leaves_is_charged_at_least_what_it_read(served: Gateway) -> None:
    before = completion_tokens(served, "cut")
    body = {
        "model": "chat", "stream": True, "fake_chunks": 200, "fake_chunk_delay": 0.02,
        **_BODIES["/v1/messages"],
    }  # fmt: skip
    read = ""
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", served.url + "/v1/messages", json=body, headers={"Authorization": f"Bearer {CUT}"}
    ) as answer:
        for chunk in answer.iter_text():
            read += chunk
            if deltas(read) >= 30:
                break  # and away
    wait_until(
        lambda: completion_tokens(served, "cut") - before >= 30,
        10,
        f"the 30 tokens read before the client left to be charged "
        f"(charged {completion_tokens(served, 'cut') - before:g}; Messages' message_start says 1)",
    )


def test_a_burst_asking_n_predict_beyond_max_tokens_is_admitted_only_up_to_the_tpm(served: Gateway) -> None:
    # llama-server writes n_predict's 500 tokens whatever max_tokens says: reserved as 500
    # each, two fill the key's 1000 while they run. Reserved as max_tokens' 1, all twenty
    # were let in. (An answer that ends settles its reservation at the 7 tokens it used, so
    # a thread started late on a loaded machine may get in too: hence the long answers.)
    statuses = at_once(
        20, lambda: ask_as(served, BURST, max_tokens=1, n_predict=500, fake_delay_first=4).status_code
    )
    admitted = statuses.count(200)
    assert 1 <= admitted <= 4, f"tpm 1000 with 500-token answers let {admitted} of 20 through"
    assert statuses.count(429) == 20 - admitted, statuses


def test_an_answer_over_the_kept_4_mib_is_charged_its_usage(served: Gateway) -> None:
    answer = httpx.post(
        served.url + "/v1/chat/completions",
        json={
            "model": "chat", "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True, "top_logprobs": 20, "fake_logprobs_bytes": 5 << 20,
        },  # fmt: skip
        headers={"Authorization": f"Bearer {LARGE}"},
        timeout=60,
    )
    assert answer.status_code == 200
    assert len(answer.content) > 4 << 20, "the answer must pass the 4 MiB the gateway keeps"
    assert answer.json()["usage"]["completion_tokens"] == 4
    wait_until(
        lambda: completion_tokens(served, "large") == 4,
        10,
        f"the answer's usage (4 completion tokens) to be charged, not an estimate "
        f"(charged {completion_tokens(served, 'large'):g})",
    )
