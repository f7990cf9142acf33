"""One behaviour per rule, as a person editing the catalogue would meet it."""

from __future__ import annotations

import re

from llmgw.compiler.build import build_plan
from llmgw.compiler.lint import lint
from llmgw.plan import dump_plan, parse_plan
from tests.conftest import SMALL_FLEET, write_catalog
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


def test_two_models_with_one_name_is_an_error_on_each_file_naming_the_other(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml("same"), "b.yaml": model_yaml("same")})
    a, b = by_rule(result, "duplicate-name")
    assert a.file.endswith("a.yaml") and "b.yaml" in a.message
    assert b.file.endswith("b.yaml") and "a.yaml" in b.message
    assert a.line == b.line == 1


def test_alias_that_is_another_models_name_collides_on_both_files(tmp_path):
    result = run(tmp_path, {
        "a.yaml": model_yaml("llama"),
        "b.yaml": model_yaml("mistral", extra="aliases: [fast, llama]\n"),
    })
    a, b = by_rule(result, "alias-collision")
    assert a.file.endswith("a.yaml") and a.line == 1
    assert "also an alias of the model in" in a.message and "b.yaml (mistral)" in a.message
    assert b.file.endswith("b.yaml") and b.line == 6 and "a.yaml" in b.message


def _plan_of(tmp_path, models, fleet=SMALL_FLEET):
    """The plan of `models` as the base branch had them, for --previous; the head is then
    written over the same folder, so the paths the plan recorded are the head's."""
    base = run(tmp_path, models, fleet)
    assert not base.counts()[0], base.findings
    for written in (tmp_path / "catalog").iterdir():
        written.unlink()
    return parse_plan(dump_plan(build_plan(base)))  # as --previous reads it


def test_with_a_previous_plan_a_clash_is_reported_on_the_new_file_only(tmp_path):
    before = {"llama.yaml": model_yaml("llama"), "big.yaml": model_yaml("big", extra="aliases: [smart]\n")}
    previous = _plan_of(tmp_path, before)
    added = {**before, "00-new.yaml": model_yaml("llama", extra="aliases: [smart]\n")}
    catalog, fleet = write_catalog(tmp_path, added)
    findings = lint(catalog, fleet, previous=previous).findings
    assert {(f.file.rsplit("/", 1)[-1], f.rule) for f in findings} == {
        ("00-new.yaml", "duplicate-name"), ("00-new.yaml", "alias-collision")}, findings
    assert all("is already" in f.message for f in findings)


def test_with_a_previous_plan_an_edited_file_is_blamed_not_the_untouched_one(tmp_path):
    before = {"a.yaml": model_yaml("a"), "b.yaml": model_yaml("b")}
    previous = _plan_of(tmp_path, before)
    catalog, fleet = write_catalog(tmp_path, {**before, "b.yaml": model_yaml("a")})
    [finding] = by_rule(lint(catalog, fleet, previous=previous), "duplicate-name")
    assert finding.file.endswith("b.yaml") and "a.yaml" in finding.message


def test_a_model_that_lost_its_node_keeps_room_before_one_being_added(tmp_path):
    gpu = "memory_gb: 64, gpus: {count: 1, memory_gb: 48}, labels: {pool: gpu}"
    two = ("nodes:\n"
           f"  - {{name: g1, address: 127.0.0.21, {gpu}}}\n"
           f"  - {{name: g2, address: 127.0.0.22, {gpu}}}\n")
    vllm = {"engine": "vllm", "selector": "{pool: gpu}", "profile_extra": "    gpus: 1\n"}
    before = {"old.yaml": model_yaml("old", source="hf://o/old", weights=10_000_000_000, **vllm)}
    previous = _plan_of(tmp_path, before, two)
    # g1, where `old` ran, is retired in the same pull request that adds a larger model:
    # placed from scratch the larger one would take g2 and blame a file nobody touched.
    one = "nodes:\n" + two.split("\n")[2] + "\n"
    head = {**before, "new.yaml": model_yaml("new", source="hf://o/new", weights=25_000_000_000, **vllm)}
    catalog, fleet = write_catalog(tmp_path, head, one)
    result = lint(catalog, fleet, previous=previous)
    assert {f.file.rsplit("/", 1)[-1] for f in by_rule(result, "placement")} == {"new.yaml"}, result.findings


def test_one_shard_of_a_gguf_is_refused_saying_what_to_serve(tmp_path):
    src = "hf://org/Llama-70B-GGUF/Llama-70B-Q4_K_M-00001-of-00002.gguf"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src)})
    [finding] = by_rule(result, "sharded-source")
    assert finding.line == 2 and finding.severity == "error"
    assert "1 of 2" in finding.message and "exactly one source" in finding.message
    assert "single-file build" in finding.message and "hf://org/Llama-70B-GGUF" in finding.message
    assert "hf://org/Llama-70B-GGUF for vllm" not in finding.message, "vllm reads no GGUF"


