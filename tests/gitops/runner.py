"""Run a workflow job's `run:` steps the way a Gitea runner would, on this machine.

Not an Actions emulator: just enough to execute exactly the shell the workflow holds.
`uses:` steps are stood in for by the test (the repository is already checked out, and
Python is this one), `pip install` is a no-op because llmgw is importable from the
source tree, and `${{ … }}` is replaced from a table the test gives; an expression
missing from that table fails the test rather than silently becoming empty.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.conftest import REPO

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def load_workflow(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = YAML(typ="safe").load(path.read_text())
    return doc


@dataclass
class StepRun:
    name: str
    code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"--- step {self.name!r} [exit {self.code}]\n{self.stdout}{self.stderr}"


@dataclass(repr=False)
class JobRun:
    steps: list[StepRun] = field(default_factory=list)
    summary: str = ""

    @property
    def succeeded(self) -> bool:
        return all(s.code == 0 for s in self.steps)

    def step(self, name: str) -> StepRun:
        return next(s for s in self.steps if s.name == name)

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)

    # pytest shows an assertion's message with repr(): every step's output, not a dataclass.
    __repr__ = __str__


def shims(bin_dir: Path) -> Path:
    """`llmgw` runs this source tree; `python -m pip install` does nothing."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "llmgw").write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m llmgw "$@"\n')
    (bin_dir / "python").write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "-m pip" ]; then exit 0; fi\nexec "{sys.executable}" "$@"\n'
    )
    for name in ("llmgw", "python"):
        (bin_dir / name).chmod(0o755)
    return bin_dir


def substitute(text: str, expressions: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        expr = match.group(1)
        if expr not in expressions:
            raise AssertionError(f"the workflow uses ${{{{ {expr} }}}}, which this test does not give")
        return expressions[expr]

    return EXPRESSION.sub(value, text)


def run_job(
    workflow: Path,
    job: str,
    *,
    workspace: Path,
    temp: Path,
    env: dict[str, str],
    expressions: dict[str, str],
    stop_before: str | None = None,
) -> JobRun:
    spec = load_workflow(workflow)["jobs"][job]
    bin_dir = shims(temp / "bin")
    runner_temp = temp / "runner"
    runner_temp.mkdir(parents=True, exist_ok=True)
    summary = temp / "step-summary.md"
    summary.touch()
    job_env = {k: substitute(str(v), expressions) for k, v in (spec.get("env") or {}).items()}
    exported: dict[str, str] = {}
    result = JobRun()
    for i, step in enumerate(spec["steps"]):
        name = step.get("name") or step.get("uses") or f"step {i}"
        if name == stop_before:
            break
        if "uses" in step:
            continue
        condition = str(step.get("if", "")).strip()
        if condition not in ("", "always()", "${{ always() }}"):
            raise AssertionError(f"step {name!r} has `if: {condition}`, which this runner cannot judge")
        if not result.succeeded and condition == "":
            continue
        env_file, output_file = temp / f"env{i}", temp / f"output{i}"
        env_file.write_text("")
        output_file.write_text("")
        script = temp / f"step{i}.sh"
        script.write_text(substitute(step["run"], expressions))
        step_env = {k: substitute(str(v), expressions) for k, v in (step.get("env") or {}).items()}
        full_env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(temp),
            "RUNNER_TEMP": str(runner_temp),
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ENV": str(env_file),
            "GITHUB_OUTPUT": str(output_file),
            "GITHUB_STEP_SUMMARY": str(summary),
            **env,
            **job_env,
            **exported,
            **step_env,
        }
        # `shell: bash` as Actions runs it: errexit and pipefail on.
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        result.steps.append(StepRun(name, proc.returncode, proc.stdout, proc.stderr))
        for line in env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                exported[key] = value
    result.summary = summary.read_text()
    return result
