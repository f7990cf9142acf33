"""`llmgw inspect`: a source (or a model file's source) → what its GGUF header says, and, with
--write, those facts written back into the model file.

The model file is edited through ruamel.yaml's round-trip mode, so its comments, key order,
quoting and blank lines survive, and a pull request's diff shows only the lines that changed.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.compiler.fetch import open_source
from llmgw.compiler.gguf_header import Header, read_header
from llmgw.errors import InspectError
from llmgw.nesting import too_deep_at, too_deep_sentence

MODEL_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Inspection:
    source: str
    size_bytes: int | None
    header: Header

    def facts(self) -> dict[str, Any]:
        """What the reporters print, in the order a person reads it."""
        h = self.header
        return {
            "source": self.source,
            "size_bytes": self.size_bytes,
            "architecture": h.architecture,
            "name": h.name,
            "parameters": h.parameters,
            "file_type": h.file_type,
            "context_length": h.context_length,
            "layers": h.layers,
            "heads": h.heads,
            "kv_heads": h.kv_heads,
            "key_length": h.key_length,
            "value_length": h.value_length,
            "sliding_window": _sliding_window(h),
            "embedding_length": h.embedding_length,
            "feed_forward_length": h.feed_forward_length,
            "vocab_size": h.vocab_size,
            "chat_template": h.chat_template,
            "gguf_version": h.version,
            "header_bytes": h.header_bytes,
        }


def _sliding_window(h: Header) -> dict[str, Any] | None:
    if not h.sliding_window:
        return None
    layout = None
    if h.local_layers is not None:
        layout = "".join("L" if local else "G" for local in h.local_layers)
    return {"window": h.sliding_window, "local_layers": h.sliding_window_layers, "layout": layout}


def inspect(source: str, base_dir: Path | None = None) -> Inspection:
    with open_source(source, base_dir) as opened:
        header = read_header(opened.stream, opened.where, opened.size)
        return Inspection(source, opened.size, header)


def is_model_file(argument: str) -> bool:
    return argument.endswith(MODEL_SUFFIXES) and Path(argument).is_file()


def model_file_source(path: Path) -> str:
    """The `source` a model file names; the file must at least say that much."""
    from ruamel.yaml import YAML

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InspectError(f"cannot read {path} ({exc}); run `llmgw lint` to see why.") from None
    deep = too_deep_at(text)
    if deep is not None:
        # Asked first: ruamel's C loader crashes the process on such a file (see nesting.py).
        raise InspectError(f"{path}:{deep[0]}:{deep[1]}: {too_deep_sentence()}")
    try:
        data = YAML(typ="safe").load(text)
    except Exception as exc:  # ruamel's errors have no common base worth naming
        raise InspectError(f"cannot read {path} as YAML ({exc}); run `llmgw lint` to see where.") from None
    source = data.get("source") if isinstance(data, dict) else None
    if not isinstance(source, str) or not source:
        raise InspectError(f"{path} has no source to inspect; write `source:` first (see docs/catalogue.md).")
    return source


def architecture_block(h: Header) -> dict[str, Any] | None:
    """The model file's `architecture`, from the header; None when the header lacks the essentials."""
    if not (h.layers and h.kv_heads and h.key_length):
        return None
    block: dict[str, Any] = {
        "name": h.architecture,
        "layers": h.layers,
        "heads": h.heads,
        "kv_heads": h.kv_heads,
        "head_dim": h.key_length,
        "value_dim": h.value_length,
        "sliding_window": h.sliding_window,
        "sliding_window_layers": h.sliding_window_layers if h.local_layers is not None else None,
        "embedding_length": h.embedding_length,
        "feed_forward_length": h.feed_forward_length,
        "vocab_size": h.vocab_size,
        "trained_context": h.context_length,
    }
    return {k: v for k, v in block.items() if v is not None}


def write_facts(path: Path, inspection: Inspection) -> list[str]:
    """Fill weights_bytes and architecture into the model file in place; the keys changed."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.util import load_yaml_guess_indent

    text = path.read_text(encoding="utf-8")
    _, indent, offset = load_yaml_guess_indent(text)
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # long descriptions stay on their one line
    yaml.indent(mapping=2, sequence=indent, offset=offset)
    doc = yaml.load(text)
    if not isinstance(doc, CommentedMap):
        raise InspectError(f"{path} is not a mapping of keys; run `llmgw lint` to see what it should be.")
    changed: list[str] = []
    if inspection.size_bytes is not None and doc.get("weights_bytes") != inspection.size_bytes:
        _set_after(doc, "weights_bytes", inspection.size_bytes, after="source")
        changed.append("weights_bytes")
    block = architecture_block(inspection.header)
    if block is not None and _changed_architecture(doc.get("architecture"), block):
        _set_architecture(doc, block)
        changed.append("architecture")
    if changed:
        out = io.StringIO()
        yaml.dump(doc, out)
        path.write_text(out.getvalue(), encoding="utf-8")
    return changed


def _changed_architecture(current: Any, block: dict[str, Any]) -> bool:
    if not isinstance(current, dict):
        return True
    # kv_bytes is the person's choice (the cache type), not the file's: it is kept.
    return any(current.get(k) != v for k, v in block.items())


def _set_architecture(doc: Any, block: dict[str, Any]) -> None:
    from ruamel.yaml.comments import CommentedMap

    current = doc.get("architecture")
    if isinstance(current, CommentedMap):
        # Edited in place: the mapping keeps its style (flow or block) and its comments.
        for key, value in block.items():
            current[key] = value
        return
    fresh = CommentedMap(block)
    _set_after(doc, "architecture", fresh, after="weights_bytes")


def _set_after(doc: Any, key: str, value: Any, after: str) -> None:
    if key in doc:
        doc[key] = value
        return
    keys = list(doc.keys())
    position = keys.index(after) + 1 if after in keys else len(keys)
    doc.insert(position, key, value)