def test_the_sharded_gguf_hint_followed_lints_clean(tmp_path):
    # "a quantisation from <repo> that is one .gguf file, with engine llamacpp"
    src = "hf://org/Llama-70B-GGUF/Llama-70B-Q4_K_M-00001-of-00002.gguf"
    [finding] = by_rule(run(tmp_path, {"a.yaml": model_yaml(source=src)}), "sharded-source")
    repo = _advised_repository(finding.message)
    followed = model_yaml(source=f"{repo}/Llama-70B-Q2_K.gguf", weights=20_000_000_000)
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_the_sharded_gguf_hint_for_vllm_followed_lints_clean(tmp_path):
    # "for vllm, point source at the model's safetensors repository"
    src = "hf://org/Llama-70B-GGUF/Llama-70B-Q4_K_M-00001-of-00002.gguf"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src, engine="vllm", selector="{pool: gpu}")})
    [finding] = by_rule(result, "sharded-source")
    assert "safetensors repository" in finding.message
    followed = model_yaml(source="hf://org/Llama-70B", engine="vllm", selector="{pool: gpu}")
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_one_safetensors_shard_is_refused_and_its_hint_followed_lints_clean(tmp_path):
    src = "hf://meta-llama/Llama-3.1-8B/model-00001-of-00004.safetensors"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src, engine="vllm", selector="{pool: gpu}")})
    [finding] = by_rule(result, "sharded-source")
    repo = _advised_repository(finding.message)
    assert repo == "hf://meta-llama/Llama-3.1-8B" and "engine vllm" in finding.message
    followed = model_yaml(source=repo, engine="vllm", selector="{pool: gpu}")
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_a_gguf_repository_given_to_vllm_is_an_engine_mismatch(tmp_path):
    src = "hf://bartowski/Llama-3.1-70B-GGUF"
    result = run(tmp_path, {"a.yaml": model_yaml(source=src, engine="vllm", selector="{pool: gpu}")})
    [finding] = by_rule(result, "engine-mismatch")
    assert "is a GGUF repository" in finding.message and "vllm does not read GGUF" in finding.message
    # Followed: engine llamacpp with one .gguf file from it.
    followed = model_yaml(source=f"{src}/Llama-3.1-70B-Q2_K.gguf", weights=20_000_000_000)
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_a_gguf_repository_given_to_llamacpp_is_not_sent_to_vllm(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://bartowski/Llama-3.1-8B-GGUF")})
    [finding] = by_rule(result, "engine-mismatch")
    assert "Name the file (hf://bartowski/Llama-3.1-8B-GGUF/<name>.gguf)" in finding.message
    assert "vllm" not in finding.message


def test_a_repository_given_to_llamacpp_hint_followed_lints_clean(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct", selector="{}")})
    [finding] = by_rule(result, "engine-mismatch")
    assert "or use engine vllm" in finding.message
    followed = model_yaml(source="hf://Qwen/Qwen2.5-7B-Instruct", engine="vllm", selector="{}")
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_a_local_source_that_is_not_there_is_a_warning_not_advice_to_write_its_size(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="weights/tiny.ggfu.gguf", weights=None)})
    [missing] = by_rule(result, "source-missing")
    assert missing.severity == "warning" and missing.line == 2
    assert "weights/tiny.ggfu.gguf" in missing.message and "does not exist on this machine" in missing.message
    [unknown] = by_rule(result, "memory-unknown")
    assert unknown.message.index("Fix the path") < unknown.message.index("weights_bytes")


def test_a_local_source_that_is_not_there_with_its_size_written_is_only_a_warning(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(source="/srv/models/tiny.gguf")})
    assert [(f.rule, f.severity) for f in result.findings] == [("source-missing", "warning")]


def _advised_repository(message: str) -> str:
    """The repository id a hint names, placeholders (hf://org/repo) aside."""
    [repo] = [r for r in re.findall(r"hf://[\w.-]+/[\w.-]+(?=[ )])", message) if r != "hf://org/repo"]
    return repo


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


def test_memory_estimate_over_the_largest_node_is_one_error_with_both_figures(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(weights=60_000_000_000)})
    [finding] = by_rule(result, "placement")
    assert finding.severity == "error"
    assert "90 GB (weights 60.0 GB" in finding.message, "the figure and how it was reached"
    assert "64 GB" in finding.message and "cpu-" in finding.message, "and the largest node's room"
    assert [f.rule for f in result.findings] == ["placement"], "the shortage is reported once"


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


