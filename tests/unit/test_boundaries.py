"""The package's boundaries, checked as pip-tools checks its imports.

The gateway and the node agent run on machines that serve, not compile: what they need is
in the plan, so they import nothing of the compiler's stages. The compiler runs in CI and
on laptops: it imports nothing of the gateway or the agent. And every module imports on its
own, so no module works only because another happened to be imported first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "llmgw"
MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
    # __main__ runs the CLI and gateway.asgi builds the app from LLMGW_PLAN: both act on import,
    # by design, as the entries `python -m llmgw` and gunicorn load.
    if "__pycache__" not in p.parts and p.name != "__main__.py" and p.parts[-2:] != ("gateway", "asgi.py")
)
COMPILER_STAGES = ("llmgw.load", "llmgw.validate", "llmgw.lint", "llmgw.rules", "llmgw.place")
RUNTIME = ("llmgw.gateway", "llmgw.node")
# Renderers read only the plan too: what they need was decided when it was written.
PLAN_READERS = (*RUNTIME, "llmgw.render")


def _imports(module: str) -> tuple[int, list[str], str]:
    """Import `module` in a fresh interpreter; the llmgw modules that came with it."""
    code = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('llmgw'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    loaded = json.loads(done.stdout) if done.returncode == 0 else []
    return done.returncode, loaded, done.stderr


@pytest.fixture(scope="module")
def imported() -> dict[str, tuple[int, list[str], str]]:
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(MODULES, pool.map(_imports, MODULES), strict=True))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_module_imports_on_its_own(imported: dict[str, tuple[int, list[str], str]]) -> None:
    failed = {m: err.strip().splitlines()[-1] for m, (code, _, err) in imported.items() if code}
    assert failed == {}


def test_the_gateway_the_node_agent_and_renderers_import_nothing_of_the_compiler(
    imported: dict[str, tuple[int, list[str], str]],
) -> None:
    crossings = {
        module: [m for m in loaded if _under(m, COMPILER_STAGES)]
        for module, (_, loaded, _) in imported.items()
        if _under(module, PLAN_READERS)
    }
    assert {m: c for m, c in crossings.items() if c} == {}
    assert any(_under(m, ("llmgw.node",)) for m in crossings), "the check saw the node agent"
    assert "llmgw.render.kubernetes" in crossings, "the check saw the Kubernetes renderer"


def test_the_compiler_imports_nothing_of_the_gateway_or_the_node_agent(
    imported: dict[str, tuple[int, list[str], str]],
) -> None:
    stages = (*COMPILER_STAGES, "llmgw.plan", "llmgw.diff", "llmgw.report")
    compiler = [m for m in imported if _under(m, stages)]
    crossings = {m: [x for x in imported[m][1] if _under(x, RUNTIME)] for m in compiler}
    assert {m: c for m, c in crossings.items() if c} == {}
    assert "llmgw.lint" in compiler


def test_the_module_list_is_the_package() -> None:
    assert {"llmgw.engines", "llmgw.node.agent", "llmgw.gateway.app", "llmgw.lint"} <= set(MODULES)
    assert all(Path(REPO, *m.split(".")).with_suffix(".py").exists() or Path(REPO, *m.split(".")).is_dir()
               for m in MODULES)
