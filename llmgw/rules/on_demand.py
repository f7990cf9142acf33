"""on-demand: what `start: on-demand` and `idle_stop` may be given with.

Placement itself (an on-demand replica fits beside its node's always-on ones) is place.py's,
and a shortage is the usual `placement` error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from llmgw.catalogue import Entry
from llmgw.findings import Finding
from llmgw.rules.context import Context


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
