"""memory-unknown: a replica's memory figure exists.

A figure too big for every node it may run on is not reported here: placement reports it
as its error, with the figure's basis and the largest node's room. It once came twice, as a
`memory-fit` warning and a `placement` error for the same shortage.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.findings import Finding
from llmgw.model import Node, Profile
from llmgw.rules import Context, Entry


def check(ctx: Context) -> Iterator[Finding]:
    for entry, profile in ctx.placed_profiles():
        if entry.memory(profile) is None:
            yield entry.doc.finding(
                "error", "memory-unknown", entry.profile_path(profile), _unknown_message(entry)
            )


def capacity_gb(node: Node, profile: Profile) -> float:
    """What one replica of `profile` can use on `node`: GPU memory when it asks for GPUs."""
    gpus = profile.gpus_needed
    if gpus:
        return node.gpu_memory_gb * min(gpus, node.gpu_count)
    return node.memory_gb


def room_on(node: Node, profile: Profile) -> str:
    """`cpu-2, has 32 GB`, or for GPUs how the figure is made, since "2 GPU(s) of 160 GB" once
    read as two 160 GB cards: `gpu-2, gives it 80 GB: 1 of its 2 GPUs of 80 GB each`."""
    if not profile.gpus_needed:
        return f"{node.name}, has {node.memory_gb:g} GB"
    used = min(profile.gpus_needed, node.gpu_count)
    each = f"{node.gpu_memory_gb:g} GB each"
    cards = f"GPU{'' if node.gpu_count == 1 else 's'}"
    share = (
        f"its {node.gpu_count} {cards} of {each}"
        if used == node.gpu_count
        else (f"{used} of its {node.gpu_count} {cards} of {each}, as the profile asks for {used}")
    )
    return f"{node.name}, gives it {capacity_gb(node, profile):g} GB: {share}"


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
