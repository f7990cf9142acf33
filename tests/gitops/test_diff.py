"""`llmgw diff`: what deploying one plan over another changes, read like `terraform plan`."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

from llmgw.gitops.diff import diff_plans
from llmgw.gitops.report.diff_formats import DIFF_REPORTERS
from llmgw.gitops.report.diff_markdown import FOLD_AFTER_LINES, diff_markdown
from llmgw.gitops.report.diff_text import diff_lines
from llmgw.plan import Plan, assemble_plan, dump_plan
from tests.conftest import run_llmgw
from tests.gitops.plans import CPU, base_and_head, model, node, plan, replica


def text(old: Plan | None, new: Plan) -> str:
    return "\n".join(diff_lines(diff_plans(old, new)))


def test_the_readme_example_reads_like_terraform() -> None:
    base, head = base_and_head()
    assert text(base, head) == "\n".join(
        [
            "+ model phi-4 (chat, 1 replica)",
            "    + replica cpu/1 on cpu-1 (http://127.0.0.11:8001)",
            "~ model llama-3.1-8b",
            '    description: "General chat." → "General chat, fast and cheap."',
            "    replicas: 2 → 3",
            "    ~ replica cpu/1 moved cpu-1 → cpu-2",
            "    + replica cpu/3 on cpu-3 (http://127.0.0.13:8002)",
            "- model mistral-7b-instruct (chat, 1 replica)",
            "1 to add, 1 to change, 1 to remove.",
        ]
    )


def test_identical_plans_say_no_changes() -> None:
    base, _ = base_and_head()
    assert text(base, plan(list(base.models), CPU)) == "No changes."


def test_provenance_alone_is_no_change() -> None:
    base, _ = base_and_head()
    busier = [node("cpu-1", "127.0.0.11", replicas_placed=9), *CPU[1:]]
    other = plan(list(base.models), busier, fleet_sha="1" * 64)  # a comment edited in fleet.yaml
    assert text(base, other) == "No changes."


def test_a_description_added_to_an_undescribed_model_shows_none_before() -> None:
    old = plan([model("m", [replica("cpu-1", "127.0.0.11", 8001)], description=None)], CPU)
    new = plan([model("m", [replica("cpu-1", "127.0.0.11", 8001)], description="Tiny.")], CPU)
    assert '    description: (none) → "Tiny."' in text(old, new).splitlines()


def test_a_small_edit_to_a_long_description_shows_the_words_around_it() -> None:
    long = ("General chat, fast and cheap; the default for most requests. Use llama-3.1-70b for "
            "long reasoning and careful code review across many files, and qwen for Chinese.")
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r, description=long)], CPU)
    new = plan([model("m", r, description=long.replace("fast and cheap;", "fast;"))], CPU)
    lines = text(old, new).splitlines()
    assert lines[1:3] == [
        '    description: "General chat, fast and cheap; the default for most …"',
        '               → "General chat, fast; the default for most …"',
    ], lines


def test_an_edit_at_the_end_of_a_long_description_elides_the_start() -> None:
    long = "A " + "very " * 30 + "long description ending in one word."
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r, description=long)], CPU)
    new = plan([model("m", r, description=long.replace("one word.", "two words."))], CPU)
    lines = text(old, new).splitlines()
    assert lines[1] == ('    description: "…long description ending in one word." → '
                        '"…long description ending in two words."'), lines


def test_aliases_and_limits_show_before_and_after() -> None:
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r, aliases=("a",), context_length=8192)], CPU)
    new = plan([model("m", r, aliases=("a", "b"), context_length=16384, max_output=512)], CPU)
    lines = text(old, new).splitlines()
    assert "    aliases: [a] → [a, b]" in lines
    assert "    context_length: 8192 → 16384" in lines
    assert "    max_output: (none) → 512" in lines


def test_a_profile_field_names_its_profile() -> None:
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r)], CPU)
    changed = model("m", r, ctx_size=16384)
    assert "    profile cpu ctx_size: 8192 → 16384" in text(old, plan([changed], CPU)).splitlines()


def test_a_replica_that_only_changed_port_is_re_addressed_not_moved() -> None:
    old = plan([model("m", [replica("cpu-1", "127.0.0.11", 8001)])], CPU)
    new = plan([model("m", [replica("cpu-1", "127.0.0.11", 8005)])], CPU)
    assert (
        "    ~ replica cpu/1 endpoint http://127.0.0.11:8001 → http://127.0.0.11:8005"
        in text(old, new).splitlines()
    )


def test_a_removed_replica_says_where_it_was() -> None:
    two = [replica("cpu-1", "127.0.0.11", 8001), replica("cpu-2", "127.0.0.12", 8001)]
    old = plan([model("m", two)], CPU)
    new = plan([model("m", two[:1])], CPU)
    assert "    - replica cpu/2 from cpu-2 (http://127.0.0.12:8001)" in text(old, new).splitlines()


def test_fleet_changes_are_resources_too() -> None:
    old = plan([], CPU)
    new = plan(
        [],
        [
            *CPU[:2],
            node("cpu-3", "127.0.0.13", engines=None),
            node("gpu-9", "127.0.0.29", 256, gpus=2),
        ],
    )
    lines = text(old, new).splitlines()
    assert "+ node gpu-9 (127.0.0.29, 256 GB, 2 GPUs)" in lines
    assert "~ node cpu-3" in lines and "    engines: [llamacpp] → (none)" in lines
    assert lines[-1] == "1 to add, 1 to change, 0 to remove."


def test_an_empty_old_plan_adds_everything() -> None:
    _, head = base_and_head()
    assert text(None, head).splitlines()[-1] == "5 to add, 0 to change, 0 to remove."


def test_output_is_sorted_and_deterministic() -> None:
    base, head = base_and_head()
    shuffled = assemble_plan(reversed(head.models), reversed(head.nodes), inputs=head.inputs)
    assert text(base, shuffled) == text(base, head)


def test_markdown_has_a_table_and_folds_long_diffs() -> None:
    base, head = base_and_head()
    short = diff_markdown(diff_plans(base, head))
    assert short.startswith("### Plan: 1 to add, 1 to change, 1 to remove\n")
    assert "| `~` | model `llama-3.1-8b` | description changed; replicas 2 → 3;" in short
    assert "<details>" not in short and "```diff\n+ model phi-4" in short
    many = plan(
        [model(f"m{i:02}", [replica("cpu-1", "127.0.0.11", 8001 + i)]) for i in range(FOLD_AFTER_LINES)],
        CPU,
    )
    long = diff_markdown(diff_plans(None, many))
    assert "<details><summary>Full diff (" in long and "</details>" in long


def test_markdown_fences_survive_backticks_in_descriptions() -> None:
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r, description="plain")], CPU)
    new = plan([model("m", r, description="use ```json``` blocks")], CPU)
    md = diff_markdown(diff_plans(old, new))
    assert "````diff" in md, "the fence must be longer than any backtick run inside it"


def test_json_has_a_format_version_and_counts() -> None:
    base, head = base_and_head()
    out = io.StringIO()
    DIFF_REPORTERS["json"](diff_plans(base, head), out, color=False)
    doc = json.loads(out.getvalue())
    assert doc["format_version"] == "1"
    assert doc["summary"] == {"add": 1, "change": 1, "remove": 1}
    assert [c["name"] for c in doc["changes"]] == ["phi-4", "llama-3.1-8b", "mistral-7b-instruct"]


def test_colour_only_when_asked() -> None:
    base, head = base_and_head()
    plain, coloured = io.StringIO(), io.StringIO()
    DIFF_REPORTERS["text"](diff_plans(base, head), plain, color=False)
    DIFF_REPORTERS["text"](diff_plans(base, head), coloured, color=True)
    assert "\x1b[" not in plain.getvalue()
    assert "\x1b[32m+ model phi-4" in coloured.getvalue()


def write(tmp_path: Path, name: str, plan: Plan | dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(dump_plan(plan.doc if isinstance(plan, Plan) else plan))
    return path


def test_cli_detailed_exitcode_is_0_2_or_1(tmp_path: Path) -> None:
    base, head = base_and_head()
    old, new = write(tmp_path, "old.json", base), write(tmp_path, "new.json", head)
    same = run_llmgw("diff", old, old, "--detailed-exitcode")
    assert (same.code, same.stdout) == (0, "No changes.\n"), same
    changed = run_llmgw("diff", old, new, "--detailed-exitcode")
    assert changed.code == 2 and changed.stdout.endswith("1 to remove.\n"), changed
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    error = run_llmgw("diff", broken, new, "--detailed-exitcode")
    assert error.code == 1 and "not valid JSON" in error.stderr, error
    assert "Traceback" not in error.stderr, error


def test_cli_without_detailed_exitcode_succeeds_on_changes(tmp_path: Path) -> None:
    base, head = base_and_head()
    result = run_llmgw("diff", write(tmp_path, "o.json", base), write(tmp_path, "n.json", head))
    assert result.code == 0, result
    assert "\x1b[" not in result.stdout, "no colour when stdout is not a terminal"


def test_cli_refuses_a_hand_edited_plan(tmp_path: Path) -> None:
    base, head = base_and_head()
    edited = copy.deepcopy(head.doc)
    edited["models"][0]["replicas"] = 9  # digest no longer matches
    result = run_llmgw("diff", write(tmp_path, "o.json", base), write(tmp_path, "n.json", edited))
    assert result.code == 2 and "edited after `llmgw plan` wrote it" in result.stderr, result


def test_cli_format_choices_are_the_registry() -> None:
    result = run_llmgw("diff", "--help")
    assert "[json|markdown|text]" in result.stdout, result
    assert sorted(DIFF_REPORTERS) == ["json", "markdown", "text"]


def test_markdown_table_shows_catalogue_html_as_text() -> None:
    r = [replica("cpu-1", "127.0.0.11", 8001)]
    old = plan([model("m", r, aliases=("a",))], CPU)
    new = plan([model("m", r, aliases=("<!-- hidden", "a&b"))], CPU)
    table = diff_markdown(diff_plans(old, new)).split("```diff")[0]
    assert "<!--" not in table, table
    assert '"&lt;!-- hidden", "a&amp;b"' in table, table


def test_an_empty_new_plan_is_an_error_not_a_teardown(tmp_path) -> None:
    from tests.conftest import run_llmgw

    empty = tmp_path / "empty.json"
    empty.write_text("")
    result = run_llmgw("diff", "/dev/null", empty, "--detailed-exitcode")
    assert result.code == 1, result
    assert "to remove" not in result.stdout and "a plan step failed" in result.stderr, result


def _with_args(m, *args: str, profile: str = "cpu"):
    p = m.profiles[0].model_copy(update={"args": args, "name": profile})
    return m.model_copy(update={"profiles": (p,)})


def test_the_args_themselves_are_shown_however_they_arrive() -> None:
    # A reviewer must read --trust-remote-code or --host 0.0.0.0, not only that args changed.
    where = [replica("cpu-1", "127.0.0.11", 8001)]
    plain = model("m", where)
    old = plan([plain], CPU)
    changed = plan([_with_args(plain, "--log-file", "/tmp/x")], CPU)
    added_model = plan([plain, _with_args(model("n", where), "--path", "/srv")], CPU)
    second = _with_args(plain, "--rpc", "10.0.0.9:50052", profile="fast")
    added_profile = plan([plain.model_copy(update={"profiles": (*plain.profiles, *second.profiles)})], CPU)
    assert '    profile cpu args: [] → ["--log-file", "/tmp/x"]' in text(old, changed).splitlines()
    assert '    profile cpu args: ["--path", "/srv"]' in text(old, added_model).splitlines()
    profile_lines = text(old, added_profile).splitlines()
    assert '    + profile fast (llamacpp) args: ["--rpc", "10.0.0.9:50052"]' in profile_lines
    for new in (changed, added_model, added_profile):
        table = diff_markdown(diff_plans(old, new)).split("```")[0]
        assert "/tmp/x" in table or "/srv" in table or "10.0.0.9" in table, table


def test_args_are_quoted_one_way_in_a_list() -> None:
    """`["--task", embed]` and `["--parallel", 1]` mixed quoted and bare strings (newcomer
    round 4): a list of args is quoted throughout."""
    from llmgw.gitops.report.diff_text import value

    assert value(["--task", "embed"]) == '["--task", "embed"]'
    assert value(["--parallel", "1"]) == '["--parallel", "1"]'
    assert value(["a", "b"]) == "[a, b]"
