"""Documents → findings: JSON Schema violations, each said as a sentence at its line.

The schema files decide what is valid (editors read the same files); this module
only turns jsonschema's errors into what a person editing the file needs to read.
"""

from __future__ import annotations

from difflib import get_close_matches

from jsonschema.exceptions import ValidationError

from llmgw.findings import Finding
from llmgw.load import Document
from llmgw.schema import validator


def schema_findings(doc: Document, name: str) -> list[Finding]:
    """Every schema violation in `doc`, each at the offending value's line."""
    findings: list[Finding] = []
    for error in validator(name).iter_errors(doc.data):
        for finding in _explain(doc, error):
            # One mistake can break two keywords (a blank description fails
            # minLength and pattern); say it once.
            if finding not in findings:
                findings.append(finding)
    return findings


def _explain(doc: Document, error: ValidationError) -> list[Finding]:
    path = tuple(error.absolute_path)
    field = _field_name(path)
    if error.validator == "additionalProperties":
        return _unknown_fields(doc, error, path)
    if path and path[-1] == "description" and isinstance(error.instance, str):
        return [doc.finding("error", "schema", path,
                            "description is empty. Write one or two sentences for someone "
                            "choosing between models (what it is good at, what it costs beside "
                            "its neighbours), or remove the key to leave the model undescribed.")]
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in str(error.message) else "a field"
        where = f" in {field}" if field else ""
        return [doc.finding("error", "schema", path,
                            f"missing required field '{missing}'{where}; add it.")]
    if error.validator == "enum":
        options = ", ".join(str(o) for o in error.validator_value)
        guess = get_close_matches(str(error.instance), [str(o) for o in error.validator_value], 1)
        hint = f"; did you mean '{guess[0]}'?" if guess else "."
        return [doc.finding("error", "schema", path,
                            f"{field} is {error.instance!r}, which is not one of: {options}{hint}")]
    if error.validator == "type":
        want = error.validator_value
        want_text = " or ".join(want) if isinstance(want, list) else want
        return [doc.finding("error", "schema", path,
                            f"{field or 'the file'} must be {_article(want_text)} {want_text}, "
                            f"not {_describe(error.instance)}.")]
    if error.validator == "pattern" and "endpoints" in path:
        return [doc.finding("error", "schema", path,
                            f"{field} {error.instance!r} is not an engine address the gateway "
                            "can reach; write http://HOST:PORT, optionally ending in /v1.")]
    if error.validator == "pattern" and path and path[-1] == "name":
        return [doc.finding("error", "schema", path,
                            f"{field} {error.instance!r} is not a usable name: use letters, digits "
                            "and . _ - : / only, starting with a letter or digit.")]
    subject = field or "the file"
    return [doc.finding("error", "schema", path, f"{subject}: {error.message}.")]


def _unknown_fields(doc: Document, error: ValidationError, path: tuple) -> list[Finding]:
    known = list(error.schema.get("properties", {}))
    instance = error.instance if isinstance(error.instance, dict) else {}
    out = []
    for key in instance:
        if key in known:
            continue
        guess = get_close_matches(str(key), known, 1, 0.6)
        hint = (f" Did you mean '{guess[0]}'?" if guess
                else f" Known fields here: {', '.join(known)}.")
        where = f" in {_field_name(path)}" if path else ""
        out.append(doc.finding("error", "unknown-field", (*path, key),
                               f"unknown field {_quoted(key)}{where}.{hint}", key=True))
    return out


def _quoted(key: object, limit: int = 40) -> str:
    # A file that is not a model file at all would otherwise be echoed back line by line.
    text = str(key)
    if len(text) > limit or not text.isprintable():
        return f"'{text[:limit].encode('unicode_escape').decode()}…'"
    return f"'{text}'"


def _field_name(path: tuple) -> str:
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
