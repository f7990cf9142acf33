"""`llmgw node` with stand-in engines: lifecycle, new plans, adoption, and failures as states."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.gateway.harness import ROOT
from tests.node.agents import Agent, Fleet, alive, chat_model, wait_for


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path / "fleet")



def run_agent(agents: list[Agent], fleet: Fleet, bin_dir: Path, **env: str) -> Agent:
    agent = Agent(fleet, bin_dir, **env)
    agents.append(agent)
    return agent.start()


def test_a_node_the_plan_lacks_is_refused_with_the_plans_nodes(fleet: Fleet, bin_dir: Path) -> None:
    fleet.plan({"a.yaml": chat_model("a")})
    agent = Agent(fleet, bin_dir)
    done = subprocess.run(
        agent.command(node="nosuch"), env=agent.env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 2
    assert "no node named 'nosuch'" in done.stderr and "elsewhere, local" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_replica_goes_from_loading_to_ready_with_the_plans_command_line(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    doc = fleet.plan({"a.yaml": chat_model("a", args='[--parallel, "2"]')})
    agent = run_agent(agents, fleet, bin_dir, STAND_IN_LOAD_S="2")
    loading = agent.wait_state("a", "loading")
    ready = agent.wait_state("a", "ready")
    replica = doc["models"][0]["profiles"][0]["replicas"][0]
    assert ready["endpoint"] == replica["endpoint"] and ready["pid"] == loading["pid"]
    assert ready["restarts"] == 0 and ready["message"] is None
    [start] = agent.started()
    weights = str(fleet.catalog / "weights.gguf")
    assert start["argv"] == [
        "llama-server",
        "--model",
        weights,
        "--host",
        "127.0.0.1",
        "--port",
        str(replica["port"]),
        "--ctx-size",
        "2048",
        "--alias",
        "a",
        "--parallel",
        "2",
    ], "the context is given explicitly: 1024 for each of the two slots"
    assert httpx.get(replica["endpoint"] + "/health", timeout=5).status_code == 200
    status = agent.status()
    assert status is not None and status["plan_digest"] == doc["digest"] and status["node"] == "local"
    metrics = httpx.get(agent.status_url + "/metrics", timeout=5).text
    endpoint = replica["endpoint"]
    series = f'llmgw_node_replica_state{{endpoint="{endpoint}",model="a",profile="cpu",state="ready"}}'
    assert f"{series} 1.0" in metrics
    # The weights are a file beside the catalogue: nothing was downloaded, so nothing says so.
    assert "downloading" not in agent.log_text(), agent.log_text()


def test_an_embedding_model_gets_embeddings_and_a_vllm_replica_its_gpus(
    tmp_path: Path, bin_dir: Path, agents: list[Agent]
) -> None:
    fleet = Fleet(tmp_path / "gpu", gpus=2)
    vllm = (
        "name: big\nsource: hf://Qwen/Qwen2.5-7B-Instruct\nweights_bytes: 1000000000\ncontext_length: 4096\n"
        "profiles:\n  - name: gpu\n    engine: vllm\n    args: [--dtype, half]\n"
    )
    doc = fleet.plan(
        {
            "embed.yaml": chat_model("embed", extra="task: embedding\n"),
            "big.yaml": vllm,
            "big2.yaml": vllm.replace("name: big", "name: big2"),
        }
    )
    agent = run_agent(agents, fleet, bin_dir)
    for name in ("embed", "big", "big2"):
        agent.wait_state(name, "ready")
    starts = {s["argv"][0] + ":" + s["argv"][s["argv"].index("--port") + 1]: s for s in agent.started()}
    ports = {m["name"]: m["profiles"][0]["replicas"][0]["port"] for m in doc["models"]}
    gpus = {m["name"]: m["profiles"][0]["replicas"][0].get("gpu_ids") for m in doc["models"]}
    assert gpus["big"] != gpus["big2"] and sorted(gpus["big"] + gpus["big2"]) == [0, 1]
    big = starts[f"vllm:{ports['big']}"]
    assert big["argv"] == [
        "vllm",
        "serve",
        "Qwen/Qwen2.5-7B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        str(ports["big"]),
        "--max-model-len",
        "4096",
        "--served-model-name",
        "big",
        "--dtype",
        "half",
    ]
    assert big["cuda"] == ",".join(map(str, gpus["big"]))
    assert starts[f"vllm:{ports['big2']}"]["cuda"] == ",".join(map(str, gpus["big2"]))
    embed = starts[f"llama-server:{ports['embed']}"]
    assert embed["argv"][-1] == "--embeddings" and embed["cuda"] is None


def test_a_new_plan_starts_the_new_stops_the_gone_replaces_the_changed_and_keeps_the_rest(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    fleet.plan(
        {"keep.yaml": chat_model("keep"), "gone.yaml": chat_model("gone"), "edit.yaml": chat_model("edit")}
    )
    agent = run_agent(agents, fleet, bin_dir)
    before = {name: agent.wait_state(name, "ready")["pid"] for name in ("keep", "gone", "edit")}
    fleet.plan(
        {
            "keep.yaml": chat_model("keep"),
            "edit.yaml": chat_model("edit", args="[--threads, '1']"),
            "new.yaml": chat_model("new"),
        }
    )
    agent.wait_state("new", "ready")
    wait_for(lambda: not alive(before["gone"]), 15, "the removed replica's engine to stop", agent)
    edited = wait_for(
        lambda: (
            (r := agent.replicas().get("edit")) and r["state"] == "ready" and r["pid"] != before["edit"] and r
        ),
        20,
        "the edited replica replaced",
        agent,
    )
    assert not alive(before["edit"])
    assert "--threads" in next(s for s in agent.started() if s["pid"] == edited["pid"])["argv"]
    assert agent.replicas()["keep"]["pid"] == before["keep"] and alive(before["keep"]), "untouched"
    assert "gone" not in agent.replicas()
    assert [s["pid"] for s in agent.started()].count(before["keep"]) == 1


def test_an_engine_that_dies_is_restarted_after_a_backoff(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    fleet.plan({"a.yaml": chat_model("a")})
    agent = run_agent(agents, fleet, bin_dir)
    first = agent.wait_state("a", "ready")["pid"]
    os.kill(first, signal.SIGKILL)
    back = wait_for(
        lambda: (r := agent.replicas()["a"]) and r["state"] == "ready" and r["pid"] != first and r,
        20,
        "the engine restarted",
        agent,
    )
    assert back["restarts"] == 1 and back["last_exit"] == -9


def test_an_agent_killed_and_started_again_adopts_its_engines(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    fleet.plan({"a.yaml": chat_model("a")})
    agent = run_agent(agents, fleet, bin_dir)
    pid = agent.wait_state("a", "ready")["pid"]
    agent.stop(signal.SIGKILL)
    assert alive(pid), "a killed agent leaves its engines serving"
    again = run_agent(agents, fleet, bin_dir)
    adopted = again.wait_state("a", "ready")
    assert adopted["pid"] == pid and adopted["restarts"] == 0
    assert len(again.started()) == 1, "no second engine was started"
    assert again.stop() == 0
    wait_for(lambda: not alive(pid), 10, "the adopted engine stopped with the agent", again)


def test_stopping_the_agent_stops_every_engine(fleet: Fleet, bin_dir: Path, agents: list[Agent]) -> None:
    fleet.plan({"a.yaml": chat_model("a"), "b.yaml": chat_model("b")})
    agent = run_agent(agents, fleet, bin_dir)
    pids = [agent.wait_state(name, "ready")["pid"] for name in ("a", "b")]
    assert agent.stop(signal.SIGINT) == 0
    assert not any(alive(pid) for pid in pids)
    assert not list((agent.state_dir / "replicas").glob("*.json")), "no record of a stopped engine is left"


@pytest.mark.parametrize(
    ("env", "exit_code", "said"),
    [
        ({"STAND_IN_EXIT": "1"}, 1, ["exited at once (code 1)", "unknown file magic"]),
        # A llama.cpp built with -march=native on a VM whose CPU reports AMX it cannot run
        # loaded its weights and died at the first prompt; "code -4" alone said nothing.
        (
            {"STAND_IN_SIGNAL": "SIGILL"},
            -signal.SIGILL,
            [
                "exited at once (code -4, SIGILL: the engine's build uses CPU instructions",
                "-DGGML_NATIVE=OFF",
                "threadpool init",
            ],
        ),
    ],
    ids=["exit code", "SIGILL"],
)
def test_an_engine_that_exits_at_once_says_why_with_its_log(
    fleet: Fleet, bin_dir: Path, agents: list[Agent], env: dict[str, str], exit_code: int, said: list[str]
) -> None:
    fleet.plan({"a.yaml": chat_model("a")})
    agent = run_agent(agents, fleet, bin_dir, **env)
    failed = wait_for(
        lambda: (r := agent.replicas()["a"]) and r["last_exit"] == exit_code and r, 20, "an exit", agent
    )
    for words in said:  # how it ended, what to do, and the last lines of the engine's log
        assert words in failed["message"]
    assert Path(failed["log"]).is_absolute() or (agent.fleet.root / failed["log"]).exists()


def test_a_missing_engine_says_what_to_install_and_which_variable_to_set(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    fleet.plan({"a.yaml": chat_model("a")})
    agent = run_agent(agents, fleet, bin_dir, LLMGW_LLAMA_SERVER=str(bin_dir / "no-such-server"))
    failed = wait_for(lambda: (r := agent.replicas()["a"]) and r["message"] and r, 20, "a message", agent)
    assert failed["state"] == "failed", "it stays failed, with its sentence, while it waits to try again"
    assert "LLMGW_LLAMA_SERVER" in failed["message"] and "llama-server" in failed["message"]
    assert agent.proc is not None and agent.proc.poll() is None, "the agent itself keeps running"


def test_a_port_held_by_another_process_is_a_state_not_a_crash(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    import socket

    doc = fleet.plan({"a.yaml": chat_model("a")})
    port = doc["models"][0]["profiles"][0]["replicas"][0]["port"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        agent = run_agent(agents, fleet, bin_dir)
        failed = wait_for(lambda: (r := agent.replicas()["a"]) and r["message"] and r, 20, "a message", agent)
        assert f"port {port} on 127.0.0.1 is held by another process" in failed["message"]
        assert failed["state"] == "failed"
        assert agent.started() == []
    agent.wait_state("a", "ready", timeout=30)


def test_more_memory_than_the_node_has_is_a_warning_in_the_status(
    fleet: Fleet, bin_dir: Path, agents: list[Agent]
) -> None:
    huge = chat_model("a").replace("min_memory_gb: 0.1", "min_memory_gb: 9999")
    fleet.fleet.write_text(fleet.fleet.read_text().replace("memory_gb: 16", "memory_gb: 10000"))
    fleet.plan({"a.yaml": huge})
    agent = run_agent(agents, fleet, bin_dir)
    ready = agent.wait_state("a", "ready")
    assert "the plan says a replica needs 9999 GB" in ready["message"]
    assert "needs 9999 GB" in agent.log_text()


def test_the_agent_follows_the_plan_the_gateway_serves(
    fleet: Fleet, bin_dir: Path, agents: list[Agent], tmp_path: Path
) -> None:
    from tests.gateway.harness import gateway

    fleet.plan({"a.yaml": chat_model("a")})
    with gateway(fleet.plan_path, LLMGW_ADMIN_TOKEN="admin") as gw:
        refused = Agent(fleet, bin_dir, source=["--gateway", gw.url])
        done = subprocess.run(refused.command(), env=refused.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "LLMGW_ADMIN_TOKEN" in done.stderr
        agent = Agent(fleet, bin_dir, source=["--gateway", gw.url], LLMGW_ADMIN_TOKEN="admin")
        agents.append(agent)
        agent.start()
        agent.wait_state("a", "ready")
        new = fleet.plan({"a.yaml": chat_model("a"), "b.yaml": chat_model("b")})
        new_path = tmp_path / "new.json"
        new_path.write_text(fleet.plan_path.read_text())
        deploy = subprocess.run(
            [sys.executable, "-m", "llmgw", "deploy", str(new_path), "--gateway", gw.url],
            env={**agent.env, "LLMGW_ADMIN_TOKEN": "admin"},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert deploy.returncode == 0, deploy.stderr
        agent.wait_state("b", "ready", timeout=40)
        assert agent.status()["plan_digest"] == new["digest"]
