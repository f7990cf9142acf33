"""Each node's memory on the dashboard, in headless Chromium: a bar of always-on, loaded on
demand and free, and which models are loaded or start on first use, updating as a model
loads; /v1/models says the same."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.plan import (
    NodeUse,
    OnDemandUse,
    PlanMemory,
    PlanModel,
    PlanNode,
    PlanProfile,
    PlanReplica,
    PortRange,
)
from tests.dashboard import test_dashboard_browser as shared
from tests.dashboard.plans import make_model
from tests.dashboard.test_dashboard_browser import LIVE_TIMEOUT_MS, Gateway, Page, write_plan
from tests.dashboard.upstream import FakeUpstream
from tests.gateway.stand_in_agent import StandInAgent
from tests.plans import plan_of

# The same Chromium, started once per module as the layout tests start it.
browser = shared.browser

TOKEN = "agent-token-for-dashboard-tests"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _profile(name: str, endpoint: str, node: str, gb: float, on_demand: bool) -> PlanProfile:
    port = int(endpoint.rsplit(":", 1)[1])
    return PlanProfile(
        name="cpu", engine="llamacpp", priority=100, weight=1, ctx_size=2048, args=(), gpus=0,
        node_selector={}, memory=PlanMemory(gb=gb, source="declared", basis="for tests"),
        served_name=name, external=False,
        start="on-demand" if on_demand else None, idle_stop_s=600 if on_demand else None,
        replicas=(PlanReplica(endpoint=endpoint, node=node, port=port),),
    )


def node_plan(agent: StandInAgent, always: str, lazy_a: str, lazy_b: str):  # type: ignore[no-untyped-def]
    # 16 GB: 4 always on, and two on-demand models of 6 and 8 GB that fit beside it one at a time.
    node = PlanNode(
        name="box", address="127.0.0.1", memory_gb=16, gpus=0, gpu_memory_gb=0, labels={},
        ports=PortRange(first=1024, last=65535), used=NodeUse(memory_gb=4, gpus=0, replicas=1),
        on_demand=OnDemandUse(replicas=2, memory_gb=14, largest_gb=8), agent=agent.url,
    )
    models: list[PlanModel] = [
        make_model("steady", [_profile("steady", always, "box", 4, on_demand=False)]),
        make_model("lazy-a", [_profile("lazy-a", lazy_a, "box", 6, on_demand=True)]),
        make_model("lazy-b", [_profile("lazy-b", lazy_b, "box", 8, on_demand=True)]),
    ]
    return plan_of(models, [node])


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    agent = StandInAgent(TOKEN, load_s=0.2)
    upstream = FakeUpstream()
    monkeypatch.setenv("LLMGW_AGENT_TOKEN", TOKEN)
    path = tmp_path / "plan.json"
    lazy_a, lazy_b = f"http://127.0.0.1:{_free_port()}", f"http://127.0.0.1:{_free_port()}"
    write_plan(path, node_plan(agent, upstream.endpoint, lazy_a, lazy_b))
    gw = Gateway(path, [upstream], tmp_path / "gateway.log")
    try:
        yield gw
    finally:
        gw.close()
        upstream.close()
        agent.close()


BAR = """(node) => {
  const el = [...document.querySelectorAll("div[data-node]")].find(d => d.dataset.node === node);
  const width = (cls) => el.querySelector("rect." + cls).getBoundingClientRect().width;
  const bar = el.querySelector("svg.bar").getBoundingClientRect().width;
  return {
    always: width("always") / bar, loaded: width("loaded") / bar, free: width("free") / bar,
    label: el.querySelector(".memory-label").textContent,
    models: Object.fromEntries([...el.querySelectorAll("li")].map(
      li => [li.querySelector("code").textContent, li.querySelector(".start").textContent])),
  };
}"""


def test_a_nodes_memory_bar_and_its_models_show_what_is_loaded_and_what_starts_on_first_use(
    browser: Any, served: Gateway
) -> None:
    page = Page(browser, served.url, 1280, 900)
    try:
        before = page.page.evaluate(BAR, "box")
        assert before["models"] == {
            "steady": "always on", "lazy-a": "starts on first use", "lazy-b": "starts on first use"
        }, before
        assert abs(before["always"] - 4 / 16) < 0.02 and before["loaded"] < 0.01, before
        assert abs(before["free"] - 12 / 16) < 0.02, before
        listed = {m["id"]: m for m in httpx.get(served.url + "/v1/models", timeout=10).json()["data"]}
        assert listed["lazy-a"]["loaded"] is False and "loaded" not in listed["steady"]

        answer = httpx.post(
            served.url + "/v1/chat/completions",
            json={"model": "lazy-b", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        # The page learns it on its next poll, without a reload.
        page.page.wait_for_function(
            """() => [...document.querySelectorAll("li[data-on-demand]")]
                 .some(li => li.dataset.onDemand === "lazy-b" && li.textContent.includes("loaded"))""",
            timeout=LIVE_TIMEOUT_MS,
        )
        after = page.page.evaluate(BAR, "box")
        assert after["models"]["lazy-b"] == "loaded" and after["models"]["lazy-a"] == "starts on first use"
        assert abs(after["loaded"] - 8 / 16) < 0.02 and abs(after["free"] - 4 / 16) < 0.02, after
        assert "loaded on demand 8 GB" in after["label"], after["label"]
        listed = {m["id"]: m for m in httpx.get(served.url + "/v1/models", timeout=10).json()["data"]}
        assert listed["lazy-b"]["loaded"] is True and listed["lazy-a"]["loaded"] is False
        assert not page.errors, page.errors
        page.screenshot("dashboard-nodes.png")
    finally:
        page.close()
