"""sharded-source, unreadable-format, engine-mismatch: one source, in a format its engine reads."""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.findings import Finding
from llmgw.rules import Context, Entry
from llmgw.source import READERS


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        yield from _check_entry(entry)


def _check_entry(entry: Entry) -> Iterator[Finding]:
    src = entry.source
    if src.several_files:
        yield entry.doc.finding("error", "sharded-source", ("source",), _sharded_message(entry))
        return
    if src.format == "unknown":
        what = (f"nothing here reads {src.suffix} files" if src.suffix
                else f"cannot tell what format {src.text} is in, since it names no file type")
        yield entry.doc.finding(
            "error", "unreadable-format", ("source",),
            f"{what}: llamacpp reads one .gguf file, vllm reads .safetensors or .bin, or a "
            "repository id (hf://org/repo). Point source at one of those.",
        )
        return
    readers = READERS[src.format]
    for profile in entry.spec.profiles:
        if profile.engine in readers:
            continue
        yield entry.doc.finding(
            "error", "engine-mismatch", (*entry.profile_path(profile), "engine"),
            _mismatch_message(entry, profile.engine, src.format, readers),
        )


def _sharded_message(entry: Entry) -> str:
    src = entry.source
    if src.shard is not None:
        what = f"one shard ({src.shard[0]} of {src.shard[1]}) of weights split across files"
    else:
        what = f"a directory holding {len(src.weight_files)} weight files"
    instead = "a single-file build (a GGUF, for llamacpp)"
    if src.repository:
        instead += f", or the repository id {src.repository} for vllm, which fetches the shards itself"
    else:
        instead += ", or the repository id (hf://org/repo) for vllm, which fetches the shards itself"
    return f"source names {what}; an entry names exactly one source. Serve {instead}."


def _mismatch_message(entry: Entry, engine: str, fmt: str, readers: frozenset[str]) -> str:
    if fmt == "repository":
        return (f"{engine} cannot serve a repository id: it needs one GGUF file. Name the file "
                f"({entry.source.repository or 'hf://org/repo'}/<name>.gguf), or use engine vllm.")
    others = " or ".join(sorted(readers))
    if fmt == "gguf":
        return (f"{engine} does not read GGUF files; use engine {others}, or point source at the "
                "safetensors repository for vllm.")
    return (f"{engine} cannot read .{fmt} weights; use engine {others}, or point source at a GGUF "
            "build of the same model for llamacpp.")
