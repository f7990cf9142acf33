"""One behaviour per rule, as a person editing the catalogue would meet it."""

from __future__ import annotations

from tests.unit.gguf_files import write_gguf
from tests.unit.helpers import by_rule, model_yaml, run

NO_ENGINE_FLEET = """\
nodes:
  - name: cpu-1
    address: 127.0.0.11
    memory_gb: 64
    labels: {pool: cpu}
    engines: [llamacpp]
"""


def test_two_models_with_one_name_is_an_error_naming_both_files(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml("same"), "b.yaml": model_yaml("same")})
    [finding] = by_rule(result, "duplicate-name")
    assert finding.file.endswith("b.yaml") and "a.yaml" in finding.message
    assert finding.line == 1


def test_alias_that_is_another_models_name_collides(tmp_path):
    result = run(tmp_path, {
        "a.yaml": model_yaml("llama"),
        "b.yaml": model_yaml("mistral", extra="aliases: [fast, llama]\n"),
    })
    [finding] = by_rule(result, "alias-collision")
    assert finding.file.endswith("b.yaml") and "a.yaml" in finding.message
    assert finding.line == 6


def test_one_shard_of_a_gguf_is_refused_saying_what_to_serve(tmp_path):
    src = "hf://org/Llama-70B-GGUF/Llama-70B-Q4_K_M-00001-of-00002.gguf"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src)})
    [finding] = by_rule(result, "sharded-source")
    assert finding.line == 2 and finding.severity == "error"
    assert "1 of 2" in finding.message and "exactly one source" in finding.message
    assert "single-file build" in finding.message and "hf://org/Llama-70B-GGUF" in finding.message


def test_one_safetensors_shard_is_refused(tmp_path):
    src = "hf://meta-llama/Llama-3.1-8B/model-00001-of-00004.safetensors"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src, engine="vllm", selector="{pool: gpu}")})
    assert by_rule(result, "sharded-source")


def test_local_directory_of_several_weight_files_is_refused(tmp_path):
    weights = tmp_path / "catalog" / "weights"
    weights.mkdir(parents=True)
    for i in (1, 2):
        (weights / f"model-part{i}.safetensors").write_bytes(b"x")
    result = run(tmp_path, {"a.yaml": model_yaml(source="weights", engine="vllm",
                                                  selector="{pool: gpu}")})
    [finding] = by_rule(result, "sharded-source")
    assert "directory holding 2 weight files" in finding.message


def test_repository_id_given_to_vllm_is_fine(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct",
                                                  engine="vllm", selector="{pool: gpu}")})
    assert result.findings == []


def test_a_file_type_nothing_reads_is_an_error(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://o/r/model.pt")})
    [finding] = by_rule(result, "unreadable-format")
    assert ".pt" in finding.message


def test_gguf_on_vllm_is_an_engine_mismatch_at_the_engine(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(engine="vllm", selector="{pool: gpu}")})
    [finding] = by_rule(result, "engine-mismatch")
    assert finding.line == 8 and "llamacpp" in finding.message


def test_engine_nobody_reports_is_a_warning_not_a_refusal(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct",
                                                  engine="vllm", selector="{}",
                                                  profile_extra="    gpus: 0\n")},
                 fleet=NO_ENGINE_FLEET)
    [finding] = by_rule(result, "engine-unavailable")
    assert finding.severity == "warning"
    assert result.counts() == (0, 1)


def test_missing_gpu_engine_suggests_a_gguf_build_on_cpu(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct",
                                                  engine="vllm", selector="{}")},
                 fleet=NO_ENGINE_FLEET)
    [finding] = by_rule(result, "engine-unavailable")
    assert "GGUF build" in finding.message and "CPU nodes" in finding.message


def test_node_reporting_nothing_is_unknown_not_none(tmp_path):
    fleet = NO_ENGINE_FLEET.replace("    engines: [llamacpp]\n", "")
    result = run(tmp_path, {"a.yaml": model_yaml(selector="{}")}, fleet=fleet)
    assert not by_rule(result, "engine-unavailable")


