"""The compiler's fast paths answer exactly as the slow ones they stand in for.

Each fast path is only allowed to be faster: a plain file loads to the data ruamel's safe
loader gives, a document proved valid is one jsonschema finds nothing wrong with, the plan
is written byte for byte as json.dumps writes it, and the first-fit search finds the node
a walk from the cursor finds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.compiler.capacity import FirstFit, NodeState
from llmgw.load import _fast_yaml, _NotPlain, _plain_data, load_document
from llmgw.model import Node
from llmgw.plan import dump_plan
from llmgw.schema import load_schema, proves_valid, validator
from tests.unit.helpers import model_yaml

REPO = Path(__file__).resolve().parent.parent.parent

SCALARS = [
    "1",
    "-1",
    "+1",
    "007",
    "0o17",
    "0x1f",
    "0b101",
    "1_000",
    "1.5",
    "-0.0",
    ".5",
    "1e3",
    ".inf",
    "-.Inf",
    ".nan",
    "true",
    "False",
    "yes",
    "null",
    "~",
    "",
    "2001-12-14",
    "2001-02-30",
    "'q'",
    '"d"',
    "hf://org/x",
    "a b",
    "[1, x]",
    "{a: 1}",
    "[]",
    "!!int 5",
    "!!str 5",
    "&a x",
    "*a",
    "<<",
    "._",
    "١٢",
]
KEYS = ["a", "b", "c", "'q'", "1", "null", "<<"]


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@st.composite
def yaml_texts(draw: st.DrawFn, depth: int = 0) -> str:
    lines = []
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4)):
        kind = draw(st.integers(0, 2 if depth < 2 else 0))
        if kind == 0:
            lines.append(f"{key}: {draw(st.sampled_from(SCALARS))}")
        elif kind == 1:
            lines.append(f"{key}:")
            lines += [f"  - {v}" for v in draw(st.lists(st.sampled_from(SCALARS), min_size=1, max_size=3))]
        else:
            lines.append(f"{key}:")
            lines += ["  " + line for line in draw(yaml_texts(depth + 1)).splitlines()]
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None)
@given(text=yaml_texts())
def test_a_plain_file_loads_to_what_ruamels_safe_loader_gives(text):
    data = _plain_data(text)
    if data is _NotPlain:
        return  # the full loader reads it, as it always did
    assert _same(data, _fast_yaml().load(text)), f"the plain path read {text!r} as {data!r}"


def test_catalogue_files_take_the_plain_path():
    for path in sorted((REPO / "catalog").glob("*.yaml")):
        assert _plain_data(path.read_text()) is not _NotPlain, f"{path.name} took the slow path"


def test_an_alias_still_takes_the_full_loader_and_is_refused(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("name: a\nbase: &b [1, 2]\nagain: *b\n")
    assert _plain_data(path.read_text()) is _NotPlain
    _, findings = load_document(path, "a.yaml")
    assert [f.rule for f in findings] == ["yaml"] and "aliases" in findings[0].message


VALUES = [
    None,
    True,
    False,
    0,
    -1,
    1,
    1.0,
    0.5,
    float("nan"),
    "",
    " ",
    "a",
    "A b",
    "x\n",
    "llamacpp",
    "chat",
    [],
    ["a"],
    ["a", "a"],
    [1, True],
    {},
    {"a": 1},
    {"pool": "cpu"},
    {"pool": 5},
    "http://h:1",
    ["http://h:1"],
    10**30,
]
FIELDS = [
    "name",
    "description",
    "aliases",
    "task",
    "source",
    "weights_bytes",
    "context_length",
    "max_output",
    "replicas",
    "replica",
    "architecture",
    "profiles",
]
PROFILE_FIELDS = [
    "name",
    "engine",
    "ctx_size",
    "args",
    "min_memory_gb",
    "gpus",
    "node_selector",
    "weight",
    "priority",
    "routing",
    "replicas",
    "endpoints",
    "prioirty",
]


@settings(max_examples=400, deadline=None)
@given(
    model=st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(VALUES), max_size=4),
    profile=st.dictionaries(st.sampled_from(PROFILE_FIELDS), st.sampled_from(VALUES), max_size=3),
    drop=st.lists(st.sampled_from(FIELDS), max_size=2),
)
def test_a_document_proved_valid_is_one_jsonschema_finds_nothing_wrong_with(model, profile, drop):
    data = _fast_yaml().load(model_yaml(extra='description: "Fast."\naliases: [x]\n'))
    data["profiles"][0].update(profile)
    data.update(model)
    for key in drop:
        data.pop(key, None)
    if proves_valid("model")(data):
        errors = [e.message for e in validator("model").iter_errors(data)]
        assert not errors, f"proved valid, but jsonschema says: {errors}"


# What draft 7 has (fastjsonschema reads the schemas as draft 7), less what only annotates.
_DRAFT_7_KEYWORDS = {
    "$ref",
    "$defs",
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "type",
    "enum",
    "const",
    "properties",
    "additionalProperties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "format",
    "patternProperties",
    "propertyNames",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "if",
    "then",
    "else",
}


def _keywords(schema, found):
    if isinstance(schema, dict):
        for key, value in schema.items():
            found.add(key)
            if key in ("properties", "$defs", "patternProperties"):
                for sub in value.values():
                    _keywords(sub, found)
            elif key not in ("enum", "const", "required", "examples", "default"):
                _keywords(value, found)
    elif isinstance(schema, list):
        for sub in schema:
            _keywords(sub, found)
    return found


@pytest.mark.parametrize("name", ["model", "fleet", "plan", "keys"])
def test_the_schemas_use_only_keywords_the_quick_check_knows(name):
    # A 2020-12 keyword draft 7 lacks (prefixItems, unevaluatedProperties...) would be
    # ignored by the quick check: a file jsonschema refuses would be proved valid.
    unknown = _keywords(load_schema(name), set()) - _DRAFT_7_KEYWORDS
    assert not unknown, f"schema/{name}.schema.json uses {sorted(unknown)}, which the quick check ignores"


def test_every_bundled_model_and_the_fleet_are_proved_valid():
    for path in sorted((REPO / "catalog").glob("*.yaml")):
        assert proves_valid("model")(_fast_yaml().load(path.read_text())), path.name
    assert proves_valid("fleet")(_fast_yaml().load((REPO / "fleet.yaml").read_text()))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_the_plan_is_written_byte_for_byte_as_json_dumps_writes_it(value):
    assert dump_plan(value) == json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def test_a_value_the_writer_does_not_know_is_left_to_json():
    value = {"a": (1, 2), "b": {1: "x"}}
    assert dump_plan(value) == json.dumps(value, indent=2, ensure_ascii=False) + "\n"


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 4), st.booleans()), min_size=1, max_size=40),
    need=st.integers(0, 70),
    gpus=st.integers(0, 3),
    bounds=st.tuples(st.integers(0, 40), st.integers(0, 40)),
)
def test_the_first_fit_search_finds_the_node_a_walk_finds(free, need, gpus, bounds):
    states = []
    for i, (gb, cards, ports_left) in enumerate(free):
        node = Node(
            name=f"n{i}",
            address=f"10.0.0.{i}",
            memory_gb=64,
            gpus={"count": 4, "memory_gb": 24} if i % 2 else None,
        )
        state = NodeState(
            node,
            float(gb),
            list(range(cards if i % 2 else 0)),
            node.ports.first if ports_left else node.ports.last + 1,
        )
        states.append(state)
    room = FirstFit(states)
    lo, hi = min(bounds[0], len(states)), min(bounds[1], len(states))
    walked = next((i for i in range(lo, hi) if states[i].fits(need, gpus)), None)
    found = room.first(lo, hi, need, gpus)
    while found is not None and not states[found].fits(need, gpus):
        found = room.first(found + 1, hi, need, gpus)  # as _scan does: the GPUs' memory is its check
    assert found == walked
