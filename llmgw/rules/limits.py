"""context-pool, limits: what a request is promised fits in what the engine is given."""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.findings import Finding
from llmgw.rules import Context, Entry


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        yield from _check_entry(entry)


def _check_entry(entry: Entry) -> Iterator[Finding]:
    spec = entry.spec
    if spec.max_output is not None and spec.max_output > spec.context_length:
        yield entry.doc.finding(
            "error", "limits", ("max_output",),
            f"max_output {spec.max_output} is more than context_length {spec.context_length}, "
            "so no request could use it; lower max_output or raise context_length.",
        )
    for profile in spec.profiles:
        if profile.engine != "llamacpp" or profile.external:
            continue
        slots = profile.slots
        pool = spec.ctx_size_for(profile)
        per_request = pool // slots
        if per_request >= spec.context_length:
            continue
        # llama.cpp splits its pool evenly across slots: a request longer than
        # one slot's share fails mid-stream although the catalogue promised it.
        yield entry.doc.finding(
            "error", "context-pool", (*entry.profile_path(profile), "ctx_size"),
            f"ctx_size {pool} split across {slots} slot(s) gives each request {per_request} "
            f"tokens, less than context_length {spec.context_length}; raise ctx_size to "
            f"{spec.context_length * slots} or lower --parallel.",
        )
