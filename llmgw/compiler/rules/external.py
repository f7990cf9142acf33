"""ignored-setting: what a profile with `endpoints` does not use.

Such a profile is routed to engines llmgw does not run, so nothing places it: replicas, GPUs,
memory and a node selector mean nothing there. Written anyway, they read as if they held,
and were once copied into the plan without a word.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.findings import Finding

_PLACEMENT_KEYS = ("replicas", "gpus", "min_memory_gb", "node_selector")


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        yield from _check_entry(entry)


def _check_entry(entry: Entry) -> Iterator[Finding]:
    profiles = entry.doc.data.get("profiles", [])
    for i, profile in enumerate(entry.spec.profiles):
        if not profile.external:
            continue
        written = profiles[i] if i < len(profiles) and isinstance(profiles[i], dict) else {}
        for key in _PLACEMENT_KEYS:
            if key in written:
                yield entry.doc.finding(
                    "warning",
                    "ignored-setting",
                    ("profiles", i, key),
                    f"profile {profile.name} has endpoints, so llmgw runs no replica of it and "
                    f"{key} does nothing here; remove it (the count and size of the engines "
                    "behind those endpoints are set where they run).",
                    key=True,
                )
    if "replicas" in entry.doc.data and all(p.external for p in entry.spec.profiles):
        yield entry.doc.finding(
            "warning",
            "ignored-setting",
            ("replicas",),
            "every profile of this model has endpoints, so llmgw runs no replica of it and "
            "replicas does nothing; remove it.",
            key=True,
        )
