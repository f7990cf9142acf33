"""Documents → findings: JSON Schema violations, each said as a sentence at its line.

The schema files decide what is valid (editors read the same files); this module
only turns jsonschema's errors into what a person editing the file needs to read.
"""

from __future__ import annotations

import copy
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

from llmgw.findings import Finding
from llmgw.load import Document
from llmgw.schema import load_schema, proves_valid, validator

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError


def check_document(doc: Document, name: str) -> tuple[list[Finding], dict[str, Any] | None]:
    """Every schema violation in `doc`, each at the offending value's line; and the data
    the later stages may check (see `without_mistakes`), or None."""
    if proves_valid(name)(doc.data):
        return [], doc.data
    misplaced = _keys_file(doc, name)
    if misplaced is not None:
        return [misplaced], None
    errors = list(validator(name).iter_errors(doc.data))
    findings: list[Finding] = []
    for error in errors:
        for finding in _explain(doc, error):
            # One mistake can break two keywords (a blank description fails
            # minLength and pattern); say it once.
            if finding not in findings:
                findings.append(finding)
    if not errors:
        return findings, doc.data
    return findings, without_mistakes(doc.data, name, errors)


def _keys_file(doc: Document, name: str) -> Finding | None:
    """A keys file put among the model files: said once, with where it belongs, rather than
    as a model missing every field it needs."""
    data = doc.data
    if name != "model" or not isinstance(data, dict) or "keys" not in data:
        return None
    if set(data) & set(load_schema("model")["properties"]):
        return None  # a model file with a stray `keys:`: its unknown field says so
    return doc.finding(
        "error",
        "schema",
        ("keys",),
        "this is a keys file (top-level `keys:`), not a model file, and every .yaml in the "
        "catalogue is read as a model. Move it out, beside the catalogue: `llmgw lint`, `plan` "
        "and `keys add` read keys.yaml from the folder they run in, or the file --keys names.",
        key=True,
    )


def schema_findings(doc: Document, name: str) -> list[Finding]:
    return check_document(doc, name)[0]


def without_mistakes(
    data: Any, name: str, errors: list[ValidationError] | None = None
) -> dict[str, Any] | None:
    """`data` with every optional key the schema refuses taken out, or None if that is not
    enough (a required key is missing or wrong).

    A file with one unknown key would otherwise hide everything else wrong with it until
    the next run; its other rules run on what is left, and no plan is written anyway.
    """
    if not isinstance(data, dict):
        return None
    try:
        data = copy.deepcopy(data)
    except RecursionError:
        return None  # nested deeper than any model file; its findings are enough
    for _ in range(3):
        errors = errors if errors is not None else list(validator(name).iter_errors(data))
        if not errors:
            return data  # type: ignore[no-any-return]  # deepcopy is Any; the schema made it a dict
        for error in errors:
            if not _drop(data, error):
                return None
        errors = None
    return None


def _drop(data: dict[str, Any], error: ValidationError) -> bool:
    """Take out what `error` is about, found by its path; False when nothing may go."""
    if error.validator == "required":
        return False  # a required key that was dropped, or never there
    path: list[str | int] = list(error.absolute_path)
    if error.validator == "additionalProperties":
        target = _at(data, path)
        if not isinstance(target, dict):
            return False
        known = error.schema.get("properties", {})
        for key in [k for k in target if k not in known]:
            del target[key]
        return True
    # Only whole keys go: dropping a list item would shift the positions of the rest.
    while path and isinstance(path[-1], int):
        path.pop()
    if not path or path[-1] not in _MAY_SET_ASIDE:
        return False
    parent = _at(data, path[:-1])
    if not isinstance(parent, dict):
        return False
    parent.pop(path[-1], None)
    return True


# Keys whose absence changes nothing the other rules judge, or only makes them say less.
# Without `endpoints` a remote profile would be checked as a placed one, and without
# `node_selector` a profile would match every node: rules would invent findings.
_MAY_SET_ASIDE = frozenset(
    {
        "description",
        "aliases",
        "weights_bytes",
        "architecture",
        "max_output",
        "args",
        "ctx_size",
        "min_memory_gb",
        "weight",
        "priority",
    }
)


def _at(data: Any, path: list[str | int]) -> Any:
    for step in path:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _explain(doc: Document, error: ValidationError) -> list[Finding]:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        return _unknown_fields(doc, error, path)
    return [doc.finding("error", "schema", path, _sentence(error, path, _field_name(path)))]


def _sentence(error: ValidationError, path: tuple[str | int, ...], field: str) -> str:
    """What is wrong at `path`, and what to write instead."""
    if path and path[-1] == "description" and (isinstance(error.instance, str) or error.instance is None):
        # `description:` with nothing after it is null, and means what "" means.
        return (
            "description is empty. Write one or two sentences for someone "
            "choosing between models (what it is good at, what it costs beside "
            "its neighbours), or remove the key to leave the model undescribed."
        )
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in str(error.message) else "a field"
        where = f" in {field}" if field else ""
        return f"missing required field '{missing}'{where}; add it."
    if error.validator == "type" and not path and error.instance is None:
        required = ", ".join(error.schema.get("required", []))
        return f"the file is empty; write the fields it needs ({required}), or delete the file."
    if error.validator == "pattern":
        said = _pattern_sentence(error, path, field)
    else:
        said = _value_sentence(error, field)
    return said if said is not None else f"{field or 'the file'}: {error.message}."


