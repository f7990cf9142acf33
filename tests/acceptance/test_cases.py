"""Acceptance: each folder under cases/ is a catalogue with the exit code and lines it expects.

A case folder holds catalog/, optionally its own fleet.yaml, and expect.yaml:
`exit` (lint's exit code), `strict_exit` (with --strict, when it differs), and
`stdout`: fragments that must each appear in lint's output (an empty list: no output).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from tests.conftest import run_llmgw

HERE = Path(__file__).parent
CASES = sorted(p for p in (HERE / "cases").iterdir() if p.is_dir())


def _setup(case: Path, tmp_path: Path) -> Path:
    shutil.copytree(case / "catalog", tmp_path / "catalog")
    fleet = case / "fleet.yaml" if (case / "fleet.yaml").exists() else HERE / "fleet.yaml"
    shutil.copy(fleet, tmp_path / "fleet.yaml")
    return tmp_path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Path, tmp_path: Path) -> None:
    expect = YAML(typ="safe").load((case / "expect.yaml").read_text())
    root = _setup(case, tmp_path)
    run = run_llmgw("lint", cwd=root)
    assert run.code == expect["exit"], run
    assert "Traceback" not in run.stderr, run
    if expect["stdout"] == []:
        assert run.stdout == "", run
    for fragment in expect["stdout"]:
        assert fragment in run.stdout, f"expected {fragment!r} in the output\n{run}"
    if "strict_exit" in expect:
        strict = run_llmgw("lint", "--strict", cwd=root)
        assert strict.code == expect["strict_exit"], strict
    plan = run_llmgw("plan", "--out", "plan.json", cwd=root)
    assert plan.code == (0 if expect["exit"] == 0 else 1), plan
    assert (root / "plan.json").exists() == (expect["exit"] == 0)
