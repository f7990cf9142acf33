"""keys.yaml for the compiler: lint it against the catalogue, and add a key to it.

The gateway reads the same file on its own (gateway/state/keys.py): it must not import the
compiler's stages, and the compiler must not import the gateway.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import io
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from llmgw.atomic import replace_file
from llmgw.compiler.catalogue import Entry, catalogue_files
from llmgw.compiler.validate import check_document
from llmgw.errors import UsageError
from llmgw.findings import Finding
from llmgw.load import Document, load_document, parsed_or_refused
from llmgw.plan import Plan
from llmgw.schema import dates_as_text, proves_valid

MODELINE = "# yaml-language-server: $schema=schema/keys.schema.json\n"
# Prefixed so a leaked key is recognisable for what it is (secret scanners match on it).
KEY_PREFIX = "sk-llmgw-"


def lint_keys(
    path: Path,
    entries: Sequence[Entry],
    today: dt.date | None = None,
    previous: Plan | None = None,
) -> list[Finding]:
    """Findings for keys.yaml: schema, repeated names or hashes, `models` entries that match
    no model (errors), keys past their `expires` day (warnings), and with the plan now
    deployed, models a key reaches that it did not (warnings, on the model's file)."""
    display = path.as_posix()
    doc, findings = load_document(path, display)
    if doc is None or findings:
        return findings
    # YAML reads 2027-01-31 as a date; the schema (as editors read it) says a string.
    checked = Document(doc.file, doc.text, dates_as_text(doc.data))
    problems, data = check_document(checked, "keys")
    if data is None:
        return problems
    findings.extend(problems)
    names = {name for e in entries for name in (e.spec.name, *e.spec.aliases)}
    first_name: dict[str, int] = {}
    first_hash: dict[str, int] = {}
    for i, key in enumerate(data.get("keys", [])):
        name, digest = key.get("name"), str(key.get("sha256", "")).lower()
        if name in first_name:
            findings.append(
                doc.finding(
                    "error",
                    "keys-duplicate",
                    ("keys", i, "name"),
                    f"the name '{name}' is also key #{first_name[name] + 1}'s; metrics and logs "
                    "could not tell the two apart. Give each key its own name.",
                )
            )
        else:
            first_name[name] = i
        if digest and digest in first_hash:
            findings.append(
                doc.finding(
                    "error",
                    "keys-duplicate",
                    ("keys", i, "sha256"),
                    f"this hash is also key #{first_hash[digest] + 1}'s, so one key would count as "
                    "both; remove one entry, or make a new key with `llmgw keys add`.",
                )
            )
        elif digest:
            first_hash[digest] = i
        for j, pattern in enumerate(key.get("models") or []):
            if patterns_matching_nothing([pattern], names):
                findings.append(
                    doc.finding(
                        "error",
                        "keys-no-model",
                        ("keys", i, "models", j),
                        f"'{pattern}' matches no model name or alias in the catalogue, so it grants "
                        "nothing; fix the spelling, or remove it.",
                    )
                )
        if previous is not None and key.get("models"):
            findings.extend(_newly_reached(display, i, key, entries, previous))
        findings.extend(_unbounded(doc, i, key, entries))
        expires = key.get("expires")
        if expires and dt.date.fromisoformat(expires) < (today or dt.date.today()):
            findings.append(
                doc.finding(
                    "warning",
                    "keys-expired",
                    ("keys", i, "expires"),
                    f"the key '{name}' expired on {expires} and is refused (401); remove the entry, "
                    "or move the date if the key should still work.",
                )
            )
    return findings


def _unbounded(doc: Document, i: int, key: dict[str, Any], entries: Sequence[Entry]) -> list[Finding]:
    """A key with a budget or tpm that reaches a model setting no max_output: a request to it
    without max_tokens may run to the end of its context, so the gateway holds that much of
    the key's tokens for it, and such requests are refused far sooner than their answers
    would spend."""
    limits = [what for what in ("budget", "tpm") if key.get(what) is not None]
    if not limits:
        return []
    patterns = key.get("models") or ["*"]
    reached = sorted(
        e.spec.name
        for e in entries
        if e.spec.max_output is None
        and e.spec.task in ("chat", "completion")
        and any(fnmatch.fnmatchcase(n, p) for p in patterns for n in (e.spec.name, *e.spec.aliases))
    )
    if not reached:
        return []
    return [
        doc.finding(
            "warning",
            "keys-unbounded",
            ("keys", i, limits[0]),
            f"the key '{key.get('name')}' has a {' and a '.join(limits)} and reaches "
            f"{', '.join(reached)}, which set no max_output: each of its requests there without "
            "max_tokens holds the model's whole context of the key's tokens until it ends. Give "
            "those models a max_output, or have the key's clients send max_tokens.",
        )
    ]


def catalogue_names(catalog: Path) -> set[str]:
    """Every model name and alias the catalogue's files give, read without the fleet: what
    `keys add --models` checks a pattern against. A file that does not parse gives none
    (lint says why)."""
    names: set[str] = set()
    for path in catalogue_files(catalog):
        doc, _ = load_document(path, path.as_posix())
        data = doc.data if doc is not None else None
        if not isinstance(data, dict):
            continue
        aliases = data.get("aliases")
        for name in [data.get("name"), *(aliases if isinstance(aliases, list) else [])]:
            if isinstance(name, str):
                names.add(name)
    return names


def patterns_matching_nothing(patterns: Sequence[str], names: set[str]) -> list[str]:
    """The `models` entries that would grant nothing: the same test as lint's keys-no-model."""
    return [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]


def _newly_reached(
    keys_file: str, index: int, key: dict[str, Any], entries: Sequence[Entry], previous: Plan
) -> list[Finding]:
    """Models `key` reaches in this catalogue and did not in `previous`, each said on the name
    or alias that lets it in.

    A key scoped by a glob (`a-*`) silently gained a model when a pull request gave that
    model a matching alias, and nothing in the pull request touched keys.yaml. A model the
    key names exactly, by its own name, is the grant the file asked for and is not said.
    """
    patterns = [str(p) for p in key["models"]]

    def reaches(words: Sequence[str]) -> tuple[str, int] | None:
        for k, word in enumerate(words):
            for pattern in patterns:
                if fnmatch.fnmatchcase(word, pattern):
                    return pattern, k
        return None

    before = {m.name for m in previous.models if reaches((m.name, *m.aliases))}
    findings = []
    for entry in entries:
        spec = entry.spec
        words = (spec.name, *spec.aliases)
        found = reaches(words)
        if spec.name in before or found is None or spec.name in patterns:
            continue
        pattern, k = found
        what, where = ("name", ("name",)) if k == 0 else ("alias", ("aliases", k - 1))
        findings.append(
            entry.doc.finding(
                "warning",
                "keys-reach",
                where,
                f"this {what} '{words[k]}' lets the key '{key.get('name')}' ({keys_file} key "
                f"#{index + 1}, models '{pattern}') use {spec.name}, which it could not use in "
                f"the previous plan; if that key should not, choose {'an alias' if k else 'a name'} "
                f"its models do not match, or narrow the key's models in {keys_file}.",
            )
        )
    return findings


def key_name_is_valid(name: str) -> bool:
    """Whether keys.yaml's schema takes `name` as a key's name: the one rule, which the
    gateway and editors read too."""
    return proves_valid("keys")({"keys": [{"name": name, "sha256": "0" * 64}]})


def _text_of(path: Path) -> str:
    """The keys file's text to edit, or a new file's; UsageError when it cannot be read."""
    if not path.exists():
        return MODELINE + "keys: []\n"
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path} is not UTF-8 (byte {exc.start}); save it as UTF-8 before adding a key."
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}.") from None


