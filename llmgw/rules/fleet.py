"""selector-matches-nothing, engine-unavailable: can the fleet run this profile at all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from llmgw.catalogue import Entry
from llmgw.engines import engine, without_gpus
from llmgw.findings import Finding
from llmgw.model import Fleet, Profile
from llmgw.rules.context import Context


def check(ctx: Context) -> Iterator[Finding]:
    for entry, profile in ctx.placed_profiles():
        key = ("may-run", tuple(sorted(profile.node_selector.items())), profile.engine)
        may_run = cast("bool | None", ctx.once(key, _may_run, ctx.fleet, profile))
        yield from _check_profile(entry, profile, ctx.fleet, may_run)


def _may_run(fleet: Fleet, profile: Profile) -> bool | None:
    """None when no node matches; else whether any matching node has or may have the engine."""
    nodes = fleet.matching(profile.node_selector)
    if not nodes:
        return None
    # A node that reports nothing is an older agent: unknown, not "none installed".
    return any(n.reports(profile.engine) is not False for n in nodes)


def _check_profile(entry: Entry, profile: Profile, fleet: Fleet, may_run: bool | None) -> Iterator[Finding]:
    path = entry.profile_path(profile)
    if may_run is None:
        yield entry.doc.finding(
            "error",
            "selector-matches-nothing",
            (*path, "node_selector"),
            f"node_selector {_selector(profile)} matches no node in {fleet.file}; "
            f"{_labels_hint(fleet)} Fix the selector, or label a node to match it.",
        )
        return
    if may_run:
        return
    message = (
        f"no node matching {_selector(profile)} reports engine {profile.engine}; replicas "
        "are placed there anyway and will not start until it is installed."
    )
    if engine(profile.engine).needs_gpu and not any(n.gpu_count for n in fleet.nodes):
        message += without_gpus(profile.engine)
    yield entry.doc.finding("warning", "engine-unavailable", (*path, "engine"), message)


def _selector(profile: Profile) -> str:
    if not profile.node_selector:
        return "{} (every node)"
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(profile.node_selector.items())) + "}"


def _labels_hint(fleet: Fleet) -> str:
    labels = sorted({f"{k}={v}" for n in fleet.nodes for k, v in n.labels.items()})
    if not labels:
        return "no node in it has labels."
    return f"the labels in it are: {', '.join(labels)}."
