"""fallback-unknown, fallback-cycle, fallback-task, fallback-smaller: a model's fallbacks
answer the same requests when it cannot.

A fallback is sent the very request its model was: one that names no model, or does another
task (embeddings for a chat), would turn a model's outage into every caller's 400. One with a
smaller context or output limit takes most requests but refuses the longest, so it is only
a warning. Since the gateway caps a fallback's answer at its own max_output, a model with no
limit of its own whose fallback has one is warned of the same way: its answers while it is
down are cut shorter than the same answers when it is up.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.findings import Finding


def check(ctx: Context) -> Iterator[Finding]:
    by_name: dict[str, Entry] = {}
    for entry in ctx.entries:
        for name in (entry.spec.name, *entry.spec.aliases):
            by_name.setdefault(name, entry)
    for entry in sorted(ctx.entries, key=lambda e: e.doc.file):
        for i, name in enumerate(entry.spec.fallbacks):
            other = by_name.get(name)
            if other is None:
                yield entry.doc.finding(
                    "error",
                    "fallback-unknown",
                    ("fallbacks", i),
                    f"fallback '{name}' is no model's name or alias in the catalogue; correct the "
                    "name, or add that model.",
                )
                continue
            yield from _unlike(entry, i, other)
        yield from _cycle(entry, by_name)


def _unlike(entry: Entry, i: int, other: Entry) -> Iterator[Finding]:
    spec, fallback = entry.spec, other.spec
    if fallback.name == spec.name:
        yield entry.doc.finding(
            "error", "fallback-cycle", ("fallbacks", i), "a model cannot be its own fallback; remove it."
        )
        return
    if fallback.task != spec.task:
        yield entry.doc.finding(
            "error",
            "fallback-task",
            ("fallbacks", i),
            f"fallback '{fallback.name}' does {fallback.task}, this model {spec.task}: it could not "
            "answer this model's requests. Name a model of the same task.",
        )
        return
    smaller = []
    if fallback.context_length < spec.context_length:
        smaller.append(f"context_length {fallback.context_length} < {spec.context_length}")
    if spec.max_output is not None and (fallback.max_output or spec.max_output) < spec.max_output:
        smaller.append(f"max_output {fallback.max_output} < {spec.max_output}")
    elif spec.max_output is None and fallback.max_output is not None:
        smaller.append(f"max_output {fallback.max_output}, where this model sets none")
    if smaller:
        yield entry.doc.finding(
            "warning",
            "fallback-smaller",
            ("fallbacks", i),
            f"fallback '{fallback.name}' takes less ({'; '.join(smaller)}): the longest requests "
            "this model takes would be refused by it while this model is down.",
        )


def _cycle(entry: Entry, by_name: dict[str, Entry]) -> Iterator[Finding]:
    """A path of fallbacks leading back to this model: a → b → a."""
    start = entry.spec.name
    for i, name in enumerate(entry.spec.fallbacks):
        path, seen = [start, name], {start}
        todo = [(name, path)]
        while todo:
            current, trail = todo.pop()
            other = by_name.get(current)
            if other is None or other.spec.name in seen:
                continue
            seen.add(other.spec.name)
            for onward in other.spec.fallbacks:
                target = by_name.get(onward)
                if target is not None and target.spec.name == start:
                    yield entry.doc.finding(
                        "error",
                        "fallback-cycle",
                        ("fallbacks", i),
                        f"fallbacks go round in a circle ({' → '.join([*trail, onward])}); a request "
                        "could be passed back and forth while every model in it is down. Break the circle.",
                    )
                    return
                todo.append((onward, [*trail, onward]))
