"""The fleet's rules, in one place: is the fleet file itself usable (`fleet_problems`, which
stops lint), and selector-matches-nothing, engine-unavailable: can the fleet run this profile
at all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.engines import engine, without_gpus
from llmgw.findings import Finding
from llmgw.load import Document
from llmgw.model import Fleet, Node, Profile


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


def fleet_problems(fleet: Fleet, doc: Document) -> list[Finding]:
    """What makes the fleet file itself unusable: nodes that share a name, or an address with
    overlapping ports, or a port range backwards. Lint stops on these (a FleetError)."""
    problems = []
    seen: dict[str, int] = {}
    # Earlier nodes by address: comparing each node with every earlier one took minutes
    # at 10,000 nodes, and only nodes sharing an address can clash.
    at: dict[str, list[tuple[int, Node]]] = {}
    for i, node in enumerate(fleet.nodes):
        earlier = at.setdefault(node.address, [])
        for j, other in earlier:
            if _ranges_overlap(other, node):
                # Two replicas would get one host:port, and the gateway would route both to one.
                problems.append(
                    doc.finding(
                        "error",
                        "schema",
                        ("nodes", i, "address"),
                        f"node '{node.name}' has the address {node.address} of node '{other.name}' "
                        f"(node {j + 1}) with overlapping ports; give each node its own address, "
                        "or disjoint port ranges.",
                    )
                )
        if node.name in seen:
            problems.append(
                doc.finding(
                    "error",
                    "schema",
                    ("nodes", i, "name"),
                    f"node name '{node.name}' is used twice (also node {seen[node.name] + 1}); "
                    "give each node its own name.",
                )
            )
        seen.setdefault(node.name, i)
        earlier.append((i, node))
        if node.ports.first > node.ports.last:
            problems.append(
                doc.finding(
                    "error",
                    "schema",
                    ("nodes", i, "ports"),
                    f"ports.first {node.ports.first} is after ports.last {node.ports.last}; swap them.",
                )
            )
    return problems


def _ranges_overlap(a: Node, b: Node) -> bool:
    return a.ports.first <= b.ports.last and b.ports.first <= a.ports.last
