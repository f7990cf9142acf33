"""PlanDiff → text, the way `terraform plan` reads: one sign per line, a closing count."""

from __future__ import annotations

import json
import re
from typing import Any, TextIO

from llmgw.gitops.diff import FieldChange, NodeMemory, PlanDiff, ReplicaChange, ResourceChange

SIGNS = {"add": "+", "change": "~", "remove": "-", "move": "~"}
_COLORS = {"+": "\x1b[32m", "~": "\x1b[33m", "-": "\x1b[31m"}
_RESET = "\x1b[0m"
# Past this many characters of before and after together, the two go on separate lines.
LONG_VALUES = 80
# A string that YAML and a reader both take as one word needs no quotes.
_BARE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./:=-]*$")


def report_diff_text(diff: PlanDiff, stream: TextIO, *, color: bool) -> None:
    for line in diff_lines(diff):
        stream.write(_paint(line) if color else line)
        stream.write("\n")


def diff_lines(diff: PlanDiff) -> list[str]:
    """The diff as plain lines; markdown reuses them inside a ```diff block."""
    if not diff.has_changes:
        return ["No changes."]
    lines: list[str] = []
    for change in diff.changes:
        lines.extend(resource_lines(change))
    if diff.memory:
        lines.append("Memory by node:")
        lines.extend(f"    {memory_line(m)}" for m in diff.memory)
    lines.append(closing_line(diff))
    return lines


def memory_line(m: NodeMemory) -> str:
    """`gpu-1: always-on 61 → 74 GB of 80; on demand: 3 replicas, the largest 18 GB`."""
    after = value(m.after_always_on_gb)
    moved = m.before_always_on_gb is not None and m.before_always_on_gb != m.after_always_on_gb
    always = f"{value(m.before_always_on_gb)} → {after}" if moved else after
    line = f"{m.node}: always-on {always} GB of {value(m.memory_gb)}"
    if m.after_on_demand or m.before_on_demand:
        n = m.after_on_demand
        count = f"{m.before_on_demand} → {n}" if m.before_on_demand not in (None, n) else str(n)
        line += f"; on demand: {count} replica{'' if n == 1 else 's'}"
        if m.largest_on_demand_gb is not None:
            line += f", the largest {value(m.largest_on_demand_gb)} GB"
    return line


def closing_line(diff: PlanDiff) -> str:
    add, change, remove = diff.counts()
    return f"{add} to add, {change} to change, {remove} to remove."


def resource_lines(change: ResourceChange) -> list[str]:
    head = f"{SIGNS[change.action]} {change.kind} {change.name}"
    if change.action != "change":
        head += f" ({describe(change)})"
    lines = [head]
    if change.action == "add":
        lines.extend(f"    profile {name} args: {value(args)}" for name, args in added_args(change))
    lines.extend(f"    {line}" for f in change.fields for line in field_lines(f))
    for p in change.profiles:
        external = ", external" if p.external else ""
        args = f" args: {value(list(p.args))}" if p.args and p.action == "add" else ""
        lines.append(f"    {SIGNS[p.action]} profile {p.name} ({p.engine}{external}){args}")
    lines.extend(f"    {replica_line(r)}" for r in change.replicas)
    lines.extend(f"    {SIGNS[w.action]} warning {w.rule}: {w.message}" for w in change.warnings)
    return lines


def added_args(change: ResourceChange) -> list[tuple[str, list[str]]]:
    """An added model's profiles that hand the engine args, with the args."""
    args = change.facts.get("args") or {}
    return sorted(args.items()) if change.kind == "model" else []


def describe(change: ResourceChange) -> str:
    """What an added or removed resource is, in a few words."""
    facts = change.facts
    if change.kind == "model":
        n = facts.get("replicas", 0)
        demand = ", on demand" if facts.get("on_demand") else ""
        return f"{facts.get('task')}, {n} replica{'' if n == 1 else 's'}{demand}"
    gpus = facts.get("gpus") or 0
    parts = [str(facts.get("address")), f"{value(facts.get('memory_gb'))} GB"]
    if gpus:
        parts.append(f"{gpus} GPU{'' if gpus == 1 else 's'}")
    return ", ".join(parts)


def field_lines(f: FieldChange) -> list[str]:
    """`field: before → after`; long values (descriptions) stack so the two can be compared."""
    where = f"profile {f.profile} {field_name(f.field)}" if f.profile else field_name(f.field)
    before, after = field_value(f.field, f.before), field_value(f.field, f.after)
    if len(before) + len(after) > LONG_VALUES and isinstance(f.before, str) and isinstance(f.after, str):
        before, after = (value(v) for v in around_the_change(f.before, f.after))
    if len(before) + len(after) <= LONG_VALUES:
        return [f"{where}: {before} → {after}"]
    return [f"{where}: {before}", f"{' ' * len(where)}→ {after}"]


