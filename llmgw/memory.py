"""How much memory one replica needs, and where the figure came from.

The figure is filled in, never left blank: in the Go gateway this grew from, a
profile without one constrained nothing, and a model was placed on a node too
small to hold both its weights and its KV pool.

Three ways to a figure, the first that applies:

    declared     min_memory_gb in the model file
    sized        the engine's own rule (`Engine.memory`): for llama.cpp, an architecture with
                 its sizes (from the GGUF header, or written by `llmgw inspect --write`):
                 weights + KV cache + compute buffers + llama-server itself
                 (`sized_llamacpp`), checked against the real engine by bench/memory.py
    rough        weights + the KV cache when the layers are known, + buffers of a tenth of
                 the weights (at least 1 GB); or weights + half again, when nothing is known
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmgw.engines import ctx_size_for, engine
from llmgw.engines.base import Memory as Memory  # its home is beneath the engines, who give one
from llmgw.model import Architecture, ModelSpec, Profile

GB = 1_000_000_000
MiB = 1 << 20
# Below this, runtime buffers and the engine itself dominate: never estimate less.
OVERHEAD_FLOOR_GB = 2.0

# llama.cpp's KV cache element sizes by --cache-type-k/-v: quantized types store blocks of 32
# values with their scales (q8_0: 34 bytes for 32 values).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
# llama.cpp rounds the KV cache up to whole blocks of cells.
CELL_PADDING = 256
DEFAULT_UBATCH = 512
# With --parallel left to llama-server, it runs 4 slots that share one (unified) cache.
AUTO_SLOTS = 4
# What llama-server holds beside weights, cache and compute buffers: the binary and its
# libraries, the tokenizer's tables, threads, the HTTP server, and a request's working memory.
# A little of it grows with the context (the cells' bookkeeping, the prompt's tokens and their
# copies): between 0.2 and 1 KiB a cell over runs. Not derived: fitted to Gemma 3 270M by
# bench/memory.py (see docs/catalogue.md), and rounded up.
ENGINE_BYTES = 80 * MiB
ENGINE_BYTES_PER_CELL = 512
# llama-server copies the window of a sliding-window model's cache as a "context checkpoint",
# so a later request sharing the prompt need not reprocess it: two near the end of each prompt
# (measured at every size). They persist per slot up to --ctx-checkpoints (32) when later
# prompts extend earlier ones; that case is not counted here.
CHECKPOINTS_PER_PROMPT = 2


def memory_for(
    spec: ModelSpec,
    profile: Profile,
    weights_bytes: int | None,
    architecture: Architecture | None = None,
    architecture_from: str = "the model file",
) -> Memory | None:
    """None only when nothing was written and the weights' size is unknown.

    `architecture` is the model file's or, when it has none, the GGUF header's; `architecture_from`
    says which, for the basis.
    """
    if profile.min_memory_gb is not None:
        return Memory(profile.min_memory_gb, "declared", "min_memory_gb in the model file")
    if weights_bytes is None:
        return None
    arch = architecture if architecture is not None else spec.architecture
    if arch is None:
        return _half_again(weights_bytes / GB)
    ctx = ctx_size_for(spec, profile)
    sized = engine(profile.engine).memory(arch, profile, ctx, weights_bytes, architecture_from)
    if sized is not None:
        return sized
    kv = kv_cache_bytes(arch, ctx, LlamaCpp.of(profile, arch)) / GB
    weights = weights_bytes / GB
    buffers = max(weights * 0.1, 1.0)
    return Memory(
        _round(weights + kv + buffers),
        "estimated",
        f"weights {weights:.1f} GB + KV cache {kv:.1f} GB for ctx_size {ctx} + buffers {buffers:.1f} GB",
    )


def _half_again(weights: float) -> Memory:
    # Weights plus half again for KV cache and buffers, with a floor: the
    # rule of thumb that held across the fleet before we knew architectures.
    overhead = max(weights / 2, OVERHEAD_FLOOR_GB)
    return Memory(
        _round(weights + overhead),
        "estimated",
        f"weights {weights:.1f} GB + {overhead:.1f} GB (half again, at least {OVERHEAD_FLOOR_GB:.0f} GB)",
    )


@dataclass(frozen=True)
class LlamaCpp:
    """What a profile's args tell about llama-server's buffers."""

    slots: int
    unified: bool  # one cache shared by the slots, rather than one stream each
    ubatch: int
    swa_full: bool
    flash_attn: bool
    bytes_k: float
    bytes_v: float
    cache_types: str

    @classmethod
    def of(cls, profile: Profile, arch: Architecture) -> LlamaCpp:
        parallel = profile.arg_value("--parallel", "-np")
        explicit = parallel is not None and parallel.isdigit() and int(parallel) > 0
        unified = not explicit
        if _flag(profile, "--kv-unified", "-kvu"):
            unified = True
        if _flag(profile, "--no-kv-unified", "-no-kvu"):
            unified = False
        ubatch = profile.arg_value("--ubatch-size", "-ub")
        k = (profile.arg_value("--cache-type-k", "-ctk") or "").lower()
        v = (profile.arg_value("--cache-type-v", "-ctv") or "").lower()
        written = arch.kv_bytes if arch.kv_bytes is not None else 2.0
        bytes_k = CACHE_TYPE_BYTES.get(k, written)
        bytes_v = CACHE_TYPE_BYTES.get(v, written)
        default = "f16" if arch.kv_bytes is None else f"{written:g} bytes"
        names = (k or default, v or default)
        return cls(
            slots=int(parallel) if explicit and parallel else AUTO_SLOTS,
            unified=unified,
            ubatch=int(ubatch) if ubatch and ubatch.isdigit() else DEFAULT_UBATCH,
            swa_full=_flag(profile, "--swa-full"),
            flash_attn=(profile.arg_value("--flash-attn", "-fa") or "auto") != "off",
            bytes_k=bytes_k,
            bytes_v=bytes_v,
            cache_types=names[0] if names[0] == names[1] else f"K {names[0]}, V {names[1]}",
        )


def _flag(profile: Profile, *names: str) -> bool:
    return any(arg.partition("=")[0] in names for arg in profile.args)


def cells(ctx: int) -> int:
    return math.ceil(ctx / CELL_PADDING) * CELL_PADDING


def window_cells(arch: Architecture, ctx: int, engine: LlamaCpp) -> int:
    """Cells the sliding-window layers keep: the window for each slot, plus one batch in flight."""
    full = cells(ctx)
    if engine.swa_full or not arch.sliding_window:
        return full
    if engine.unified:
        return min(full, cells(arch.sliding_window * engine.slots + engine.ubatch))
    per_slot = min(full // engine.slots, cells(arch.sliding_window + engine.ubatch))
    return per_slot * engine.slots


def kv_cache_bytes(arch: Architecture, ctx: int, engine: LlamaCpp) -> float:
    per_cell = arch.kv_heads * (arch.head_dim * engine.bytes_k + arch.value_size * engine.bytes_v)
    local = arch.local_layers
    return per_cell * ((arch.layers - local) * cells(ctx) + local * window_cells(arch, ctx, engine))


def compute_bytes(arch: Architecture, ctx: int, engine: LlamaCpp) -> float:
    """The graph's scratch for one batch of `ubatch` tokens against a full cache.

    With flash attention (llama-server's default on CPU) the largest part that grows with the
    context is the attention mask: 2 bytes per cell per token of the batch. Without it, the
    scores themselves: 4 bytes per cell per head. The rest is the batch's activations and one
    row of logits per slot.
    """
    assert arch.embedding_length and arch.feed_forward_length and arch.vocab_size  # arch.sized
    attended = cells(ctx) + (window_cells(arch, ctx, engine) if arch.local_layers else 0)
    if engine.flash_attn:
        attention = engine.ubatch * 2 * attended
    else:
        attention = engine.ubatch * 4 * (arch.heads or arch.kv_heads) * attended
    activations = engine.ubatch * 4 * 3 * (arch.embedding_length + arch.feed_forward_length)
    logits = arch.vocab_size * 4 * engine.slots
    return float(attention + activations + logits)


def checkpoint_bytes(arch: Architecture, ctx: int, engine: LlamaCpp) -> float:
    """The context checkpoints one prompt leaves: each the window of every local layer."""
    if not arch.local_layers or engine.swa_full or not arch.sliding_window:
        return 0.0
    per_cell = arch.kv_heads * (arch.head_dim * engine.bytes_k + arch.value_size * engine.bytes_v)
    return CHECKPOINTS_PER_PROMPT * per_cell * arch.local_layers * arch.sliding_window


def engine_bytes(ctx: int) -> float:
    return float(ENGINE_BYTES + ENGINE_BYTES_PER_CELL * cells(ctx))


def sized_llamacpp(arch: Architecture, profile: Profile, ctx: int, weights: int, source: str) -> Memory:
    engine = LlamaCpp.of(profile, arch)
    kv = kv_cache_bytes(arch, ctx, engine)
    compute = compute_bytes(arch, ctx, engine)
    checkpoints = checkpoint_bytes(arch, ctx, engine)
    server = engine_bytes(ctx)
    total = weights + kv + compute + checkpoints + server
    layout = ""
    if arch.local_layers and not engine.swa_full:
        layout = f"; {arch.local_layers} of {arch.layers} layers at the {arch.sliding_window}-token window"
    return Memory(
        _round_fine(total / GB),
        "estimated",
        f"weights {weights / GB:.2f} GB + KV cache {kv / GB:.2f} GB for ctx_size {ctx} "
        f"({engine.cache_types}{layout}) + compute buffers {compute / GB:.2f} GB "
        + (f"+ context checkpoints {checkpoints / GB:.2f} GB " if checkpoints else "")
        + f"+ llama-server {server / GB:.2f} GB; architecture from {source}",
    )


def _round(gb: float) -> float:
    # Rounded up to a tenth, so the plan shows what a person would write.
    return -(-round(gb * 1000) // 100) / 10


def _round_fine(gb: float) -> float:
    # A sized estimate is worth more than tenths: half a gigabyte model is not rounded to 0.6.
    return -(-round(gb * 10000) // 100) / 100
