"""PlanDiff → markdown for the pull-request comment: a table to scan, the full diff below it.

Long diffs fold into <details> so the comment stays readable when a pull request
touches the whole fleet; the table above always shows every resource that changes.
"""

from __future__ import annotations

from typing import TextIO

from llmgw.gitops.diff import PlanDiff, ResourceChange
from llmgw.gitops.report.diff_text import (
    SIGNS,
    added_args,
    closing_line,
    describe,
    diff_lines,
    field_name,
    field_value,
    memory_line,
    value,
)
from llmgw.gitops.report.markdown import cell, code, fenced

# Past this many lines the full diff is folded; below it, opening a fold costs a click
# and saves nothing.
FOLD_AFTER_LINES = 20


def report_diff_markdown(diff: PlanDiff, stream: TextIO, *, color: bool) -> None:
    stream.write(diff_markdown(diff))


def diff_markdown(diff: PlanDiff) -> str:
    if not diff.has_changes:
        return "\n".join(
            [
                "### Plan: no changes",
                "",
                "Merging this serves exactly what is served now.",
                _provenance(diff),
                "",
            ]
        )
    lines = [
        f"### Plan: {closing_line(diff).rstrip('.')}",
        "",
        "| | Resource | Change |",
        "|---|---|---|",
    ]
    for change in diff.changes:
        sign = SIGNS[change.action]
        lines.append(f"| `{sign}` | {change.kind} {code(change.name)} | {cell(summary(change))} |")
    lines.append("")
    if diff.memory:
        lines += ["**Memory by node** (always-on must fit together; each on-demand replica beside them):", ""]
        lines += [f"- {memory_line(m)}" for m in diff.memory]
        lines.append("")
    text = diff_lines(diff)
    block = fenced(text, "diff")
    if len(text) > FOLD_AFTER_LINES:
        lines += [
            f"<details><summary>Full diff ({len(text)} lines)</summary>",
            "",
            *block,
            "",
            "</details>",
        ]
    else:
        lines += block
    lines += ["", _provenance(diff), ""]
    return "\n".join(lines)


def summary(change: ResourceChange) -> str:
    """One cell: what happens to this resource, in words a reviewer scans."""
    if change.action == "add":
        args = "".join(f"; profile {name} args {value(a)}" for name, a in added_args(change))
        return f"added ({describe(change)}){args}"
    if change.action == "remove":
        return f"removed ({describe(change)})"
    parts: list[str] = []
    for f in change.fields:
        # Long prose is named, not quoted: the full diff below has before and after.
        name = f"profile {f.profile} {field_name(f.field)}" if f.profile else field_name(f.field)
        if f.field == "description" or f.field == "source":
            parts.append(f"{name} changed" if f.before and f.after else f"{name} {_presence(f.after)}")
        else:
            parts.append(f"{name} {field_value(f.field, f.before)} → {field_value(f.field, f.after)}")
    for p in change.profiles:
        args = f" with args {value(list(p.args))}" if p.args and p.action == "add" else ""
        parts.append(f"profile {p.name} {'added' if p.action == 'add' else 'removed'}{args}")
    for action, word in (
        ("add", "added"),
        ("remove", "removed"),
        ("move", "moved"),
        ("change", "re-addressed"),
    ):
        n = sum(1 for r in change.replicas if r.action == action)
        if n:
            parts.append(f"{n} replica{'' if n == 1 else 's'} {word}")
    new_warnings = sum(1 for w in change.warnings if w.action == "add")
    gone_warnings = len(change.warnings) - new_warnings
    if new_warnings:
        parts.append(f"{new_warnings} new warning{'' if new_warnings == 1 else 's'}")
    if gone_warnings:
        parts.append(f"{gone_warnings} warning{'' if gone_warnings == 1 else 's'} resolved")
    return "; ".join(parts)


def _presence(after: object) -> str:
    return "added" if after is not None else "removed"


def _provenance(diff: PlanDiff) -> str:
    return f"<sub>{_short(diff.old_digest)} → {_short(diff.new_digest)}</sub>"


def _short(digest: str | None) -> str:
    if digest is None:
        return "no plan"
    return digest[: len("sha256:") + 12]
