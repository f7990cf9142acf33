"""sharded-source, unreadable-format, engine-mismatch, source-missing, source-outside: one
source, in a format its engine reads.

Every hint here is advice that passes lint when followed: a test applies each one and lints
again. A hint that sent vLLM to a GGUF repository once traded one error for another.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from llmgw import engines
from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.findings import Finding


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        yield from _check_entry(entry)


def _check_entry(entry: Entry) -> Iterator[Finding]:
    src = entry.source
    if src.leaves_catalogue:
        # Said without the target's name or kind: the finding is posted on the pull request.
        yield entry.doc.finding(
            "error",
            "source-outside",
            ("source",),
            f"source {src.text} is inside the catalogue as written, but a symlink leads out of "
            "it, so lint reads nothing there; put the weights themselves in the catalogue, or "
            "write the path they are at, where the reviewer can see it.",
        )
        return
    if src.missing:
        # A warning: weights may live only on the nodes. But a typo in the path is the
        # likelier cause, and without this the only finding was memory-unknown's advice
        # to write weights_bytes, which hides the typo until the engine fails to start.
        yield entry.doc.finding(
            "warning",
            "source-missing",
            ("source",),
            f"{_shown(entry)} does not exist on this machine. If the path is wrong, fix it; "
            "if the file is only on the nodes, the plan is written anyway, and the node agent "
            "fails to start the engine where it is missing.",
        )
    if src.several_files:
        yield entry.doc.finding("error", "sharded-source", ("source",), _sharded_message(entry))
        return
    if src.format == "unknown":
        what = (
            f"nothing here reads {src.suffix} files"
            if src.suffix
            else f"cannot tell what format {src.text} is in, since it names no file type"
        )
        yield entry.doc.finding(
            "error",
            "unreadable-format",
            ("source",),
            f"{what}: llamacpp reads one .gguf file, vllm reads .safetensors or .bin, or a "
            "repository id (hf://org/repo). Point source at one of those.",
        )
        return
    # A repository id is for an engine that fetches the files itself (vLLM); llama.cpp
    # needs to be handed one GGUF file. Each engine says what it reads (`Engine.reads`).
    readers = frozenset(name for name in engines.names() if src.format in engines.engine(name).reads)
    if src.gguf_repository and src.format == "repository":
        readers = frozenset()  # llama.cpp needs the file named, and vLLM reads no GGUF
    for profile in entry.spec.profiles:
        if profile.engine in readers:
            continue
        yield entry.doc.finding(
            "error",
            "engine-mismatch",
            (*entry.profile_path(profile), "engine"),
            _mismatch_message(entry, profile.engine, src.format, readers),
        )


def _shown(entry: Entry) -> str:
    """A local source as the user finds it from where lint runs: beside the model file."""
    text = entry.source.text
    if Path(text).is_absolute():
        return f"source {text}"
    return f"source {text} ({(entry.base_dir / text).as_posix()})"


def _sharded_message(entry: Entry) -> str:
    src = entry.source
    if src.shard is not None:
        what = f"one shard ({src.shard[0]} of {src.shard[1]}) of weights split across files"
    else:
        what = f"a directory holding {len(src.weight_files)} weight files"
    head = f"source names {what}; an entry names exactly one source."
    if src.format == "gguf" or src.gguf_repository:
        # The repository of a split GGUF holds only GGUF files: not something vLLM reads.
        where = f" from {src.repository}" if src.repository else ""
        return (
            f"{head} Serve a single-file build with engine llamacpp: a quantisation{where} "
            "that is one .gguf file. vllm does not read GGUF; for vllm, point source at the "
            "model's safetensors repository (hf://org/repo) instead."
        )
    repository = src.repository or "hf://org/repo"
    return (
        f"{head} Serve the repository id {repository} with engine vllm, which fetches the "
        "shards itself, or a GGUF build of the same model in one file with engine llamacpp."
    )


def _mismatch_message(entry: Entry, engine: str, fmt: str, readers: frozenset[str]) -> str:
    src = entry.source
    if src.gguf_repository and fmt == "repository":
        if "repository" in engines.engine(engine).reads:
            return (
                f"{src.repository} is a GGUF repository (its name says so), and vllm does not "
                "read GGUF; use engine llamacpp with one .gguf file from it "
                f"({src.repository}/<name>.gguf), or point source at the model's safetensors "
                "repository for vllm."
            )
        return (
            f"{engine} cannot serve a repository id: it needs one GGUF file. Name the file "
            f"({src.repository}/<name>.gguf)."
        )
    if fmt == "repository":
        return (
            f"{engine} cannot serve a repository id: it needs one GGUF file. Name the file "
            f"({src.repository or 'hf://org/repo'}/<name>.gguf), or use engine vllm."
        )
    others = " or ".join(sorted(readers))
    if fmt == "gguf":
        return (
            f"{engine} does not read GGUF files; use engine {others}, or point source at the "
            "safetensors repository for vllm."
        )
    return (
        f"{engine} cannot read .{fmt} weights; use engine {others}, or point source at a GGUF "
        "build of the same model for llamacpp."
    )
