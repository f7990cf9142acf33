"""A model's fallbacks in the catalogue: each lint finding at its file:line, and the plan
carrying the list only for a model that has one."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.compiler.build import build_plan
from llmgw.gitops.diff import diff_plans
from llmgw.gitops.report.diff_markdown import diff_markdown
from llmgw.plan import dump_plan, parse_plan
from tests.unit.helpers import by_rule, model_yaml, run


def test_a_fallback_that_names_no_model_is_an_error_at_its_line(tmp_path: Path) -> None:
    models = {"a.yaml": model_yaml("a", extra="fallbacks: [b, nowhere]\n"), "b.yaml": model_yaml("b")}
    result = run(tmp_path, models)
    (finding,) = by_rule(result, "fallback-unknown")
    assert finding.severity == "error" and finding.file.endswith("a.yaml") and finding.line == 6
    assert "'nowhere'" in finding.message


def test_fallbacks_in_a_circle_are_an_error(tmp_path: Path) -> None:
    result = run(tmp_path, {
        "a.yaml": model_yaml("a", extra="fallbacks: [b]\n"),
        "b.yaml": model_yaml("b", extra="fallbacks: [a]\n"),
    })  # fmt: skip
    found = by_rule(result, "fallback-cycle")
    assert {f.file.rsplit("/", 1)[-1] for f in found} == {"a.yaml", "b.yaml"}
    assert all(f.severity == "error" for f in found)
    assert all("a → b → a" in f.message or "b → a → b" in f.message for f in found)


def test_a_fallback_of_another_task_is_an_error(tmp_path: Path) -> None:
    result = run(tmp_path, {
        "chat.yaml": model_yaml("chat", extra="fallbacks: [embed]\n"),
        "embed.yaml": model_yaml("embed", extra="task: embedding\n"),
    })  # fmt: skip
    (finding,) = by_rule(result, "fallback-task")
    assert finding.severity == "error" and "embedding" in finding.message and finding.line == 6


def test_a_smaller_fallback_is_a_warning(tmp_path: Path) -> None:
    result = run(tmp_path, {
        "big.yaml": model_yaml("big", extra="max_output: 4096\nfallbacks: [small]\n"),
        "small.yaml": model_yaml("small", extra="max_output: 1024\n"),
    })  # fmt: skip
    (finding,) = by_rule(result, "fallback-smaller")
    assert finding.severity == "warning" and "max_output 1024 < 4096" in finding.message


def test_a_fallback_with_a_limit_behind_a_model_without_one_is_a_warning(tmp_path: Path) -> None:
    """The gateway caps what a fallback is sent at its own max_output: while the first model is
    down, its long answers come back shorter, and the reviewer is told before the merge."""
    result = run(tmp_path, {
        "open.yaml": model_yaml("open", extra="fallbacks: [small]\n"),
        "small.yaml": model_yaml("small", extra="max_output: 100\n"),
    })  # fmt: skip
    (finding,) = by_rule(result, "fallback-smaller")
    assert finding.severity == "warning" and "max_output 100, where this model sets none" in finding.message


def test_the_plan_lists_fallbacks_only_for_a_model_that_has_them(tmp_path: Path) -> None:
    result = run(tmp_path, {"a.yaml": model_yaml("a", extra="fallbacks: [b]\n"), "b.yaml": model_yaml("b")})
    assert not result.counts()[0], result.findings
    models = {m["name"]: m for m in json.loads(dump_plan(build_plan(result)))["models"]}
    assert models["a"]["fallbacks"] == ["b"]
    assert "fallbacks" not in models["b"], "a model without fallbacks is written as before"


def test_the_pull_request_comment_shows_a_change_of_fallbacks(tmp_path: Path) -> None:
    before = run(tmp_path / "base", {"a.yaml": model_yaml("a"), "b.yaml": model_yaml("b")})
    head = {"a.yaml": model_yaml("a", extra="fallbacks: [b]\n"), "b.yaml": model_yaml("b")}
    after = run(tmp_path / "head", head)
    old, new = (parse_plan(dump_plan(build_plan(r))) for r in (before, after))
    comment = diff_markdown(diff_plans(old, new))
    assert "fallbacks" in comment and "b" in comment, comment
