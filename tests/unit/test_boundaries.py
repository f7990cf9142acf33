"""The package's boundaries, checked as pip-tools checks its imports.

The gateway and the node agent run on machines that serve, not compile: what they need is
in the plan, so they import nothing of the compiler's stages. The compiler runs in CI and
on laptops: it imports nothing of the gateway or the agent. And every module imports on its
own, so no module works only because another happened to be imported first.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "llmgw"
MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
    # __main__ runs the CLI and gateway.asgi builds the app from LLMGW_PLAN: both act on import,
    # by design, as the entries `python -m llmgw` and gunicorn load.
    if "__pycache__" not in p.parts and p.name != "__main__.py" and p.parts[-2:] != ("server", "asgi.py")
)
COMPILER = ("llmgw.compiler",)
GITOPS = ("llmgw.gitops",)
RUNTIME = ("llmgw.gateway", "llmgw.node")
# Renderers read only the plan too: what they need was decided when it was written.
PLAN_READERS = (*RUNTIME, "llmgw.render")


# Third-party packages the modules use, imported once in the parent: each child forked from it
# starts with them loaded and with no llmgw module at all, so what a child finds in sys.modules
# after one import is exactly what that module brought. A fresh interpreter per module gave
# the same answer in 61 s; a fork costs milliseconds.
_THIRD_PARTY = (
    "falcon.asgi",
    "httpx",
    "pydantic",
    "ruamel.yaml",
    "jsonschema",
    "fastjsonschema",
    "click",
    "jinja2",
    "prometheus_client",
    "dns.asyncresolver",
    "uvicorn",
    "gunicorn.app.base",
)


def _imports_in_child(module: str, out: Any) -> None:
    import importlib
    import traceback

    from prometheus_client import REGISTRY

    # Metrics that tests run earlier in this process registered stay in prometheus' default
    # registry, and the module that makes them again would find them taken.
    for collector in list(REGISTRY._collector_to_names):
        REGISTRY.unregister(collector)
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - reported, not raised, as a subprocess exits non-zero
        out.send((1, [], "".join(traceback.format_exception_only(type(exc), exc))))
        return
    out.send((0, sorted(m for m in sys.modules if m.startswith("llmgw")), ""))


def _imports(module: str) -> tuple[int, list[str], str]:
    """Import `module` in a child with no llmgw module loaded; the llmgw modules that came with it."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_imports_in_child, args=(module, send))
    child.start()
    send.close()
    try:
        if not receive.poll(120):
            return 1, [], f"importing {module} took over 120 s"
        code, loaded, err = receive.recv()
        return code, loaded, err
    except EOFError:
        return 1, [], f"importing {module} ended its process (exit code {child.exitcode})"
    finally:
        child.join(10)


@pytest.fixture(scope="module")
def imported() -> dict[str, tuple[int, list[str], str]]:
    import importlib

    for name in _THIRD_PARTY:
        importlib.import_module(name)
    # The parent must hold no llmgw module for its children to start clean; tests that ran
    # before this one in the same process may have imported some.
    saved = {m: sys.modules.pop(m) for m in list(sys.modules) if m == "llmgw" or m.startswith("llmgw.")}
    try:
        return {module: _imports(module) for module in MODULES}
    finally:
        sys.modules.update(saved)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_module_imports_on_its_own(imported: dict[str, tuple[int, list[str], str]]) -> None:
    failed = {m: err.strip().splitlines()[-1] for m, (code, _, err) in imported.items() if code}
    assert failed == {}


def test_the_gateway_the_node_agent_and_renderers_import_nothing_of_the_compiler_or_gitops(
    imported: dict[str, tuple[int, list[str], str]],
) -> None:
    crossings = {
        module: [m for m in loaded if _under(m, (*COMPILER, *GITOPS))]
        for module, (_, loaded, _) in imported.items()
        if _under(module, PLAN_READERS)
    }
    assert {m: c for m, c in crossings.items() if c} == {}
    assert any(_under(m, ("llmgw.node",)) for m in crossings), "the check saw the node agent"
    assert "llmgw.render.kubernetes" in crossings, "the check saw the Kubernetes renderer"


def test_the_compiler_imports_nothing_of_the_gateway_the_node_agent_or_gitops(
    imported: dict[str, tuple[int, list[str], str]],
) -> None:
    compiler = [m for m in imported if _under(m, COMPILER)]
    crossings = {m: [x for x in imported[m][1] if _under(x, (*RUNTIME, *GITOPS))] for m in compiler}
    assert {m: c for m, c in crossings.items() if c} == {}
    assert "llmgw.compiler.lint" in compiler


