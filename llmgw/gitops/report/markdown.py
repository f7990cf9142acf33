"""Findings → markdown, for a job summary and the pull-request comment.

Gitea renders no annotations, so on a pull request this table is where a reviewer reads
each finding; every row names the file:line:column to open.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

# Enough rows to read; a catalogue with more findings than this has a bigger problem
# than the table, and a comment past Gitea's body size would be refused outright.
MAX_ROWS = 200


def report_markdown(findings: Sequence[Any], stream: TextIO, *, color: bool) -> None:
    stream.write(findings_markdown(findings))


def findings_markdown(findings: Sequence[Any]) -> str:
    errors = sum(1 for f in findings if f.severity == "error")
    warnings = len(findings) - errors
    if not findings:
        return "### Lint: no findings\n\nEvery model file passed every rule.\n"
    lines = [
        f"### Lint: {_count(errors, 'error')}, {_count(warnings, 'warning')}",
        "",
        _lint_verdict(errors),
        "",
        "| | Where | Rule | Finding |",
        "|---|---|---|---|",
    ]
    for f in list(findings)[:MAX_ROWS]:
        where = f"{f.file}:{f.line}:{f.column}"
        lines.append(f"| {_severity_mark(f.severity)} | {code(where)} | {code(f.rule)} | {cell(f.message)} |")
    if len(findings) > MAX_ROWS:
        lines.append("")
        lines.append(
            f"{len(findings) - MAX_ROWS} more finding(s) not shown; run `llmgw lint` locally to see them all."
        )
    return "\n".join(lines) + "\n"


def _lint_verdict(errors: int) -> str:
    if errors:
        return "Errors block the merge: no plan is written until they are fixed."
    return "Warnings do not block the merge, but say what a reader of the catalogue will miss."


def _severity_mark(severity: str) -> str:
    return "**error**" if severity == "error" else "warning"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cell(text: str) -> str:
    """Text shown as written inside one table cell, never read as HTML or markup.

    Catalogue text (key names, model names, descriptions) reaches the pull-request comment
    through here: a key named `<!--` once went out verbatim, and whatever Gitea's sanitiser
    keeps of such HTML is not what the catalogue says. Backticks are escaped too, so no
    code span forms in which the entities below would show literally.
    """
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "<br>")


def code(text: str) -> str:
    """Inline code, for a table cell, that survives backticks, pipes and line breaks in `text`.

    A code span shows `<` and `&` as they are, but entities too: `&#124;` would be shown
    as those six characters. `\\|` is the one escape GFM tables read inside a code span.
    A line break would end the table row, so it becomes a space, as a code span shows it.
    """
    text = re.sub(r"\r\n?|\n", " ", text).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fenced(lines: Iterable[str], info: str = "") -> list[str]:
    """A fenced block one backtick longer than any run inside it, so content cannot close it."""
    body = list(lines)
    longest = max((len(m) for line in body for m in re.findall(r"`{3,}", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body, fence]
