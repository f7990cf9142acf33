"""A mistake in a model file is named at file:line:column with what to write instead."""

from __future__ import annotations

import time

import pytest

from llmgw.schema import load_schema
from tests.unit.helpers import by_rule, model_yaml, run


def test_yaml_syntax_error_points_at_the_line_and_says_what_to_fix(tmp_path):
    text = "name: a\nsource: hf://o/r/x.gguf\ndescription: Fast: good for chat\n"
    result = run(tmp_path, {"a.yaml": text})
    [finding] = by_rule(result, "yaml")
    assert (finding.line, finding.severity) == (3, "error")
    assert "quoted" in finding.message


def test_duplicate_key_is_an_error_naming_both_lines(tmp_path):
    text = model_yaml(extra="replicas: 3\n")  # replicas appears twice
    result = run(tmp_path, {"a.yaml": text})
    [finding] = by_rule(result, "yaml")
    assert finding.line == 6
    assert "appears twice (first at line 5)" in finding.message


def test_alias_bomb_is_refused_quickly_instead_of_expanded(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    started = time.perf_counter()
    result = run(tmp_path, {"bomb.yaml": "\n".join(lines) + "\n"})
    elapsed = time.perf_counter() - started
    [finding] = by_rule(result, "yaml")
    assert "aliases" in finding.message
    assert elapsed < 1.0, f"an alias bomb took {elapsed:.2f} s to refuse"
    assert not by_rule(result, "schema")


def test_unknown_field_suggests_the_close_known_one(tmp_path):
    text = model_yaml(extra="replica: 2\n")
    result = run(tmp_path, {"a.yaml": text})
    [finding] = by_rule(result, "unknown-field")
    assert finding.line == 6 and finding.column == 1
    assert "Did you mean 'replicas'?" in finding.message


def test_unknown_field_in_a_profile_is_found_at_its_key(tmp_path):
    text = model_yaml(profile_extra="    prioirty: 5\n")
    result = run(tmp_path, {"a.yaml": text})
    [finding] = by_rule(result, "unknown-field")
    assert finding.line == 10 and finding.column == 5
    assert "'priority'" in finding.message


def test_blank_description_is_refused_with_write_one_or_remove_it(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(extra='description: "   "\n')})
    [finding] = by_rule(result, "schema")
    assert finding.line == 6
    assert "write one" in finding.message.lower() and "remove the key" in finding.message


def test_description_with_no_value_is_refused_as_an_empty_one_is(tmp_path):
    # `description:` with nothing after it is null in YAML, not a type mistake to explain.
    result = run(tmp_path, {"a.yaml": model_yaml(extra="description:\n")})
    [finding] = by_rule(result, "schema")
    assert finding.line == 6 and "description is empty" in finding.message
    assert "remove the key to leave the model undescribed" in finding.message
    assert "must be" not in finding.message


def test_wrong_type_says_what_was_expected_and_what_was_found(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(extra='max_output: "lots"\n')})
    [finding] = by_rule(result, "schema")
    assert finding.line == 6
    assert "must be a whole number" in finding.message and "'lots'" in finding.message


def test_unknown_engine_suggests_the_right_spelling(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(engine="llama.cpp")})
    [finding] = by_rule(result, "schema")
    assert "did you mean 'llamacpp'" in finding.message


def test_every_finding_is_reported_in_one_run(tmp_path):
    result = run(
        tmp_path,
        {
            "a.yaml": "name: [unclosed\n",
            "b.yaml": model_yaml("b", extra="replica: 2\n"),
            "c.yaml": model_yaml("c", source="hf://o/r/model-00001-of-00004.gguf"),
        },
    )
    assert {f.rule for f in result.findings} >= {"yaml", "unknown-field", "sharded-source"}
    assert {f.file.rsplit("/", 1)[-1] for f in result.findings} == {"a.yaml", "b.yaml", "c.yaml"}


def test_an_endpoint_the_gateway_could_not_route_is_refused_by_lint(tmp_path):
    profile = '    endpoints: ["http://127.0.0.51:abc"]\n'
    result = run(tmp_path, {"a.yaml": model_yaml(profile_extra=profile, weights=None)})
    [finding] = by_rule(result, "schema")
    assert finding.line == 9 and "'http://127.0.0.51:abc' is not an engine address" in finding.message
    assert "http://HOST:PORT" in finding.message