def test_gitops_imports_nothing_of_the_compiler_the_gateway_or_the_node_agent(
    imported: dict[str, tuple[int, list[str], str]],
) -> None:
    gitops = [m for m in imported if _under(m, GITOPS)]
    crossings = {m: [x for x in imported[m][1] if _under(x, (*RUNTIME, *COMPILER))] for m in gitops}
    assert {m: c for m, c in crossings.items() if c} == {}
    assert "llmgw.gitops.deploy" in gitops, "the check saw deploy's client"


# The commands stand above both halves; everything else at the top of the package is beneath
# them, shared by the compiler, the GitOps tools, the gateway and the node agent.
ENTRIES = ("llmgw.cli", "llmgw.up")


def test_the_shared_modules_import_no_half_above_them() -> None:
    shared = [
        m
        for m in MODULES
        if m != "llmgw" and m not in ENTRIES and not _under(m, (*COMPILER, *GITOPS, *RUNTIME, "llmgw.render"))
    ]
    upward = {
        m: sorted(
            x
            for x in _imported_names(m)
            if x in ENTRIES or _under(x, (*COMPILER, *GITOPS, *RUNTIME, "llmgw.render"))
        )
        for m in shared
    }
    assert {m: x for m, x in upward.items() if x} == {}, (
        "a shared module imports a half above it: move what it needs beneath"
    )
    assert {"llmgw.plan", "llmgw.engines.llamacpp", "llmgw.load"} <= set(shared)


def test_the_module_list_is_the_package() -> None:
    expected = {
        "llmgw.engines",
        "llmgw.node.agent",
        "llmgw.node.runner",
        "llmgw.gateway.server.app",
        "llmgw.compiler.lint",
    }
    assert expected <= set(MODULES)
    assert all(
        Path(REPO, *m.split(".")).with_suffix(".py").exists() or Path(REPO, *m.split(".")).is_dir()
        for m in MODULES
    )


def _imported_names(module: str) -> set[str]:
    """The llmgw modules `module`'s source names in an import, wherever it stands: at the top,
    inside a function, or under TYPE_CHECKING (a circle kept legal that way is still one)."""
    path = Path(REPO, *module.split("."))
    source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmgw"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("llmgw"))
    return {m for m in out if m in MODULES and m != module}


def test_no_module_imports_its_way_back_to_itself() -> None:
    graph = {m: _imported_names(m) for m in MODULES}
    circles = []
    for start in MODULES:
        # Depth-first from each module, looking for a path back to it.
        stack, seen = [(start, (start,))], set()
        while stack:
            here, path = stack.pop()
            for there in graph[here]:
                if there == start:
                    circles.append(" → ".join((*path, start)))
                elif there not in seen:
                    seen.add(there)
                    stack.append((there, (*path, there)))
    assert circles == [], "an import circle: move what both sides need beneath them"


# The gateway's rooms, top to bottom: a request's path from the process down to what changes
# under it. Modules straight under gateway/ (settings, the upstream pool, the API table, errors)
# are beneath them all. schedule/ is reserved for fair scheduling, between request/ and state/.
GATEWAY_LAYERS = ("server", "pages", "request", "schedule", "state")


def _gateway_layer(module: str) -> int | None:
    """How far down the gateway `module` stands: 0 for server/, one past state/ for shared modules;
    None outside the gateway, and for the package itself, which only re-exports the app."""
    parts = module.split(".")
    if parts[:2] != ["llmgw", "gateway"] or len(parts) < 3:
        return None
    if parts[2] in GATEWAY_LAYERS:
        return GATEWAY_LAYERS.index(parts[2])
    return len(GATEWAY_LAYERS)


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside the gateway from a room to one above it, as 'importer → imported'."""
    arrows = []
    for module, names in graph.items():
        here = _gateway_layer(module)
        if here is None:
            continue
        for there in sorted(names):
            layer = _gateway_layer(there)
            if layer is not None and layer < here:
                arrows.append(f"{module} → {there}")
    return arrows


def test_inside_the_gateway_every_import_points_down() -> None:
    gateway = [m for m in MODULES if m.startswith("llmgw.gateway.")]
    assert upward_arrows({m: _imported_names(m) for m in gateway}) == [], (
        "an import up the gateway's layers (server → pages → request → schedule → state → shared): "
        "move what both need beneath them"
    )
    assert "llmgw.gateway.state.routes" in gateway, "the check saw the route table"


def test_an_upward_import_is_caught() -> None:
    graph = {"llmgw.gateway.state.health": {"llmgw.gateway.request.proxy"}, "llmgw.gateway.settings": set()}
    assert upward_arrows(graph) == ["llmgw.gateway.state.health → llmgw.gateway.request.proxy"]
    assert upward_arrows({"llmgw.gateway.upstream": {"llmgw.gateway.state.metrics"}}) != []
    assert upward_arrows({"llmgw.gateway.request.proxy": {"llmgw.gateway.state.metrics"}}) == []
