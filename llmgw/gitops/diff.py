"""Plan → plan changes: what deploying NEW over OLD would do, read the way `terraform plan` reads.

A reviewer of a catalogue pull request cares about what the gateway will serve differently,
not about which bytes of the plan moved. So the diff compares resources (models and nodes)
by name and each field by meaning. The plan's provenance (digest, inputs, generated_by, a
model's `file`) and the nodes' derived `used` totals are not changes of their own: the same
catalogue planned from another directory names its files differently.

Nothing here prints; `llmgw.gitops.report.diff_formats` turns a PlanDiff into text, markdown or JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from llmgw.errors import PlanError
from llmgw.plan import Plan, PlanModel, PlanNode, PlanProfile, PlanReplica, PlanWarning, read_previous

Action = Literal["add", "change", "remove"]
ReplicaAction = Literal["add", "remove", "move", "change"]

# Rendering order of a model's own fields: what a reviewer reads first comes first.
MODEL_FIELDS = (
    "description",
    "aliases",
    "fallbacks",
    "task",
    "source",
    "format",
    "weights_bytes",
    "context_length",
    "max_output",
    "replicas",
)
PROFILE_FIELDS = (
    "engine",
    "priority",
    "weight",
    "ctx_size",
    "args",
    "gpus",
    "node_selector",
    "memory_gb",
    "memory_source",
    "served_name",
    "external",
    "start",
    "idle_stop_s",
)
# `used` is left out: it is the sum of the placements, which the replica lines already show.
NODE_FIELDS = ("address", "memory_gb", "gpus", "gpu_memory_gb", "labels", "engines", "ports")

_ACTION_ORDER: dict[str, int] = {"add": 0, "change": 1, "remove": 2}
_KIND_ORDER: dict[str, int] = {"model": 0, "node": 1}
_Named = TypeVar("_Named", PlanModel, PlanNode)


@dataclass(frozen=True)
class FieldChange:
    """One field before → after; None stands for absent (a plan never holds null)."""

    field: str
    before: Any
    after: Any
    profile: str | None = None


@dataclass(frozen=True)
class ReplicaChange:
    """A replica is named `profile/ordinal`, the ordinal counting from 1 in the plan's order."""

    action: ReplicaAction
    profile: str
    ordinal: int
    node_before: str | None = None
    node_after: str | None = None
    endpoint_before: str | None = None
    endpoint_after: str | None = None


@dataclass(frozen=True)
class ProfileChange:
    """A routing profile added to or removed from a model that exists on both sides."""

    action: Literal["add", "remove"]
    name: str
    engine: str
    external: bool
    # What the engine is told besides llmgw's own flags: a reviewer reads them, not just that
    # a profile with args arrived (--trust-remote-code runs the repository's code).
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class WarningChange:
    action: Literal["add", "remove"]
    rule: str
    message: str


