"""`llmgw lint` and `llmgw plan` as a person or a CI job runs them: output and exit codes."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from tests.conftest import run_llmgw_process, write_catalog
from tests.unit.helpers import model_yaml

SHARD = "hf://org/r/model-00001-of-00002.gguf"


def test_bundled_catalogue_lints_clean():
    # End to end, as CI's workflow runs it: `python -m llmgw` in a process of its own.
    run = run_llmgw_process("lint")
    assert run.code == 0, run
    assert run.stdout == ""
    assert "9 model file(s) checked: no findings." in run.stderr


def test_errors_exit_1_and_print_like_a_compiler(tmp_path):
    catalog, fleet = write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    run = run_llmgw_process("lint", "catalog", "--fleet", "fleet.yaml", cwd=tmp_path)
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
        "::error file=catalog/x.yaml,line=2,col=9,title=sharded-source::source names one shard"
    )


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


def test_an_empty_previous_plan_means_none_for_plan_and_lint_as_for_diff(llmgw, tmp_path):
    # The first deploy has no deployed plan; the workflows pass an empty file for it.
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    (tmp_path / "none.json").write_text("")
    assert llmgw("plan", "--previous", "none.json", cwd=tmp_path).code == 0
    lint = llmgw("lint", "--previous", "none.json", cwd=tmp_path)
    assert lint.code == 0, lint
    assert "previous" not in json.loads((tmp_path / "plan.json").read_text())["inputs"]


def test_fleet_nodes_sharing_an_address_and_ports_exit_2(llmgw, tmp_path):
    fleet = (
        "nodes:\n  - {name: a, address: 127.0.0.1, memory_gb: 8}\n"
        "  - {name: b, address: 127.0.0.1, memory_gb: 8}\n"
    )
    write_catalog(tmp_path, {"x.yaml": model_yaml(selector="{}")}, fleet)
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 2, run
    assert "fleet.yaml:3:" in run.stderr and "has the address 127.0.0.1 of node 'a'" in run.stderr


def test_fleet_nodes_sharing_an_address_with_disjoint_ports_are_fine(llmgw, tmp_path):
    fleet = (
        "nodes:\n  - {name: a, address: 127.0.0.1, memory_gb: 8, ports: {first: 8001, last: 8049}}\n"
        "  - {name: b, address: 127.0.0.1, memory_gb: 8, ports: {first: 8050, last: 8099}}\n"
    )
    write_catalog(tmp_path, {"x.yaml": model_yaml(selector="{}", replicas=2, weights=10**9)}, fleet)
    run = llmgw("plan", "--out", "-", cwd=tmp_path)
    assert run.code == 0, run
    assert "127.0.0.1:8001" in run.stdout and "127.0.0.1:8050" in run.stdout


def test_plan_to_a_missing_folder_exits_2_and_leaves_nothing_behind(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    run = llmgw("plan", "--out", "nowhere/plan.json", cwd=tmp_path)
    assert run.code == 2, run
    assert "cannot write the plan to nowhere/plan.json" in run.stderr and "Traceback" not in run.stderr
    (tmp_path / "adir").mkdir()
    run = llmgw("plan", "--out", "adir", cwd=tmp_path)
    assert run.code == 2, run
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_plan_out_through_a_link_to_dev_null_leaves_the_link_and_the_device(llmgw, tmp_path):
    # A rename over the target once turned /dev/null into a regular file; the real
    # /dev/null is never the target here, a link to it is.
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    (tmp_path / "null").symlink_to("/dev/null")
    run = llmgw("plan", "--out", "null", cwd=tmp_path)
    assert run.code == 0, run
    assert (tmp_path / "null").is_symlink(), "the link was replaced by a regular file"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_plan_out_to_a_fifo_writes_into_it_and_leaves_it_a_fifo(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    fifo = tmp_path / "plan.pipe"
    os.mkfifo(fifo)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    run = llmgw("plan", "--out", "plan.pipe", cwd=tmp_path)
    reader.join(timeout=30)
    assert run.code == 0, run
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert json.loads(read[0])["models"][0]["name"] == "llama-3.1-8b"


def test_plan_out_through_a_link_to_a_plan_updates_that_plan(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "live.json").write_text("old")
    (tmp_path / "plan.json").symlink_to("plans/live.json")
    run = llmgw("plan", "--out", "plan.json", cwd=tmp_path)
    assert run.code == 0, run
    assert (tmp_path / "plan.json").is_symlink()
    assert json.loads((tmp_path / "plans" / "live.json").read_text())["format_version"] == "1"
    assert [p.name for p in (tmp_path / "plans").iterdir()] == ["live.json"], "no temporary left"


def test_fleet_given_as_a_directory_says_so(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    run = llmgw("lint", "--fleet", "catalog", cwd=tmp_path)
    assert run.code == 2 and "fleet inventory catalog is a directory" in run.stderr


def test_symlink_out_of_the_catalogue_is_not_read(llmgw, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:hunter2:0:0\n")
    write_catalog(tmp_path, {"x.yaml": model_yaml()})
    (tmp_path / "catalog" / "leak.yaml").symlink_to(secret)
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 1, run
    assert "hunter2" not in run.stdout + run.stderr
    assert "catalog/leak.yaml:1:1: error[yaml] this is a symlink to a file outside catalog/" in run.stdout


def test_a_file_that_is_not_a_model_is_not_echoed_back_line_by_line(llmgw, tmp_path):
    key = "a-very-long-key-that-goes-on-and-on-and-on-and-on-forever"
    write_catalog(tmp_path, {"x.yaml": f"{key}: 1\n"})
    run = llmgw("lint", cwd=tmp_path)
    assert f"unknown field '{key[:40]}…'" in run.stdout, run
    assert key not in run.stdout


def _lint_on_a_terminal(tmp_path, **env: str) -> str:
    import os
    import pty
    import subprocess
    import sys

    from tests.conftest import llmgw_env

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "lint"],
        cwd=tmp_path,
        env=llmgw_env(**env),
        stdout=slave,
        stderr=subprocess.DEVNULL,
    )
    proc.wait(timeout=60)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return out.decode()


def test_colour_on_a_terminal_unless_no_color(tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml(source=SHARD)})
    assert "\033[1;31merror\033[0m[sharded-source]" in _lint_on_a_terminal(tmp_path)
    plain = _lint_on_a_terminal(tmp_path, NO_COLOR="1")
    assert "error[sharded-source]" in plain and "\033[" not in plain


def test_a_broken_fleet_is_reported_in_every_format_with_exit_2(llmgw, tmp_path):
    write_catalog(tmp_path, {"x.yaml": model_yaml()}, "nodes:\n  - {name: n1, memory_gb: 8}\n")
    as_json = llmgw("lint", "--format", "json", cwd=tmp_path)
    assert as_json.code == 2, as_json
    [finding] = json.loads(as_json.stdout)["findings"]
    assert finding["file"] == "fleet.yaml" and "missing required field 'address'" in finding["message"]
    as_github = llmgw("lint", "--format", "github", cwd=tmp_path)
    assert as_github.code == 2 and as_github.stdout.startswith("::error file=fleet.yaml,line=2")
    as_markdown = llmgw("lint", "--format", "markdown", cwd=tmp_path)
    assert as_markdown.code == 2 and "address" in as_markdown.stdout


def test_github_format_escapes_what_would_break_a_workflow_command():
    import io

    from llmgw.findings import Finding
    from llmgw.gitops.report.github import report

    out = io.StringIO()
    report(
        [Finding("catalog/a,b:c.yaml", 3, 4, "yaml", "error", "100% wrong\nsecond line")], out, color=False
    )
    assert out.getvalue() == (
        "::error file=catalog/a%2Cb%3Ac.yaml,line=3,col=4,title=yaml::100%25 wrong%0Asecond line\n"
    )


def test_a_fleet_address_that_is_not_an_address_exits_2(llmgw, tmp_path):
    write_catalog(
        tmp_path,
        {"x.yaml": model_yaml()},
        "nodes:\n  - {name: n1, address: 'not an address!', memory_gb: 8}\n",
    )
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 2, run
    assert "'not an address!' is not a host name or IP address" in run.stderr


def test_status_without_a_plan_reads_the_one_up_serves_in_this_folder(llmgw, tmp_path: Path) -> None:
    from tests.gateway.harness import model, profile, write_plan
    from tests.plans import plan_of

    missing = llmgw("status", cwd=tmp_path)
    assert missing.code == 2 and ".llmgw-up/plan.json" in missing.stderr, missing
    (tmp_path / ".llmgw-up").mkdir()
    write_plan(
        tmp_path / ".llmgw-up" / "plan.json", plan_of([model("m", [profile(["http://127.0.0.1:9"], "m")])])
    )
    found = llmgw("status", "--json", cwd=tmp_path)
    assert found.code == 0 and json.loads(found.stdout)["plan"].startswith("sha256:"), found


def test_every_command_summary_fits_the_help_page(llmgw) -> None:
    """`llmgw --help` cut every summary with '...' (`deploy  Send PLAN to a running gateway
    (token from...`): each says what it does in a line that fits."""
    run = llmgw("--help")
    commands = run.stdout.split("Commands:", 1)[1]
    assert "..." not in commands, commands
