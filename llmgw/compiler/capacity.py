"""What a node has room for: capacity by memory or GPUs, ports and GPU ids claimed one replica
at a time, and a search for the first node with room that stays fast at 10,000 nodes.

place.py decides which replica goes where; this module keeps the books it decides on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llmgw.engines import gpus_for
from llmgw.model import Node, Profile

# Nodes by what they say of a profile's engine. A node that reports nothing is an older
# agent (unknown, not "none"), so it comes before one that says it lacks the engine.
REPORTS_ENGINE, REPORTS_NOTHING, LACKS_ENGINE = 0, 1, 2


def capacity_gb(node: Node, profile: Profile) -> float:
    """What one replica of `profile` can use on `node`: GPU memory when it asks for GPUs."""
    gpus = gpus_for(profile)
    if gpus:
        return node.gpu_memory_gb * min(gpus, node.gpu_count)
    return node.memory_gb


def room_on(node: Node, profile: Profile) -> str:
    """`cpu-2, has 32 GB`, or for GPUs how the figure is made, since "2 GPU(s) of 160 GB" once
    read as two 160 GB cards: `gpu-2, gives it 80 GB: 1 of its 2 GPUs of 80 GB each`."""
    if not gpus_for(profile):
        return f"{node.name}, has {node.memory_gb:g} GB"
    used = min(gpus_for(profile), node.gpu_count)
    each = f"{node.gpu_memory_gb:g} GB each"
    cards = f"GPU{'' if node.gpu_count == 1 else 's'}"
    share = (
        f"its {node.gpu_count} {cards} of {each}"
        if used == node.gpu_count
        else (f"{used} of its {node.gpu_count} {cards} of {each}, as the profile asks for {used}")
    )
    return f"{node.name}, gives it {capacity_gb(node, profile):g} GB: {share}"


def engine_tier(reports: bool | None) -> int:
    if reports:
        return REPORTS_ENGINE
    return REPORTS_NOTHING if reports is None else LACKS_ENGINE


@dataclass(frozen=True)
class Slot:
    node: Node
    port: int
    # Which of the node's GPUs the replica owns: the node agent sets CUDA_VISIBLE_DEVICES
    # from them, so two replicas on one node never load onto the same card.
    gpu_ids: tuple[int, ...] = ()

    @property
    def endpoint(self) -> str:
        return f"http://{self.node.address}:{self.port}"


@dataclass
class NodeState:
    node: Node
    free_gb: float
    free_gpu_ids: list[int]
    next_port: int
    ports: set[int] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    replicas: int = 0
    # Model → GPUs and GB its replicas hold here: a shortage names who holds the room.
    holders: dict[str, list[float]] = field(default_factory=dict)
    # The search trees this node is a leaf of, told when it gives up room.
    rooms: list[tuple[FirstFit, int]] = field(default_factory=list)
    # On-demand replicas here: each needs what is free beside the always-on ones, and
    # takes none of it from the next, since the agent makes room by stopping idle ones.
    on_demand: list[float] = field(default_factory=list)

    @property
    def free_gpus(self) -> int:
        return len(self.free_gpu_ids)

    def fits(self, need_gb: float, gpus: int) -> bool:
        if self.next_port > self.node.ports.last:
            return False
        if gpus:
            return self.free_gpus >= gpus and self.node.gpu_memory_gb * gpus >= need_gb
        return self.free_gb >= need_gb

    def take(
        self,
        model: str,
        need_gb: float,
        gpus: int,
        port: int | None = None,
        gpu_ids: tuple[int, ...] = (),
        on_demand: bool = False,
    ) -> Slot:
        """Claim room for one replica; the previous plan's port and GPUs when still free,
        else the lowest free ones, so the same catalogue always gets the same plan.

        An on-demand replica claims only its port: the memory and GPUs it names are the
        ones left beside the always-on replicas, which every on-demand replica here shares.
        """
        taken: tuple[int, ...] = ()
        if gpus:
            keep = len(gpu_ids) == gpus and all(g in self.free_gpu_ids for g in gpu_ids)
            taken = tuple(sorted(gpu_ids)) if keep else tuple(self.free_gpu_ids[:gpus])
            if not on_demand:
                self.free_gpu_ids = [g for g in self.free_gpu_ids if g not in taken]
        elif not on_demand:
            self.free_gb -= need_gb
        if port is None:
            port = self.next_port
        self.ports.add(port)
        while self.next_port in self.ports:
            self.next_port += 1
        self.models.add(model)
        if on_demand:
            self.on_demand.append(need_gb)
            for room, i in self.rooms:
                room.update(i)
            return Slot(self.node, port, taken)
        self.replicas += 1
        held = self.holders.setdefault(model, [0, 0.0])
        held[0] += len(taken)
        held[1] += 0.0 if gpus else need_gb
        for room, i in self.rooms:
            room.update(i)
        return Slot(self.node, port, taken)

    def held(self, gpus: bool) -> str:
        """Who holds this node's GPUs (or memory), largest first: `a (2 GPUs), b (1 GPU)`."""
        index = 0 if gpus else 1
        rows = sorted((-h[index], m) for m, h in self.holders.items() if h[index])

        def unit(n: float) -> str:
            return f"{n:g} GPU{'' if n == 1 else 's'}" if gpus else f"{n:g} GB"

        return ", ".join(f"{m} ({unit(-n)})" for n, m in rows) or "nothing"