def around_the_change(before: str, after: str, context: int = 30) -> tuple[str, str]:
    """Both strings cut to the part that differs, with a few words either side and … where
    text is left out: a ten-character edit to a long description is found at a glance, not by
    comparing two paragraphs."""
    same_start = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        same_start += 1
    same_end = 0
    limit = min(len(before), len(after)) - same_start
    while same_end < limit and before[-1 - same_end] == after[-1 - same_end]:
        same_end += 1
    start = max(0, same_start - context)
    if start:
        # From a word's start; looked for in the common prefix, so the same in both strings.
        space = before.find(" ", start, same_start)
        start = space + 1 if space >= 0 else start
    return (
        _cut(before, start, len(before) - same_end + context),
        _cut(after, start, len(after) - same_end + context),
    )


def _cut(text: str, start: int, stop: int) -> str:
    if stop < len(text):
        space = text.rfind(" ", start, stop)
        stop = space if space > start else stop
    head = "…" if start else ""
    tail = " …" if stop < len(text) else ""
    return head + text[start:stop] + tail


def replica_line(r: ReplicaChange) -> str:
    name = f"replica {r.profile}/{r.ordinal}"
    if r.action == "add":
        return f"+ {name} {_where(r.node_after, r.endpoint_after)}"
    if r.action == "remove":
        return f"- {name} {_where(r.node_before, r.endpoint_before, 'from')}"
    if r.action == "move":
        return f"~ {name} moved {r.node_before or '(external)'} → {r.node_after or '(external)'}"
    return f"~ {name} endpoint {r.endpoint_before} → {r.endpoint_after}"


def _where(node: str | None, endpoint: str | None, preposition: str = "on") -> str:
    # External replicas have no node: they are routed to, not placed.
    if node is None:
        return f"at {endpoint}"
    return f"{preposition} {node} ({endpoint})"


# The plan's fields as the model file's author knows them: its key there, and its value in the
# units written there. A reviewer once read `idle_stop_s: 300` for a file that said `5m`.
_FILE_KEYS = {"idle_stop_s": "idle_stop"}
_DEFAULTS = {"start": "always"}  # what an absent field means, said rather than "(none)"
_UNITS = {"memory_gb": "GB", "gpu_memory_gb": "GB", "weights_bytes": "bytes"}


def field_name(field: str) -> str:
    return _FILE_KEYS.get(field, field)


def field_value(field: str, v: Any) -> str:
    if v is None and field in _DEFAULTS:
        return _DEFAULTS[field]
    if field == "start" and isinstance(v, str):
        return v  # a word of the file's, as `always` is: not a quoted string beside it
    if field == "idle_stop_s" and isinstance(v, int | float) and not isinstance(v, bool):
        return duration(v)
    if field in _UNITS and isinstance(v, int | float) and not isinstance(v, bool):
        return f"{value(v)} {_UNITS[field]}"
    return value(v)


def duration(seconds: float) -> str:
    """Seconds as the catalogue writes a duration: `2h`, `10m`, `90s`."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    for size, unit in ((3600, "h"), (60, "m")):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def value(v: Any) -> str:
    """A field value as a reader would write it: (none), numbers bare, strings quoted."""
    if v is None:
        return "(none)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        if v and all(isinstance(x, str) for x in v) and not all(_plain(x) for x in v):
            # One way for a list: `["--parallel", 1]` read as a flag and a number, though the
            # engine is handed the text "1" either way.
            return "[" + ", ".join(json.dumps(x, ensure_ascii=False) for x in v) + "]"
        return "[" + ", ".join(_item(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_item(k)}: {_item(x)}" for k, x in sorted(v.items())) + "}"
    return json.dumps(v, ensure_ascii=False, sort_keys=True)


def _plain(text: str) -> bool:
    """A string that reads as itself unquoted: not a number, not something YAML would type."""
    return bool(_BARE.match(text)) and not text.replace(".", "", 1).isdigit()


def _item(v: Any) -> str:
    if isinstance(v, str) and _plain(v):
        return v
    return value(v)


def _paint(line: str) -> str:
    sign = line.lstrip()[:1]
    color = _COLORS.get(sign)
    return f"{color}{line}{_RESET}" if color else line