def _editable(yaml: YAML, text: str, path: Path) -> Any:
    """The file's round-trip document; UsageError for anything that keeps it from being edited.
    Read first with the bounded loader every reader of keys.yaml uses, so a file that nests too
    deeply or expands through aliases is refused before the round-trip loader sees it."""
    try:
        parsed_or_refused(text, str(path))
    except UsageError as exc:
        raise UsageError(f"{exc} No key was added.") from None
    try:
        return yaml.load(text)
    except YAMLError as exc:
        raise UsageError(
            f"{path} is not valid YAML ({exc}); fix it (`llmgw lint` shows where) before adding a key."
        ) from None
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, RecursionError) as exc:
        raise UsageError(
            f"{path} holds a value that cannot be read ({exc}); fix it (`llmgw lint` shows where) "
            "before adding a key."
        ) from None


def add_key(
    path: Path,
    name: str,
    models: Sequence[str] = (),
    rpm: int | None = None,
    tpm: int | None = None,
    expires: dt.date | None = None,
    priority: str | None = None,
    share: float | None = None,
    budget: tuple[int, str, float | None] | None = None,
) -> str:
    """Append a new key's entry to `path` (made if missing), comments kept; the key itself,
    which is stored nowhere."""
    yaml = YAML()  # round-trip: a person's comments and layout survive
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = _editable(yaml, _text_of(path), path)
    if doc is None:
        doc = CommentedMap()
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if keys is None and isinstance(doc, dict):
        keys = doc["keys"] = CommentedSeq()
    if not isinstance(keys, list):
        raise UsageError(f"{path} has no `keys:` list; fix the file before adding a key.")
    if any(isinstance(k, dict) and k.get("name") == name for k in keys):
        raise UsageError(
            f"{path} already has a key named '{name}'; pick another name, or remove "
            "that entry first to replace its key."
        )
    if isinstance(keys, CommentedSeq) and keys.fa.flow_style():
        keys.fa.set_block_style()  # `keys: []` grows into a block list, as people write it
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    entry = CommentedMap(name=name, sha256=hashlib.sha256(key.encode()).hexdigest())
    if models:
        entry["models"] = CommentedSeq(models)
        entry["models"].fa.set_flow_style()
    if rpm is not None:
        entry["rpm"] = rpm
    if tpm is not None:
        entry["tpm"] = tpm
    if expires is not None:
        entry["expires"] = expires
    if priority is not None:
        entry["priority"] = priority
    if share is not None:
        entry["share"] = int(share) if share == int(share) else share
    if budget is not None:
        tokens, every, warn_at = budget
        entry["budget"] = CommentedMap(tokens=tokens, every=every)
        if warn_at is not None:
            entry["budget"]["warn_at"] = warn_at
        entry["budget"].fa.set_flow_style()
    keys.append(entry)
    out = io.StringIO()
    yaml.dump(doc, out)
    replace_file(path, out.getvalue().encode())
    return key
