"""Engines answer only the gateway: the agent starts each engine with a credential of its own,
kept in its state (0600) and out of every command line, tells it only to a caller with its
token, and the gateway sends it on every request; a request straight to an engine's port
without it is refused (401)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx

from tests.gateway.harness import gateway
from tests.node.agents import Agent, Fleet, chat_model, stand_in_bin

TOKEN = "a-token-for-both"


def test_an_engine_answers_the_gateway_and_refuses_anyone_else(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=2)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.agent_at(agent.status_url)
    doc = fleet.plan({"a.yaml": chat_model("a")})
    endpoint = doc["models"][0]["profiles"][0]["replicas"][0]["endpoint"]
    agent.start()
    try:
        agent.wait_state("a", "ready")
        chat = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
        straight = httpx.post(endpoint + "/v1/chat/completions", json=chat, timeout=10)
        assert straight.status_code == 401, "the engine served a caller without its credential"
        forged = httpx.post(
            endpoint + "/v1/chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert forged.status_code == 401, "the agent's token opened the engine"

        open_status = httpx.get(agent.status_url + "/status", timeout=10).json()
        assert "credentials" not in open_status, "the open /status told the engine's key"
        told = httpx.get(
            agent.status_url + "/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ).json()["credentials"]
        key = told[endpoint]
        assert (
            httpx.post(
                endpoint + "/v1/chat/completions",
                json=chat,
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            ).status_code
            == 200
        )

        [started] = agent.started()
        assert "--api-key-file" in started["argv"] and key not in " ".join(started["argv"]), started["argv"]
        key_file = Path(started["argv"][started["argv"].index("--api-key-file") + 1])
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(key_file.parent).st_mode) == 0o700
        assert key not in agent.log_text(), "the key reached the agent's log"

        with gateway(fleet.plan_path, LLMGW_AGENT_TOKEN=TOKEN) as gw:
            # A client's own Authorization is its gateway key, never passed on to the engine.
            answer = httpx.post(
                gw.url + "/v1/chat/completions",
                json=chat,
                headers={"Authorization": "Bearer sk-x"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text + gw.log()[-3000:]
            assert key not in gw.log()
    finally:
        agent.stop()


def test_a_node_token_from_a_file_opens_its_own_agent_and_no_other(tmp_path: Path) -> None:
    """The agent reads its token from a file (`--token-file`), so it sits in no environment;
    the gateway holds one token per node (LLMGW_AGENT_TOKENS_FILE) and uses each node's own."""
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=2)
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "agent.token").write_text("token-of-local\n")
    (secret_dir / "tokens.yaml").write_text("local: token-of-local\nother-node: token-of-other\n")
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN="")
    agent.source = [*agent.source, "--token-file", str(secret_dir / "agent.token")]
    fleet.agent_at(agent.status_url)
    fleet.plan({"a.yaml": chat_model("a") + "    start: on-demand\n"})
    agent.start()
    try:
        assert agent.proc is not None
        environ = Path(f"/proc/{agent.proc.pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{agent.proc.pid}/cmdline").read_bytes()
        assert b"token-of-local" not in environ + cmdline, "the token sits where ps shows it"
        endpoint = fleet.plan({"a.yaml": chat_model("a") + "    start: on-demand\n"})["models"][0][
            "profiles"
        ][0]["replicas"][0]["endpoint"]
        for token, status in (("token-of-other", 401), ("token-of-local", 200)):
            answer = httpx.post(
                agent.status_url + "/acquire",
                json={"endpoint": endpoint, "wait_s": 20},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert answer.status_code == status, (token, answer.text)
        with gateway(fleet.plan_path, LLMGW_AGENT_TOKENS_FILE=str(secret_dir / "tokens.yaml")) as gw:
            answer = httpx.post(
                gw.url + "/v1/chat/completions",
                json={"model": "a", "messages": [{"role": "user", "content": "hi"}]},
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
    finally:
        agent.stop()


def test_the_agents_logs_and_records_are_its_own(tmp_path: Path) -> None:
    """An engine's log and record say what it runs and where its files are: 0600 in 0700
    folders, as the token and credential files are (they were 0644 in 0755)."""
    fleet = Fleet(tmp_path / "fleet", others=False, memory_gb=2)
    agent = Agent(fleet, stand_in_bin(tmp_path / "bin", "llama-server"), LLMGW_AGENT_TOKEN=TOKEN)
    fleet.plan({"a.yaml": chat_model("a")})
    agent.start()
    try:
        agent.wait_state("a", "ready")
        for folder in ("logs", "replicas"):
            path = agent.state_dir / folder
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, folder
            for file in path.iterdir():
                assert stat.S_IMODE(os.stat(file).st_mode) == 0o600, file
    finally:
        agent.stop()
