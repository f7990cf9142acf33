"""Fixtures every node-agent test shares: the stand-in engines on PATH, agents that are
stopped, with whatever they left running, when a test ends, and the real model's weights."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node import gemma
from tests.node.agents import Agent, alive, stand_in_bin


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    return stand_in_bin(tmp_path / "bin", "llama-server", "vllm")


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for agent in started:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop()
    # Whatever a test left running (an agent killed with -9 leaves its engines) goes too.
    for agent in started:
        for start in agent.started():
            if alive(start["pid"]):
                os.kill(start["pid"], signal.SIGKILL)


@pytest.fixture(scope="session")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M, assembled once a run, for tests that need the real llama-server too.

    CI installs the `local` extra and sets LLMGW_REAL_ENGINE=required, so there a missing
    engine or model fails the test; elsewhere it is skipped with the reason.
    """
    if (why := gemma.missing()) is not None:
        if os.environ.get("LLMGW_REAL_ENGINE") == "required":
            pytest.fail(f"LLMGW_REAL_ENGINE=required, but {why}")
        pytest.skip(why)
    return gemma.assemble(tmp_path_factory.mktemp("gemma"))
