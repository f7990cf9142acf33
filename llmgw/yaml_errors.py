"""What is wrong with a YAML text, in a sentence saying what to do: ruamel's own wording
("while scanning a quoted scalar ... found unexpected end of stream") names its parser's
states, not the fix, and an unclosed quote is reported where the file ends, not where the
quote opened.

Beneath both the compiler (load: lint's `yaml` finding) and the gateway (its keys file), so a
refused keys file reads on /readyz as it does in `llmgw lint`.
"""

from __future__ import annotations

import re

from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError


def yaml_error(exc: MarkedYAMLError, text: str) -> tuple[int, int, str]:
    """Where a YAML text goes wrong (line and column, from 1) and a sentence saying what to do."""
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    problem = (exc.problem or exc.context or "not valid YAML").strip()
    if isinstance(exc, DuplicateKeyError):
        key = problem.split('"')[1] if '"' in problem else "this key"
        first = _earlier_key_line(text, key, line, col)
        where = f" (first at line {first})" if first else ""
        return line, col, f"the key '{key}' appears twice{where}; keep one of them."
    if mark is not None and _char_at(text, mark.line, mark.column) == "\t":
        problem = "a tab character"
    opened = exc.context_mark
    context = exc.context or ""
    # An unclosed quote or bracket is found at the end of the file, or on a later line;
    # the fix goes where it was opened.
    if opened is not None and "quoted scalar" in context:
        return (
            opened.line + 1,
            opened.column + 1,
            "not valid YAML: this quote is never closed; end the value with the same "
            "quote mark it starts with.",
        )
    if opened is not None and "flow" in context and ("expected ','" in problem or "end of stream" in problem):
        bracket = _char_at(text, opened.line, opened.column) or "bracket"
        closing = {"[": "]", "{": "}"}.get(bracket, "its closing bracket")
        return (
            opened.line + 1,
            opened.column + 1,
            f"not valid YAML: this {bracket} is never closed, or an item in it lacks a "
            f"comma; close it with {closing}, or separate items with ', '.",
        )
    return line, col, f"not valid YAML: {problem}; {_hint(problem)}"


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.splitlines()
    return lines[line][column : column + 1] if line < len(lines) else ""


def _earlier_key_line(text: str, key: str, line: int, col: int) -> int | None:
    """The line where `key` first appeared at the same indentation, before `line`."""
    lines = text.splitlines()
    for n in range(line - 1, 0, -1):
        # `  - name: a` holds its key at the same column as the `    name: b` below it.
        candidate = re.sub(r"^(\s*)((?:-\s)*)", lambda m: m.group(1) + " " * len(m.group(2)), lines[n - 1])
        if len(candidate) - len(candidate.lstrip(" ")) != col - 1:
            continue
        if candidate.strip().split(":", 1)[0].strip().strip("'\"") == key:
            return n
    return None


def _hint(problem: str) -> str:
    if "tab" in problem:
        return "indent with spaces, not tabs."
    if "found unexpected ':'" in problem:
        return 'inside [ ] or { }, quote a value that contains a colon, e.g. ["http://host:8000"].'
    if "mapping values are not allowed" in problem:
        return (
            "a value containing ': ' must be quoted, e.g. description: \"Fast: good for "
            'chat"; or, if this line starts a new key, indent it like the keys above it.'
        )
    if "expected <block end>" in problem or "could not find expected" in problem:
        return "check the indentation of this line against the lines above it."
    if "found character" in problem and "cannot start any token" in problem:
        return "quote the value; characters such as ` @ % cannot start a plain value."
    if "could not determine a constructor" in problem:
        return "remove the !tag: catalogue files hold plain values only."
    if "found undefined alias" in problem:
        return "write the value out in full; catalogue files do not use aliases."
    return "check the line for a missing quote, colon or indentation."
