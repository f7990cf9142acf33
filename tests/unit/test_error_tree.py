"""Every error llmgw raises stands in the one tree errors.py draws, as httpx draws its own:
a reader finds what a caller may catch in one place, and `except LlmgwError` means all of it."""

from __future__ import annotations

import ast

from tests.conftest import REPO

# Outside the tree on purpose: the root itself, and the gateway's HTTP answer in OpenAI's shape,
# which is a response to a client rather than an error of llmgw's (errors.py says so).
ROOTS = {"LlmgwError", "ApiError"}
BUILTIN_ROOTS = {"Exception", "BaseException", "ValueError", "RuntimeError", "OSError", "KeyError"}


def _public_exceptions_outside_the_tree() -> list[str]:
    outside = []
    for path in sorted((REPO / "llmgw").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_") or node.name in ROOTS:
                continue
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if bases & BUILTIN_ROOTS:
                outside.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    return outside


def test_every_public_exception_derives_from_llmgws_base_error() -> None:
    assert _public_exceptions_outside_the_tree() == []


def test_every_error_class_is_drawn_in_the_tree() -> None:
    import llmgw.errors
    from llmgw.errors import LlmgwError

    drawn = llmgw.errors.__doc__ or ""
    names = set()
    for path in sorted((REPO / "llmgw").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                names.add(node.name)
    assert issubclass(llmgw.errors.ServiceError, LlmgwError)
    missing = sorted(
        n
        for n in ("QueueFull", "AgentSilent", "Refusal", "NoRoom", "NotOnDemand", "EngineNotReady")
        if n in names and n not in drawn
    )
    assert missing == []
