"""`llmgw inventory --kubernetes`: a fleet from recorded `kubectl get nodes -o json` output,
counting only what the scheduler hands out, and only on nodes it will use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from llmgw.errors import UsageError
from llmgw.gitops.inventory import fleet_from_kubectl, quantity
from tests.unit.helpers import model_yaml

RECORDED = Path(__file__).with_name("kubectl")


def _fleet(llmgw, name: str) -> tuple[dict, str, str]:
    run = llmgw("inventory", "--kubernetes", RECORDED / name)
    assert run.code == 0, run
    return YAML(typ="safe").load(run.stdout), run.stdout, run.stderr


def test_cpu_nodes_give_allocatable_memory_and_every_label(llmgw):
    fleet, _, _ = _fleet(llmgw, "cpu-nodes.json")
    cpu_a = next(n for n in fleet["nodes"] if n["name"] == "cpu-a")
    # 65842948Ki allocatable, not the 65945348Ki capacity: the kubelet keeps the difference.
    assert cpu_a["memory_gb"] == 67.4
    assert cpu_a["address"] == "127.0.0.41"
    assert cpu_a["labels"]["pool"] == "cpu" and cpu_a["labels"]["kubernetes.io/hostname"] == "cpu-a"
    assert "gpus" not in cpu_a and "engines" not in cpu_a, "engines unknown, not none"


def test_cordoned_and_tainted_nodes_are_left_out_and_named(llmgw):
    fleet, _, notes = _fleet(llmgw, "cpu-nodes.json")
    assert [n["name"] for n in fleet["nodes"]] == ["cpu-a", "cpu-b"]
    assert "cpu-c is left out: it is cordoned" in notes
    assert "control-plane is left out: its taint node-role.kubernetes.io/control-plane:NoSchedule" in notes


def test_gpu_nodes_give_count_and_memory_from_the_gpu_memory_label(llmgw):
    fleet, _, notes = _fleet(llmgw, "gpu-nodes.json")
    gpu_a = next(n for n in fleet["nodes"] if n["name"] == "gpu-a")
    assert gpu_a["gpus"] == {"count": 2, "memory_gb": 85.8}  # 81920 MiB
    gpu_b = next(n for n in fleet["nodes"] if n["name"] == "gpu-b")
    assert gpu_b["gpus"] == {"count": 4, "memory_gb": 0}
    assert "gpu-b has 4 GPU(s) but no nvidia.com/gpu.memory label" in notes
    assert "gpu-c is left out: it is not Ready" in notes


def test_the_fleet_written_is_one_plan_can_use(llmgw, tmp_path):
    _, cpu_text, _ = _fleet(llmgw, "cpu-nodes.json")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(cpu_text)
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "m.yaml").write_text(model_yaml("m", replicas=2))
    run = llmgw("plan", catalog, "--fleet", fleet, "--target", "kubernetes", "--out", "-")
    assert run.code == 0, run
    profile = json.loads(run.stdout)["models"][0]["profiles"][0]
    assert profile["workload"]["replicas"] == 2


def test_json_format_is_the_same_fleet(llmgw):
    fleet, _, _ = _fleet(llmgw, "gpu-nodes.json")
    run = llmgw("inventory", "--kubernetes", RECORDED / "gpu-nodes.json", "--format", "json")
    assert json.loads(run.stdout) == fleet


def test_something_else_than_kubectl_output_is_refused_with_a_sentence(llmgw, tmp_path):
    not_nodes = tmp_path / "pods.json"
    not_nodes.write_text('{"kind": "Pod"}')
    run = llmgw("inventory", "--kubernetes", not_nodes)
    assert run.code == 2 and "kubectl get nodes -o json" in run.stderr, run


def test_machine_options_with_kubernetes_are_refused(llmgw):
    run = llmgw("inventory", "--kubernetes", RECORDED / "cpu-nodes.json", "--address", "127.0.0.9")
    assert run.code == 2 and "leave them out" in run.stderr, run


@pytest.mark.parametrize(("text", "value"), [
    ("64Gi", 64 * 2**30), ("65842948Ki", 65842948 * 1024), ("1G", 1e9),
    ("2", 2), ("1e3", 1000), ("500m", 0.5),
])
def test_quantities(text, value):
    assert quantity(text) == value


def test_an_empty_cluster_says_nothing_can_be_planned():
    inventory = fleet_from_kubectl({"items": []})
    assert inventory.entry == {"nodes": []}
    assert "empty" in inventory.notes[0]
    with pytest.raises(UsageError, match="quantity"):
        quantity("lots")
