from __future__ import annotations

from pathlib import Path

from llmgw.compiler.lint import LintResult, lint
from llmgw.findings import Finding
from tests.conftest import SMALL_FLEET, write_catalog

GGUF = "hf://bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"


def model_yaml(
    name: str = "llama-3.1-8b",
    *,
    source: str = GGUF,
    engine: str = "llamacpp",
    extra: str = "",
    profile_extra: str = "",
    selector: str = "{pool: cpu}",
    replicas: int = 1,
    weights: int | None = 4_920_734_016,
) -> str:
    weights_line = f"weights_bytes: {weights}\n" if weights else ""
    return (
        f"name: {name}\n"
        f"source: {source}\n"
        f"{weights_line}"
        "context_length: 8192\n"
        f"replicas: {replicas}\n"
        f"{extra}"
        "profiles:\n"
        "  - name: main\n"
        f"    engine: {engine}\n"
        f"    node_selector: {selector}\n"
        f"{profile_extra}"
    )


def run(tmp_path: Path, models: dict[str, str], fleet: str = SMALL_FLEET) -> LintResult:
    catalog, fleet_path = write_catalog(tmp_path, models, fleet)
    return lint(catalog, fleet_path)


def by_rule(result: LintResult, rule: str) -> list[Finding]:
    return [f for f in result.findings if f.rule == rule]
