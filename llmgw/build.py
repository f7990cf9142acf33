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
from llmgw.catalogue import Entry
from llmgw.errors import PlanError
from llmgw.lint import LintResult
from llmgw.model import Node
from llmgw.place import Slot
from llmgw.plan import FORMAT_VERSION, Plan, cycle_collector_paused, file_sha256, plan_digest


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "kubernetes",
            "namespace": self.namespace,
            "cluster_domain": self.cluster_domain,
            "port": self.port,
        }


def build_plan(
    result: LintResult, previous: Plan | None = None, target: KubernetesTarget | None = None
) -> dict[str, Any]:
    """The resolved plan of a lint run without errors: deterministic, every default filled in.

    With a Kubernetes target the fit checks are the same, but no replica is pinned to a
    node: each (model, profile) becomes a workload, and its replicas one DNS name.
    """
    with cycle_collector_paused():
        return _build_plan(result, previous, target)


def _build_plan(
    result: LintResult, previous: Plan | None, target: KubernetesTarget | None
) -> dict[str, Any]:
    plan: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "digest": "",
        "generated_by": {"tool": "llmgw", "version": __version__},
        "inputs": _inputs(result, previous),
    }
    if target is not None:  # absent for the node agents, so their plans read as they always did
        plan["target"] = target.as_dict()
    names = (
        workload_names(
            [(e.spec.name, p.name) for e in result.entries for p in e.spec.profiles if not p.external]
        )
        if target
        else {}
    )
    plan["nodes"] = [
        _node(s.node, s.free_gb, s.free_gpus, s.replicas, s.on_demand) for s in result.placement.nodes
    ]
    warnings: dict[str, list[dict[str, str]]] = {}
    for f in result.findings:  # each model's, in one pass rather than a pass per model
        if f.severity == "warning":
            warnings.setdefault(f.file, []).append({"rule": f.rule, "message": f.message})
    plan["models"] = [_model(e, result, target, names, warnings.get(e.doc.file, [])) for e in result.entries]
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


def _inputs(result: LintResult, previous: Plan | None) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "catalog": result.catalog,
        "fleet": _file_ref(result.fleet_doc.file, result.fleet_doc.text),
        "files": [_file_ref(d.file, d.text) for d in result.documents],
    }
    if previous is not None:
        inputs["previous"] = previous.digest
    return inputs


def _file_ref(path: str, text: str) -> dict[str, str]:
    return {"path": path, "sha256": file_sha256(text)}


def _node(
    node: Node, free_gb: float, free_gpus: int, replicas: int, on_demand: list[float]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": node.name,
        "address": node.address,
        "memory_gb": node.memory_gb,
        "gpus": node.gpu_count,
        "gpu_memory_gb": node.gpu_memory_gb,
        "labels": dict(sorted(node.labels.items())),
    }
    if node.engines is not None:  # absent: the agent reports nothing, which is not "none"
        out["engines"] = sorted(node.engines)
    out["ports"] = {"first": node.ports.first, "last": node.ports.last}
    out["used"] = {
        "memory_gb": round(node.memory_gb - free_gb, 3),
        "gpus": node.gpu_count - free_gpus,
        "replicas": replicas,
    }
    if on_demand:  # absent otherwise, so plans without on-demand profiles read as they did
        out["on_demand"] = {
            "replicas": len(on_demand),
            "memory_gb": round(sum(on_demand), 3),
            "largest_gb": round(max(on_demand), 3),
        }
        out["agent"] = node.agent
    return out


def _model(
    entry: Entry,
    result: LintResult,
    target: KubernetesTarget | None,
    names: dict[tuple[str, str], str],
    warnings: list[dict[str, str]],
) -> dict[str, Any]:
    spec = entry.spec
    out: dict[str, Any] = {"name": spec.name}
    if spec.description is not None:  # undescribed: no key at all, never ""
        out["description"] = spec.description.strip()
    out["aliases"] = list(spec.aliases)
    out["task"] = spec.task
    out["source"] = spec.source
    out["format"] = entry.source.format
    if entry.weights_bytes is not None:
        out["weights_bytes"] = entry.weights_bytes
    out["context_length"] = spec.context_length
    if spec.max_output is not None:
        out["max_output"] = spec.max_output
    out["replicas"] = spec.replicas
    out["file"] = entry.doc.file
    out["profiles"] = [_profile(entry, p, result, target, names) for p in spec.routing_order()]
    out["warnings"] = warnings
    return out


def _profile(
    entry: Entry,
    profile: Any,
    result: LintResult,
    target: KubernetesTarget | None,
    names: dict[tuple[str, str], str],
) -> dict[str, Any]:
    spec = entry.spec
    out: dict[str, Any] = {
        "name": profile.name,
        "engine": profile.engine,
        "priority": profile.priority,
        "weight": profile.weight,
        "ctx_size": spec.ctx_size_for(profile),
        "args": list(profile.args),
        "gpus": profile.gpus_needed,
        "node_selector": dict(sorted(profile.node_selector.items())),
    }
    memory = entry.memory(profile)
    if memory is not None:
        out["memory"] = memory.as_dict()
    out["served_name"] = spec.name
    out["routing"] = spec.routing_for(profile)
    out["external"] = profile.external
    if profile.on_demand:  # absent for always-on, so existing plans keep their bytes
        out["start"] = "on-demand"
        out["idle_stop_s"] = profile.idle_stop_s
    if profile.external:
        out["replicas"] = [{"endpoint": e.rstrip("/")} for e in profile.endpoints]
    elif target is not None:
        # The fit check placed every replica (a plan promises only what the cluster can
        # hold), but the scheduler chooses the nodes: the plan names the workload instead.
        name = names[(spec.name, profile.name)]
        placed = len(result.placement.replicas(spec.name, profile.name))
        out["workload"] = {"name": name, "replicas": placed}
        out["replicas"] = [{"endpoint": target.endpoint(name), "discovery": "dns"}] if placed else []
    else:
        out["replicas"] = [_replica(s) for s in result.placement.replicas(spec.name, profile.name)]
    return out


def _replica(slot: Slot) -> dict[str, Any]:
    out: dict[str, Any] = {"endpoint": slot.endpoint, "node": slot.node.name, "port": slot.port}
    if slot.gpu_ids:  # absent for a CPU replica, so CPU-only plans read as they always did
        out["gpu_ids"] = list(slot.gpu_ids)
    return out


