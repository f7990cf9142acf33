"""Replicas → nodes.

Memory, GPUs, ports and the node selector are hard: a replica goes only where
they hold, after the replicas already placed there. Engines are soft: nodes that
report the engine come first, then nodes that report nothing, then the rest
(lint has already warned). With a previous plan, every replica stays where it
was while it still fits, so a small edit to the catalogue does not reshuffle
the fleet and restart engines that were serving fine.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmgw.compiler.capacity import (
    LACKS_ENGINE,
    REPORTS_ENGINE,
    REPORTS_NOTHING,
    WALK,
    FirstFit,
    NodeState,
    Slot,
    capacity_gb,
    engine_tier,
    room_on,
)
from llmgw.compiler.catalogue import Entry
from llmgw.engines import engine, gpus_for, without_gpus
from llmgw.findings import Finding
from llmgw.model import Fleet, Node, Profile
from llmgw.plan import Plan

ReplicaKey = tuple[str, str, int]  # model, profile, index


@dataclass
class Placement:
    slots: dict[tuple[str, str], list[Slot]]  # (model, profile) -> replicas in index order
    findings: list[Finding]
    nodes: list[NodeState]

    def replicas(self, model: str, profile: str) -> list[Slot]:
        return self.slots.get((model, profile), [])


@dataclass(frozen=True)
class _Want:
    entry: Entry
    profile: Profile
    index: int
    need_gb: float
    gpus: int

    @property
    def key(self) -> ReplicaKey:
        return (self.entry.spec.name, self.profile.name, self.index)

    @property
    def on_demand(self) -> bool:
        return self.profile.on_demand


def place(
    entries: list[Entry],
    fleet: Fleet,
    previous: Plan | None = None,
    changed: frozenset[str] | None = None,
) -> Placement:
    """`changed`: the files new or edited since `previous`. A shortage is then reported on
    one of them when it can be, since that is the file a reviewer of the change reads."""
    wants = _wants(entries)
    placement = _fill(wants, fleet, previous, changed, settled_first=False)
    if changed is None or not _short_on_settled(placement, changed):
        return placement
    # Largest first packs best, but here it left a model nobody touched short: give the
    # settled models their room first and let the new ones take what is left, unless
    # that leaves a settled model short all the same.
    settled_first = _fill(wants, fleet, previous, changed, settled_first=True)
    return placement if _short_on_settled(settled_first, changed) else settled_first


def _short_on_settled(placement: Placement, changed: frozenset[str]) -> bool:
    return any(f.rule == "placement" and f.file not in changed for f in placement.findings)


def _fill(
    wants: list[_Want],
    fleet: Fleet,
    previous: Plan | None,
    changed: frozenset[str] | None,
    settled_first: bool,
) -> Placement:
    states = {n.name: NodeState(n, n.memory_gb, list(range(n.gpu_count)), n.ports.first) for n in fleet.nodes}
    got: dict[ReplicaKey, Slot] = {}
    before = _previous_slots(previous)
    chooser = _Chooser(list(states.values()))

    def is_new(want: _Want) -> bool:
        return changed is not None and want.entry.doc.file in changed

    # Always-on replicas first, all of them: an on-demand one must fit beside every
    # always-on replica of its node, so it is placed against what they leave free.
    for phase in (False, True):
        batch = [w for w in wants if w.on_demand is phase]
        # Settled models keep their place first: a model that grew in place must not push
        # out a neighbour nobody touched.
        for want in sorted(batch, key=is_new):
            slot = _keep_previous(want, states, before, chooser)
            if slot:
                got[want.key] = slot
        # Largest first: big replicas find room before small ones fragment the nodes.
        for want in sorted(batch, key=lambda w: (settled_first and is_new(w), -w.gpus, -w.need_gb, w.key)):
            if want.key in got:
                continue
            slot = chooser.choose(want)
            if slot:
                got[want.key] = slot
    return _result(wants, got, fleet, list(states.values()), chooser)


def _wants(entries: list[Entry]) -> list[_Want]:
    wants = []
    for entry in sorted(entries, key=lambda e: e.spec.name):
        for profile in entry.spec.routing_order():
            memory = entry.memory(profile)
            if profile.external or memory is None:
                continue
            for i in range(entry.spec.replicas_for(profile)):
                wants.append(_Want(entry, profile, i, memory.gb, gpus_for(profile)))
    return wants


_Previous = tuple[str, int, tuple[int, ...]]  # node, port, GPU ids


def _previous_slots(previous: Plan | None) -> dict[ReplicaKey, _Previous]:
    if previous is None:
        return {}
    out: dict[ReplicaKey, _Previous] = {}
    for model in previous.models:
        for profile in model.profiles:
            for i, replica in enumerate(profile.replicas):
                if replica.node is not None and replica.port is not None:
                    out[(model.name, profile.name, i)] = (replica.node, replica.port, replica.gpu_ids)
    return out


def _keep_previous(
    want: _Want,
    states: dict[str, NodeState],
    before: dict[ReplicaKey, _Previous],
    chooser: _Chooser,
) -> Slot | None:
    was = before.get(want.key)
    if was is None:
        return None
    node_name, port, gpu_ids = was
    state = states.get(node_name)
    if state is None or not state.node.matches(want.profile.node_selector):
        return None
    if state.node.reports(want.profile.engine) is False and chooser.room_with_engine(want):
        return None  # its node no longer has the engine, and one that may has room: move it
    ports = state.node.ports
    if not (ports.first <= port <= ports.last) or port in state.ports:
        return None
    if not state.fits(want.need_gb, want.gpus):
        return None
    return state.take(want.entry.spec.name, want.need_gb, want.gpus, port, gpu_ids, want.on_demand)


class _Chooser:
    """Round-robin over the eligible nodes of each (selector, engine), best tier first.

    A cursor per group keeps the common case O(1) at 5,000 models on 500 nodes,
    and spreads replicas instead of stacking them on the first node that fits.
    """

    def __init__(self, states: list[NodeState]) -> None:
        self.states = sorted(states, key=lambda s: s.node.name)
        self.groups: dict[tuple[Any, ...], list[list[NodeState]]] = {}
        self.rooms: dict[tuple[Any, ...], FirstFit] = {}
        self.cursors: dict[tuple[Any, ...], int] = {}

    def _tiers(self, profile: Profile) -> tuple[tuple[Any, ...], list[list[NodeState]]]:
        key = (tuple(sorted(profile.node_selector.items())), profile.engine)
        if key not in self.groups:
            tiers: list[list[NodeState]] = [[], [], []]
            for s in self.states:
                if not s.node.matches(profile.node_selector):
                    continue
                reports = s.node.reports(profile.engine)
                tiers[engine_tier(reports)].append(s)
            self.groups[key] = tiers
            for t, tier in enumerate(tiers):
                self.rooms[key + (t,)] = FirstFit(tier)
        return key, self.groups[key]

    def room_with_engine(self, want: _Want) -> bool:
        """True when a node that reports the engine, or reports nothing, can take `want`."""
        _, tiers = self._tiers(want.profile)
        able = (*tiers[REPORTS_ENGINE], *tiers[REPORTS_NOTHING])
        return any(s.fits(want.need_gb, want.gpus) for s in able)

    def engine_may_run(self, profile: Profile) -> bool:
        """True when a node for this profile reports its engine, or reports nothing."""
        _, tiers = self._tiers(profile)
        return bool(tiers[REPORTS_ENGINE] or tiers[REPORTS_NOTHING])

    # Spread one model's replicas over different nodes where there are enough; but a
    # node that says it lacks the engine is the last resort, since a replica there does
    # not start: two replicas on one able node serve more than one on each of two.
    # (engine tier, may share a node with the model's other replicas), tried in this order.
    SEARCH_ORDER = (
        (REPORTS_ENGINE, False),
        (REPORTS_NOTHING, False),
        (REPORTS_ENGINE, True),
        (REPORTS_NOTHING, True),
        (LACKS_ENGINE, False),
        (LACKS_ENGINE, True),
    )

    def choose(self, want: _Want) -> Slot | None:
        key, tiers = self._tiers(want.profile)
        model = want.entry.spec.name
        for t, allow_same_node in self.SEARCH_ORDER:
            found = self._scan(key + (t,), tiers[t], want, model, allow_same_node)
            if found:
                return found
        return None

    def _scan(
        self, key: tuple[Any, ...], tier: list[NodeState], want: _Want, model: str, same: bool
    ) -> Slot | None:
        """The first node from the cursor on, round the tier, that fits `want` (and holds
        none of its model's replicas, unless `same`)."""
        n = len(tier)
        if not n:
            return None
        start = self.cursors.get(key, 0) % n
        # The next few nodes one by one: while the fleet has room, one of them fits.
        for step in range(min(n, WALK)):
            i = (start + step) % n
            s = tier[i]
            if (same or model not in s.models) and s.fits(want.need_gb, want.gpus):
                self.cursors[key] = i + 1
                return s.take(model, want.need_gb, want.gpus, on_demand=want.on_demand)
        if n <= WALK:
            return None
        # The rest of the way round, by the tree.
        room = self.rooms[key]
        begin = (start + WALK) % n
        for lo, hi in ((begin, start),) if begin < start else ((begin, n), (0, start)):
            while lo < hi:
                found = room.first(lo, hi, want.need_gb, want.gpus)
                if found is None:
                    break
                s = tier[found]
                if (same or model not in s.models) and s.fits(want.need_gb, want.gpus):
                    self.cursors[key] = found + 1
                    return s.take(model, want.need_gb, want.gpus, on_demand=want.on_demand)
                lo = found + 1
        return None


def _result(
    wants: list[_Want],
    got: dict[ReplicaKey, Slot],
    fleet: Fleet,
    states: list[NodeState],
    chooser: _Chooser,
) -> Placement:
    slots: dict[tuple[str, str], list[Slot]] = {}
    short: dict[tuple[str, str], list[_Want]] = {}
    lacking: dict[tuple[str, str], list[tuple[_Want, Slot]]] = {}
    for want in wants:
        pair = (want.entry.spec.name, want.profile.name)
        slot = got.get(want.key)
        if not slot:
            short.setdefault(pair, []).append(want)
            continue
        slots.setdefault(pair, []).append(slot)
        if slot.node.reports(want.profile.engine) is False and chooser.engine_may_run(want.profile):
            lacking.setdefault(pair, []).append((want, slot))
    by_name = {s.node.name: s for s in states}
    eligible: dict[tuple[Any, ...], _Eligible] = {}
    findings = [
        _why_short(ws, len(slots.get(pair, [])), fleet, by_name, eligible) for pair, ws in short.items()
    ]
    findings += [_on_nodes_lacking_the_engine(placed) for placed in lacking.values()]
    return Placement(slots, [f for f in findings if f], sorted(states, key=lambda s: s.node.name))


def _on_nodes_lacking_the_engine(placed: list[tuple[_Want, Slot]]) -> Finding:
    want = placed[0][0]
    engine = want.profile.engine
    nodes = ", ".join(sorted({slot.node.name for _, slot in placed}))
    return want.entry.doc.finding(
        "warning",
        "engine-unavailable",
        (*want.entry.profile_path(want.profile), "engine"),
        f"{len(placed)} replica(s) of profile {want.profile.name} are placed on {nodes}, which "
        f"report(s) no {engine}, because the nodes that have it are full; they will not start "
        f"until {engine} is installed there. Add room on nodes with {engine}, or install it.",
    )


class _Eligible:
    """The nodes a shortage is explained against, for one selector and GPU count, worked
    out once: for each short profile again, they took minutes at 10,000 nodes."""

    def __init__(self, nodes: list[Node], profile: Profile) -> None:
        self.nodes = nodes
        self.most_gpus = max((n.gpu_count for n in nodes), default=0)
        self.capacity = sorted((capacity_gb(n, profile), n.name) for n in nodes)
        self.sizes = [size for size, _ in self.capacity]
        self._largest = max(nodes, key=lambda n: (capacity_gb(n, profile), n.name)) if nodes else None
        self._fit: dict[float, list[str]] = {}

    def fits_somewhere(self, need_gb: float) -> bool:
        return bool(self.sizes) and self.sizes[-1] >= need_gb

    def largest(self) -> Node:
        assert self._largest is not None  # there are eligible nodes
        return self._largest

    def fit(self, need_gb: float) -> list[str]:
        """The names of the nodes that can hold `need_gb`, sorted."""
        i = bisect.bisect_left(self.sizes, need_gb)
        if i == len(self.sizes):
            return []
        least = self.sizes[i]
        if least not in self._fit:
            self._fit[least] = sorted(name for _, name in self.capacity[i:])
        return self._fit[least]


def _why_short(
    missing: list[_Want],
    placed: int,
    fleet: Fleet,
    states: dict[str, NodeState],
    known: dict[tuple[Any, ...], _Eligible],
) -> Finding | None:
    want = missing[0]
    entry, profile = want.entry, want.profile
    key = (tuple(sorted(profile.node_selector.items())), gpus_for(profile))
    if key not in known:
        known[key] = _Eligible(fleet.matching(profile.node_selector), profile)
    eligible = known[key]
    if not eligible.nodes:
        return None  # selector-matches-nothing already says so
    total = placed + len(missing)
    head = (
        f"{placed} of {total} replica(s) of profile {profile.name} can be placed, "
        "and a plan offers no replica it cannot place: "
    )
    selector = ", ".join(f"{k}: {v}" for k, v in sorted(profile.node_selector.items()))
    where = f"nodes matching {{{selector}}}" if selector else "nodes"
    if want.gpus and eligible.most_gpus < want.gpus:
        most = eligible.most_gpus
        has = f"have at most {most}" if most else "have none"
        reason = (
            f"a replica needs {want.gpus} GPU(s) and the {where} {has}. "
            "Lower gpus, or add a node with more GPUs."
        )
        if not any(n.gpu_count for n in fleet.nodes) and engine(profile.engine).needs_gpu:
            reason += without_gpus(profile.engine)
    elif not eligible.fits_somewhere(want.need_gb):
        largest = eligible.largest()
        memory = entry.memory(profile)
        basis = f" ({memory.basis})" if memory is not None else ""
        reason = (
            f"a replica needs {want.need_gb:g} GB{basis} and it is too big for every "
            f"eligible node (the largest, {room_on(largest, profile)}). Write "
            "min_memory_gb if the estimate is wrong, or add a larger node."
        )
    else:
        fit = eligible.fit(want.need_gb)
        if all(states[name].next_port > states[name].node.ports.last for name in fit):
            room = (
                f"({_each(fit, str)}) have no ports left in their port ranges; widen ports in "
                "the fleet, or add nodes."
            )
        elif want.gpus:
            held = _each(
                fit,
                lambda n: (
                    f"{n} has {states[n].free_gpus} of {states[n].node.gpu_count} "
                    f"free, held by {states[n].held(gpus=True)}"
                ),
            )
            room = (
                f"have too few free GPUs for one asking for {want.gpus}: {held}. Lower "
                "replicas, free GPUs by moving or removing a model, or add nodes."
            )
        else:
            held = _each(
                fit, lambda n: f"{n} has {states[n].free_gb:g} GB free, held by {states[n].held(gpus=False)}"
            )
            beside = (
                " (an on-demand replica must fit beside its node's always-on replicas)"
                if want.on_demand
                else ""
            )
            room = (
                f"have too little memory left for one needing {want.need_gb:g} GB{beside}: {held}. "
                "Lower replicas, or add nodes."
            )
        reason = f"too few eligible nodes: the {where} that can hold one {room}"
    path: tuple[str | int, ...] = entry.profile_path(profile)
    if profile.replicas is None:
        path = ("replicas",) if "replicas" in entry.doc.data else path
    return entry.doc.finding("error", "placement", path, head + reason)


def _each(names: list[str], say: Callable[[str], str], most: int = 3) -> str:
    """A few nodes in full; at 500 nodes the message would otherwise be the whole fleet."""
    shown = "; ".join(say(n) for n in names[:most])
    return shown + (f"; and {len(names) - most} more alike" if len(names) > most else "")
