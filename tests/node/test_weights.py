"""Weights reach the node: from the hub (huggingface_hub, through HF_ENDPOINT) and over HTTP,
resumed after a cut, refused with a sentence. Every server is on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.node.weights import WeightsError, weights_for
from llmgw.plan import Plan
from tests.node.agents import Agent, Fleet, alive, chat_model, stand_in_bin, wait_for
from tests.node.hub import Hub

GGUF = b"GGUF" + os.urandom(3 * 1024 * 1024)
# huggingface_hub writes in 10 MB blocks and resumes after the last whole one: a file cut at
# its half must be larger than two blocks for the resume to show.
LARGE_GGUF = b"GGUF" + os.urandom(24 * 1024 * 1024)


@pytest.fixture
def hub() -> Iterator[Hub]:
    with Hub(
        {"org/tiny-GGUF/tiny.Q4_K_M.gguf": LARGE_GGUF, "files/tiny.gguf": GGUF},
        private=("org/gated-GGUF",),
    ) as running:
        yield running


@pytest.fixture
def agent_on_hub(tmp_path: Path, hub: Hub) -> Iterator[tuple[Fleet, Agent]]:
    fleet = Fleet(tmp_path / "fleet")
    bin_dir = stand_in_bin(tmp_path / "bin", "llama-server")
    agent = Agent(
        fleet,
        bin_dir,
        HF_ENDPOINT=hub.url,
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_ETAG_TIMEOUT="5",
    )
    yield fleet, agent
    if agent.proc is not None and agent.proc.poll() is None:
        agent.stop()
    for start in agent.started():
        if alive(start["pid"]):
            os.kill(start["pid"], 9)


def hub_model(name: str, source: str) -> str:
    return chat_model(name, source=source, extra=f"weights_bytes: {len(LARGE_GGUF)}\n")


def test_a_hub_file_cut_halfway_resumes_and_the_engine_loads_the_cached_file(
    agent_on_hub: tuple[Fleet, Agent], hub: Hub, tmp_path: Path
) -> None:
    fleet, agent = agent_on_hub
    hub.cut_next = 1
    fleet.plan({"a.yaml": hub_model("a", "hf://org/tiny-GGUF/tiny.Q4_K_M.gguf")})
    agent.start()
    agent.wait_state("a", "ready")
    [start] = agent.started()
    loaded = Path(start["argv"][start["argv"].index("--model") + 1])
    assert loaded.is_relative_to(tmp_path / "hf"), "in huggingface_hub's cache under HF_HOME"
    assert loaded.read_bytes() == LARGE_GGUF
    assert len(hub.ranges) == 2 and hub.ranges[0] is None, hub.ranges
    resumed_at = int(str(hub.ranges[1]).removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= len(LARGE_GGUF) // 2, f"the second request resumed: {hub.ranges}"


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("hf://org/gated-GGUF/model.gguf", "set HF_TOKEN"),
        ("hf://org/tiny-GGUF/missing.gguf", "hf://org/tiny-GGUF/missing.gguf does not exist (404)"),
    ],
)
def test_a_refused_download_is_a_state_with_a_sentence(
    agent_on_hub: tuple[Fleet, Agent], source: str, says: str
) -> None:
    fleet, agent = agent_on_hub
    fleet.plan({"a.yaml": hub_model("a", source)})
    agent.start()
    failed = wait_for(lambda: (r := agent.replicas()["a"]) and r["message"] and r, 30, "a message", agent)
    assert says in failed["message"]
    assert agent.started() == [], "no engine starts without its weights"
    assert "Traceback" not in agent.log_text()


def url_model(tmp_path: Path, hub: Hub, size: int = len(GGUF)) -> Plan:
    fleet = Fleet(tmp_path / "url")
    doc = fleet.plan(
        {"a.yaml": chat_model("a", source=f"{hub.url}/files/tiny.gguf", extra=f"weights_bytes: {size}\n")}
    )
    return Plan.of(doc)


def test_an_http_download_cut_halfway_resumes_with_a_range_request(tmp_path: Path, hub: Hub) -> None:
    plan = url_model(tmp_path, hub)
    hub.cut_next = 1
    seen: list[int] = []
    path = Path(weights_for(plan.models[0], tmp_path / "cache", seen.append))
    assert path.read_bytes() == GGUF
    assert hub.ranges == [None, f"bytes={len(GGUF) // 2}-"]
    assert sum(seen) == len(GGUF), "each byte fetched once"
    again = Path(weights_for(plan.models[0], tmp_path / "cache"))
    assert again == path and len(hub.ranges) == 2, "a finished download is not fetched again"


def test_an_http_server_that_ignores_range_gets_the_file_from_the_start(tmp_path: Path, hub: Hub) -> None:
    plan = url_model(tmp_path, hub)
    hub.cut_next, hub.ignore_range = 1, True
    path = Path(weights_for(plan.models[0], tmp_path / "cache"))
    assert path.read_bytes() == GGUF


def test_an_http_file_of_another_size_than_weights_bytes_is_refused(tmp_path: Path, hub: Hub) -> None:
    plan = url_model(tmp_path, hub, size=len(GGUF) + 1)
    with pytest.raises(WeightsError, match=r"but the plan says weights_bytes .*Fix weights_bytes"):
        weights_for(plan.models[0], tmp_path / "cache")


def test_an_http_404_names_the_file(tmp_path: Path, hub: Hub) -> None:
    plan = url_model(tmp_path, hub)
    del hub.files["files/tiny.gguf"]
    with pytest.raises(WeightsError, match=r"/files/tiny.gguf does not exist \(404\)"):
        weights_for(plan.models[0], tmp_path / "cache")
