"""embedding-pooling: what a profile's args must tell the engine that the catalogue cannot.

llama-server serves embeddings from a model only with a pooling type: the GGUF's own
(`ARCH.pooling_type`, which converted embedding models carry) or `--pooling` in the args.
A chat model's GGUF carries none, and served as `task: embedding` it loaded and then refused
every request ("Pooling type 'none' is not OAI compatible"): the plan looked fine and the
model answered nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from llmgw.compiler.catalogue import Entry
from llmgw.compiler.gguf_header import Header
from llmgw.compiler.rules.context import Context
from llmgw.engines import engine
from llmgw.errors import InspectError
from llmgw.findings import Finding, Severity

# llama.cpp's enum llama_pooling_type, as a GGUF stores it.
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
FIX = (
    "add --pooling mean to the profile's args (or cls or last, however the model was trained "
    "to be pooled; mean suits a model that was not trained for embeddings)"
)


def check(ctx: Context) -> Iterator[Finding]:
    for entry in ctx.entries:
        if entry.spec.task != "embedding":
            continue
        for profile in entry.spec.profiles:
            if not engine(profile.engine).needs_pooling_type or profile.external:
                continue
            if profile.arg_value("--pooling") not in (None, "none"):
                continue
            found = _without_pooling(entry, _header(entry))
            if found is not None:
                severity, message = found
                yield entry.doc.finding(
                    severity, "embedding-pooling", (*entry.profile_path(profile), "args"), message
                )


def _without_pooling(entry: Entry, header: Header | None) -> tuple[Severity, str] | None:
    """What to say about an embedding profile with no --pooling; None when the GGUF names one."""
    if header is None:
        # Unknown is not no: a remote GGUF's header is not fetched by lint, and most
        # converted embedding models name their pooling there.
        return (
            "warning",
            "lint cannot read this GGUF's header here, so cannot tell whether it names a pooling "
            "type; without one llama-server refuses every embedding request (\"Pooling type 'none' "
            f'is not OAI compatible"). If it names none, {FIX}; to be sure either way, write the '
            "pooling into args.",
        )
    stored = header.metadata.get(f"{header.architecture}.pooling_type")
    if isinstance(stored, int) and POOLING_TYPES.get(stored, "none") != "none":
        return None  # the model says how it is pooled
    return (
        "error",
        f"{entry.spec.source} names no pooling type (its header has no "
        f"{header.architecture}.pooling_type, as a chat model's has not), so llama-server would "
        "load it and refuse every embedding request (\"Pooling type 'none' is not OAI "
        f'compatible"); {FIX}.',
    )


def _header(entry: Entry) -> Header | None:
    """The source's GGUF header when it is on this machine; None when unknown."""
    header = entry.header
    if isinstance(header, Header):
        return header
    src = entry.source
    if header is not None or src.format != "gguf" or src.local is None or not src.local.is_file():
        return None  # unreadable (gguf-header says why), remote, or missing (source-missing)
    from llmgw.compiler.inspect import inspect  # the model file has its architecture written

    try:
        return inspect(src.text, base_dir=entry.base_dir).header
    except InspectError:
        return None
