"""How deeply a YAML text nests its lists and mappings, asked before a loader builds it.

ruamel's C composer builds nested collections by recursing in C: a file of 50,000 `[`
(100 KB) ended `llmgw lint` and every gateway worker reading such a keys file with
SIGSEGV, no output and no refusal. Its pure-Python loader recurses too, and ends in a
RecursionError. libyaml's parser, which hands out one event at a time, does not recurse,
so the depth is counted on its events, and the walk stops at the first level too many.

Beneath both the compiler (load, keys, inspect) and the gateway (its keys file), so each
refuses the same files in the same words.
"""

from __future__ import annotations

from ruamel.yaml.cyaml import CParser  # type: ignore[attr-defined]  # clib's, or clibz's
from ruamel.yaml.error import YAMLError
from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent

# A model file nests four or five deep, keys.yaml three, fleet.yaml four; well past any
# of them, and far short of where a recursive loader runs out of stack.
MAX_DEPTH = 64

# Every list or mapping YAML can write starts with one of these: `[`, `{`, a block list's
# `-`, a mapping's `:` (or `?` for an explicit key). Fewer of them than the limit, and no
# chain of nested collections can be as long, so most files need no walk at all.
_INDICATORS = "[{-:?"


def could_nest_deeper(text: str, limit: int) -> bool:
    """Whether `text` holds enough collection indicators to nest past `limit` at all."""
    count = 0
    for indicator in _INDICATORS:
        count += text.count(indicator)
        if count > limit:
            return True
    return False


def too_deep_at(text: str, limit: int = MAX_DEPTH) -> tuple[int, int] | None:
    """1-based (line, column) of the first list or mapping nested deeper than `limit`;
    None when nothing is. Text that is not valid YAML short of that depth is None too:
    the loader then reads it, nesting no deeper, and says what is wrong and where."""
    if not could_nest_deeper(text, limit):
        return None
    parser = CParser(text)
    depth = 0
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > limit:
                    mark = event.start_mark
                    return mark.line + 1, mark.column + 1
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
    except YAMLError:
        return None
    finally:
        parser.dispose()
    return None


def too_deep_sentence(limit: int = MAX_DEPTH) -> str:
    """What a refusal says, after naming the file (and the line, where it has one)."""
    return (
        f"lists and mappings nest more than {limit} deep here, which no llmgw file needs and "
        "the YAML reader cannot follow; write the values out flat, as the examples in docs/catalogue.md do."
    )
