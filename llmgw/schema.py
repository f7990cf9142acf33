"""The JSON Schemas in schema/ are the one definition of each file format.

Editors validate against the same files (the `$schema` comment at the top of each
model file), so the package never keeps a second copy of the rules in code: the
quick check below is compiled from the same schema, and only ever answers "valid"
where jsonschema would find nothing wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from numbers import Number
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

    jsonschema's generic pass took a third of linting 5,000 valid model files. Valid
    documents need no error messages, so they are proved valid here by a check compiled
    from the same schema; the others go through jsonschema, whose errors become findings.
    A schema using a keyword this compiler does not know proves nothing valid.
    """
    schema = load_schema(name)
    try:
        check = _compile(schema, schema, {})
    except _Unsupported:
        return _unproven

    def proves(document: Any) -> bool:
        try:
            return check(document)
        except RecursionError:  # nested deeper than any valid file: jsonschema decides
            return False

    return proves


class _Unsupported(Exception):
    """A schema keyword, or a form of one, that the quick check does not compile."""


def _unproven(instance: Any) -> bool:
    return False


def _always(instance: Any) -> bool:
    return True


# Keywords that never make a document invalid: the validator is built without a format
# checker, so `format` only annotates too.
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples", "format", "$defs"}
)


def _is_number(x: Any) -> bool:
    # As jsonschema's type checker: a bool is not a number.
    return isinstance(x, Number) and not isinstance(x, bool)


_TYPES: dict[str, Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": _is_number,
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}


def _compile(schema: Any, root: dict[str, Any], done: dict[str, Check]) -> Check:
    """One function checking every keyword of `schema`; each keyword applies only to the
    kind of value it is about (`minimum` passes a string), as in JSON Schema."""
    if schema is True:
        return _always
    if not isinstance(schema, dict) or not schema.keys() <= _KEYWORDS.keys() | _STRUCTURE | _ANNOTATIONS:
        raise _Unsupported
    checks: list[Check] = []
    if "$ref" in schema:
        checks.append(_reference(schema["$ref"], root, done))
    if "properties" in schema or "additionalProperties" in schema:
        checks.append(_properties(schema, root, done))
    if "items" in schema:
        item = _compile(schema["items"], root, done)
        checks.append(lambda x: not isinstance(x, list) or all(item(i) for i in x))
    for keyword, value in schema.items():
        make = _KEYWORDS.get(keyword)
        if make is not None:
            checks.append(make(value))
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]

    def every(x: Any) -> bool:
        for check in checks:
            if not check(x):
                return False
        return True

    return every


def _reference(ref: Any, root: dict[str, Any], done: dict[str, Check]) -> Check:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise _Unsupported  # only references within the same schema
    if ref not in done:
        target: Any = root
        for step in ref[2:].split("/"):
            if not isinstance(target, dict) or step not in target:
                raise _Unsupported
            target = target[step]
        done[ref] = _unproven  # a schema that refers back into itself is left to jsonschema
        done[ref] = _compile(target, root, done)
    if done[ref] is _unproven:
        raise _Unsupported
    return done[ref]


def _properties(schema: dict[str, Any], root: dict[str, Any], done: dict[str, Check]) -> Check:
    written = schema.get("properties", {})
    if not isinstance(written, dict):
        raise _Unsupported
    props = {k: _compile(v, root, done) for k, v in written.items()}
    extra = schema.get("additionalProperties", True)
    closed = extra is False
    other = None if extra is True or closed else _compile(extra, root, done)

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for key, value in x.items():
            known = props.get(key)
            if known is not None:
                if not known(value):
                    return False
            elif closed or (other is not None and not other(value)):
                return False
        return True

    return check


def _type(types: Any) -> Check:
    wanted = [_TYPES[t] for t in (types if isinstance(types, list) else [types])]
    if len(wanted) == 1:
        return wanted[0]
    return lambda x: any(t(x) for t in wanted)


def _strings(values: Any) -> frozenset[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise _Unsupported  # jsonschema's equality of 1 and 1.0 and True is not copied here
    return frozenset(values)


def _enum(values: Any) -> Check:
    allowed = _strings(values)
    return lambda x: isinstance(x, str) and x in allowed


def _const(value: Any) -> Check:
    allowed = _strings([value])
    return lambda x: isinstance(x, str) and x in allowed


def _pattern(pattern: Any) -> Check:
    search = re.compile(pattern).search  # jsonschema uses re.search: the same matches
    return lambda x: not isinstance(x, str) or search(x) is not None


def _unique(unique: Any) -> Check:
    if not unique:
        return _always
    # Strings and whole numbers are unique as a set says; other items are left to jsonschema,
    # which holds True and 1 apart.
    return lambda x: (
        not isinstance(x, list)
        or (all(type(i) is str or type(i) is int for i in x) and len(set(x)) == len(x))
    )


def _bound(holds: Callable[[Any, Any], bool]) -> Callable[[Any], Check]:
    def make(bound: Any) -> Check:
        if not _is_number(bound):
            raise _Unsupported
        return lambda x: not _is_number(x) or holds(x, bound)

    return make


def _length(holds: Callable[[int, int], bool], kind: type[str] | type[list[Any]]) -> Callable[[Any], Check]:
    def make(bound: Any) -> Check:
        if not isinstance(bound, int):
            raise _Unsupported
        return lambda x: not isinstance(x, kind) or holds(len(x), bound)

    return make


def _required(keys: Any) -> Check:
    needed = list(keys)
    return lambda x: not isinstance(x, dict) or all(k in x for k in needed)


# Each check is written so that True means jsonschema finds nothing (a NaN fails every
# bound here, and jsonschema decides it).
_KEYWORDS: dict[str, Callable[[Any], Check]] = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "pattern": _pattern,
    "minLength": _length(lambda n, b: n >= b, str),
    "maxLength": _length(lambda n, b: n <= b, str),
    "minItems": _length(lambda n, b: n >= b, list),
    "maxItems": _length(lambda n, b: n <= b, list),
    "uniqueItems": _unique,
    "minimum": _bound(lambda x, b: x >= b),
    "maximum": _bound(lambda x, b: x <= b),
    "exclusiveMinimum": _bound(lambda x, b: x > b),
    "exclusiveMaximum": _bound(lambda x, b: x < b),
    "required": _required,
}
# Compiled with their neighbours in `_compile`.
_STRUCTURE = frozenset({"$ref", "properties", "additionalProperties", "items"})
