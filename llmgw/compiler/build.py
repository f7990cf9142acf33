"""The compiler's writer: a lint run's catalogue and placement → the resolved plan.

A plan is a promise: it lists only replicas that were placed, with every default filled in,
so that nothing downstream has to know the catalogue's rules. Readers never import this
module; they read the plan through llmgw/plan.py, which this module writes for.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from llmgw import __version__
from llmgw.compiler.capacity import Slot
from llmgw.compiler.catalogue import Entry
from llmgw.compiler.lint import LintResult
from llmgw.engines import ctx_size_for, gpus_for
from llmgw.errors import PlanError
from llmgw.model import Node, Profile
from llmgw.plan import (
    FORMAT_VERSION,
    FileRef,
    GeneratedBy,
    Inputs,
    NodeUse,
    OnDemandUse,
    Plan,
    PlanMemory,
    PlanModel,
    PlanNode,
    PlanProfile,
    PlanReplica,
    PlanWarning,
    PortRange,
    Target,
    Workload,
    cycle_collector_paused,
    file_sha256,
    plan_digest,
)


@dataclass(frozen=True)
class KubernetesTarget:
    """Where `llmgw plan --target kubernetes` says the workloads run, and how they are named.

    The names are the cluster's, so they are settings: a cluster set up with another DNS
    domain than cluster.local resolves nothing under cluster.local.
    """

    namespace: str = "llmgw"
    cluster_domain: str = "cluster.local"
    port: int = 8080  # every engine container listens here: pods have an address each

    def endpoint(self, workload: str) -> str:
        return f"http://{workload}.{self.namespace}.svc.{self.cluster_domain}:{self.port}"

    def as_target(self) -> Target:
        return Target(
            kind="kubernetes", namespace=self.namespace, cluster_domain=self.cluster_domain, port=self.port
        )


def build_plan(
    result: LintResult, previous: Plan | None = None, target: KubernetesTarget | None = None
) -> dict[str, Any]:
    """The resolved plan of a lint run without errors: deterministic, every default filled in.

    With a Kubernetes target the fit checks are the same, but no replica is pinned to a
    node: each (model, profile) becomes a workload, and its replicas one DNS name.
    """
    with cycle_collector_paused():
        return _build_plan(result, previous, target)


def _build_plan(result: LintResult, previous: Plan | None, target: KubernetesTarget | None) -> dict[str, Any]:
    # Built from the plan's own types (llmgw/plan.py), not as a dict by hand: the plan's
    # shape is written in the schema and the types, which a test keeps in step, and a field
    # renamed there fails here, at the compiler, not in a reader at run time.
    names = (
        workload_names(
            [(e.spec.name, p.name) for e in result.entries for p in e.spec.profiles if not p.external]
        )
        if target
        else {}
    )
    warnings: dict[str, list[PlanWarning]] = {}
    for f in result.findings:  # each model's, in one pass rather than a pass per model
        if f.severity == "warning":
            warnings.setdefault(f.file, []).append(PlanWarning(rule=f.rule, message=f.message))
    draft = Plan(
        format_version=FORMAT_VERSION,
        digest="",
        generated_by=GeneratedBy(tool="llmgw", version=__version__),
        inputs=_inputs(result, previous),
        target=target.as_target() if target is not None else None,
        nodes=tuple(
            _node(s.node, s.free_gb, s.free_gpus, s.replicas, s.on_demand) for s in result.placement.nodes
        ),
        models=tuple(
            _model(e, result, target, names, tuple(warnings.get(e.doc.file, ()))) for e in result.entries
        ),
    )
    # Every field with a default is one the compiler leaves out where it does not apply (no
    # description, a CPU replica's gpu_ids, an always-on profile's start): no key at all.
    plan = draft.document()
    plan["digest"] = plan_digest(plan)
    return plan


_NOT_IN_A_LABEL = re.compile(r"[^a-z0-9]+")


def workload_names(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(model, profile) → a DNS label for its Deployment and Service, the same every time.

    Model names may hold dots, capitals and slashes, which a Service name may not; two
    pairs that would clean up to one name, or a name past 63 characters, get a suffix
    from a hash of the pair, so no two workloads ever share a Service.

    A suffixed name can still be another pair's plain one (`a.b`/`cpu` and `a-b`/`cpu` both
    become `a-b-cpu-` and a hash, which a model `a-b-cpu` with that hash for a profile name
    has as it is), and then one Deployment was silently lost. A plain name is kept, since it
    is what a person reads and what the cluster already runs; each suffixed one that clashes
    is hashed again, with a round number, until every name is its pair's alone.
    """
    plain = {pair: _label_of(pair) for pair in pairs}
    taken = Counter(plain.values())
    out = {
        pair: _suffixed(name, pair, 0) if taken[name] > 1 or len(name) > 63 else name
        for pair, name in plain.items()
    }
    for attempt in range(1, 100):
        holders = Counter(out.values())
        clashing = [p for p, name in out.items() if holders[name] > 1 and out[p] != plain[p]]
        if not clashing:
            return out
        for pair in clashing:
            out[pair] = _suffixed(plain[pair], pair, attempt)
    raise PlanError("cannot give every Kubernetes workload its own name; rename a model.")


