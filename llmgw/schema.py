"""The JSON Schemas in schema/ are the one definition of each file format.

Editors validate against the same files (the `$schema` comment at the top of each
model file), so the package never keeps a second copy of the rules in code.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

_PACKAGED = Path(__file__).parent / "_schemas"  # inside the wheel
_SOURCE_TREE = Path(__file__).parent.parent / "schema"  # a checkout or editable install


def schema_dir() -> Path:
    return _PACKAGED if _PACKAGED.is_dir() else _SOURCE_TREE


@cache
def load_schema(name: str) -> dict[str, Any]:
    """`name` is model, fleet or plan."""
    with open(schema_dir() / f"{name}.schema.json", encoding="utf-8") as f:
        schema: dict[str, Any] = json.load(f)
    return schema


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name))
