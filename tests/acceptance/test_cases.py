"""Acceptance: each folder under cases/ is a catalogue with the exit code and lines it expects.

A case folder holds catalog/, optionally its own fleet.yaml, and expect.yaml:
`exit` (lint's exit code), `strict_exit` (with --strict, when it differs), and
`stdout`: fragments that must each appear in lint's output (an empty list: no output);
`absent`: fragments that must not.

A case that also holds base/ is a pull request: base/ is the catalogue on the base branch.
It is planned first, and lint and plan then run with --previous that plan, as the
review workflow runs them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.conftest import run_llmgw

HERE = Path(__file__).parent
CASES = sorted(p for p in (HERE / "cases").iterdir() if p.is_dir())


def _setup(case: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    shutil.copytree(case / "catalog", tmp_path / "catalog")
    fleet = case / "fleet.yaml" if (case / "fleet.yaml").exists() else HERE / "fleet.yaml"
    shutil.copy(fleet, tmp_path / "fleet.yaml")
    if not (case / "base").is_dir():
        return tmp_path, []
    base = tmp_path / "base"
    shutil.copytree(case / "base", base / "catalog")
    shutil.copy(fleet, base / "fleet.yaml")
    planned = run_llmgw("plan", "--out", "../base.json", cwd=base)
    assert planned.code == 0, f"the base catalogue must plan\n{planned}"
    return tmp_path, ["--previous", "base.json"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Path, tmp_path: Path) -> None:
    expect = YAML(typ="safe").load((case / "expect.yaml").read_text())
    root, previous = _setup(case, tmp_path)
    run = run_llmgw("lint", *previous, cwd=root)
    assert run.code == expect["exit"], run
    assert "Traceback" not in run.stderr, run
    if expect["stdout"] == []:
        assert run.stdout == "", run
    for fragment in expect["stdout"]:
        assert fragment in run.stdout, f"expected {fragment!r} in the output\n{run}"
    for fragment in expect.get("absent", []):
        assert fragment not in run.stdout, f"expected no {fragment!r} in the output\n{run}"
    if "strict_exit" in expect:
        strict = run_llmgw("lint", "--strict", *previous, cwd=root)
        assert strict.code == expect["strict_exit"], strict
    plan = run_llmgw("plan", "--out", "plan.json", *previous, cwd=root)
    assert plan.code == (0 if expect["exit"] == 0 else 1), plan
    if expect["exit"] == 1:
        # plan reports what lint reports, on the same files: a reviewer reads either.
        assert plan.stderr.startswith(run.stdout), f"lint and plan disagree\n{run}\n{plan}"
    assert (root / "plan.json").exists() == (expect["exit"] == 0)
