"""How much memory one replica needs, and where the figure came from.

The figure is filled in, never left blank: in the Go gateway this grew from, a
profile without one constrained nothing, and a model was placed on a node too
small to hold both its weights and its KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.model import ModelSpec, Profile

GB = 1_000_000_000
# Below this, runtime buffers and the engine itself dominate: never estimate less.
OVERHEAD_FLOOR_GB = 2.0


@dataclass(frozen=True)
class Memory:
    gb: float
    source: Literal["declared", "estimated"]
    basis: str

    def as_dict(self) -> dict[str, object]:
        return {"gb": self.gb, "source": self.source, "basis": self.basis}


def memory_for(spec: ModelSpec, profile: Profile, weights_bytes: int | None) -> Memory | None:
    """None only when nothing was written and the weights' size is unknown."""
    if profile.min_memory_gb is not None:
        return Memory(profile.min_memory_gb, "declared", "min_memory_gb in the model file")
    if weights_bytes is None:
        return None
    weights = weights_bytes / GB
    arch = spec.architecture
    if arch is None:
        # Weights plus half again for KV cache and buffers, with a floor: the
        # rule of thumb that held across the fleet before we knew architectures.
        overhead = max(weights / 2, OVERHEAD_FLOOR_GB)
        return Memory(
            _round(weights + overhead),
            "estimated",
            f"weights {weights:.1f} GB + {overhead:.1f} GB (half again, at least "
            f"{OVERHEAD_FLOOR_GB:.0f} GB)",
        )
    ctx = spec.ctx_size_for(profile)
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * arch.kv_bytes * ctx / GB
    buffers = max(weights * 0.1, 1.0)
    return Memory(
        _round(weights + kv + buffers),
        "estimated",
        f"weights {weights:.1f} GB + KV cache {kv:.1f} GB for ctx_size {ctx} "
        f"+ buffers {buffers:.1f} GB",
    )


def _round(gb: float) -> float:
    # Rounded up to a tenth, so the plan shows what a person would write.
    return -(-round(gb * 1000) // 100) / 10
