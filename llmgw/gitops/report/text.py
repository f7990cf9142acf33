"""Like a compiler: `catalog/x.yaml:12:3: error[sharded-source] message`."""

from __future__ import annotations

from typing import TextIO

from llmgw.findings import Finding

_COLORS = {"error": "\033[1;31m", "warning": "\033[1;33m"}
_RESET = "\033[0m"


def report(findings: list[Finding], stream: TextIO, *, color: bool = False) -> None:
    for f in findings:
        severity = f"{_COLORS[f.severity]}{f.severity}{_RESET}" if color else f.severity
        stream.write(f"{f.file}:{f.line}:{f.column}: {severity}[{f.rule}] {f.message}\n")