@dataclass(frozen=True)
class ResourceChange:
    kind: Literal["model", "node"]
    name: str
    action: Action
    # A few facts that say what an added or removed resource is (task and replicas for a
    # model; address and size for a node), so "+ model phi-4" is not a bare name.
    facts: dict[str, Any] = field(default_factory=dict)
    fields: tuple[FieldChange, ...] = ()
    profiles: tuple[ProfileChange, ...] = ()
    replicas: tuple[ReplicaChange, ...] = ()
    warnings: tuple[WarningChange, ...] = ()


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory before and after, always-on and on demand apart: a reviewer asks
    "does it still fit?", and the replica lines alone do not add up to an answer.

    `before_*` is None for a node the old plan did not have.
    """

    node: str
    memory_gb: float
    before_always_on_gb: float | None
    after_always_on_gb: float
    before_on_demand: int | None
    after_on_demand: int
    largest_on_demand_gb: float | None  # the after side's largest; None without any


@dataclass(frozen=True)
class PlanDiff:
    old_digest: str | None
    new_digest: str | None
    changes: tuple[ResourceChange, ...]
    memory: tuple[NodeMemory, ...] = ()

    def counts(self) -> tuple[int, int, int]:
        """(to add, to change, to remove), counting models and nodes alike."""
        add = sum(1 for c in self.changes if c.action == "add")
        change = sum(1 for c in self.changes if c.action == "change")
        return add, change, len(self.changes) - add - change

    @property
    def has_changes(self) -> bool:
        return bool(self.changes)  # a node's memory moves only with a change listed here


def diff_plans(old: Plan | None, new: Plan) -> PlanDiff:
    """Everything deploying `new` over `old` changes; `old` is None when nothing is deployed yet."""
    changes = [
        *_diff_named(old.models if old else (), new.models, "model", _model_facts, _diff_model),
        *_diff_named(old.nodes if old else (), new.nodes, "node", _node_facts, _diff_node),
    ]
    changes.sort(key=lambda c: (_ACTION_ORDER[c.action], _KIND_ORDER[c.kind], c.name))
    return PlanDiff(old.digest if old else None, new.digest, tuple(changes), _memory_changes(old, new))


def _memory_changes(old: Plan | None, new: Plan) -> tuple[NodeMemory, ...]:
    """The nodes whose always-on memory or on-demand replicas change, or that are new."""
    before = {n.name: n for n in old.nodes} if old else {}
    out = []
    for node in sorted(new.nodes, key=lambda n: n.name):
        was = before.get(node.name)
        demand = node.on_demand
        was_demand = None if was is None else (was.on_demand.replicas if was.on_demand else 0)
        row = NodeMemory(
            node=node.name,
            memory_gb=node.memory_gb,
            before_always_on_gb=None if was is None else was.used.memory_gb,
            after_always_on_gb=node.used.memory_gb,
            before_on_demand=was_demand,
            after_on_demand=demand.replicas if demand else 0,
            largest_on_demand_gb=demand.largest_gb if demand else None,
        )
        same = was is not None and was.used.memory_gb == node.used.memory_gb and was.on_demand == demand
        if not same and (was is not None or row.after_always_on_gb or row.after_on_demand):
            out.append(row)
    return tuple(out)


def _diff_named(
    old: Sequence[_Named],
    new: Sequence[_Named],
    kind: Literal["model", "node"],
    facts: Callable[[_Named], dict[str, Any]],
    diff_one: Callable[[_Named, _Named], ResourceChange | None],
) -> Iterable[ResourceChange]:
    before = {item.name: item for item in old}
    after = {item.name: item for item in new}
    for name in sorted(after.keys() - before.keys()):
        added = after[name]
        replicas = _replicas_of_added(added) if isinstance(added, PlanModel) else ()
        yield ResourceChange(kind, name, "add", facts=facts(added), replicas=replicas)
    for name in sorted(before.keys() - after.keys()):
        yield ResourceChange(kind, name, "remove", facts=facts(before[name]))
    for name in sorted(before.keys() & after.keys()):
        change = diff_one(before[name], after[name])
        if change is not None:
            yield change


def _model_facts(model: PlanModel) -> dict[str, Any]:
    placed = sum(len(p.replicas) for p in model.profiles)
    facts: dict[str, Any] = {"task": model.task, "replicas": placed}
    if any(p.on_demand for p in model.profiles):
        facts["on_demand"] = True
    args = {p.name: list(p.args) for p in model.profiles if p.args}
    if args:
        facts["args"] = args  # shown for an added model, as a changed profile's args are
    return facts


def _node_facts(node: PlanNode) -> dict[str, Any]:
    return {"address": node.address, "memory_gb": node.memory_gb, "gpus": node.gpus}


def _replicas_of_added(model: PlanModel) -> tuple[ReplicaChange, ...]:
    return tuple(
        ReplicaChange("add", p.name, i, node_after=r.node, endpoint_after=r.endpoint)
        for p in model.profiles
        for i, r in enumerate(p.replicas, start=1)
    )


def _as_written(value: Any) -> Any:
    """A field's value as the plan's JSON holds it (lists, objects), which the reports print."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, tuple):
        return [_as_written(v) for v in value]
    return value


def _fields_of(part: BaseModel, names: Iterable[str]) -> dict[str, Any]:
    return {name: _as_written(getattr(part, name)) for name in names}


def _diff_fields(
    old: dict[str, Any], new: dict[str, Any], names: Iterable[str], profile: str | None = None
) -> list[FieldChange]:
    return [FieldChange(name, old[name], new[name], profile) for name in names if old[name] != new[name]]


def _diff_model(old: PlanModel, new: PlanModel) -> ResourceChange | None:
    fields = _diff_fields(_fields_of(old, MODEL_FIELDS), _fields_of(new, MODEL_FIELDS), MODEL_FIELDS)
    profiles: list[ProfileChange] = []
    replicas: list[ReplicaChange] = []
    old_profiles = {p.name: p for p in old.profiles}
    new_profiles = {p.name: p for p in new.profiles}
    for p in new.profiles:
        before = old_profiles.get(p.name)
        if before is None:
            profiles.append(ProfileChange("add", p.name, p.engine, p.external, p.args))
            replicas.extend(_diff_replicas(p.name, (), p.replicas))
            continue
        fields.extend(_diff_fields(_flat_profile(before), _flat_profile(p), PROFILE_FIELDS, profile=p.name))
        replicas.extend(_diff_replicas(p.name, before.replicas, p.replicas))
    for p in old.profiles:
        if p.name not in new_profiles:
            profiles.append(ProfileChange("remove", p.name, p.engine, p.external))
    warnings = _diff_warnings(old.warnings, new.warnings)
    if not (fields or profiles or replicas or warnings):
        return None
    return ResourceChange(
        "model",
        new.name,
        "change",
        facts=_model_facts(new),
        fields=tuple(fields),
        profiles=tuple(profiles),
        replicas=tuple(replicas),
        warnings=warnings,
    )


