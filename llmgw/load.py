"""Files → documents that remember where each value came from.

Parsing 5,000 model files must take well under a second, so every file is loaded once
with ruamel's C parser, which keeps no positions, and a plain file (string keys; no
tags, aliases or repeated keys: what catalogue files are) is built straight from the
parser's nodes. Anything else takes ruamel's whole safe loader, which also says what is
wrong. Only a file that has a finding is parsed a second time, into the C parser's node
tree, to learn the line and column of the value the finding is about.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.cyaml import CParser  # type: ignore[attr-defined]  # clib's, or clibz's
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.tag import Tag

from llmgw.errors import UsageError
from llmgw.findings import Finding, Severity
from llmgw.nesting import too_deep_at, too_deep_sentence
from llmgw.yaml_errors import yaml_error

YamlPath = tuple[str | int, ...]

# A catalogue entry is a page of YAML; anything this large is a mistake or an attack.
MAX_FILE_BYTES = 1 << 20

_local = threading.local()


class _Yaml12Resolver(VersionedResolver):
    """YAML 1.2, as ruamel reads by default, without asking on every scalar.

    With the C parser, ruamel's resolver looks for the document's %YAML version on a
    scanner that does not exist, raising and catching an AttributeError for each scalar:
    a third of the time spent loading 5,000 model files.
    """

    @property
    def processing_version(self) -> Any:
        return (1, 2)


def _fast_yaml() -> YAML:
    if not hasattr(_local, "fast"):
        _local.fast = YAML(typ="safe", pure=False)
        _local.fast.Resolver = _Yaml12Resolver
    fast: YAML = _local.fast  # a thread-local attribute is Any to mypy
    return fast


# One Tag object per YAML 1.2 tag, so that the plain path knows a node's type by identity.
# ruamel's resolver makes a new Tag for every scalar, and its loader a new class per file:
# two thirds of the time it spent on 5,000 model files.
_TAGS: dict[str, Tag] = {}


def _shared_tag(name: str) -> Tag:
    return _TAGS.setdefault(name, Tag(suffix=name))


_STR, _SEQ, _MAP = (_shared_tag(f"tag:yaml.org,2002:{t}") for t in ("str", "seq", "map"))
_INT, _NULL = _shared_tag("tag:yaml.org,2002:int"), _shared_tag("tag:yaml.org,2002:null")
# ruamel's own YAML 1.2 table (first character → (tag, pattern) in its order), so that a
# plain scalar resolves exactly as the full loader resolves it.
_TABLE: dict[str | None, list[tuple[str, Any]]] = _Yaml12Resolver().versioned_resolver
_IMPLICIT: dict[str | None, list[tuple[Tag, Any]]] = {
    first: [(_shared_tag(tag), pattern) for tag, pattern in [*resolvers, *_TABLE.get(None, [])]]
    for first, resolvers in _TABLE.items()
}
_ANY_FIRST = _IMPLICIT.get(None, [])
_RESOLVED = frozenset(id(tag) for tag in _TAGS.values())


class _NotPlain(Exception):
    """The file uses YAML a catalogue file does not need; the full loader reads it."""


class _PlainLoader(CParser, SafeConstructor, _Yaml12Resolver):  # type: ignore[misc]  # CParser is Any
    """ruamel's C parser and composer, with a resolver that answers from `_IMPLICIT`."""

    def __init__(self, text: str) -> None:
        CParser.__init__(self, text)
        self._parser = self._composer = self
        SafeConstructor.__init__(self, loader=self)
        _Yaml12Resolver.__init__(self, loadumper=self)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Tag:
        if kind is ScalarNode:
            if implicit[0]:
                for tag, pattern in _IMPLICIT.get(value[:1], _ANY_FIRST):
                    if pattern.match(value):
                        return tag
            return _STR
        return _SEQ if kind is SequenceNode else _MAP

    # No path resolvers are registered: the composer's calls to these need do nothing.
    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        return None

    def ascend_resolver(self) -> None:
        return None

    def build(self, node: Node, seen: set[int]) -> Any:
        """The value of `node`, as ruamel's safe loader builds it; _NotPlain when that
        takes more than dicts with string keys, lists and scalars."""
        tag = node.ctag
        if tag is _STR:
            return node.value
        kind = type(node)
        if kind is MappingNode:
            if tag is not _MAP or id(node) in seen:
                raise _NotPlain  # a tag, or an alias: the full loader shares the object
            seen.add(id(node))
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.ctag is not _STR or type(key_node) is not ScalarNode:
                    raise _NotPlain  # `<<` merges, non-string keys
                key = key_node.value
                if key in out:
                    raise _NotPlain  # the full loader says which key, and where
                out[key] = self.build(value_node, seen)
            return out
        if kind is SequenceNode:
            if tag is not _SEQ or id(node) in seen:
                raise _NotPlain
            seen.add(id(node))
            return [self.build(item, seen) for item in node.value]
        if tag is _INT and node.value.isdigit():  # the resolver matched [0-9]: ASCII only
            return int(node.value)
        if tag is _NULL:
            return None
        if id(tag) in _RESOLVED:  # a resolved bool, float, signed or based int, or a date
            return self.construct_non_recursive_object(node)
        raise _NotPlain  # an explicit tag