def test_placement_settings_on_a_profile_with_endpoints_are_warned_as_doing_nothing(tmp_path):
    external = ('    endpoints: ["http://127.0.0.51:8000"]\n    gpus: 2\n    min_memory_gb: 40\n'
                "    replicas: 3\n")
    result = run(tmp_path, {"a.yaml": model_yaml(profile_extra=external, weights=None)})
    ignored = by_rule(result, "ignored-setting")
    on_profile = [f for f in ignored if f.message.startswith("profile main has endpoints")]
    keys = sorted(f.message.split(" does nothing")[0].rsplit(" ", 1)[-1] for f in on_profile)
    assert keys == ["gpus", "min_memory_gb", "node_selector", "replicas"], ignored
    assert all(f.severity == "warning" for f in ignored)
    assert any(f.line == 4 and "every profile of this model" in f.message for f in ignored), ignored
    # Followed: remove them, and lint says nothing.
    followed = ("name: a\nsource: hf://o/r/a.gguf\ncontext_length: 8192\nprofiles:\n"
                '  - name: main\n    engine: llamacpp\n    endpoints: ["http://127.0.0.51:8000"]\n')
    assert run(tmp_path, {"a.yaml": followed}).findings == []


def test_memory_fit_on_gpus_says_how_many_cards_of_what_size(tmp_path):
    vllm = {"source": "hf://o/big", "engine": "vllm", "selector": "{pool: gpu}"}
    one = run(tmp_path, {"a.yaml": model_yaml(weights=100_000_000_000, **vllm)})
    [finding] = by_rule(one, "placement")
    assert "gpu-1, gives it 80 GB: 1 of its 2 GPUs of 80 GB each, as the profile asks for 1" \
        in finding.message
    two_gpus = "    gpus: 2\n"
    two = run(tmp_path, {"a.yaml": model_yaml(weights=150_000_000_000, profile_extra=two_gpus, **vllm)})
    [finding] = by_rule(two, "placement")
    assert "gpu-1, gives it 160 GB: its 2 GPUs of 80 GB each" in finding.message, finding.message


def test_gpus_all_taken_names_the_replicas_that_hold_them(tmp_path):
    vllm = {"engine": "vllm", "selector": "{pool: gpu}", "weights": 2_000_000}
    result = run(tmp_path, {
        "a.yaml": model_yaml("big", source="hf://o/big", profile_extra="    gpus: 2\n", **vllm),
        "b.yaml": model_yaml("tiny", source="hf://o/tiny", **vllm),
    })
    [finding] = by_rule(result, "placement")
    assert "too few free GPUs for one asking for 1" in finding.message, finding.message
    assert "gpu-1 has 0 of 2 free, held by big (2 GPUs)" in finding.message, finding.message


def test_a_source_symlinked_out_of_the_catalogue_is_not_read_nor_its_kind_named(tmp_path):
    secret = tmp_path / "secret.conf"
    secret.write_text("root:x:0:0:hunter2\n")
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "weights.gguf").symlink_to(secret)
    (catalog / "folder").symlink_to(tmp_path)
    result = run(tmp_path, {
        "a.yaml": model_yaml("a", source="weights.gguf", weights=None),
        "b.yaml": model_yaml("b", source="folder/secret.conf", weights=None),
    })
    outside = by_rule(result, "source-outside")
    assert [f.file.rsplit("/", 1)[-1] for f in outside] == ["a.yaml", "b.yaml"], result.findings
    said = "\n".join(f.message for f in result.findings)
    assert "root" not in said and "hunter2" not in said, "lint's output quoted the linked file"
    assert ".conf" not in said.replace("folder/secret.conf", ""), "the target's file type was named"
    assert not by_rule(result, "gguf-header") and not by_rule(result, "unreadable-format")


def test_a_weights_file_linked_into_the_catalogue_is_read(tmp_path):
    # The README's example links the assembled GGUF in; so do people whose weights live in the
    # hub's cache or on a models disk.
    write_gguf(tmp_path / "elsewhere.gguf", "gemma3", layers=6, window=512)
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "m.gguf").symlink_to(tmp_path / "elsewhere.gguf")
    result = run(tmp_path, {"m.yaml": model_yaml("m", source="m.gguf", weights=None)})
    assert not by_rule(result, "source-outside"), result.findings
    [entry] = result.entries
    assert entry.weights_bytes == (tmp_path / "elsewhere.gguf").stat().st_size


def test_a_gguf_missing_behind_a_linked_folder_is_missing_not_outside(tmp_path):
    # The weights live on a models disk linked in as a folder, and this one is not written yet.
    (tmp_path / "disk").mkdir()
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "models").symlink_to(tmp_path / "disk")
    result = run(tmp_path, {"m.yaml": model_yaml("m", source="models/m.gguf", weights=None)})
    assert not by_rule(result, "source-outside"), result.findings
    [missing] = by_rule(result, "source-missing")
    assert "models/m.gguf" in missing.message and "does not exist" in missing.message


def test_a_source_written_outside_the_catalogue_is_read_as_before(tmp_path):
    write_gguf(tmp_path / "m.gguf", "gemma3", layers=6, window=512)
    result = run(tmp_path, {"m.yaml": model_yaml("m", source="../m.gguf", weights=None)})
    assert not by_rule(result, "source-outside")
    [entry] = result.entries
    assert entry.weights_bytes, "the reviewer sees ../ in the file: it is read"
