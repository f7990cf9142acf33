"""context-pool, limits, context-beyond-training, gguf-header: what a request is promised fits in
what the engine is given, and in what the model was trained for."""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.rules.context import Context
from llmgw.engines import ctx_size_for, engine
from llmgw.errors import InspectError
from llmgw.findings import Finding


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        yield from _check_entry(entry)


def _check_entry(entry: Entry) -> Iterator[Finding]:
    yield from _check_training(entry)
    spec = entry.spec
    if spec.max_output is not None and spec.max_output > spec.context_length:
        yield entry.doc.finding(
            "error",
            "limits",
            ("max_output",),
            f"max_output {spec.max_output} is more than context_length {spec.context_length}, "
            "so no request could use it; lower max_output or raise context_length.",
        )
    for profile in spec.profiles:
        runs = engine(profile.engine)
        if not runs.shares_context_pool or profile.external:
            continue
        slots = runs.context_slots(profile.args)
        pool = ctx_size_for(spec, profile)
        per_request = pool // slots
        if per_request >= spec.context_length:
            continue
        # llama.cpp splits its pool evenly across slots: a request longer than
        # one slot's share fails mid-stream although the catalogue promised it.
        yield entry.doc.finding(
            "error",
            "context-pool",
            (*entry.profile_path(profile), "ctx_size"),
            f"ctx_size {pool} split across {slots} slot(s) gives each request {per_request} "
            f"tokens, less than context_length {spec.context_length}; raise ctx_size to "
            f"{spec.context_length * slots} or lower --parallel.",
        )


def _check_training(entry: Entry) -> Iterator[Finding]:
    header = entry.header
    if isinstance(header, InspectError):
        # The engine would refuse the file too; said here, before a node downloads or loads it.
        yield entry.doc.finding(
            "warning",
            "gguf-header",
            ("source",),
            f"cannot read the GGUF header of the source, so the memory estimate falls back to a rule "
            f"of thumb: {header}",
        )
        return
    arch, where = entry.architecture
    trained = arch.trained_context if arch is not None else None
    context = entry.spec.context_length
    if trained is None or context <= trained:
        return
    said = "its GGUF header says" if where == "the GGUF header" else "architecture.trained_context says"
    yield entry.doc.finding(
        "warning",
        "context-beyond-training",
        ("context_length",),
        f"context_length {context} is beyond the {trained} tokens the model was trained for ({said}): "
        f"past that its answers degrade, unless the engine stretches the context with RoPE scaling "
        f"(llama.cpp's --rope-scaling yarn). Lower context_length to {trained}, or add the scaling "
        "to the profile's args and keep this warning as the reminder.",
    )