def _write_instead(wants: list[str], instance: object, field: str) -> str:
    """What to write when a number stands where text belongs: YAML typed it, so quoting it is
    the fix, and for a duration, its unit too (`idle_stop: 90` means nothing without one)."""
    if wants != ["string"] or not isinstance(instance, int | float) or isinstance(instance, bool):
        return "."
    text = f"{instance:g}" if isinstance(instance, float) else str(instance)
    if field.endswith("idle_stop"):
        return f"; write '{text}s' (or minutes as '{text}m')."
    return f"; quote it: '{text}'."


def _value_sentence(error: ValidationError, field: str) -> str | None:
    """A value of the wrong kind, size or count; None for what has no sentence of its own."""
    if error.validator == "enum":
        options = ", ".join(str(o) for o in error.validator_value)
        guess = get_close_matches(str(error.instance), [str(o) for o in error.validator_value], 1)
        hint = f"; did you mean '{guess[0]}'?" if guess else "."
        return f"{field} is {error.instance!r}, which is not one of: {options}{hint}"
    if error.validator == "type":
        want = error.validator_value
        wants = want if isinstance(want, list) else [want]
        want_text = " or ".join(_YAML_WORDS.get(w, f"a {w}") for w in wants)
        return f"{field or 'the file'} must be {want_text}, not {_describe(error.instance)}" + _write_instead(
            wants, error.instance, field
        )
    if error.validator in ("minimum", "exclusiveMinimum", "maximum"):
        bound = error.validator_value
        need = {
            "minimum": f"at least {bound}",
            "exclusiveMinimum": f"more than {bound}",
            "maximum": f"at most {bound}",
        }[str(error.validator)]
        return f"{field} is {error.instance}; it must be {need}."
    if error.validator == "minItems":
        return (
            f"{field} is empty; list at least {error.validator_value}, or remove "
            "the key where it is optional."
        )
    if error.validator == "uniqueItems" and isinstance(error.instance, list):
        dupes = sorted({str(x) for x in error.instance if error.instance.count(x) > 1})
        return f"{field} lists {', '.join(repr(d) for d in dupes)} more than once; keep one of each."
    return None


def _pattern_sentence(error: ValidationError, path: tuple[str | int, ...], field: str) -> str | None:
    """A string of the wrong shape, said for what the field is; None for the schema's words."""
    if path and path[-1] == "address":
        return (
            f"{field} {error.instance!r} is not a host name or IP address; write "
            "the address the gateway reaches this node on, e.g. 127.0.0.11."
        )
    if "endpoints" in path:
        return (
            f"{field} {error.instance!r} is not an engine address the gateway "
            "can reach; write http://HOST:PORT, optionally ending in /v1."
        )
    if path and path[-1] == "sha256":
        # A `|` block or a pasted `sha256sum` line ends in a newline: a hash that never matches.
        return (
            f"{field} {error.instance!r} is not 64 hexadecimal digits and nothing else; "
            "write the hash on one line, as `printf %s KEY | sha256sum` prints it without "
            "the trailing ' -', or make a new key with `llmgw keys add`."
        )
    if path and (path[-1] == "name" or "aliases" in path):
        return f"{field} {error.instance!r} is not a usable name: {_name_rule(str(error.validator_value))}."
    return None


# A model's profile fields, which a file indented one level too little puts at the top.
_PROFILE_FIELDS = frozenset(load_schema("model")["$defs"]["profile"]["properties"]) - {"name"}


def _unknown_fields(doc: Document, error: ValidationError, path: tuple[str | int, ...]) -> list[Finding]:
    known = list(error.schema.get("properties", {}))
    instance = error.instance if isinstance(error.instance, dict) else {}
    out = []
    for key in instance:
        if key in known:
            continue
        guess = get_close_matches(str(key), known, 1, 0.6)
        hint = f" Did you mean '{guess[0]}'?" if guess else f" Known fields here: {', '.join(known)}."
        if not path and "profiles" in known and key in _PROFILE_FIELDS:
            hint = (
                f" {_quoted(key)} is a profile's field: indent it under an entry of `profiles:`, "
                "beside that entry's `engine:`, for the profile it applies to."
            )
        where = f" in {_field_name(path)}" if path else ""
        out.append(
            doc.finding(
                "error",
                "unknown-field",
                (*path, key),
                f"unknown field {_quoted(key)}{where}.{hint}",
                key=True,
            )
        )
    return out


def _quoted(key: object, limit: int = 40) -> str:
    # A file that is not a model file at all would otherwise be echoed back line by line.
    text = str(key)
    if len(text) > limit or not text.isprintable():
        return f"'{text[:limit].encode('unicode_escape').decode()}…'"
    return f"'{text}'"


_YAML_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "boolean": "true or false",
}


def _name_rule(pattern: str) -> str:
    """The name pattern in words: each schema names things slightly differently."""
    letters = "lowercase letters" if "A-Z" not in pattern else "letters"
    extra = " ".join(c for c in "._:/-" if c in pattern.split("]")[1])
    length = pattern.rsplit("{", 1)[-1].split("}")[0].split(",")[-1] if "{" in pattern else ""
    longest = f", at most {int(length) + 1} characters" if length.isdigit() else ""
    return f"use {letters}, digits and {extra} only, starting with a letter or digit{longest}"


def _field_name(path: tuple[str | int, ...]) -> str:
    parts: list[str] = []
    for step in path:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        else:
            parts.append(("." if parts else "") + str(step))
    return "".join(parts)


def _describe(value: object) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
