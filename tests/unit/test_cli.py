"""`llmgw lint` and `llmgw plan` as a person or a CI job runs them: output and exit codes."""

from __future__ import annotations

import json

from tests.conftest import write_catalog
from tests.unit.helpers import model_yaml

SHARD = "hf://org/r/model-00001-of-00002.gguf"


def test_bundled_catalogue_lints_clean(llmgw):
    run = llmgw("lint")
    assert run.code == 0, run
    assert run.stdout == ""
    assert "9 model file(s) checked: no findings." in run.stderr


def test_errors_exit_1_and_print_like_a_compiler(llmgw, tmp_path):
    catalog, fleet = write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    run = llmgw("lint", "catalog", "--fleet", "fleet.yaml", cwd=tmp_path)
    assert run.code == 1, run
    assert run.stdout.startswith("catalog/x.yaml:2:9: error[sharded-source] ")
    assert "1 error(s), 0 warning(s)" in run.stderr


def test_warnings_pass_unless_strict(llmgw, tmp_path):
    fleet = "nodes:\n  - {name: n1, address: 127.0.0.11, memory_gb: 64, engines: [vllm]}\n"
    write_catalog(tmp_path, {"x.yaml": model_yaml(selector="{}")}, fleet)
    assert llmgw("lint", cwd=tmp_path).code == 0
    strict = llmgw("lint", "--strict", cwd=tmp_path)
    assert strict.code == 1, strict
    assert "warning[engine-unavailable]" in strict.stdout


def test_missing_catalogue_directory_exits_2_with_a_sentence(llmgw, tmp_path):
    run = llmgw("lint", "nowhere", cwd=tmp_path)
    assert run.code == 2
    assert "catalogue directory nowhere does not exist" in run.stderr
    assert "Traceback" not in run.stderr


def test_unreadable_fleet_exits_2_naming_the_position(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()}, "nodes:\n  - name: n1\n    memory_gb: [\n")
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 2, run
    assert "fleet.yaml:" in run.stderr and "Traceback" not in run.stderr


def test_fleet_missing_a_required_field_exits_2(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()}, "nodes:\n  - {name: n1, memory_gb: 8}\n")
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 2, run
    assert "missing required field 'address'" in run.stderr


def test_json_format_lists_findings_with_counts(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    run = llmgw("lint", "--format", "json", cwd=tmp_path)
    doc = json.loads(run.stdout)
    assert doc["format_version"] == "1" and doc["errors"] == 1 and doc["warnings"] == 0
    [finding] = doc["findings"]
    assert set(finding) == {"severity", "rule", "file", "line", "column", "message"}
    assert (finding["rule"], finding["line"], finding["column"]) == ("sharded-source", 2, 9)


def test_github_format_is_workflow_commands(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    run = llmgw("lint", "--format", "github", cwd=tmp_path)
    assert run.stdout.startswith(
        "::error file=catalog/x.yaml,line=2,col=9,title=sharded-source::source names one shard")


def test_no_colour_when_not_a_terminal(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    assert "\033[" not in llmgw("lint", cwd=tmp_path).stdout


def test_plan_with_errors_writes_nothing_and_exits_1(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    run = llmgw("plan", cwd=tmp_path)
    assert run.code == 1, run
    assert not (tmp_path / "plan.json").exists()
    assert "error[sharded-source]" in run.stderr and "No plan written." in run.stderr


def test_plan_refuses_a_broken_previous_plan_with_a_sentence(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    (tmp_path / "old.json").write_text("{not json")
    run = llmgw("plan", "--previous", "old.json", cwd=tmp_path)
    assert run.code == 2, run
    assert "old.json is not valid JSON" in run.stderr and "Traceback" not in run.stderr
