"""The dashboard's memory bar of a node is the memory its engines load into: a GPU node's
cards, not its host memory."""

from __future__ import annotations

from pathlib import Path

from llmgw.compiler.build import build_plan
from llmgw.compiler.lint import lint
from llmgw.gateway.pages.dashboard import node_document, plan_view
from llmgw.plan import dump_plan, parse_plan
from tests.conftest import write_catalog

FLEET = """\
nodes:
  - name: gpu-1
    address: 127.0.0.21
    memory_gb: 256
    gpus: {count: 2, memory_gb: 80}
    engines: [vllm]
  - name: cpu-1
    address: 127.0.0.11
    memory_gb: 64
    engines: [llamacpp]
"""
GPU_MODEL = """\
name: big
source: hf://org/big
weights_bytes: 30000000000
context_length: 8192
profiles:
  - name: gpu
    engine: vllm
    gpus: 1
    min_memory_gb: 40
"""
CPU_MODEL = """\
name: small
source: hf://org/small/small.gguf
weights_bytes: 4000000000
context_length: 4096
profiles:
  - name: cpu
    engine: llamacpp
    min_memory_gb: 6
"""


def test_a_gpu_nodes_bar_is_its_gpu_memory_and_a_cpu_nodes_its_memory(tmp_path: Path) -> None:
    catalog, fleet = write_catalog(tmp_path, {"big.yaml": GPU_MODEL, "small.yaml": CPU_MODEL}, FLEET)
    result = lint(catalog, fleet)
    assert result.counts()[0] == 0, result.findings
    view = plan_view(parse_plan(dump_plan(build_plan(result))))
    shown = {n.name: node_document(n, frozenset()) for n in view.nodes}
    gpu = shown["gpu-1"]
    assert gpu["label"] == "always on 80 GB, loaded on demand 0 GB, free 80 GB of 160 GB GPU memory", gpu
    assert gpu["bar"]["always"] == 50.0, "one of two 80 GB cards is taken"
    assert "256" not in gpu["label"], "the host's memory, where no model of this node loads"
    assert shown["cpu-1"]["label"].endswith("free 58 GB of 64 GB"), shown["cpu-1"]
