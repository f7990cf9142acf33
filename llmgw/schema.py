"""The JSON Schemas in schema/ are the one definition of each file format.

Editors validate against the same files (the `$schema` comment at the top of each
model file), so the package never keeps a second copy of the rules in code: the
quick check below is compiled from the same schema files, and only ever answers "valid"
where jsonschema would find nothing wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported when a document needs it: a valid catalogue never does
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
    # jsonschema takes a tenth of a second to import: a pull request's lint of valid files,
    # all proved valid by `proves_valid`, starts that much sooner without it.
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema(name))


Check = Callable[[Any], bool]


@cache
def proves_valid(name: str) -> Check:
    """A quick test that a document is valid against schema `name`: True only when
    jsonschema would report nothing; False when it might report something.

    jsonschema's generic pass took a third of linting 5,000 valid model files, and several
    seconds of a gateway's start with a 5,000-model plan. Valid documents need no error
    messages, so they are proved valid by fastjsonschema, which compiles the same schema
    file into Python; the others go through jsonschema, whose errors become findings.
    fastjsonschema reads the schemas as draft 7, which has every keyword they use (a test
    holds them to that), and checks no `format`, as jsonschema here checks none.
    """
    import fastjsonschema

    # use_default=False: by default it writes the schema's defaults into the document it
    # checks, and a rule that looks for what the file itself says found keys it never had.
    check = fastjsonschema.compile(load_schema(name), use_formats=False, use_default=False)

    def proves(document: Any) -> bool:
        try:
            check(document)
        except (fastjsonschema.JsonSchemaValueException, RecursionError):
            return False  # jsonschema decides, and says why
        return True

    return proves


def dates_as_text(data: Any) -> Any:
    """YAML's dates as the schemas' strings: the safe loader makes `2027-01-31` a date, and a
    schema says `"type": "string", "format": "date"` for what a person writes there."""
    import datetime as dt

    if isinstance(data, dict):
        return {k: dates_as_text(v) for k, v in data.items()}
    if isinstance(data, list):
        return [dates_as_text(v) for v in data]
    if isinstance(data, dt.date):
        return data.isoformat()
    return data


def first_error_path(name: str, document: Any) -> tuple[str | int, ...] | None:
    """Where in `document` the schema `name` finds its most telling error; None when valid.
    For readers at the edge (a worker reading keys.yaml) that refuse with their own sentence
    rather than lint's findings, but decide by the same schema."""
    if proves_valid(name)(document):
        return None
    from jsonschema.exceptions import best_match

    error = best_match(validator(name).iter_errors(document))
    return tuple(error.absolute_path) if error is not None else ()
