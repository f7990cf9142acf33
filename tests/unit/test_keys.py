"""keys.yaml: `llmgw lint` checks it against the catalogue; `llmgw keys add` appends to it."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pytest

from llmgw.compiler.keys import add_key, lint_keys
from llmgw.compiler.lint import lint
from llmgw.errors import UsageError
from llmgw.gateway.state.keys import read_keys_file
from tests.conftest import write_catalog
from tests.unit.helpers import model_yaml

A = "a" * 64
B = "b" * 64


def lint_of(tmp_path: Path, keys: str) -> list[str]:
    catalog, fleet = write_catalog(tmp_path, {"m.yaml": model_yaml(extra="aliases: [default]\n")})
    (tmp_path / "keys.yaml").write_text(keys)
    entries = lint(catalog, fleet).entries
    found = lint_keys(tmp_path / "keys.yaml", entries, today=dt.date(2026, 6, 1))
    return [f"{f.line}:{f.column} {f.severity}[{f.rule}] {f.message}" for f in found]


def test_a_good_keys_file_has_no_findings(tmp_path: Path) -> None:
    keys = f"keys:\n  - name: a\n    sha256: {A}\n    models: [default, llama-*]\n    expires: 2027-01-01\n"
    assert lint_of(tmp_path, keys) == []


def test_repeated_names_and_hashes_are_errors_at_the_second(tmp_path: Path) -> None:
    keys = f"keys:\n  - name: a\n    sha256: {A}\n  - name: a\n    sha256: {A}\n"
    found = lint_of(tmp_path, keys)
    assert found[0].startswith("4:11 error[keys-duplicate] the name 'a' is also key #1's"), found
    assert found[1].startswith("5:13 error[keys-duplicate] this hash is also key #1's"), found


def test_a_models_entry_matching_nothing_is_an_error_at_the_entry(tmp_path: Path) -> None:
    keys = f"keys:\n  - name: a\n    sha256: {A}\n    models: [default, qwen-*]\n"
    found = lint_of(tmp_path, keys)
    assert found == [
        "4:23 error[keys-no-model] 'qwen-*' matches no model name or alias in the catalogue, so it "
        "grants nothing; fix the spelling, or remove it."
    ]


def test_an_expired_key_is_a_warning(tmp_path: Path) -> None:
    keys = f"keys:\n  - name: old\n    sha256: {B}\n    expires: 2026-01-31\n"
    found = lint_of(tmp_path, keys)
    assert len(found) == 1, found
    assert found[0].startswith("4:14 warning[keys-expired] the key 'old' expired on 2026-01-31")


def test_schema_mistakes_are_findings_with_positions(tmp_path: Path) -> None:
    keys = f"keys:\n  - name: a\n    sha256: {A}\n    rpm: many\n"
    found = lint_of(tmp_path, keys)
    assert len(found) == 1 and found[0].startswith("4:10 error[schema]"), found


def test_lint_reports_the_keys_file_beside_the_catalogue(llmgw, tmp_path: Path) -> None:
    write_catalog(tmp_path, {"m.yaml": model_yaml()})
    (tmp_path / "keys.yaml").write_text(f"keys:\n  - name: a\n    sha256: {A}\n    models: [nope]\n")
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 1, run
    assert run.stdout.startswith("keys.yaml:4:14: error[keys-no-model] 'nope' matches no model"), run.stdout


def test_plan_refuses_a_keys_file_lint_refuses_and_writes_nothing(llmgw, tmp_path: Path) -> None:
    write_catalog(tmp_path, {"m.yaml": model_yaml()})
    (tmp_path / "keys.yaml").write_text(f"keys:\n  - name: a\n    sha256: {A}\n    models: [nope]\n")
    run = llmgw("plan", cwd=tmp_path)
    assert run.code == 1, run
    assert "keys.yaml:4:14: error[keys-no-model] 'nope' matches no model" in run.stderr, run.stderr
    assert "No plan written" in run.stderr and not (tmp_path / "plan.json").exists(), "plan runs lint"
    assert "keys.yaml was read as this catalogue's keys file" in run.stderr and "--keys FILE" in run.stderr
    (tmp_path / "keys.yaml").rename(tmp_path / "tenants.yaml")
    given = llmgw("plan", "--keys", "tenants.yaml", cwd=tmp_path)
    assert given.code == 1 and "tenants.yaml:4:14: error[keys-no-model]" in given.stderr, given
    assert not (tmp_path / "plan.json").exists()


def test_keys_add_refuses_a_model_the_catalogue_lacks_and_writes_nothing(llmgw, tmp_path: Path) -> None:
    write_catalog(tmp_path, {"m.yaml": model_yaml()})
    run = llmgw("keys", "add", "chat", "--models", "defualt,llama-*", cwd=tmp_path)
    assert run.code == 2, run
    assert "'defualt' matches no model name or alias in catalog/" in run.stderr, run.stderr
    assert "no key was made" in run.stderr and "sk-llmgw-" not in run.stdout
    assert not (tmp_path / "keys.yaml").exists()


def test_keys_add_prints_the_key_once_and_keeps_comments(llmgw, tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"# who may call\nkeys:\n  # search\n  - name: search\n    sha256: {A}\n")
    run = llmgw(
        "keys", "add", "chat", "--models", "default,llama-*", "--rpm", "60", "--tpm", "1000", cwd=tmp_path
    )
    assert run.code == 0, run
    key = run.stdout.strip()
    assert key.startswith("sk-llmgw-") and "shown this once" in run.stderr
    text = path.read_text()
    assert "# who may call" in text and "  # search" in text
    assert key not in text, "only the key's hash is stored"
    tenants = read_keys_file(path)
    tenant = tenants[hashlib.sha256(key.encode()).hexdigest()]
    assert (tenant.name, tenant.models, tenant.rpm, tenant.tpm) == ("chat", ("default", "llama-*"), 60, 1000)


def test_keys_add_refuses_a_name_in_use(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    add_key(path, "a")
    try:
        add_key(path, "a")
    except Exception as exc:
        assert "already has a key named 'a'" in str(exc)
    else:
        raise AssertionError("a second key named 'a' was added")
    assert path.read_text().startswith("# yaml-language-server: $schema=schema/keys.schema.json\n")


def test_llmgw_serve_refuses_a_bad_keys_file_in_one_sentence(tmp_path: Path) -> None:
    from llmgw.errors import UsageError
    from llmgw.gateway.server.serve import check_environment

    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - name: a\n    sha256: nope\n")
    try:
        check_environment(tmp_path / "plan.json", {"LLMGW_KEYS_FILE": str(keys)})
    except UsageError as exc:
        assert "key #1 ('a'): `sha256` must be the key's SHA-256 in hex" in str(exc)
    else:
        raise AssertionError("a keys file with a bad hash was accepted")


def test_both_kinds_of_keys_file_at_once_are_refused(tmp_path: Path) -> None:
    from llmgw.errors import UsageError
    from llmgw.gateway.state.keys import keys_from_settings

    try:
        keys_from_settings(tmp_path / "keys.yaml", tmp_path / "keys.txt")
    except UsageError as exc:
        assert "set one" in str(exc)
    else:
        raise AssertionError("both LLMGW_KEYS_FILE and LLMGW_API_KEYS_FILE were accepted")


def test_a_hash_with_a_trailing_newline_is_refused_since_it_would_never_match(tmp_path: Path) -> None:
    found = lint_of(tmp_path, f"keys:\n  - name: a\n    sha256: |\n      {A}\n")
    assert len(found) == 1 and "error[schema]" in found[0], found
    assert "on one line" in found[0], found


def _reach(tmp_path: Path, before: dict[str, str], after: dict[str, str], models: str) -> list[str]:
    from llmgw.compiler.build import build_plan
    from llmgw.plan import dump_plan, parse_plan

    tmp_path.mkdir(exist_ok=True)
    catalog, fleet = write_catalog(tmp_path, before)
    previous = parse_plan(dump_plan(build_plan(lint(catalog, fleet))))
    for written in catalog.iterdir():
        written.unlink()
    catalog, fleet = write_catalog(tmp_path, after)
    (tmp_path / "keys.yaml").write_text(f"keys:\n  - name: team-a\n    sha256: {A}\n    models: {models}\n")
    entries = lint(catalog, fleet, previous=previous).entries
    found = lint_keys(tmp_path / "keys.yaml", entries, previous=previous)
    return [f"{Path(f.file).name}:{f.line} {f.severity}[{f.rule}] {f.message}" for f in found]


def test_a_pull_request_giving_a_model_an_alias_a_keys_glob_matches_is_said(tmp_path: Path) -> None:
    before = {"a.yaml": model_yaml("a-chat"), "b.yaml": model_yaml("b-secret")}
    after = {**before, "b.yaml": model_yaml("b-secret", extra="aliases: [a-secret]\n")}
    found = _reach(tmp_path, before, after, '["a-*"]')
    assert len(found) == 1, f"the key silently gained b-secret: {found}"
    assert found[0].startswith("b.yaml:6 warning[keys-reach] this alias 'a-secret' lets the key 'team-a'")
    assert "narrow the key's models" in found[0]


def test_a_key_reaching_what_it_reached_before_or_naming_a_new_model_is_quiet(tmp_path: Path) -> None:
    before = {"a.yaml": model_yaml("a-chat")}
    after = {**before, "n.yaml": model_yaml("new-model"), "c.yaml": model_yaml("a-chat-2")}
    found = _reach(tmp_path / "1", before, after, '["a-chat", "new-model"]')
    assert found == [], "a-chat was reached before, and new-model is named by the key itself"
    assert len(_reach(tmp_path / "2", before, after, '["a-*"]')) == 1, "a-chat-2 is new and reached by a glob"


def test_lint_the_gateway_and_keys_add_refuse_the_same_names_by_the_one_schema(llmgw, tmp_path: Path) -> None:
    # A name with a trailing newline: the schema refused it, and the gateway's hand-written
    # check once let it through, so a key lint failed on was served.
    text = f'keys:\n  - name: "team\\n"\n    sha256: {A}\n'
    found = lint_of(tmp_path, text)
    assert len(found) == 1 and "error[schema]" in found[0], found
    path = tmp_path / "served.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=r"key #1 \('team'\): `name` must be letters"):
        read_keys_file(path)
    added = llmgw("keys", "add", "team\n", "--keys", str(tmp_path / "new.yaml"))
    assert added.code == 2 and "NAME" in added.stderr, added
    assert not (tmp_path / "new.yaml").exists()
    path.write_text(f"keys:\n  - name: team\n    sha256: {A}\n    rpm: 0\n")
    with pytest.raises(UsageError, match=r"key #1 \('team'\): `rpm` must be a whole number of 1 or more"):
        read_keys_file(path)


def test_the_gateway_refuses_a_keys_file_that_is_not_yaml_in_lints_words(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f'keys:\n  - name: "team-a\n    sha256: {A}\n')
    (finding,) = lint_keys(path, [])
    try:
        read_keys_file(path)
    except UsageError as exc:
        refusal = str(exc)
    else:
        raise AssertionError("a keys file with an unclosed quote was served")
    assert f"keys.yaml:{finding.line}:{finding.column} " in refusal, refusal
    assert finding.message in refusal, f"/readyz says {refusal!r}, lint says {finding.message!r}"
    assert "while scanning" not in refusal, "the parser's own wording reached the operator"


ALIAS_BOMB = "".join(
    ["keys: []\nbomb:\n  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
    + [f"  - &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]\n" for n in range(1, 9)]
)


@pytest.mark.parametrize("command", [("keys", "list", "--file", "keys.yaml"), ("keys", "add", "new")])
def test_every_reader_of_keys_yaml_refuses_an_alias_bomb_at_once(llmgw, tmp_path: Path, command) -> None:
    """A few hundred bytes of nested aliases once took `keys list` 60 s and 2.7 GB; only lint
    refused them. Each reader refuses them as lint does, naming where, and changes nothing."""
    (tmp_path / "keys.yaml").write_text(ALIAS_BOMB)
    run = llmgw(*command, cwd=tmp_path)
    assert run.code == 2, run
    assert "keys.yaml:3:5" in run.stderr and "anchors and aliases" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert (tmp_path / "keys.yaml").read_text() == ALIAS_BOMB, "the file was changed"


def test_the_gateway_refuses_an_alias_bomb_in_keys_yaml_in_lints_words(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(UsageError) as refused:
        read_keys_file(path)
    assert "anchors and aliases" in str(refused.value) and "(LLMGW_KEYS_FILE)" in str(refused.value)


def test_a_key_with_a_budget_reaching_a_model_without_max_output_is_warned(tmp_path: Path) -> None:
    found = lint_of(
        tmp_path,
        f"keys:\n  - name: team\n    sha256: {A}\n    budget: {{tokens: 3000, every: day}}\n"
        f"  - name: free\n    sha256: {B}\n",
    )
    (warning,) = [f for f in found if "keys-unbounded" in f]
    assert warning.startswith("4:13 warning") and "'team' has a budget" in warning, found
    assert "set no max_output" in warning


def test_a_key_whose_models_all_bound_their_answers_is_not_warned(tmp_path: Path) -> None:
    catalog, fleet = write_catalog(tmp_path, {"m.yaml": model_yaml(extra="max_output: 512\n")})
    (tmp_path / "keys.yaml").write_text(f"keys:\n  - name: team\n    sha256: {A}\n    tpm: 1000\n")
    found = lint_keys(tmp_path / "keys.yaml", lint(catalog, fleet).entries)
    assert [f for f in found if f.rule == "keys-unbounded"] == []


def test_keys_add_writes_a_budget_the_gateway_reads(llmgw, tmp_path: Path) -> None:
    run = llmgw("keys", "add", "team", "--budget", "5000000/month", "--warn-at", "0.8", cwd=tmp_path)
    assert run.code == 0, run
    (tenant,) = read_keys_file(tmp_path / "keys.yaml").values()
    assert tenant.budget is not None and (tenant.budget.tokens, tenant.budget.every) == (5000000, "month")
    bad = llmgw("keys", "add", "other", "--budget", "lots", cwd=tmp_path)
    assert bad.code == 2 and "5000000/month" in bad.stderr, bad


def test_lints_summary_counts_a_keys_yaml_error_as_the_keys_files(llmgw, tmp_path: Path) -> None:
    write_catalog(tmp_path, {"m.yaml": model_yaml()})
    (tmp_path / "keys.yaml").write_text("keys:\n  - name: a\n    sha256: nope\n")
    run = llmgw("lint", cwd=tmp_path)
    assert run.code == 1, run
    assert "0 error(s), 0 warning(s) in the catalogue, 1 error(s), 0 warning(s) in keys.yaml" in run.stderr, (
        run.stderr
    )
