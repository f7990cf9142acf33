"""A finding: one thing lint has to say about one place in one file.

Rule ids are stable: CI jobs select and silence them, and docs/lint-rules.md lists each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Finding:
    # Field order is the sort order: by file, then position, so output reads top-down.
    file: str
    line: int
    column: int
    rule: str
    severity: Severity
    message: str

    def as_dict(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "rule": self.rule,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "message": self.message,
        }


def count(findings: list[Finding]) -> tuple[int, int]:
    """(errors, warnings)."""
    errors = sum(1 for f in findings if f.severity == "error")
    return errors, len(findings) - errors