@pytest.mark.parametrize(
    ("value", "kind"), [("._", "a number"), ("2001-02-30", "a date"), ('!!int "x"', "an integer")]
)
def test_a_value_yaml_types_but_cannot_build_is_a_finding_at_its_place(tmp_path, value, kind):
    result = run(tmp_path, {"a.yaml": f"name: a\ncontext_length: {value}\n"})
    [finding] = by_rule(result, "yaml")
    assert (finding.line, finding.column) == (2, 17)
    assert f"reads as {kind}" in finding.message and "quote it" in finding.message


def test_deeply_nested_brackets_are_findings_not_a_crash(tmp_path):
    result = run(
        tmp_path, {"a.yaml": "a: " + "[" * 20000 + "]" * 20000 + "\n", "b.yaml": "a: " + "[" * 20000 + "\n"}
    )
    # Balanced or not, past 64 deep it is refused before the C composer could recurse.
    for name in ("a.yaml", "b.yaml"):
        [finding] = [f for f in result.findings if f.file.endswith(name)]
        assert finding.rule == "yaml" and "more than 64 deep" in finding.message, finding
    shallow = run(tmp_path, {"c.yaml": "a: " + "[" * 60 + "]" * 60 + "\n"})
    assert "unknown-field" in {f.rule for f in shallow.findings}


def test_schema_messages_say_what_to_write_instead(tmp_path):
    text = (
        model_yaml(extra="aliases: [a, a]\n", profile_extra="    weight: -1\n")
        .replace("replicas: 1", "replicas: 0")
        .replace("  - name: main", "  - name: GPU")
    )
    result = run(tmp_path, {"a.yaml": text})
    messages = [f.message for f in by_rule(result, "schema")]
    assert "replicas is 0; it must be at least 1." in messages
    assert "aliases lists 'a' more than once; keep one of each." in messages
    assert "profiles[0].weight is -1; it must be at least 0." in messages
    assert any("profiles[0].name 'GPU' is not a usable name: use lowercase letters" in m for m in messages)


def test_wrong_kind_of_value_uses_yaml_words(tmp_path):
    result = run(tmp_path, {"a.yaml": model_yaml(extra="aliases: llama\n")})
    [finding] = by_rule(result, "schema")
    assert finding.message == "aliases must be a list, not a string ('llama')."


def test_empty_profiles_says_list_at_least_one(tmp_path):
    text = "name: a\nsource: hf://o/r/a.gguf\nweights_bytes: 1000\ncontext_length: 4096\nprofiles: []\n"
    [finding] = by_rule(run(tmp_path, {"a.yaml": text}), "schema")
    assert finding.message.startswith("profiles is empty; list at least 1")


def test_an_unclosed_quote_is_found_where_it_opens(tmp_path):
    result = run(tmp_path, {"a.yaml": 'name: a\ndescription: "unclosed\nreplicas: 1\n'})
    [finding] = by_rule(result, "yaml")
    assert (finding.line, finding.column) == (2, 14) and "quote is never closed" in finding.message


def test_an_unclosed_bracket_is_found_where_it_opens(tmp_path):
    result = run(tmp_path, {"a.yaml": "name: b\naliases: [x, y\nreplicas: 1\n"})
    [finding] = by_rule(result, "yaml")
    assert (finding.line, finding.column) == (2, 10) and "this [ is never closed" in finding.message


def test_duplicate_first_key_of_a_list_item_names_the_first_line(tmp_path):
    result = run(tmp_path, {"a.yaml": "profiles:\n  - name: a\n    name: b\n"})
    [finding] = by_rule(result, "yaml")
    assert "appears twice (first at line 2)" in finding.message