def _flat_profile(profile: PlanProfile) -> dict[str, Any]:
    # The memory basis is prose about how a figure was reached; only the figure and whether
    # it was declared or estimated change what gets placed.
    flat = _fields_of(profile, (f for f in PROFILE_FIELDS if not f.startswith("memory_")))
    flat["memory_gb"] = profile.memory.gb if profile.memory else None
    flat["memory_source"] = profile.memory.source if profile.memory else None
    return flat


def _diff_replicas(
    profile: str, old: Sequence[PlanReplica], new: Sequence[PlanReplica]
) -> list[ReplicaChange]:
    """Pair old and new replicas so that a replica that kept its endpoint is no change.

    Pairing is by endpoint first, then by node (the port changed), then in order (the
    replica moved to another node); whatever is left over was added or removed.
    """
    old_left = list(range(len(old)))
    new_left = list(range(len(new)))
    pairs: list[tuple[int, int]] = []

    def pair_by(same: Callable[[PlanReplica, PlanReplica], bool]) -> None:
        for j in list(new_left):
            for i in old_left:
                if same(old[i], new[j]):
                    pairs.append((i, j))
                    old_left.remove(i)
                    new_left.remove(j)
                    break

    pair_by(lambda a, b: a.endpoint == b.endpoint)
    pair_by(lambda a, b: a.node is not None and a.node == b.node)
    in_order = min(len(old_left), len(new_left))
    pairs.extend(zip(old_left[:in_order], new_left[:in_order], strict=True))
    old_rest, new_rest = old_left[in_order:], new_left[in_order:]

    changes: list[ReplicaChange] = []
    for i, j in sorted(pairs, key=lambda p: p[1]):
        a, b = old[i], new[j]
        if a.endpoint == b.endpoint and a.node == b.node:
            continue
        changes.append(
            ReplicaChange(
                "move" if a.node != b.node else "change",
                profile,
                j + 1,
                node_before=a.node,
                node_after=b.node,
                endpoint_before=a.endpoint,
                endpoint_after=b.endpoint,
            )
        )
    for j in new_rest:
        changes.append(
            ReplicaChange("add", profile, j + 1, node_after=new[j].node, endpoint_after=new[j].endpoint)
        )
    for i in old_rest:
        changes.append(
            ReplicaChange("remove", profile, i + 1, node_before=old[i].node, endpoint_before=old[i].endpoint)
        )
    return changes


def _diff_warnings(old: Sequence[PlanWarning], new: Sequence[PlanWarning]) -> tuple[WarningChange, ...]:
    before = {(w.rule, w.message) for w in old}
    after = {(w.rule, w.message) for w in new}
    return (
        *(WarningChange("add", r, m) for r, m in sorted(after - before)),
        *(WarningChange("remove", r, m) for r, m in sorted(before - after)),
    )


def _diff_node(old: PlanNode, new: PlanNode) -> ResourceChange | None:
    fields = _diff_fields(_fields_of(old, NODE_FIELDS), _fields_of(new, NODE_FIELDS), NODE_FIELDS)
    if not fields:
        return None
    return ResourceChange("node", new.name, "change", facts=_node_facts(new), fields=tuple(fields))


def read_side(path: Path | str) -> Plan | None:
    """Read the old side of a diff; an empty file (such as /dev/null) stands for no plan.

    The first pull request that adds a catalogue has no base plan, and the first deploy
    has no deployed one: both are "everything is added", not an error. The new side is
    always a plan: an empty one there means a plan step failed, not "remove everything".
    """
    return read_previous(path)


def read_new_side(path: Path | str) -> Plan:
    """Read the new side of a diff: always a plan, so an empty file is a failed plan step."""
    plan = read_previous(path)
    if plan is None:
        raise PlanError(
            f"the new plan {path} is empty, so a plan step failed (llmgw plan writes nothing "
            "when lint finds errors); fix what that step reported, then diff the plan it writes."
        )
    return plan