# Nodes the search tries one by one from the cursor before it asks the tree.
WALK = 32


class FirstFit:
    """Max trees over one tier's nodes, for the first node from the cursor with room.

    The search went node by node from the cursor: when most nodes were full, every replica
    walked the whole tier, and 10,000 nodes took minutes. A tree finds the same node, the
    first in the same order whose free memory (or free GPUs) is enough, in log n steps.
    A node without a free port has no room at all. While the fleet has room the next few
    nodes serve, so the tree is built at its first question and kept up to date lazily.
    """

    def __init__(self, states: list[NodeState]) -> None:
        self.states = states
        self.size = 1 << max(0, len(states) - 1).bit_length()
        self.gb: list[float] = []
        self.gpus: list[int] = []
        self.changed: set[int] = set()
        # The most GPU memory a node here has: a replica needing more per GPU fits nowhere.
        self.gpu_memory = max((s.node.gpu_memory_gb for s in states), default=0.0)
        for i, state in enumerate(states):
            state.rooms.append((self, i))

    def _build(self) -> None:
        self.gb = [-math.inf] * (2 * self.size)
        self.gpus = [-1] * (2 * self.size)
        for i, state in enumerate(self.states):
            self.gb[self.size + i], self.gpus[self.size + i] = self._leaf(state)
        for p in range(self.size - 1, 0, -1):
            self.gb[p] = max(self.gb[2 * p], self.gb[2 * p + 1])
            self.gpus[p] = max(self.gpus[2 * p], self.gpus[2 * p + 1])
        self.changed.clear()

    @staticmethod
    def _leaf(state: NodeState) -> tuple[float, int]:
        if state.next_port > state.node.ports.last:
            return -math.inf, -1
        return state.free_gb, state.free_gpus

    def update(self, i: int) -> None:
        if self.gb:
            self.changed.add(i)

    def _catch_up(self) -> None:
        if not self.gb or len(self.changed) > self.size // 8:
            self._build()
            return
        for i in self.changed:
            p = self.size + i
            self.gb[p], self.gpus[p] = self._leaf(self.states[i])
            p //= 2
            while p:
                self.gb[p] = max(self.gb[2 * p], self.gb[2 * p + 1])
                self.gpus[p] = max(self.gpus[2 * p], self.gpus[2 * p + 1])
                p //= 2
        self.changed.clear()

    def first(self, lo: int, hi: int, need_gb: float, gpus: int) -> int | None:
        """The first node in [lo, hi) that may fit: enough free GPUs for a GPU replica (its
        GPUs' memory is the caller's check), else enough free memory."""
        if gpus and self.gpu_memory * gpus < need_gb:
            return None
        if not self.gb or self.changed:
            self._catch_up()
        values: list[Any] = self.gpus if gpus else self.gb
        least: float = gpus if gpus else need_gb
        found = self._first(values, 1, 0, self.size, lo, hi, least)
        return found if found >= 0 else None

    def _first(self, values: list[Any], p: int, start: int, end: int, lo: int, hi: int, least: float) -> int:
        if end <= lo or start >= hi or not values[p] >= least:
            return -1
        if end - start == 1:
            return start
        mid = (start + end) // 2
        found = self._first(values, 2 * p, start, mid, lo, hi, least)
        return found if found >= 0 else self._first(values, 2 * p + 1, mid, end, lo, hi, least)
