"""A real llama-server serving a real model (Gemma 3 270M) through the agent and the gateway.

What arrives is checked (text, chunks, usage, the model's name), never the wording: see
tests/node/gemma.py. The `weights` fixture skips these tests where there is no engine or
model, and fails them in CI (LLMGW_REAL_ENGINE=required).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.harness import ROOT, free_port, gateway
from tests.node.agents import Agent, Fleet, alive, wait_for
from tests.node.gemma import EXAMPLE, answers, ask, client, model_text

EMBED_EXAMPLE = ROOT / "examples" / "local" / "gemma-3-270m-embed.yaml"


@pytest.fixture
def example(tmp_path: Path, weights: Path) -> Path:
    """The README's example catalogue, as a user has it after writing the weights."""
    catalog = tmp_path / "examples-local"
    (catalog / "models").mkdir(parents=True)
    shutil.copy(EXAMPLE, catalog / EXAMPLE.name)
    os.symlink(weights, catalog / "models" / weights.name)
    return catalog


class Up:
    def __init__(self, catalog: Path, root: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.status_url = f"http://127.0.0.1:{free_port()}"
        self.log = root / "up.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "LLMGW_HEALTH_INTERVAL": "0.5",
            "LLMGW_HEALTH_FAILURES": "1",
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llmgw",
                    "up",
                    str(catalog),
                    "--bind",
                    self.url.removeprefix("http://"),
                    "--status-bind",
                    self.status_url.removeprefix("http://"),
                    "--state-dir",
                    str(root / "up"),
                ],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def replica(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"llmgw up exited ({self.proc.returncode}):\n{self.log.read_text()}")
        try:
            return httpx.get(self.status_url + "/status", timeout=5).json()["replicas"][0]
        except (httpx.HTTPError, IndexError, KeyError, ValueError):
            return None

    def ready_pid(self, other_than: int | None = None) -> int:
        found = wait_for(
            lambda: (r := self.replica()) and r["state"] == "ready" and r["pid"] != other_than and r,
            120,
            "the engine ready",
            None,
        )
        return int(found["pid"])


@pytest.fixture
def up(example: Path, tmp_path: Path) -> Iterator[Up]:
    running = Up(example, tmp_path)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.proc.send_signal(signal.SIGINT)
            running.proc.wait(120)


def test_llmgw_up_serves_real_text_streamed_and_not_and_comes_back_after_a_crash(up: Up) -> None:
    pid = up.ready_pid()
    wait_for(lambda: answers(up.url), 60, "a first answer through the gateway")

    answer = ask(up.url)
    assert answer.model == "gemma-3-270m"
    assert answer.choices[0].message.content.strip()
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8

    stream = client(up.url).chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) >= 2, f"tokens arrive as several chunks: {chunks}"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    os.kill(pid, signal.SIGKILL)
    again = up.ready_pid(other_than=pid)
    assert not alive(pid) and alive(again)
    wait_for(lambda: answers(up.url), 60, "the gateway to put the restarted engine back in rotation")

    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(120) == 0
    assert not alive(again), "Ctrl-C stops every engine"
    assert "stopped the gateway, the agent and every engine" in up.log.read_text()


