"""`llmgw status PLAN`: the real node agent with stand-in engines, judged per model as Argo CD
judges an app: Synced or OutOfSync, and Healthy, Progressing, Degraded, Missing or Suspended,
with exit 0 only when every model is Synced and Healthy or Suspended."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.harness import ROOT, gateway, wait_until
from tests.node.agents import Agent, Fleet, chat_model

ON_DEMAND = "    start: on-demand\n    idle_stop: 60s\n"


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path / "fleet", others=False)


def status(plan: Path, *args: str, timeout: float = 60) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "status", str(plan), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout + done.stderr


def verdict(plan: Path) -> tuple[int, dict[str, Any]]:
    code, out = status(plan, "--json")
    doc = json.loads(out)
    return code, {m["name"]: m for m in doc["models"]}


def start_agent(
    agents: list[Agent], fleet: Fleet, bin_dir: Path, models: dict[str, str], **env: str
) -> Agent:
    agent = Agent(fleet, bin_dir, **env)
    fleet.agent_at(agent.status_url)  # the fleet names the agent's port, as an operator's would
    fleet.plan(models)
    agents.append(agent)
    return agent.start()


def test_a_fleet_running_the_plan_is_synced_and_healthy(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = start_agent(agents, fleet, bin_dir, {"a.yaml": chat_model("a"), "b.yaml": chat_model("b")})
    agent.wait_state("a", "ready")
    agent.wait_state("b", "ready")
    code, models = verdict(fleet.plan_path)
    assert code == 0, models
    assert [(m["name"], m["sync"], m["health"]) for m in models.values()] == [
        ("a", "Synced", "Healthy"),
        ("b", "Synced", "Healthy"),
    ]
    [replica] = models["a"]["replicas"]
    assert replica["node"] == "local" and replica["state"] == "ready" and "message" not in replica
    code, table = status(fleet.plan_path)
    assert code == 0
    assert any(line.split()[:3] == ["a", "Synced", "Healthy"] for line in table.splitlines()), table
    assert "the fleet runs the plan" in table


def test_a_killed_engine_is_degraded_or_progressing_then_healthy_again(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = start_agent(agents, fleet, bin_dir, {"a.yaml": chat_model("a")}, STAND_IN_LOAD_S="1")
    pid = agent.wait_state("a", "ready")["pid"]
    os.kill(pid, signal.SIGKILL)
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        code, models = verdict(fleet.plan_path)
        seen.add(models["a"]["health"])
        if models["a"]["health"] != "Healthy":
            assert code == 1, "a fleet with an engine down is not a deploy that succeeded"
            assert models["a"]["sync"] == "Synced", "the agent still runs the plan's replica"
        elif seen - {"Healthy"}:
            break
    assert seen - {"Healthy"} <= {"Degraded", "Progressing"} and seen - {"Healthy"}, seen
    assert models["a"]["health"] == "Healthy", "the agent brought the engine back"


def test_a_model_no_agent_runs_is_out_of_sync(fleet: Fleet, bin_dir: Path, agents: list[Agent]) -> None:
    agent = start_agent(agents, fleet, bin_dir, {"a.yaml": chat_model("a")})
    agent.wait_state("a", "ready")
    # A newer plan the agent has not been given: what a deploy checks before the agents follow.
    newer = fleet.root / "newer.json"
    shutil.copy(fleet.plan_path, newer)
    fleet.plan_path = newer
    fleet.plan({"a.yaml": chat_model("a"), "x.yaml": chat_model("x")})
    code, models = verdict(newer)
    assert code == 1
    assert (models["a"]["sync"], models["a"]["health"]) == ("Synced", "Healthy")
    assert (models["x"]["sync"], models["x"]["health"]) == ("OutOfSync", "Missing")
    assert models["x"]["replicas"][0]["message"] == "the agent on local does not run it"
    code, table = status(newer)
    assert code == 1 and "x/cpu" in table and "does not run the plan" in table, table


def test_a_changed_engine_command_the_agent_has_not_applied_is_out_of_sync(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = start_agent(agents, fleet, bin_dir, {"a.yaml": chat_model("a")})
    agent.wait_state("a", "ready")
    newer = fleet.root / "newer.json"
    shutil.copy(fleet.plan_path, newer)
    fleet.plan_path = newer
    fleet.plan({"a.yaml": chat_model("a", args="[--threads, '1']")})
    code, models = verdict(newer)
    assert code == 1 and models["a"]["sync"] == "OutOfSync", models
    assert "another engine command" in models["a"]["replicas"][0]["message"]


def test_an_on_demand_model_not_loaded_is_suspended_and_fine(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = start_agent(
        agents, fleet, bin_dir, {"a.yaml": chat_model("a"), "lazy.yaml": chat_model("lazy") + ON_DEMAND}
    )
    agent.wait_state("a", "ready")
    agent.wait_state("lazy", "idle")
    code, models = verdict(fleet.plan_path)
    assert (models["lazy"]["sync"], models["lazy"]["health"]) == ("Synced", "Suspended")
    assert code == 0, "an on-demand model waiting for its first request is what the plan asks for"


def test_a_stopped_agent_leaves_its_models_missing(fleet: Fleet, bin_dir: Path, agents: list[Agent]) -> None:
    agent = start_agent(agents, fleet, bin_dir, {"a.yaml": chat_model("a")})
    agent.wait_state("a", "ready")
    agent.stop()
    code, models = verdict(fleet.plan_path)
    assert code == 1
    assert (models["a"]["sync"], models["a"]["health"]) == ("OutOfSync", "Missing")
    assert "does not answer" in models["a"]["replicas"][0]["message"]


def test_wait_returns_once_a_new_agents_engines_are_up(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = Agent(fleet, bin_dir, STAND_IN_LOAD_S="2")
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": chat_model("a")})
    agents.append(agent)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "status", str(fleet.plan_path), "--wait", "60", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    time.sleep(2)
    assert waiting.poll() is None, "no agent answers yet, so the fleet does not run the plan"
    started = time.monotonic()
    agent.start()
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, out + err
    assert time.monotonic() - started >= 1.5, "it waited for the engine's load, not only the agent"
    [model] = json.loads(out)["models"]
    assert (model["sync"], model["health"]) == ("Synced", "Healthy")


def test_wait_gives_up_with_exit_1_and_the_last_answer(fleet: Fleet) -> None:
    fleet.agent_at("http://127.0.0.1:1")  # nothing listens there
    fleet.plan({"a.yaml": chat_model("a")})
    started = time.monotonic()
    code, out = status(fleet.plan_path, "--wait", "2")
    assert code == 1 and time.monotonic() - started < 30
    assert "OutOfSync" in out and "Missing" in out and "does not answer" in out, out



def test_the_dashboard_shows_the_same_two_words_per_model(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    agent = start_agent(
        agents, fleet, bin_dir, {"a.yaml": chat_model("a"), "lazy.yaml": chat_model("lazy") + ON_DEMAND}
    )
    agent.wait_state("a", "ready")
    with gateway(fleet.plan_path) as gw:

        def words() -> dict[str, tuple[str, str]] | None:
            models = httpx.get(gw.url + "/dashboard/status.json", timeout=10).json()["models"]
            found = {n: (m.get("sync"), m.get("fleet_health")) for n, m in models.items()}
            return found if found == {"a": ("Synced", "Healthy"), "lazy": ("Synced", "Suspended")} else None

        wait_until(words, 30, "the dashboard to say what llmgw status says")
        page = httpx.get(gw.url + "/", timeout=10).text
        assert "Synced" in page and "Suspended" in page
        agent.stop()
        wait_until(
            lambda: httpx.get(gw.url + "/dashboard/status.json", timeout=10).json()["models"]["a"].get(
                "fleet_health"
            )
            == "Missing",
            30,
            "the dashboard to say the stopped agent's model is Missing",
        )