def _label_of(pair: tuple[str, str]) -> str:
    name = _NOT_IN_A_LABEL.sub("-", f"{pair[0]}-{pair[1]}".lower()).strip("-")
    return name if name[:1].isalpha() else "m-" + name


def _suffixed(name: str, pair: tuple[str, str], attempt: int) -> str:
    # Round 0 is the hash plans have always had, so names that never clashed stay the same.
    key = "/".join(pair) + (f"#{attempt}" if attempt else "")
    return f"{name[:54].rstrip('-')}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _inputs(result: LintResult, previous: Plan | None) -> Inputs:
    return Inputs(
        catalog=result.catalog,
        fleet=_file_ref(result.fleet_doc.file, result.fleet_doc.text),
        files=tuple(_file_ref(d.file, d.text) for d in result.documents),
        previous=previous.digest if previous is not None else None,
    )


def _file_ref(path: str, text: str) -> FileRef:
    return FileRef(path=path, sha256=file_sha256(text))


def _node(node: Node, free_gb: float, free_gpus: int, replicas: int, on_demand: list[float]) -> PlanNode:
    return PlanNode(
        name=node.name,
        address=node.address,
        memory_gb=node.memory_gb,
        gpus=node.gpu_count,
        gpu_memory_gb=node.gpu_memory_gb,
        labels=dict(sorted(node.labels.items())),
        # None: the agent reports nothing, which is not "none"
        engines=tuple(sorted(node.engines)) if node.engines is not None else None,
        ports=PortRange(first=node.ports.first, last=node.ports.last),
        used=NodeUse(
            memory_gb=round(node.memory_gb - free_gb, 3), gpus=node.gpu_count - free_gpus, replicas=replicas
        ),
        # Absent without on-demand replicas, so plans without them read as they did.
        on_demand=OnDemandUse(
            replicas=len(on_demand),
            memory_gb=round(sum(on_demand), 3),
            largest_gb=round(max(on_demand), 3),
        )
        if on_demand
        else None,
        # Where its agent listens, for a node with on-demand replicas (the gateway asks it for
        # starts) or whose fleet entry names agent_port (the gateway asks it for its engines'
        # credentials); absent otherwise, so plans without either read as they did.
        agent=node.agent if on_demand or "agent_port" in node.model_fields_set else None,
    )


def _model(
    entry: Entry,
    result: LintResult,
    target: KubernetesTarget | None,
    names: dict[tuple[str, str], str],
    warnings: tuple[PlanWarning, ...],
) -> PlanModel:
    spec = entry.spec
    return PlanModel(
        name=spec.name,
        # Undescribed: no key at all, never "".
        description=spec.description.strip() if spec.description is not None else None,
        aliases=tuple(spec.aliases),
        task=spec.task,
        source=spec.source,
        format=entry.source.format,
        weights_bytes=entry.weights_bytes,
        context_length=spec.context_length,
        max_output=spec.max_output,
        replicas=spec.replicas,
        file=entry.doc.file,
        profiles=tuple(_profile(entry, p, result, target, names) for p in spec.routing_order()),
        warnings=warnings,
        fallbacks=tuple(spec.fallbacks),
    )


def _profile(
    entry: Entry,
    profile: Profile,
    result: LintResult,
    target: KubernetesTarget | None,
    names: dict[tuple[str, str], str],
) -> PlanProfile:
    spec = entry.spec
    memory = entry.memory(profile)
    workload: Workload | None = None
    replicas: tuple[PlanReplica, ...]
    if profile.external:
        replicas = tuple(PlanReplica(endpoint=e.rstrip("/")) for e in profile.endpoints or ())
    elif target is not None:
        # The fit check placed every replica (a plan promises only what the cluster can
        # hold), but the scheduler chooses the nodes: the plan names the workload instead.
        name = names[(spec.name, profile.name)]
        placed = len(result.placement.replicas(spec.name, profile.name))
        workload = Workload(name=name, replicas=placed)
        replicas = (PlanReplica(endpoint=target.endpoint(name), discovery="dns"),) if placed else ()
    else:
        replicas = tuple(_replica(s) for s in result.placement.replicas(spec.name, profile.name))
    return PlanProfile(
        name=profile.name,
        engine=profile.engine,
        priority=profile.priority,
        weight=profile.weight,
        ctx_size=ctx_size_for(spec, profile),
        args=tuple(profile.args),
        gpus=gpus_for(profile),
        node_selector=dict(sorted(profile.node_selector.items())),
        memory=None if memory is None else PlanMemory(gb=memory.gb, source=memory.source, basis=memory.basis),
        served_name=spec.name,
        routing=spec.routing_for(profile),
        external=profile.external,
        # Absent for always-on, so existing plans keep their bytes.
        start="on-demand" if profile.on_demand else None,
        idle_stop_s=profile.idle_stop_s if profile.on_demand else None,
        workload=workload,
        replicas=replicas,
    )


def _replica(slot: Slot) -> PlanReplica:
    # gpu_ids absent for a CPU replica, so CPU-only plans read as they always did.
    return PlanReplica(
        endpoint=slot.endpoint, node=slot.node.name, port=slot.port, gpu_ids=tuple(slot.gpu_ids)
    )
