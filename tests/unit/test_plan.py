"""The resolved plan: deterministic, complete, placed, and stable against the previous one."""

from __future__ import annotations

import json
import shutil

import pytest

from llmgw.compiler.build import build_plan
from llmgw.errors import PlanError
from llmgw.plan import dump_plan, parse_plan, plan_digest
from llmgw.schema import validator
from tests.conftest import REPO, write_catalog
from tests.unit.helpers import model_yaml

UNKNOWN_AGENT_FLEET = """\
nodes:
  - name: a-reports
    address: 127.0.0.11
    memory_gb: 64
    engines: [llamacpp]
  - name: b-unknown
    address: 127.0.0.12
    memory_gb: 64
  - name: c-other
    address: 127.0.0.13
    memory_gb: 64
    engines: [vllm]
"""


def plan_for(tmp_path, models, fleet=None, previous=None):
    kwargs = {"fleet": fleet} if fleet else {}
    catalog, fleet_path = write_catalog(tmp_path, models, **kwargs)
    from llmgw.compiler.lint import lint

    # The previous plan as every reader gets it: read back and typed.
    previous = parse_plan(dump_plan(previous)) if previous is not None else None
    result = lint(catalog, fleet_path, previous=previous)
    assert result.counts()[0] == 0, result.findings
    return build_plan(result, previous=previous)


def test_bundled_catalogue_plan_validates_against_the_plan_schema(llmgw, tmp_path):
    out = tmp_path / "plan.json"
    run = llmgw("plan", "catalog", "--fleet", "fleet.yaml", "--out", out)
    assert run.code == 0, run
    plan = json.loads(out.read_text())
    assert list(validator("plan").iter_errors(plan)) == []
    assert plan["digest"] == plan_digest(plan)
    assert len(plan["models"]) == 9


def test_undescribed_model_has_no_description_key_and_none_is_empty(llmgw):
    run = llmgw("plan", "--out", "-")
    plan = json.loads(run.stdout)
    undescribed = [m for m in plan["models"] if "description" not in m]
    assert [m["name"] for m in undescribed] == ["mistral-7b-instruct"]
    assert all(m["description"].strip() for m in plan["models"] if "description" in m)


def test_plan_is_byte_identical_whatever_the_order_of_files_on_disk(llmgw, tmp_path):
    names = sorted(p.name for p in (REPO / "catalog").iterdir())
    outputs = []
    for label, order in (("forward", names), ("backward", names[::-1])):
        root = tmp_path / label
        (root / "catalog").mkdir(parents=True)
        shutil.copy(REPO / "fleet.yaml", root / "fleet.yaml")
        for name in order:  # creation order is what a directory listing tends to follow
            shutil.copy(REPO / "catalog" / name, root / "catalog" / name)
        run = llmgw("plan", "catalog", "--out", "-", cwd=root)
        assert run.code == 0, run
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]


def test_every_default_is_filled_in(tmp_path):
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(selector="{}")})
    [model] = plan["models"]
    assert model["task"] == "chat" and model["aliases"] == [] and model["replicas"] == 1
    [profile] = model["profiles"]
    assert profile["priority"] == 100 and profile["weight"] == 1 and profile["gpus"] == 0
    assert profile["ctx_size"] == 8192 and profile["args"] == []
    assert profile["memory"]["source"] == "estimated" and profile["memory"]["gb"] == 7.4
    assert profile["served_name"] == "llama-3.1-8b"


def test_replicas_of_one_model_go_on_different_nodes(tmp_path):
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(replicas=2)})
    nodes = [r["node"] for r in plan["models"][0]["profiles"][0]["replicas"]]
    assert sorted(nodes) == ["cpu-1", "cpu-2"]


def test_placement_prefers_nodes_reporting_the_engine_then_unknown_then_others(tmp_path):
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(replicas=3, selector="{}")},
                    fleet=UNKNOWN_AGENT_FLEET)
    nodes = [r["node"] for r in plan["models"][0]["profiles"][0]["replicas"]]
    # Spread over the nodes that may run it; never onto one that says it cannot.
    assert nodes == ["a-reports", "b-unknown", "a-reports"]
    assert plan["models"][0]["warnings"] == []


def test_a_node_lacking_the_engine_is_the_last_resort_and_warned_about(tmp_path):
    fleet = UNKNOWN_AGENT_FLEET.replace("memory_gb: 64\n    engines: [llamacpp]",
                                        "memory_gb: 8\n    engines: [llamacpp]")
    fleet = fleet.replace("  - name: b-unknown\n    address: 127.0.0.12\n    memory_gb: 64\n", "")
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(replicas=2, selector="{}")}, fleet=fleet)
    nodes = [r["node"] for r in plan["models"][0]["profiles"][0]["replicas"]]
    assert nodes == ["a-reports", "c-other"]
    [warning] = plan["models"][0]["warnings"]
    assert warning["rule"] == "engine-unavailable" and "placed on c-other" in warning["message"]


