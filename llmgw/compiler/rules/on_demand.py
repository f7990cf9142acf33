"""on-demand: what `start: on-demand` and `idle_stop` may be given with.

Placement itself (an on-demand replica fits beside its node's always-on ones) is place.py's,
and a shortage is the usual `placement` error.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.engines import gpus_for
from llmgw.findings import Finding

if TYPE_CHECKING:
    from llmgw.compiler.place import Placement


def check(ctx: Context) -> Iterator[Finding]:
    if ctx.kubernetes:
        yield from unsupported_on_kubernetes(ctx.entries)
    for entry in ctx.entries:
        for profile in entry.spec.profiles:
            path = entry.profile_path(profile)
            if profile.on_demand and profile.external:
                yield entry.doc.finding(
                    "error",
                    "on-demand",
                    (*path, "start"),
                    f"profile {profile.name} lists endpoints, which run elsewhere and which no "
                    "llmgw agent starts or stops; remove `start: on-demand`, or the endpoints.",
                )
            elif profile.idle_stop is not None and not profile.on_demand:
                yield entry.doc.finding(
                    "warning",
                    "on-demand",
                    (*path, "idle_stop"),
                    f"idle_stop applies only to an on-demand profile, and {profile.name} is always "
                    "on, so nothing stops it; add `start: on-demand`, or remove idle_stop.",
                )


def unsupported_on_kubernetes(entries: Iterable[Entry]) -> list[Finding]:
    """`--target kubernetes` runs every profile as a Deployment, always on: an on-demand
    profile is refused rather than silently kept running."""
    return [
        entry.doc.finding(
            "error",
            "on-demand",
            (*entry.profile_path(profile), "start"),
            f"profile {profile.name} is on-demand, which --target kubernetes does not support yet: "
            "its Deployment would run all the time. Remove `start: on-demand` to run it always "
            "on the cluster, or plan it for llmgw's node agents (--target nodes).",
        )
        for entry in entries
        for profile in entry.spec.profiles
        if profile.on_demand
    ]


def crowded(entries: Iterable[Entry], placement: Placement) -> list[Finding]:
    """On-demand replicas of one profile placed on a node that holds fewer of them at once:
    the agent starts one only by stopping another, so the rest add no capacity. Placement
    accepts them (each fits beside the always-on replicas), and said nothing."""
    nodes = {state.node.name: state for state in placement.nodes}
    findings = []
    for entry in entries:
        for profile in entry.spec.profiles:
            memory = entry.memory(profile)
            if not profile.on_demand or memory is None:
                continue
            per_node = Counter(slot.node.name for slot in placement.replicas(entry.spec.name, profile.name))
            for name, placed in sorted(per_node.items()):
                state = nodes[name]
                gpus = gpus_for(profile)
                room = state.free_gb  # what the always-on replicas leave
                fit = state.free_gpus // gpus if gpus else math.floor(room / memory.gb + 1e-9)
                if placed <= max(fit, 1):
                    continue
                path = entry.profile_path(profile)
                where = (*path, "replicas") if profile.replicas is not None else ("replicas",)
                need = f"{gpus} GPU(s)" if gpus else f"{memory.gb:g} GB"
                left = f"{state.free_gpus} GPU(s)" if gpus else f"{room:g} GB"
                findings.append(
                    entry.doc.finding(
                        "warning",
                        "on-demand",
                        where,
                        f"{placed} on-demand replicas of profile {profile.name} are placed on {name}, "
                        f"which holds {max(fit, 1)} of them at once: each needs {need}, and {left} is "
                        "left beside its always-on replicas. The agent starts one only by stopping "
                        "another, so the rest add no capacity; lower replicas, or add nodes for them.",
                    )
                )
    return findings
