"""The schema files are the one definition of each format, for llmgw and for editors alike."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator
from ruamel.yaml import YAML

from llmgw.schema import load_schema
from tests.conftest import REPO


@pytest.mark.parametrize("name", ["model", "fleet", "plan"])
def test_schema_is_valid_draft_2020_12(name):
    schema = load_schema(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_every_bundled_model_file_validates_as_an_editor_would_see_it():
    validator = Draft202012Validator(load_schema("model"))
    files = sorted((REPO / "catalog").glob("*.yaml"))
    assert len(files) == 9
    for path in files:
        text = path.read_text()
        assert text.startswith("# yaml-language-server: $schema=../schema/model.schema.json")
        errors = [e.message for e in validator.iter_errors(YAML(typ="safe").load(text))]
        assert errors == [], f"{path.name}: {errors}"


def test_bundled_fleet_is_valid_and_on_loopback_only():
    fleet = YAML(typ="safe").load((REPO / "fleet.yaml").read_text())
    assert list(Draft202012Validator(load_schema("fleet")).iter_errors(fleet)) == []
    assert all(n["address"].startswith("127.") for n in fleet["nodes"])
    assert any(n["memory_gb"] == 7.9 for n in fleet["nodes"]), "the small 7.9 GB node is gone"
