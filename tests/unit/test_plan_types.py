"""The typed plan every reader gets: the schema's fields exactly, and GPUs owned per replica."""

from __future__ import annotations

import json
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from llmgw.plan import Plan, assemble_plan, dump_plan, read_plan
from llmgw.schema import validator
from tests.unit.helpers import model_yaml
from tests.unit.test_plan import plan_for

GPU_FLEET = """\
nodes:
  - name: gpu-a
    address: 127.0.0.21
    memory_gb: 256
    gpus: {count: 4, memory_gb: 80}
    engines: [vllm]
"""


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic class inside `X`, `X | None` or `tuple[X, ...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) else ():
        found = _model_class(arg)
        if found:
            return found
    return None


def _disagreements(schema: dict[str, Any], defs: dict[str, Any], cls: type[BaseModel], at: str) -> list[str]:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    if schema.get("type") == "array":
        return _disagreements(schema["items"], defs, cls, at + "[]")
    props = schema.get("properties", {})
    fields = cls.model_fields
    out = [f"{at}.{name}: in the schema, not in {cls.__name__}" for name in props if name not in fields]
    out += [f"{at}.{name}: in {cls.__name__}, not in the schema" for name in fields if name not in props]
    required = set(schema.get("required", []))
    for name, field in fields.items():
        if name not in props:
            continue
        if (name in required) != field.is_required():
            out.append(f"{at}.{name}: required in one and optional in the other")
        inner = _model_class(field.annotation)
        if inner:
            out += _disagreements(props[name], defs, inner, f"{at}.{name}")
    return out


def test_the_typed_plan_has_every_field_of_the_schema_and_no_other():
    schema = validator("plan").schema
    assert _disagreements(schema, schema["$defs"], Plan, "plan") == []


def test_the_bundled_plan_read_as_objects_loses_nothing(llmgw, tmp_path):
    out = tmp_path / "plan.json"
    assert llmgw("plan", "--out", out).code == 0
    plan = read_plan(out)
    doc = json.loads(out.read_text())
    assert plan.model_dump(mode="json", exclude_unset=True) == doc
    written = json.dumps(plan.model_dump(mode="json", exclude_unset=True))
    assert written == json.dumps(doc), "numbers keep their type: 64 stays 64, 64.0 stays 64.0"
    undescribed = next(m for m in plan.models if m.name == "mistral-7b-instruct")
    assert undescribed.description is None


def test_each_gpu_replica_owns_its_own_gpus_on_a_node(tmp_path):
    models = {
        "big.yaml": model_yaml("big", source="hf://Qwen/Qwen2.5-32B-Instruct-AWQ", engine="vllm",
                               selector="{}", profile_extra="    gpus: 2\n"),
        "small.yaml": model_yaml("small", source="hf://Qwen/Qwen2.5-7B-Instruct", engine="vllm",
                                 selector="{}", replicas=2),
    }
    plan = Plan.of(plan_for(tmp_path, models, fleet=GPU_FLEET))
    owned = {
        (m.name, i): r.gpu_ids for m in plan.models for i, r in enumerate(m.profiles[0].replicas)
    }
    assert owned == {("big", 0): (0, 1), ("small", 0): (2,), ("small", 1): (3,)}
    assert list(validator("plan").iter_errors(plan.doc)) == []


def test_previous_plan_keeps_each_replicas_gpus(tmp_path):
    small = model_yaml("small", source="hf://Qwen/Qwen2.5-7B-Instruct", engine="vllm", selector="{}",
                       replicas=2)
    first = plan_for(tmp_path / "one", {"small.yaml": small}, fleet=GPU_FLEET)
    # A bigger model arrives and sorts first: without --previous it would take GPUs 0 and 1.
    models = {
        "small.yaml": small,
        "a-big.yaml": model_yaml("a-big", source="hf://Qwen/Qwen2.5-32B-Instruct-AWQ", engine="vllm",
                                 selector="{}", profile_extra="    gpus: 2\n"),
    }
    fresh = Plan.of(plan_for(tmp_path / "two", models, fleet=GPU_FLEET))
    kept = Plan.of(plan_for(tmp_path / "three", models, fleet=GPU_FLEET, previous=first))

    def gpus(plan: Plan, name: str) -> list[tuple[int, ...]]:
        model = next(m for m in plan.models if m.name == name)
        return [r.gpu_ids for r in model.profiles[0].replicas]

    assert gpus(Plan.of(first), "small") == [(0,), (1,)]
    assert gpus(fresh, "small") != [(0,), (1,)], "the test should show the GPUs move without --previous"
    assert gpus(kept, "small") == [(0,), (1,)]
    assert gpus(kept, "a-big") == [(2, 3)]


def test_a_cpu_replica_has_no_gpu_ids_key(tmp_path):
    doc = plan_for(tmp_path, {"a.yaml": model_yaml(selector="{}")})
    replica = doc["models"][0]["profiles"][0]["replicas"][0]
    assert "gpu_ids" not in replica and {"endpoint", "node", "port"} <= replica.keys()


def test_a_plan_assembled_from_a_compiled_plans_parts_is_that_plan_byte_for_byte(llmgw, tmp_path):
    # What tests build by hand goes through assemble_plan: it must write what `llmgw plan`
    # writes (keys, their order, absent defaults, the digest), or tests would read plans no
    # compiler makes.
    for target in ((), ("--target", "kubernetes")):
        out = tmp_path / f"plan{len(target)}.json"
        assert llmgw("plan", *target, "--out", out).code == 0
        compiled = read_plan(out)
        again = assemble_plan(compiled.models, compiled.nodes, inputs=compiled.inputs, target=compiled.target)
        assert dump_plan(again.doc) == out.read_text()
        assert again == compiled
