"""`llmgw node status`: the table a person reads to see what each engine is doing, and where
its log is when the message is not enough."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from click.testing import CliRunner

from llmgw.cli import main
from tests.conftest import serve_on_loopback

STATUS = {
    "node": "local",
    "plan_digest": "sha256:abc",
    "replicas": [
        {
            "model": "gemma-3-270m",
            "profile": "cpu",
            "endpoint": "http://127.0.0.1:8001",
            "port": 8001,
            "state": "failed",
            "pid": None,
            "restarts": 3,
            "last_exit": -4,
            "since": "2026-12-03T11:00:00Z",
            "message": "llama-server exited at once (-4)",
            "log": ".llmgw-up/node/logs/gemma-3-270m-cpu-8001.log",
            "start": "always",
            "in_flight": None,
            "starts": 4,
        }
    ],
}


@pytest.fixture
def agent_url() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(STATUS).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serve_on_loopback(Handler) as url:
        yield url


def test_the_table_names_each_engines_log_file(agent_url: str) -> None:
    result = CliRunner().invoke(main, ["node", "status", "--agent", agent_url])
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()[1:3]
    assert "LOG" in header.split(), header
    assert ".llmgw-up/node/logs/gemma-3-270m-cpu-8001.log" in row, "the README promises the log file here"
    assert row.rstrip().endswith("llama-server exited at once (-4)"), "the message stays last, unpadded"
