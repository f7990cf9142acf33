"""The memory estimate for llama.cpp: weights + KV cache (sliding-window layers at their window,
the cache type from the args) + compute buffers + the engine; what lint reads to make it."""

from __future__ import annotations

import pytest

from llmgw.compiler.memory import GB, memory_for
from llmgw.engines.llamacpp import LlamaCppBuffers, kv_cache_bytes
from llmgw.model import Architecture, ModelSpec
from tests.unit.gguf_files import write_gguf
from tests.unit.helpers import by_rule, run

GEMMA = Architecture(name="gemma3", layers=18, heads=4, kv_heads=1, head_dim=256, sliding_window=512,
                     sliding_window_layers=15, embedding_length=640, feed_forward_length=2048,
                     vocab_size=262144, trained_context=32768)
LOCAL_FLEET = "nodes:\n  - {name: n1, address: 127.0.0.1, memory_gb: 8, engines: [llamacpp]}\n"


def spec(arch: Architecture | None = GEMMA, args: tuple[str, ...] = (), ctx: int = 8192,
         context_length: int = 2048) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "m", "source": "m.gguf", "context_length": context_length, "architecture": arch,
        "profiles": [{"name": "cpu", "engine": "llamacpp", "ctx_size": ctx, "args": list(args)}],
    })


def kv(arch: Architecture, *args: str, ctx: int = 32768) -> float:
    s = spec(arch, args, ctx)
    return kv_cache_bytes(arch, ctx, LlamaCppBuffers.of(s.profiles[0], arch))


def test_sliding_window_layers_hold_only_their_window():
    everything_global = GEMMA.model_copy(update={"sliding_window": None, "sliding_window_layers": 0})
    # 3 global layers at 32768 cells, 15 local at 4 slots × 512 + a 512 batch = 2560 cells,
    # 1 KiB a cell a layer: 96 MiB + 37.5 MiB, as llama-server prints at startup.
    assert kv(GEMMA) == (96 + 37.5) * 2**20
    assert kv(everything_global) == 18 * 32768 * 1024


def test_swa_full_keeps_the_whole_context_on_every_layer():
    assert kv(GEMMA, "--swa-full") == 18 * 32768 * 1024


def test_slots_of_their_own_each_keep_a_window():
    # --parallel 2 without a unified cache: two streams, each min(16384, 512 + 512) cells.
    assert kv(GEMMA, "--parallel", "2") == (3 * 32768 + 15 * 2 * 1024) * 1024