def test_a_restarted_agent_keeps_the_engine_and_a_deploy_that_drops_the_model_stops_it(
    tmp_path: Path, weights: Path
) -> None:
    fleet = Fleet(tmp_path / "fleet")
    fleet.plan({"gemma.yaml": model_text(weights)})
    agent = Agent(fleet, tmp_path / "bin")  # no stand-ins in that folder: the real llama-server
    (tmp_path / "bin").mkdir()
    try:
        agent.start()
        pid = agent.wait_state("gemma-3-270m", "ready", timeout=120)["pid"]
        with gateway(fleet.plan_path, LLMGW_HEALTH_FAILURES="1") as gw:
            wait_for(lambda: answers(gw.url), 60, "a first answer through the gateway")
            failures: list[str] = []
            done = threading.Event()

            def keep_asking() -> None:
                while not done.is_set():
                    try:
                        ask(gw.url)
                    except openai.APIError as exc:
                        failures.append(str(exc))

            asker = threading.Thread(target=keep_asking)
            asker.start()
            try:
                agent.stop(signal.SIGKILL)
                agent.start()
                adopted = agent.wait_state("gemma-3-270m", "ready", timeout=60)
            finally:
                done.set()
                asker.join(60)
            assert adopted["pid"] == pid and adopted["restarts"] == 0, "the same engine, adopted"
            assert failures == [], "no request failed while the agent restarted"

            empty = fleet.plan({})
            wait_for(lambda: not alive(pid), 60, "the dropped model's engine to stop", agent)
            # The agent records the new plan once every stop has returned, a moment after the
            # process is gone (CI once read the status in between).
            wait_for(
                lambda: agent.status()["plan_digest"] == empty["digest"],
                30,
                "the agent to report the new plan",
                agent,
            )
            assert json.loads(fleet.plan_path.read_text())["models"] == []
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop()


def test_the_examples_embedding_model_answers_with_vectors(tmp_path: Path, weights: Path) -> None:
    # Without --pooling in its args the engine loaded and refused every request.
    fleet = Fleet(tmp_path / "fleet", others=False)
    text = EMBED_EXAMPLE.read_text().replace("source: models/gemma-3-270m-q4_k_m.gguf", f"source: {weights}")
    fleet.plan({"embed.yaml": text})
    (tmp_path / "bin").mkdir()
    agent = Agent(fleet, tmp_path / "bin")
    try:
        agent.start()
        agent.wait_state("gemma-3-270m-embed", "ready", timeout=120)
        with gateway(fleet.plan_path, LLMGW_HEALTH_FAILURES="1") as gw:

            def vectors() -> Any:
                try:
                    inputs = ["a red apple", "a green pear"]
                    return client(gw.url).embeddings.create(model="embed", input=inputs)
                except openai.APIError:
                    return None

            answer = wait_for(vectors, 60, "vectors through the gateway", agent)
            assert [len(d.embedding) for d in answer.data] == [640, 640], "Gemma 3 270M's embedding length"
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop()


SYSTEM = " ".join(
    f"Rule {i}: answer in plain words, never in lists, and keep to the point." for i in range(30)
)


def test_prefix_routing_sends_a_conversations_next_turn_to_the_engine_that_cached_it(
    tmp_path: Path, weights: Path
) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False)
    doc = fleet.plan({"gemma.yaml": model_text(weights).replace("replicas: 1", "replicas: 2")})
    assert len(doc["models"][0]["profiles"][0]["replicas"]) == 2
    (tmp_path / "bin").mkdir()
    agent = Agent(fleet, tmp_path / "bin")
    try:
        agent.start()
        wait_for(
            lambda: [r["state"] for r in agent.status()["replicas"]] == ["ready", "ready"],
            120,
            "both engines ready",
            agent,
        )
        with gateway(fleet.plan_path, LLMGW_HEALTH_FAILURES="1") as gw:
            wait_for(lambda: answers(gw.url), 60, "a first answer through the gateway")
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
            first = client(gw.url).chat.completions.create(
                model="gemma-3-270m", messages=messages, max_tokens=4
            )
            reply = first.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And another?"}]
            for _ in range(3):  # each later turn, whichever worker takes it
                later = client(gw.url).chat.completions.create(
                    model="gemma-3-270m", messages=messages, max_tokens=4
                )
                assert first.usage is not None and later.usage is not None
                details = later.usage.prompt_tokens_details
                cached = details.cached_tokens if details is not None else 0
                # With least-loaded routing this fails: "reused 0 of the 631 tokens".
                assert cached is not None and cached >= 0.8 * first.usage.prompt_tokens, (
                    f"turn 2 reused {cached} of the {first.usage.prompt_tokens} tokens turn 1 sent: "
                    "it went to the engine that did not have them"
                )
    finally:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop()
