"""memory-unknown: a replica's memory figure exists.

A figure too big for every node it may run on is not reported here: placement reports it
as its error, with the figure's basis and the largest node's room. It once came twice, as a
`memory-fit` warning and a `placement` error for the same shortage.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.findings import Finding


def check(ctx: Context) -> Iterator[Finding]:
    for entry, profile in ctx.placed_profiles():
        if entry.memory(profile) is None:
            yield entry.doc.finding(
                "error", "memory-unknown", entry.profile_path(profile), _unknown_message(entry)
            )


def _unknown_message(entry: Entry) -> str:
    head = "cannot tell how much memory a replica needs: "
    if entry.source.missing:
        # Most often a typo in the path: writing weights_bytes would silence this and leave
        # the typo for the engine to fail on.
        return (
            head + f"source {entry.source.text} is not on this machine to measure "
            "(see source-missing). Fix the path; if the file is only on the nodes, write "
            "weights_bytes (its size in bytes) or min_memory_gb for this profile."
        )
    return (
        head + "the size of the weights is unknown. Write weights_bytes (the size of the "
        "weights in bytes) or min_memory_gb for this profile, so it is not placed on a node "
        "too small to hold it."
    )
