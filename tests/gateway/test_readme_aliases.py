"""The README's recipe for tools that hard-code a vendor's model name: the aliases it shows
pass lint in the example catalogue, and the `openai` and `anthropic` clients asking for those
names get the model, answered under the name they asked for."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from harness import ROOT, Engine, Gateway, gateway, model, plan, profile, write_plan

from tests.conftest import run_llmgw


def readme_aliases() -> list[str]:
    """The aliases line of the README's example, as a reader would copy it."""
    found = re.search(r"^aliases: \[(.*)\]$", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert found, "the README no longer shows an aliases line for hard-coded model names"
    return [a.strip() for a in found.group(1).split(",")]


def test_the_readme_aliases_are_for_the_names_clients_hard_code() -> None:
    aliases = readme_aliases()
    assert any(a.startswith("gpt-") for a in aliases) and any(a.startswith("claude-") for a in aliases), (
        aliases
    )


def test_the_readme_aliases_pass_lint_in_the_example_catalogue(tmp_path: Path) -> None:
    catalog = tmp_path / "local"
    shutil.copytree(ROOT / "examples" / "local", catalog, ignore=shutil.ignore_patterns("*.gguf"))
    chat = catalog / "gemma-3-270m.yaml"
    text = chat.read_text()
    chat.write_text(
        re.sub(r"^aliases: .*$", f"aliases: [{', '.join(readme_aliases())}]", text, flags=re.MULTILINE)
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - {name: laptop, address: 127.0.0.1, memory_gb: 8, engines: [llamacpp]}\n")
    run = run_llmgw("lint", catalog, "--fleet", fleet, "--format", "json")
    assert run.code in (0, 1), run.stderr
    # The weights are not written here, so lint may say so; nothing else is about the names.
    about_names = [
        f for f in json.loads(run.stdout)["findings"] if f["rule"] not in ("source-missing", "memory-unknown")
    ]
    assert not about_names, f"lint objects to the README's aliases: {about_names}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_a: Engine) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("aliases") / "plan.json"
    write_plan(
        path,
        plan([model("gemma-3-270m", [profile([engine_a.url], "gemma-3-270m")], aliases=readme_aliases())]),
    )
    with gateway(path) as gw:
        yield gw


def test_an_openai_client_asking_for_gpt_gets_the_model_under_that_name(served: Gateway) -> None:
    name = next(a for a in readme_aliases() if a.startswith("gpt-"))
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=16
    )
    assert answer.model == name and answer.choices[0].message.content


def test_an_anthropic_client_asking_for_claude_gets_the_model_under_that_name(served: Gateway) -> None:
    name = next(a for a in readme_aliases() if a.startswith("claude-"))
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0)
    answer = client.messages.create(
        model=name, max_tokens=16, messages=[{"role": "user", "content": "Hello"}]
    )
    assert answer.model == name and answer.content