def _plain_data(text: str) -> Any:
    """The file's data by the plain path, or _NotPlain (the class) when it needs the full loader."""
    loader = _PlainLoader(text)
    try:
        node = loader.get_single_node()
        return None if node is None else loader.build(node, set())
    except Exception:  # a mistake, or YAML beyond the plain path: the full loader
        # reads the file again and, for a mistake, says what it is and where.
        return _NotPlain
    finally:
        _release(loader)


def _compose(text: str) -> Node | None:
    """The C composer's node tree of `text`, as ruamel's `compose` gives it: for positions."""
    loader = _PlainLoader(text)
    try:
        node: Node | None = loader.get_single_node()
        return node
    finally:
        _release(loader)


def _release(loader: _PlainLoader) -> None:
    loader.dispose()
    # The loader is its own parser, composer and resolver: without these references it is
    # freed now, not left for the cycle collector (which lint pauses while it runs).
    loader.__dict__.clear()


@dataclass
class Document:
    """One parsed file. `data` is plain dicts and lists; positions come from `position()`."""

    file: str  # as shown in findings: the path the user gave, joined with the file's name
    text: str
    data: Any
    _tree: Any = field(default=None, repr=False)

    def position(self, path: YamlPath, *, key: bool = False) -> tuple[int, int]:
        """1-based (line, column) of the value at `path`, or of its key when `key`.

        Walks as deep as the file goes: a path into a value that is missing
        points at the nearest enclosing one, which is where the fix goes.
        """
        if self._tree is None:
            self._tree = _compose(self.text)
        node: Node | None = self._tree
        mark = node.start_mark if node is not None else None
        for i, step in enumerate(path):
            child = _child(node, step)
            if child is None:
                break  # the nearest enclosing value is where the fix goes
            key_node, node = child
            last = i == len(path) - 1
            mark = key_node.start_mark if key and last and key_node is not None else node.start_mark
        if mark is None:
            return 1, 1
        return mark.line + 1, mark.column + 1

    def finding(
        self, severity: Severity, rule: str, path: YamlPath, message: str, *, key: bool = False
    ) -> Finding:
        line, col = self.position(path, key=key)
        return Finding(self.file, line, col, rule, severity, message)


