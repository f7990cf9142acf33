"""`llmgw deploy` as someone setting it up meets it: each mistake said as what to change."""

from __future__ import annotations

import httpx
import pytest

from llmgw.errors import LlmgwError
from llmgw.gitops import deploy as deploy_module
from llmgw.gitops.deploy import deploy


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{}")
    return path


def answering(monkeypatch, status: int, body: object = None) -> list[str]:
    urls: list[str] = []

    def post(url: str, **_: object) -> httpx.Response:
        urls.append(url)
        return httpx.Response(status, json=body, request=httpx.Request("POST", url))

    monkeypatch.setattr(deploy_module.httpx, "post", post)
    return urls


def test_a_gateway_url_ending_in_v1_is_refused_before_sending(monkeypatch, plan_file):
    urls = answering(monkeypatch, 404)
    with pytest.raises(LlmgwError) as caught:
        deploy(plan_file, "http://127.0.0.1:8080/v1", token="t")
    assert "ends in /v1" in str(caught.value) and "http://127.0.0.1:8080." in str(caught.value)
    assert "refused" not in str(caught.value) and urls == []


def test_a_wrong_token_says_the_token_was_not_accepted(monkeypatch, plan_file):
    answering(monkeypatch, 401, {"error": {"message": "unauthorized"}})
    with pytest.raises(LlmgwError) as caught:
        deploy(plan_file, "http://127.0.0.1:8080", token="wrong")
    message = str(caught.value)
    assert "did not accept the token (401)" in message and "LLMGW_ADMIN_TOKEN" in message
    assert "refused the plan" not in message


def test_a_url_with_a_path_that_takes_no_plan_says_to_give_the_base_url(monkeypatch, plan_file):
    answering(monkeypatch, 404)
    with pytest.raises(LlmgwError) as caught:
        deploy(plan_file, "http://127.0.0.1:8080/llm", token="t")
    assert "nothing at http://127.0.0.1:8080/llm/admin/plan takes a plan (404)" in str(caught.value)
    assert "refused" not in str(caught.value)


def test_a_url_without_a_scheme_says_how_to_write_it(llmgw, plan_file):
    run = llmgw("deploy", plan_file, "--gateway", "127.0.0.1:8080", LLMGW_ADMIN_TOKEN="t")
    assert run.code == 2, run
    assert "write it as http://HOST:PORT" in run.stderr and ".." not in run.stderr, run


def test_a_plan_the_gateway_refuses_still_says_refused_with_its_reason(monkeypatch, plan_file):
    answering(monkeypatch, 422, {"error": {"message": "model x needs 900 GB"}})
    with pytest.raises(LlmgwError) as caught:
        deploy(plan_file, "http://127.0.0.1:8080/", token="t")
    assert str(caught.value) == "the gateway refused the plan (422): model x needs 900 GB"


def test_a_node_agent_sending_the_admin_token_over_plain_http_is_warned_as_deploy_is(monkeypatch, tmp_path):
    # The agent reads the plan with the admin token, which can also deploy.
    from click.testing import CliRunner

    import llmgw.node.run
    from llmgw.cli import main

    monkeypatch.setattr(llmgw.node.run, "run_node", lambda *args, **kwargs: None)
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "t")
    state = str(tmp_path / "state")

    def stderr_of(url: str) -> str:
        run = CliRunner().invoke(main, ["node", "--node", "n", "--gateway", url, "--state-dir", state])
        assert run.exit_code == 0, run.output
        return run.stderr

    assert "travels in clear" in stderr_of("http://10.0.0.5:8080")
    assert stderr_of("http://127.0.0.1:8080") == ""
    assert stderr_of("https://gateway.example:8443") == ""