def test_cache_type_comes_from_the_args_and_defaults_to_f16():
    q8 = kv(GEMMA, "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    assert q8 == pytest.approx(kv(GEMMA) * 34 / 64)
    mixed = kv(GEMMA, "-ctk", "q8_0")
    assert kv(GEMMA) > mixed > q8


def test_written_kv_bytes_stands_when_the_args_say_nothing():
    assert kv(GEMMA.model_copy(update={"kv_bytes": 1})) == kv(GEMMA) / 2


def test_the_context_is_padded_to_whole_blocks_of_cells():
    assert kv(GEMMA, ctx=1000) == kv(GEMMA, ctx=1024)


def test_sized_estimate_names_each_part_and_where_the_architecture_came_from():
    memory = memory_for(spec(), spec().profiles[0], 253_113_024, GEMMA, "the GGUF header")
    assert memory is not None and memory.source == "estimated"
    assert memory.basis.startswith("weights 0.25 GB + KV cache 0.06 GB for ctx_size 8192 (f16; 15 of 18 "
                                   "layers at the 512-token window) + compute buffers 0.03 GB")
    assert memory.basis.endswith("; architecture from the GGUF header")
    assert 0.4 < memory.gb < 0.5


def test_more_context_needs_more_memory():
    small, big = (memory_for(spec(ctx=c), spec(ctx=c).profiles[0], 253_113_024, GEMMA) for c in (2048, 32768))
    assert small is not None and big is not None and big.gb > small.gb


def test_an_architecture_without_sizes_keeps_the_rough_buffers():
    rough = Architecture(layers=18, kv_heads=1, head_dim=256)
    memory = memory_for(spec(rough), spec(rough).profiles[0], 4 * GB)
    assert memory is not None
    assert memory.basis == "weights 4.0 GB + KV cache 0.2 GB for ctx_size 8192 + buffers 1.0 GB"


def _local_catalogue(context: int = 2048, extra: str = "") -> dict[str, str]:
    """A model file in catalog/ whose source is ../m.gguf, beside the catalogue."""
    return {"m.yaml": (f"name: m\nsource: ../m.gguf\ncontext_length: {context}\n{extra}"
                       "profiles:\n  - name: cpu\n    engine: llamacpp\n")}


def test_lint_reads_a_local_gguf_header_when_no_architecture_is_written(tmp_path, gemma_gguf):
    (tmp_path / "m.gguf").symlink_to(gemma_gguf)
    result = run(tmp_path, _local_catalogue(), LOCAL_FLEET)
    [entry] = result.entries
    memory = entry.memory(entry.spec.profiles[0])
    assert memory is not None
    assert "architecture from the GGUF header" in memory.basis
    assert "15 of 18 layers at the 512-token window" in memory.basis


def test_a_written_architecture_wins_over_the_header(tmp_path):
    write_gguf(tmp_path / "m.gguf", "gemma3", layers=6, window=512)
    extra = "architecture: {layers: 2, kv_heads: 1, head_dim: 64}\n"
    result = run(tmp_path, _local_catalogue(extra=extra), LOCAL_FLEET)
    [entry] = result.entries
    assert entry.architecture == (Architecture(layers=2, kv_heads=1, head_dim=64), "the model file")


def test_lint_never_fetches_a_remote_source(tmp_path, monkeypatch):
    import httpx

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("lint made an HTTP request")

    monkeypatch.setattr(httpx.Client, "send", refuse)
    models = {"m.yaml": "name: m\nsource: hf://org/repo/m-Q4_K_M.gguf\nweights_bytes: 4000000000\n"
                        "context_length: 2048\nprofiles:\n  - name: cpu\n    engine: llamacpp\n"}
    result = run(tmp_path, models, LOCAL_FLEET)
    [entry] = result.entries
    memory = entry.memory(entry.spec.profiles[0])
    assert memory is not None and "half again" in memory.basis


def test_context_beyond_training_warns_from_the_header(tmp_path):
    write_gguf(tmp_path / "m.gguf", context=4096)
    result = run(tmp_path, _local_catalogue(context=8192), LOCAL_FLEET)
    [finding] = by_rule(result, "context-beyond-training")
    assert finding.severity == "warning" and (finding.line, finding.column) == (3, 17)
    assert finding.message.startswith("context_length 8192 is beyond the 4096 tokens the model was "
                                      "trained for (its GGUF header says)")
    assert "Lower context_length to 4096" in finding.message


def test_context_beyond_training_from_a_written_architecture(tmp_path):
    extra = "architecture: {layers: 2, kv_heads: 1, head_dim: 64, trained_context: 1024}\n"
    models = {"m.yaml": ("name: m\nsource: hf://org/repo/m.gguf\nweights_bytes: 1000\ncontext_length: 2048\n"
                         f"{extra}profiles:\n  - name: cpu\n    engine: llamacpp\n")}
    [finding] = by_rule(run(tmp_path, models, LOCAL_FLEET), "context-beyond-training")
    assert "(architecture.trained_context says)" in finding.message


def test_context_within_training_is_quiet(tmp_path):
    write_gguf(tmp_path / "m.gguf", context=4096)
    result = run(tmp_path, _local_catalogue(context=4096), LOCAL_FLEET)
    assert by_rule(result, "context-beyond-training") == []


def test_an_unreadable_local_header_warns_and_falls_back(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(6))
    result = run(tmp_path, _local_catalogue(), LOCAL_FLEET)
    [finding] = by_rule(result, "gguf-header")
    assert finding.message.startswith("cannot read the GGUF header of the source, so the memory estimate "
                                      "falls back to a rule of thumb: ../m.gguf is GGUF version 0")
    [entry] = result.entries
    memory = entry.memory(entry.spec.profiles[0])
    assert memory is not None and "half again" in memory.basis
