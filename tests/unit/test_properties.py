"""Properties that hold for any catalogue: the plan keeps its promises, lint never crashes."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from llmgw.compiler.build import build_plan
from llmgw.compiler.lint import lint
from llmgw.load import load_document
from tests.conftest import write_catalog

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

node = st.fixed_dictionaries({
    "memory": st.integers(4, 128),
    "gpus": st.integers(0, 4),
    "pool": st.sampled_from(["cpu", "gpu"]),
    "engines": st.sampled_from(["[llamacpp]", "[vllm]", "[vllm, llamacpp]", None]),
    "last_port": st.integers(8001, 8004),
})
model = st.fixed_dictionaries({
    "gguf": st.booleans(),
    "weights_gb": st.integers(1, 60),
    "replicas": st.integers(1, 4),
    "pool": st.sampled_from(["cpu", "gpu"]),
    "gpus": st.integers(0, 2),
})


def _fleet(nodes: list[dict]) -> str:
    lines = ["nodes:"]
    for i, n in enumerate(nodes):
        lines += [f"  - name: n{i}", f"    address: 127.0.1.{i + 1}", f"    memory_gb: {n['memory']}",
                  f"    labels: {{pool: {n['pool']}}}",
                  f"    ports: {{first: 8001, last: {n['last_port']}}}"]
        if n["gpus"]:
            lines.append(f"    gpus: {{count: {n['gpus']}, memory_gb: 24}}")
        if n["engines"]:
            lines.append(f"    engines: {n['engines']}")
    return "\n".join(lines) + "\n"


def _model(i: int, m: dict) -> str:
    source = f"hf://org/m{i}-GGUF/m{i}.gguf" if m["gguf"] else f"hf://org/m{i}"
    engine = "llamacpp" if m["gguf"] else "vllm"
    return (f"name: m{i}\nsource: {source}\nweights_bytes: {m['weights_gb'] * 10**9}\n"
            f"context_length: 4096\nreplicas: {m['replicas']}\nprofiles:\n"
            f"  - {{name: p, engine: {engine}, gpus: {m['gpus']}, node_selector: {{pool: {m['pool']}}}}}\n")


@SETTINGS
@given(nodes=st.lists(node, min_size=1, max_size=6), models=st.lists(model, min_size=1, max_size=8))
def test_a_plan_never_promises_more_than_the_nodes_hold(tmp_path_factory, nodes, models):
    root = tmp_path_factory.mktemp("cat")
    catalog, fleet = write_catalog(root, {f"m{i}.yaml": _model(i, m) for i, m in enumerate(models)},
                                   _fleet(nodes))
    result = lint(catalog, fleet)
    event("placed" if not result.counts()[0] else "refused")
    if result.counts()[0]:
        assert any(f.rule in {"placement", "selector-matches-nothing"} for f in result.findings)
        return
    plan = build_plan(result)
    by_node = {n["name"]: n for n in plan["nodes"]}
    memory: dict[str, float] = {}
    gpus: dict[str, int] = {}
    ports: set[tuple[str, int]] = set()
    for m, spec in zip(plan["models"], sorted(models_with_names(models)), strict=True):
        for p in m["profiles"]:
            assert len(p["replicas"]) == spec[1]["replicas"]
            for r in p["replicas"]:
                assert (r["node"], r["port"]) not in ports, "two replicas share a port"
                ports.add((r["node"], r["port"]))
                node_ = by_node[r["node"]]
                assert node_["labels"]["pool"] == spec[1]["pool"]
                assert node_["ports"]["first"] <= r["port"] <= node_["ports"]["last"]
                if p["gpus"]:
                    gpus[r["node"]] = gpus.get(r["node"], 0) + p["gpus"]
                    assert p["memory"]["gb"] <= node_["gpu_memory_gb"] * p["gpus"]
                else:
                    memory[r["node"]] = memory.get(r["node"], 0) + p["memory"]["gb"]
    endpoints = [r["endpoint"] for m in plan["models"] for p in m["profiles"] for r in p["replicas"]]
    assert len(endpoints) == len(set(endpoints)), "two replicas share an endpoint"
    for name, used in memory.items():
        assert used <= by_node[name]["memory_gb"] + 1e-9
    for name, used in gpus.items():
        assert used <= by_node[name]["gpus"]


def models_with_names(models: list[dict]) -> list[tuple[str, dict]]:
    return [(f"m{i}", m) for i, m in enumerate(models)]


yaml_text = st.text(alphabet=string.printable + "é\t", max_size=300)


@settings(max_examples=300, deadline=None)
@given(text=yaml_text)
@example(text="a: ._")
@example(text="a: 2001-02-30")
@example(text='a: !!float "x"')
@example(text="a: 2001-12-14t21:59:43.10-99:99")
def test_any_text_gives_findings_never_an_exception(tmp_path_factory, text):
    path = Path(tmp_path_factory.mktemp("y")) / "x.yaml"
    path.write_text(text)
    doc, findings = load_document(path, "x.yaml")
    for f in findings:
        assert f.rule == "yaml" and f.line >= 1 and f.column >= 1 and f.message
