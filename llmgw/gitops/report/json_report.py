"""Machine-readable findings; format_version changes only when a field's meaning does."""

from __future__ import annotations

import json
from typing import TextIO

from llmgw.findings import Finding, count


def report(findings: list[Finding], stream: TextIO, *, color: bool = False) -> None:
    errors, warnings = count(findings)
    doc = {
        "format_version": "1",
        "findings": [f.as_dict() for f in findings],
        "errors": errors,
        "warnings": warnings,
    }
    stream.write(json.dumps(doc, indent=2) + "\n")
