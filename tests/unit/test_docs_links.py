"""Every relative link in README.md and docs/*.md leads somewhere: the file exists, and an
#anchor is a heading in it, slugged as GitHub and Gitea slug them. The README was cut into
docs/ by topic; a link left pointing at a section that moved, or at a file that was renamed,
is what a newcomer clicks first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `# comment` in a shell example is no heading."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    """GitHub's slugs: lower case, punctuation dropped (hyphens and underscores kept), spaces
    to hyphens, and a repeated heading numbered -1, -2 …"""
    slugs: set[str] = set()
    counts: dict[str, int] = {}
    for line in prose_lines(page.read_text()):
        heading = re.match(r"#{1,6} (.*)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").strip().lower()).replace(" ", "-")
        count = counts.get(slug, 0)
        counts[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def links(page: Path) -> list[str]:
    return [
        target
        for line in prose_lines(page.read_text())
        for target in LINK.findall(INLINE_CODE.sub("", line))
        if not re.match(r"[a-z]+:", target)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest.relative_to(ROOT)}")
        elif anchor and (dest.is_dir() or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading in {dest.relative_to(ROOT)} slugs to #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)} has links a reader would find broken:\n" + "\n".join(broken)


def test_the_readme_stays_a_newcomers_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 500, (
        f"README.md is {lines} lines; move detail into docs/ by topic, keep a line pointing there"
    )


def test_the_readme_maps_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    unmapped = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme]
    assert not unmapped, f"docs a newcomer cannot find from the README's map: {unmapped}"


def test_a_heading_slugs_as_github_does() -> None:
    page = ROOT / "docs" / "lint-rules.md"
    assert "llmgw-lint-and-its-rules" in anchors(page)
    assert "what-the-weights-say-llmgw-inspect" in anchors(ROOT / "docs" / "catalogue.md")