def test_a_schema_mistake_does_not_hide_the_files_other_findings(tmp_path):
    shard = "hf://org/r-GGUF/r-00001-of-00002.gguf"
    result = run(
        tmp_path,
        {
            "a.yaml": model_yaml("same"),
            "b.yaml": model_yaml("same", source=shard, extra='replica: 2\ndescription: ""\n'),
        },
    )
    rules = sorted(f.rule for f in result.findings if f.file.endswith("b.yaml"))
    assert rules == ["duplicate-name", "schema", "sharded-source", "unknown-field"]


def test_a_missing_required_key_stops_the_checks_of_that_file_only(tmp_path):
    result = run(
        tmp_path,
        {
            "a.yaml": model_yaml().replace("context_length: 8192\n", ""),
            "b.yaml": model_yaml("b", source="hf://o/r/x.pt"),
        },
    )
    assert [f.rule for f in result.findings if f.file.endswith("a.yaml")] == ["schema"]
    assert [f.rule for f in result.findings if f.file.endswith("b.yaml")] == ["unreadable-format"]


def test_an_empty_file_says_what_to_write(tmp_path):
    [finding] = run(tmp_path, {"a.yaml": ""}).findings
    assert finding.message == (
        "the file is empty; write the fields it needs (name, source, "
        "context_length, profiles), or delete the file."
    )


@pytest.mark.parametrize("value", ["!!bool x", '!!int ""', '!!float ""'])
def test_tagged_values_python_cannot_build_are_findings_too(tmp_path, value):
    [finding] = run(tmp_path, {"a.yaml": f"name: {value}\n"}).findings
    assert finding.rule == "yaml" and finding.line == 1


def test_an_alias_is_found_where_its_anchor_is(tmp_path):
    text = 'name: a\ndescription: "uses * and & in prose"\nbase: &b [1, 2]\nagain: *b\n'
    [finding] = by_rule(run(tmp_path, {"a.yaml": text}), "yaml")
    assert (finding.line, finding.column) == (3, 7) and "aliases" in finding.message


def test_a_bad_optional_key_that_changes_meaning_is_not_set_aside(tmp_path):
    # Without its endpoints the profile would be judged as placed (memory-unknown), and
    # without its selector it would match every node: neither may be guessed away.
    bad_endpoint = model_yaml(weights=None, profile_extra='    endpoints: ["ftp://127.0.0.1"]\n')
    bad_selector = model_yaml("b", selector="{pool: 5}")
    result = run(tmp_path, {"a.yaml": bad_endpoint, "b.yaml": bad_selector})
    assert sorted(f.rule for f in result.findings) == ["schema", "schema"]


@pytest.mark.parametrize(
    ("extra", "profile_extra"),
    [
        ('aliases: ["a\\n"]\n', ""),
        ("", '    endpoints: ["http://127.0.0.1:8000\\n"]\n'),
    ],
    ids=["alias", "endpoint"],
)
def test_a_value_ending_in_a_newline_fails_lint_rather_than_the_gateway(tmp_path, extra, profile_extra):
    # Python's `$` also matches before a final newline: these passed lint, and the gateway
    # then refused the plan they were in.
    result = run(
        tmp_path,
        {
            "a.yaml": model_yaml(
                weights=None if profile_extra else 4_920_734_016, extra=extra, profile_extra=profile_extra
            )
        },
    )
    assert by_rule(result, "schema"), f"a trailing newline passed lint: {result.findings}"


def test_every_anchored_schema_pattern_refuses_a_final_newline():
    def patterns(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                yield node["pattern"]
            for value in node.values():
                yield from patterns(value)
        elif isinstance(node, list):
            for value in node:
                yield from patterns(value)

    for name in ("model", "fleet", "plan"):
        for pattern in patterns(load_schema(name)):
            if pattern.endswith("$") or "$(" in pattern:
                assert pattern.endswith(r"$(?!\n)"), f"{name}: {pattern} lets a final newline through"


def test_a_number_where_text_belongs_says_what_to_write(tmp_path) -> None:
    result = run(
        tmp_path,
        {
            "m.yaml": model_yaml(
                profile_extra="    args: [--parallel, 1]\n    start: on-demand\n    idle_stop: 90\n"
            )
        },
    )
    said = [f.message for f in by_rule(result, "schema")]
    assert any("quote it: '1'" in m for m in said), said
    assert any("write '90s'" in m for m in said), said
