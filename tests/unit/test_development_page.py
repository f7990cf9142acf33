"""docs/development.md draws the package: every path it names exists, and every package in
llmgw/ is named, so the page cannot go stale as the tree changes (it once placed settings,
routing and the upstream pool where they had not been for two rounds)."""

from __future__ import annotations

import re

from tests.conftest import REPO

PAGE = REPO / "docs" / "development.md"


def _layout() -> str:
    text = PAGE.read_text()
    return text.split("```", 2)[1]


def _named_paths() -> set[str]:
    """Every file or folder the page names by a path: in its layout, by indentation, and in
    its text as `llmgw/…`."""
    named: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in _layout().splitlines()[1:]:
        match = re.match(r"^( *)([A-Za-z_][\w./]*/)(?:\s|$)", line)
        if match:
            depth, folder = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= depth:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            stack.append((depth, parent + folder))
            named.add(parent + folder)
            continue
        file = re.match(r"^( *)([a-z_]+\.py)\b", line)
        if file:
            depth = len(file.group(1))
            while stack and stack[-1][0] >= depth:
                stack.pop()
            named.add((stack[-1][1] if stack else "") + file.group(2))
    named |= set(re.findall(r"`(llmgw/[\w/]+(?:\.py)?)", PAGE.read_text()))
    # NAME.py and FAMILY.py stand for the file a reader adds.
    return {n for n in named if not any(c.isupper() for c in n)}


def test_every_path_the_page_names_exists() -> None:
    paths = _named_paths()
    assert "llmgw/compiler/rules/" in paths and "llmgw/gateway/schedule/" in paths, sorted(paths)
    missing = sorted(p for p in paths if p.startswith("llmgw/") and not (REPO / p.rstrip("/")).exists())
    assert missing == [], "docs/development.md names paths the tree does not have"


def test_every_package_is_named_on_the_page() -> None:
    paths = _named_paths()
    packages = sorted(
        str(p.parent.relative_to(REPO)) + "/"
        for p in (REPO / "llmgw").rglob("__init__.py")
        if "__pycache__" not in p.parts and "_schemas" not in p.parts
    )
    unnamed = [p for p in packages if p != "llmgw/" and p not in paths]
    assert unnamed == [], "a package docs/development.md does not draw"