def test_previous_replica_leaves_a_node_that_no_longer_reports_its_engine(tmp_path):
    first = plan_for(tmp_path / "one", {"a.yaml": model_yaml(selector="{}")},
                     fleet=UNKNOWN_AGENT_FLEET)
    assert first["models"][0]["profiles"][0]["replicas"][0]["node"] == "a-reports"
    changed = UNKNOWN_AGENT_FLEET.replace("engines: [llamacpp]", "engines: [vllm]")
    second = plan_for(tmp_path / "two", {"a.yaml": model_yaml(selector="{}")}, fleet=changed,
                      previous=first)
    assert second["models"][0]["profiles"][0]["replicas"][0]["node"] == "b-unknown"


def test_endpoints_use_the_node_address_and_its_port_range(tmp_path):
    fleet = UNKNOWN_AGENT_FLEET.replace(
        "    engines: [llamacpp]\n", "    engines: [llamacpp]\n    ports: {first: 9100, last: 9101}\n")
    plan = plan_for(tmp_path, {"a.yaml": model_yaml("a", selector="{}"),
                               "b.yaml": model_yaml("b", selector="{}")}, fleet=fleet)
    endpoints = {r["endpoint"] for m in plan["models"] for r in m["profiles"][0]["replicas"]}
    assert "http://127.0.0.11:9100" in endpoints


def test_external_endpoints_are_routed_not_placed(tmp_path):
    profile = '    endpoints: ["http://127.0.0.51:8000"]\n'
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(profile_extra=profile, weights=None)})
    [profile_out] = plan["models"][0]["profiles"]
    assert profile_out["external"] is True
    assert profile_out["replicas"] == [{"endpoint": "http://127.0.0.51:8000"}]
    assert all(n["used"]["replicas"] == 0 for n in plan["nodes"])


def test_profiles_are_in_routing_order(tmp_path):
    text = model_yaml(profile_extra="    priority: 200\n") + (
        "  - name: first\n    engine: llamacpp\n    priority: 10\n    node_selector: {pool: cpu}\n")
    plan = plan_for(tmp_path, {"a.yaml": text})
    assert [p["name"] for p in plan["models"][0]["profiles"]] == ["first", "main"]


def test_previous_plan_keeps_replicas_where_they_were(tmp_path):
    models = {f"m{i}.yaml": model_yaml(f"m{i}", selector="{}") for i in range(6)}
    first = plan_for(tmp_path / "one", models, fleet=UNKNOWN_AGENT_FLEET)
    # A small edit: one more model, added before the others alphabetically.
    models["a.yaml"] = model_yaml("a-new", selector="{}")
    fresh = plan_for(tmp_path / "two", models, fleet=UNKNOWN_AGENT_FLEET)
    kept = plan_for(tmp_path / "three", models, fleet=UNKNOWN_AGENT_FLEET, previous=first)

    def where(plan):
        return {m["name"]: m["profiles"][0]["replicas"][0]["endpoint"] for m in plan["models"]}

    before, after = where(first), where(kept)
    assert all(after[name] == endpoint for name, endpoint in before.items())
    assert where(fresh) != after, "the test should show a reshuffle without --previous"
    assert kept["inputs"]["previous"] == first["digest"]


def test_previous_placement_that_no_longer_fits_moves(tmp_path):
    first = plan_for(tmp_path / "one", {"a.yaml": model_yaml(selector="{}")},
                     fleet=UNKNOWN_AGENT_FLEET)
    was = first["models"][0]["profiles"][0]["replicas"][0]["node"]
    shrunk = UNKNOWN_AGENT_FLEET.replace("memory_gb: 64\n    engines: [llamacpp]",
                                         "memory_gb: 4\n    engines: [llamacpp]")
    second = plan_for(tmp_path / "two", {"a.yaml": model_yaml(selector="{}")}, fleet=shrunk,
                      previous=first)
    assert was == "a-reports"
    assert second["models"][0]["profiles"][0]["replicas"][0]["node"] != was


def test_an_edited_plan_is_refused_with_its_digest_mismatch(tmp_path):
    plan = plan_for(tmp_path, {"a.yaml": model_yaml()})
    plan["models"][0]["context_length"] = 999_999
    with pytest.raises(PlanError, match="edited after"):
        parse_plan(dump_plan(plan))


