"""How much memory one replica needs, and where the figure came from.

The figure is filled in, never left blank: in the Go gateway this grew from, a
profile without one constrained nothing, and a model was placed on a node too
small to hold both its weights and its KV pool.

Three ways to a figure, the first that applies:

    declared     min_memory_gb in the model file
    sized        the engine's own rule (`Engine.memory`): for llama.cpp, an architecture with
                 its sizes (from the GGUF header, or written by `llmgw inspect --write`):
                 weights + KV cache + compute buffers + llama-server itself
                 (`sized_llamacpp`, with its engine in llmgw/engines/llamacpp.py), checked
                 against the real engine by bench/memory.py
    rough        weights + the KV cache when the layers are known, + buffers of a tenth of
                 the weights (at least 1 GB); or weights + half again, when nothing is known
"""

from __future__ import annotations

from llmgw.engines import ctx_size_for, engine
from llmgw.engines.base import GB as GB
from llmgw.engines.base import Memory as Memory  # its home is beneath the engines, who give one
from llmgw.engines.llamacpp import LlamaCppBuffers, kv_cache_bytes
from llmgw.model import Architecture, ModelSpec, Profile

# Below this, runtime buffers and the engine itself dominate: never estimate less.
OVERHEAD_FLOOR_GB = 2.0


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
    kv = kv_cache_bytes(arch, ctx, LlamaCppBuffers.of(profile, arch)) / GB
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


def _round(gb: float) -> float:
    # Rounded up to a tenth, so the plan shows what a person would write.
    return -(-round(gb * 1000) // 100) / 10