def test_selector_matching_no_node_is_an_error_listing_labels(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(selector="{pool: cpuu}")})
    [finding] = by_rule(result, "selector-matches-nothing")
    assert finding.severity == "error" and finding.line == 9
    assert "pool=cpu" in finding.message
    assert not by_rule(result, "placement")


def test_memory_estimate_over_the_largest_node_warns_with_both_figures(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(weights=60_000_000_000)})
    [finding] = by_rule(result, "memory-fit")
    assert finding.severity == "warning"
    assert "90 GB" in finding.message and "64 GB" in finding.message and "cpu-" in finding.message


def test_unknown_weights_size_without_min_memory_is_an_error(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(weights=None)})
    [finding] = by_rule(result, "memory-unknown")
    assert "weights_bytes" in finding.message and "min_memory_gb" in finding.message


def test_written_min_memory_is_used_instead_of_the_estimate(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(weights=None,
                                                  profile_extra="    min_memory_gb: 12\n")})
    assert result.findings == []
    entry = result.entries[0]
    memory = entry.memory(entry.spec.profiles[0])
    assert memory is not None and (memory.gb, memory.source) == (12, "declared")


def test_local_file_size_is_read_from_disk(tmp_path):
    (tmp_path / "catalog").mkdir()
    tiny = write_gguf(tmp_path / "catalog" / "tiny.gguf", context=8192)
    result = run(tmp_path, {"a.yaml": model_yaml(source="tiny.gguf", weights=None)})
    assert result.findings == []
    assert result.entries[0].weights_bytes == tiny.stat().st_size


def test_llamacpp_pool_too_small_for_its_slots_is_an_error(tmp_path):
    profile = '    ctx_size: 16384\n    args: [--parallel, "4"]\n'
    result = run(tmp_path, {"a.yaml": model_yaml(profile_extra=profile)})
    [finding] = by_rule(result, "context-pool")
    assert "4096" in finding.message and "32768" in finding.message


def test_max_output_beyond_context_is_an_error(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(extra="max_output: 9000\n")})
    assert by_rule(result, "limits")


def test_too_many_replicas_for_the_nodes_is_a_placement_error_saying_why(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(replicas=3, weights=40_000_000_000)})
    [finding] = by_rule(result, "placement")
    assert "2 of 3 replica(s)" in finding.message
    assert "too few eligible nodes" in finding.message
    assert finding.line == 5  # at `replicas:`


def test_replica_too_big_for_every_node_says_write_min_memory(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(weights=60_000_000_000)})
    [finding] = by_rule(result, "placement")
    assert "too big for every eligible node" in finding.message
    assert "min_memory_gb" in finding.message


def test_two_profiles_with_one_name_is_an_error_at_the_second(tmp_path):
    text = model_yaml() + "  - name: main\n    engine: llamacpp\n    node_selector: {pool: gpu}\n"
    result = run(tmp_path, {"a.yaml": text})
    [finding] = by_rule(result, "duplicate-profile")
    assert finding.line == 10 and "appears twice" in finding.message


def test_a_source_naming_no_file_type_is_unreadable(tmp_path):
    for i, source in enumerate(["hf://org/repo/model", "https://127.0.0.1/download?id=3"]):
        result = run(tmp_path / str(i), {"a.yaml": model_yaml(source=source)})
        [finding] = by_rule(result, "unreadable-format")
        assert "names no file type" in finding.message and "hf://org/repo" in finding.message


def test_running_out_of_ports_is_said_as_such(tmp_path):
    fleet = "nodes:\n  - {name: n1, address: 127.0.0.11, memory_gb: 64, ports: {first: 8001, last: 8001}}\n"
    result = run(tmp_path, {"a.yaml": model_yaml("a", selector="{}"),
                            "b.yaml": model_yaml("b", selector="{}")}, fleet=fleet)
    [finding] = by_rule(result, "placement")
    assert "no ports left in their port ranges" in finding.message


def test_gpu_placement_in_a_gpu_less_fleet_suggests_a_gguf_build(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct",
                                                  engine="vllm", selector="{}")},
                 fleet=NO_ENGINE_FLEET)
    [finding] = by_rule(result, "placement")
    assert "have none" in finding.message and "a GGUF build" in finding.message