def test_plan_carries_the_warnings_that_applied_to_each_model(tmp_path):
    fleet = "nodes:\n  - {name: n1, address: 127.0.0.11, memory_gb: 64, engines: [vllm]}\n"
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(selector="{}")}, fleet=fleet)
    [model] = plan["models"]
    assert [w["rule"] for w in model["warnings"]] == ["engine-unavailable"]
    assert model["profiles"][0]["replicas"][0]["node"] == "n1"  # a warning is not a refusal


def test_known_architecture_adds_the_kv_cache_for_ctx_size(tmp_path):
    arch = "architecture: {layers: 32, kv_heads: 8, head_dim: 128}\n"
    plan = plan_for(tmp_path, {"a.yaml": model_yaml(extra=arch, selector="{}",
                                                    profile_extra="    ctx_size: 65536\n")})
    memory = plan["models"][0]["profiles"][0]["memory"]
    # 2 × 32 layers × 8 heads × 128 × 2 bytes × 65,536 tokens = 8.6 GB of KV cache.
    assert "KV cache 8.6 GB for ctx_size 65536" in memory["basis"]
    assert memory["gb"] == 14.6  # 4.92 weights + 8.59 KV + 1.0 buffers = 14.51, rounded up


def test_plan_records_every_file_it_was_made_from(tmp_path):
    plan = plan_for(tmp_path, {"b.yaml": model_yaml("b"), "a.yaml": model_yaml("a")})
    files = plan["inputs"]["files"]
    assert [f["path"].rsplit("/", 1)[-1] for f in files] == ["a.yaml", "b.yaml"]
    assert all(len(f["sha256"]) == 64 for f in files)
    assert plan["inputs"]["fleet"]["path"].endswith("fleet.yaml")


def test_previous_replica_on_a_node_lacking_the_engine_stays_when_the_others_are_full(tmp_path):
    fleet = ("nodes:\n  - {name: able, address: 127.0.0.11, memory_gb: 8, engines: [llamacpp]}\n"
             "  - {name: d, address: 127.0.0.12, memory_gb: 64, engines: [vllm]}\n"
             "  - {name: e, address: 127.0.0.13, memory_gb: 64, engines: [vllm]}\n")
    models = {"a.yaml": model_yaml(replicas=3, selector="{}")}
    first = plan_for(tmp_path / "one", models, fleet=fleet)
    again = plan_for(tmp_path / "two", models, fleet=fleet, previous=first)

    def where(plan):
        return [r["endpoint"] for r in plan["models"][0]["profiles"][0]["replicas"]]

    assert where(again) == where(first)


def test_a_rerank_model_is_planned_least_loaded_and_llama_server_is_told_to_rerank(tmp_path):
    from llmgw.engines import engine_command

    doc = plan_for(tmp_path, {"ranker.yaml": model_yaml("ranker", extra="task: rerank\n")})
    validator("plan").validate(doc)
    [ranker] = parse_plan(dump_plan(doc)).models
    assert ranker.task == "rerank"
    [profile] = ranker.profiles
    assert profile.routing == "least-loaded", "a rerank has no prompt prefix for an engine to reuse"
    argv = engine_command(ranker, profile, profile.replicas[0], weights="/w/r.gguf", host="0.0.0.0").argv
    assert argv.count("--reranking") == 1, "without it llama-server answers 501 to every /v1/rerank"
    assert "--embeddings" not in argv


def test_reverting_a_change_gives_back_the_first_plans_digest(tmp_path) -> None:
    """A plan made over another records its digest (inputs.previous), which the digest leaves
    out: the digest moves only when what the plan serves moves."""
    from llmgw.compiler.build import build_plan
    from llmgw.compiler.lint import lint
    from llmgw.plan import parse_plan
    from tests.conftest import write_catalog
    from tests.unit.helpers import model_yaml

    catalog, fleet = write_catalog(tmp_path, {"m.yaml": model_yaml()})
    first = parse_plan(dump_plan(build_plan(lint(catalog, fleet))))
    (catalog / "m.yaml").write_text(model_yaml(extra="description: now described\\n"))
    changed = parse_plan(dump_plan(build_plan(lint(catalog, fleet, previous=first), previous=first)))
    (catalog / "m.yaml").write_text(model_yaml())
    reverted = parse_plan(dump_plan(build_plan(lint(catalog, fleet, previous=changed), previous=changed)))
    assert changed.digest != first.digest
    assert reverted.inputs.previous == changed.digest
    assert reverted.digest == first.digest
