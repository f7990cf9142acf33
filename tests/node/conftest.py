"""Fixtures every node-agent test shares: the stand-in engines on PATH, and agents that are
stopped, with whatever they left running, when a test ends."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

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
