"""PlanDiff → JSON for scripts; `format_version` changes only when a key changes meaning."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, TextIO

from llmgw.gitops.diff import PlanDiff

FORMAT_VERSION = "1"


def diff_document(diff: PlanDiff) -> dict[str, Any]:
    add, change, remove = diff.counts()
    return {
        "format_version": FORMAT_VERSION,
        "old_digest": diff.old_digest,
        "new_digest": diff.new_digest,
        "summary": {"add": add, "change": change, "remove": remove},
        "changes": [asdict(c) for c in diff.changes],
        "memory": [asdict(m) for m in diff.memory],
    }


def report_diff_json(diff: PlanDiff, stream: TextIO, *, color: bool) -> None:
    stream.write(json.dumps(diff_document(diff), indent=2, ensure_ascii=False) + "\n")
