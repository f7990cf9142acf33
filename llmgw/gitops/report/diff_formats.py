"""The `llmgw diff --format` choices: name → reporter `(diff, stream, *, color) -> None`."""

from __future__ import annotations

from collections.abc import Callable

from llmgw.gitops.report.diff_json import report_diff_json
from llmgw.gitops.report.diff_markdown import report_diff_markdown
from llmgw.gitops.report.diff_text import report_diff_text

# Called as reporter(diff, stream, color=...), the same shape as the findings reporters.
DiffReporter = Callable[..., None]

DIFF_REPORTERS: dict[str, DiffReporter] = {
    "text": report_diff_text,
    "markdown": report_diff_markdown,
    "json": report_diff_json,
}