def _child(node: Node | None, step: str | int) -> tuple[Node | None, Node] | None:
    """(key node, value node) of `step` in a mapping, or (None, item) in a sequence."""
    if isinstance(node, MappingNode) and isinstance(step, str):
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode) and key_node.value == step:
                return key_node, value_node
    if isinstance(node, SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
        return None, node.value[step]
    return None


def load_document(path: Path, display: str) -> tuple[Document | None, list[Finding]]:
    """Parse one YAML file; findings instead of exceptions for a user's mistakes."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, [Finding(display, 1, 1, "yaml", "error", f"cannot read the file: {exc.strerror}.")]
    if len(raw) > MAX_FILE_BYTES:
        return None, [
            Finding(
                display,
                1,
                1,
                "yaml",
                "error",
                f"the file is {len(raw):,} bytes; a model file is a page of YAML. "
                "Split it into one file per model.",
            )
        ]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [
            Finding(
                display, 1, 1, "yaml", "error", f"the file is not UTF-8 (byte {exc.start}); save it as UTF-8."
            )
        ]
    return parse_document(text, display)


def parsed_or_refused(text: str, display: str, setting: str = "") -> Any:
    """The data of a file a command or service reads whole, or UsageError with lint's own
    sentence at file:line:column (and the setting that named the file, when one did)."""
    doc, findings = parse_document(text, display)
    errors = [f for f in findings if f.severity == "error"]
    if not errors and doc is not None:
        return doc.data
    named = f" ({setting})" if setting else ""
    if not errors:
        raise UsageError(f"{display}{named}: it could not be read.")
    first = errors[0]
    raise UsageError(f"{display}:{first.line}:{first.column}{named}: {first.message}")


def parse_document(text: str, display: str) -> tuple[Document | None, list[Finding]]:
    """Parse YAML text already read, with every bound the catalogue's files have: nesting,
    anchors and aliases (a "billion laughs" is refused, never expanded), values Python cannot
    build. Every reader of a file a person edits goes through here: keys.yaml's own loader
    once expanded nine levels of aliases in each gateway worker until it passed 2 GB."""
    deep = too_deep_at(text)
    if deep is not None:
        # Before any loader: the C composer would recurse through it and crash the process.
        return None, [Finding(display, *deep, "yaml", "error", too_deep_sentence())]
    data = _plain_data(text)
    if data is not _NotPlain:
        # The plain path refuses any list or mapping met twice, so no alias is in it.
        return Document(display, text, data), []
    try:
        data = _fast_yaml().load(text)
    except MarkedYAMLError as exc:
        return None, [_yaml_finding(display, exc, text)]
    except YAMLError as exc:  # unmarked: rare, but never a traceback
        return None, [Finding(display, 1, 1, "yaml", "error", f"not valid YAML: {exc}.")]
    except (ValueError, TypeError, OverflowError, KeyError, IndexError):
        # A scalar YAML types but Python cannot build: `._` as a float, 2001-02-30,
        # `!!bool x` (KeyError), `!!int ""` (IndexError).
        return None, [_unbuildable_value(display, text)]
    except RecursionError:
        return None, [
            Finding(
                display,
                1,
                1,
                "yaml",
                "error",
                "the file nests lists or mappings too deeply to read; a model file "
                "is a page of plain keys and values.",
            )
        ]
    doc = Document(display, text, data)
    if _shares_a_container(data):
        return doc, [
            Finding(
                display,
                *_reused_anchor(text),
                "yaml",
                "error",
                "anchors and aliases (&name / *name) are not allowed in llmgw's files (the "
                "catalogue, the fleet, keys.yaml), so a file cannot expand into something huge; "
                "write the value out in full.",
            )
        ]
    return doc, []


def _yaml_finding(display: str, exc: MarkedYAMLError, text: str) -> Finding:
    line, col, sentence = yaml_error(exc, text)
    return Finding(display, line, col, "yaml", "error", sentence)


_KINDS = {"int": "an integer", "float": "a number", "timestamp": "a date", "bool": "a boolean"}


def _unbuildable_value(display: str, text: str) -> Finding:
    yaml = _fast_yaml()
    try:
        stack: list[Node] = [yaml.compose(text)]
        while stack:
            node = stack.pop()
            if isinstance(node, MappingNode):
                stack.extend(n for pair in reversed(node.value) for n in reversed(pair))
            elif isinstance(node, SequenceNode):
                stack.extend(reversed(node.value))
            elif isinstance(node, ScalarNode) and not str(node.tag).endswith(":str"):
                try:
                    yaml.constructor.construct_object(node, deep=True)
                except (ValueError, TypeError, OverflowError, KeyError, IndexError) as exc:
                    tag = str(node.tag).rsplit(":", 1)[-1]
                    kind = _KINDS.get(tag, f"a {tag}")
                    return Finding(
                        display,
                        node.start_mark.line + 1,
                        node.start_mark.column + 1,
                        "yaml",
                        "error",
                        f"{node.value!r} reads as {kind} but is not a valid one ({exc}); quote it "
                        f'if it is text, e.g. "{node.value}".',
                    )
    except (YAMLError, RecursionError):
        pass
    return Finding(
        display,
        1,
        1,
        "yaml",
        "error",
        "a value in the file cannot be read; quote values that are meant as text.",
    )


def _shares_a_container(data: Any) -> bool:
    """True when one list or mapping appears twice in the tree: the mark of an alias.

    Checking the parsed tree by identity costs one pass over distinct nodes, so a
    "billion laughs" file is refused in microseconds instead of being expanded by
    the schema check that would walk every path through it.
    """
    seen: set[int] = set()
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            children = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        if id(node) in seen:
            return True
        seen.add(id(node))
        stack.extend(children)
    return False


def _reused_anchor(text: str) -> tuple[int, int]:
    """Where the first list or mapping used twice was anchored (the composer hands an
    alias the very node its anchor made)."""
    try:
        root = _compose(text)
    except (YAMLError, RecursionError):
        return 1, 1
    stack: list[Node] = [root] if root is not None else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, (MappingNode, SequenceNode)):
            continue
        if id(node) in seen:
            return node.start_mark.line + 1, node.start_mark.column + 1
        seen.add(id(node))
        children = [n for pair in node.value for n in pair] if isinstance(node, MappingNode) else node.value
        stack.extend(reversed(children))
    return 1, 1
