"""`llmgw plan --target kubernetes`: the same checks, replicas as workloads found by DNS."""

from __future__ import annotations

import hashlib
import json
import re

from llmgw.compiler.build import workload_names
from llmgw.plan import Plan, read_plan
from llmgw.schema import validator
from tests.conftest import write_catalog
from tests.unit.helpers import model_yaml

LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def _k8s_plan(llmgw, tmp_path, *extra: str) -> Plan:
    out = tmp_path / "plan.json"
    run = llmgw("plan", "--target", "kubernetes", *extra, "--out", out)
    assert run.code == 0, run
    return read_plan(out)


def test_the_default_plan_has_no_kubernetes_keys_at_all(llmgw):
    text = llmgw("plan", "--out", "-").stdout
    doc = json.loads(text)
    assert "target" not in doc
    assert not any("workload" in p for m in doc["models"] for p in m["profiles"])
    assert '"discovery"' not in text, "node-agent plans must read as they did before"


def test_each_profile_becomes_a_workload_with_the_catalogues_replica_count(llmgw, tmp_path):
    plan = _k8s_plan(llmgw, tmp_path)
    assert plan.target is not None and plan.target.namespace == "llmgw"
    assert list(validator("plan").iter_errors(plan.doc)) == []
    llama = next(m for m in plan.models if m.name == "llama-3.1-8b")
    cpu = llama.profiles[0]
    assert cpu.workload is not None
    assert (cpu.workload.name, cpu.workload.replicas) == ("llama-3-1-8b-cpu", 2)
    assert [(r.endpoint, r.discovery, r.node) for r in cpu.replicas] == [
        ("http://llama-3-1-8b-cpu.llmgw.svc.cluster.local:8080", "dns", None)
    ]


def test_external_endpoints_stay_as_the_catalogue_gave_them(llmgw, tmp_path):
    plan = _k8s_plan(llmgw, tmp_path)
    partner = next(p for m in plan.models for p in m.profiles if p.external)
    assert partner.workload is None
    assert all(r.discovery is None for r in partner.replicas)


def test_namespace_and_cluster_domain_name_the_endpoint(llmgw, tmp_path):
    plan = _k8s_plan(llmgw, tmp_path, "--namespace", "models", "--cluster-domain", "llmgw.test")
    endpoints = {r.endpoint for m in plan.models for p in m.profiles if p.workload for r in p.replicas}
    assert "http://llama-3-1-8b-cpu.models.svc.llmgw.test:8080" in endpoints
    assert plan.target is not None and plan.target.cluster_domain == "llmgw.test"


def test_the_cluster_is_held_to_the_same_fit_checks(llmgw, tmp_path):
    big = model_yaml("big", replicas=5, profile_extra="    min_memory_gb: 60\n")
    catalog, fleet = write_catalog(tmp_path, {"big.yaml": big})
    out = tmp_path / "plan.json"
    run = llmgw("plan", catalog, "--fleet", fleet, "--target", "kubernetes", "--out", out)
    assert run.code == 1, run
    assert "placement" in run.stderr and not out.exists()


def test_namespace_without_the_kubernetes_target_is_refused_with_a_sentence(llmgw):
    run = llmgw("plan", "--namespace", "models", "--out", "-")
    assert run.code == 2, run
    assert "--target kubernetes" in run.stderr


def test_a_namespace_kubernetes_would_refuse_is_refused_here(llmgw):
    run = llmgw("plan", "--target", "kubernetes", "--namespace", "Models_1", "--out", "-")
    assert run.code == 2, run
    assert "namespace name" in run.stderr


def test_workload_names_are_dns_labels_and_never_shared():
    names = workload_names([
        ("Llama-3.1-8B", "cpu"),
        ("llama.3.1.8b", "cpu"),  # cleans up to the same name as the first
        ("org/model", "gpu"),
        ("3b", "main"),
        ("x" * 80, "main"),
    ])
    assert all(LABEL.fullmatch(n) for n in names.values()), names
    assert len(set(names.values())) == len(names)
    assert names[("org/model", "gpu")] == "org-model-gpu"
    assert names[("3b", "main")] == "m-3b-main"
    assert workload_names([("x" * 80, "main")]) == {("x" * 80, "main"): names[("x" * 80, "main")]}


def test_a_suffixed_workload_name_never_lands_on_another_pairs_plain_name():
    # `a.b` and `a-b` with profile cpu are suffixed with a hash of the pair; a model named
    # `a-b-cpu` whose profile is that very hash once had the same name, and one was lost.
    suffix = hashlib.sha256(b"a.b/cpu").hexdigest()[:8]
    pairs = [("a.b", "cpu"), ("a-b", "cpu"), ("a-b-cpu", suffix), ("1b", "cpu"), ("m-1b", "cpu")]
    names = workload_names(pairs)
    assert len(set(names.values())) == len(pairs), names
    assert names[("a-b-cpu", suffix)] == f"a-b-cpu-{suffix}"  # a plain name is kept
    assert workload_names(list(reversed(pairs))) == names  # the same whatever the order
