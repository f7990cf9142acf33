"""Reporters: findings → output. A small registry that also supplies `--format`'s choices."""

from __future__ import annotations

from typing import Protocol, TextIO

from llmgw.findings import Finding
from llmgw.gitops.report import github, json_report, markdown, text


class Reporter(Protocol):
    def __call__(self, findings: list[Finding], stream: TextIO, *, color: bool) -> None: ...


REPORTERS: dict[str, Reporter] = {
    "text": text.report,
    "json": json_report.report,
    "github": github.report,
    "markdown": markdown.report_markdown,
}

__all__ = ["REPORTERS", "Reporter"]
