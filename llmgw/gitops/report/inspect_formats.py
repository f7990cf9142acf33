"""The `llmgw inspect --format` choices: name → reporter `(facts, stream) -> None`.

json and yaml carry every fact under the same keys, for scripts; text is for a person.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TextIO

InspectReporter = Callable[[dict[str, Any], TextIO], None]


def report_json(facts: dict[str, Any], stream: TextIO) -> None:
    stream.write(json.dumps(facts, indent=2) + "\n")


def report_yaml(facts: dict[str, Any], stream: TextIO) -> None:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # the facts' own order, not the alphabet
    yaml.dump(facts, stream)


def report_text(facts: dict[str, Any], stream: TextIO) -> None:
    rows = [
        ("file size", _bytes(facts["size_bytes"])),
        ("architecture", _name(facts)),
        ("parameters", _count(facts["parameters"])),
        ("file type", facts["file_type"]),
        ("trained context", _tokens(facts["context_length"])),
        ("layers", facts["layers"]),
        ("attention heads", _heads(facts)),
        ("head size", _head_size(facts)),
        ("sliding window", _window(facts["sliding_window"])),
        ("embedding length", facts["embedding_length"]),
        ("feed-forward length", facts["feed_forward_length"]),
        ("vocabulary", _count(facts["vocab_size"]) if facts["vocab_size"] else None),
        ("chat template", "yes" if facts["chat_template"] else "no"),
        ("header", f"GGUF v{facts['gguf_version']}, {_bytes(facts['header_bytes'])} read"),
    ]
    stream.write(f"{facts['source']}\n")
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        shown = "not in the header" if value is None else value
        stream.write(f"  {label.ljust(width)}  {shown}\n")


def _name(facts: dict[str, Any]) -> str | None:
    arch, name = facts["architecture"], facts["name"]
    return f"{arch} ({name})" if arch and name else arch


def _bytes(n: int | None) -> str | None:
    if n is None:
        return None
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _count(n: int | None) -> str | None:
    if n is None:
        return None
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit} ({n})"
    return str(n)


def _tokens(n: int | None) -> str | None:
    return None if n is None else f"{n} tokens"


def _heads(facts: dict[str, Any]) -> str | None:
    heads, kv = facts["heads"], facts["kv_heads"]
    if heads is None:
        return None
    if kv is None or kv == heads:
        return f"{heads} (as many KV heads)"
    return f"{heads}, {kv} KV heads (grouped-query attention, {heads // kv} per KV head)"


def _head_size(facts: dict[str, Any]) -> str | None:
    k, v = facts["key_length"], facts["value_length"]
    if k is None:
        return None
    return f"key {k}, value {v}"


def _window(window: dict[str, Any] | None) -> str:
    if window is None:
        return "none: every layer attends to the whole context"
    layout = window["layout"]
    if layout is None:
        return (
            f"{window['window']} tokens, layout not known for this architecture: every layer "
            "counted at the full context"
        )
    total = len(layout)
    return (
        f"{window['window']} tokens on {window['local_layers']} of {total} layers, "
        f"the rest global ({layout}: L local, G global)"
    )


INSPECT_REPORTERS: dict[str, InspectReporter] = {
    "text": report_text,
    "json": report_json,
    "yaml": report_yaml,
}
