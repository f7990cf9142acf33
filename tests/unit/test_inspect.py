"""`llmgw inspect`: what a GGUF header says, read from the header alone; bad files get a sentence."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import pytest

from llmgw.compiler.gguf_header import read_header
from llmgw.compiler.inspect import inspect
from llmgw.errors import InspectError
from tests.unit.gguf_files import header_length, write_gguf


class CountingFile:
    """A file that remembers how far it was read."""

    def __init__(self, path: Path) -> None:
        self.handle = path.open("rb")
        self.read_bytes = 0

    def read(self, n: int) -> bytes:
        chunk = self.handle.read(n)
        self.read_bytes += len(chunk)
        return chunk


def test_gemma_3_header_says_what_llama_cpp_reads(gemma_gguf):
    facts = inspect(str(gemma_gguf)).facts()
    assert facts["size_bytes"] == 253_113_024
    assert (facts["architecture"], facts["file_type"]) == ("gemma3", "Q4_K_M")
    assert facts["parameters"] == 268_098_176
    assert facts["context_length"] == 32768
    assert (facts["layers"], facts["heads"], facts["kv_heads"]) == (18, 4, 1)
    assert (facts["key_length"], facts["value_length"]) == (256, 256)
    assert (facts["embedding_length"], facts["vocab_size"]) == (640, 262144)
    assert facts["chat_template"] is False


def test_gemma_3_alternates_five_local_layers_with_one_global(gemma_gguf):
    window = inspect(str(gemma_gguf)).facts()["sliding_window"]
    assert window == {"window": 512, "local_layers": 15, "layout": "LLLLLG" * 3}


def test_reading_stops_where_the_weights_begin(gemma_gguf):
    stream = CountingFile(gemma_gguf)
    header = read_header(stream, "gemma")
    weights_start = header_length(gemma_gguf)
    assert header.header_bytes <= weights_start
    # Read in 64 KiB steps: at most one step past the header, never the 246 MB of weights.
    assert stream.read_bytes < weights_start + 65536, stream.read_bytes


def test_grouped_query_attention_and_default_head_size(tmp_path):
    path = write_gguf(tmp_path / "gqa.gguf", heads=32, kv_heads=8, embedding=4096, feed_forward=64)
    h = inspect(str(path)).header
    assert (h.heads, h.kv_heads) == (32, 8)
    # No key_length in the file: llama.cpp takes the embedding split across the heads.
    assert (h.key_length, h.value_length) == (128, 128)
    assert h.sliding_window is None and h.local_layers is None


def test_kv_heads_default_to_the_heads(tmp_path):
    h = inspect(str(write_gguf(tmp_path / "mha.gguf", heads=8, kv_heads=None))).header
    assert h.kv_heads == 8


def test_sliding_window_period_from_the_file(tmp_path):
    path = write_gguf(tmp_path / "swa.gguf", "cohere2", layers=8, window=4096, pattern=4)
    h = inspect(str(path)).header
    assert h.local_layers == (True, True, True, False) * 2
    assert (h.sliding_window, h.sliding_window_layers) == (4096, 6)


def test_sliding_window_layout_as_a_list_per_layer(tmp_path):
    layout = [True, False, True, True]
    path = write_gguf(tmp_path / "swa.gguf", "gemma3n", layers=4, window=512, pattern=layout)
    assert inspect(str(path)).header.local_layers == tuple(layout)


def test_sliding_window_of_an_unknown_layout_counts_every_layer_global(tmp_path):
    path = write_gguf(tmp_path / "swa.gguf", "mystery", layers=4, window=1024)
    facts = inspect(str(path)).facts()
    assert facts["sliding_window"] == {"window": 1024, "local_layers": 0, "layout": None}


def test_key_and_value_sizes_may_differ(tmp_path):
    path = write_gguf(tmp_path / "kv.gguf", key_length=192, value_length=128)
    h = inspect(str(path)).header
    assert (h.key_length, h.value_length) == (192, 128)


@pytest.mark.parametrize(
    "quant",
    [gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.IQ4_NL, gguf.GGMLQuantizationType.Q5_0],
)
def test_quantized_tensors_count_their_parameters_not_their_bytes(tmp_path, quant):
    path = write_gguf(
        tmp_path / "q.gguf",
        embedding=256,
        feed_forward=64,
        vocab=300,
        quantized=quant,
        file_type=gguf.LlamaFileType.MOSTLY_IQ4_NL,
    )
    h = inspect(str(path)).header
    assert h.parameters == 300 * 256 + 64 * 256
    assert h.file_type == "IQ4_NL"


def test_chat_template_present(tmp_path):
    path = write_gguf(tmp_path / "chat.gguf", chat_template="{{ messages }}")
    assert inspect(str(path)).header.chat_template is True


def test_big_endian_files_read_the_same(tmp_path):
    path = write_gguf(tmp_path / "be.gguf", endian=gguf.GGUFEndian.BIG, heads=16, kv_heads=4)
    h = inspect(str(path)).header
    assert (h.layers, h.heads, h.kv_heads, h.context_length) == (4, 16, 4, 4096)


def test_wrong_magic_says_it_is_not_a_gguf(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b'{"__metadata__": {}}' + bytes(100))
    with pytest.raises(InspectError, match=r"is not a GGUF file: it starts with b'\{\"__'"):
        inspect(str(path))


def test_truncated_header_says_the_download_was_cut(tmp_path, gemma_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gemma_gguf.read_bytes()[:3_000_000])
    with pytest.raises(InspectError, match="ends 3000000 bytes in, inside .*truncated"):
        inspect(str(cut))


def test_unsupported_version_is_named(tmp_path):
    path = write_gguf(tmp_path / "v.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 1)
    path.write_bytes(bytes(data))
    with pytest.raises(InspectError, match="is GGUF version 1; llmgw reads versions 2 and 3"):
        inspect(str(path))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(InspectError, match="nothing.gguf does not exist"):
        inspect(str(tmp_path / "nothing.gguf"))


def test_cli_text_names_each_fact(llmgw, gemma_gguf):
    run = llmgw("inspect", gemma_gguf)
    assert run.code == 0, run
    for line in (
        "architecture         gemma3 (Gemma 3 270m)",
        "parameters           268.1M",
        "file type            Q4_K_M",
        "trained context      32768 tokens",
        "attention heads      4, 1 KV heads",
        "head size            key 256, value 256",
        "sliding window       512 tokens on 15 of 18 layers",
        "vocabulary           262.1k",
        "chat template        no",
        "file size            253.11 MB",
    ):
        assert line in run.stdout, run


def test_cli_json_and_yaml_carry_the_same_facts(llmgw, tmp_path):
    from ruamel.yaml import YAML

    path = write_gguf(tmp_path / "m.gguf", chat_template="x")
    as_json = json.loads(llmgw("inspect", path, "--format", "json").stdout)
    as_yaml = YAML(typ="safe").load(llmgw("inspect", path, "--format", "yaml").stdout)
    assert as_json == as_yaml
    assert as_json["chat_template"] is True and as_json["kv_heads"] == 2


def test_cli_bad_file_exits_2_with_the_sentence(llmgw, tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    run = llmgw("inspect", "x.gguf", cwd=tmp_path)
    assert run.code == 2, run
    assert run.stderr.startswith("llmgw: x.gguf is not a GGUF file"), run
    assert "Traceback" not in run.stderr


def test_cli_repository_id_without_a_file(llmgw):
    run = llmgw("inspect", "hf://org/repo")
    assert run.code == 2, run
    assert "hf://org/repo names a repository, not a file" in run.stderr
    assert "hf://org/repo/model-Q4_K_M.gguf" in run.stderr


def test_cli_write_needs_a_model_file(llmgw, tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    run = llmgw("inspect", path, "--write")
    assert run.code == 2, run
    assert "--write fills in a model file" in run.stderr


# Damaged or hostile headers: lint reads a local .gguf on every pull request, so each count a
# header claims is checked against what the file can hold before anything loops or allocates.
def _raw_gguf(kvs: bytes = b"", kv_count: int = 0, tensors: bytes = b"", tensor_count: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, kv_count) + kvs + tensors


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _kv_u32(key: str, value: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, value)


def test_a_header_claiming_2_27_layers_is_refused_before_per_layer_tuples(tmp_path):
    # A sliding window makes the reader build one entry per layer: 2**27 of them took 51 s.
    kvs = (
        _s("general.architecture")
        + struct.pack("<I", 8)
        + _s("gemma3")
        + _kv_u32("gemma3.block_count", 2**27)
        + _kv_u32("gemma3.attention.sliding_window", 512)
    )
    path = tmp_path / "layers.gguf"
    path.write_bytes(_raw_gguf(kvs, 3))
    with pytest.raises(
        InspectError, match="says the model has 134217728 layers; no model has more than 65536"
    ):
        inspect(str(path))


def test_an_array_longer_than_the_file_is_refused(tmp_path):
    kvs = _s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**40)
    path = tmp_path / "array.gguf"
    path.write_bytes(_raw_gguf(kvs, 1))
    with pytest.raises(InspectError, match=r"ends \d+ bytes in, inside the 1099511627776 array items"):
        inspect(str(path))


def test_an_array_longer_than_any_header_is_refused_when_the_size_is_unknown(tmp_path):
    import io

    kvs = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40)
    with pytest.raises(InspectError, match="claims 1099511627776 array items .* more than a 64 MiB header"):
        read_header(io.BytesIO(_raw_gguf(kvs, 1)), "stream.gguf")


def test_more_keys_or_tensors_than_the_file_holds_are_refused(tmp_path):
    path = tmp_path / "keys.gguf"
    path.write_bytes(_raw_gguf(kv_count=900_000))
    with pytest.raises(InspectError, match="inside the 900000 metadata keys"):
        inspect(str(path))
    path.write_bytes(_raw_gguf(tensor_count=9_000_000))
    with pytest.raises(InspectError, match="inside the 9000000 tensors"):
        inspect(str(path))


def test_a_string_longer_than_the_file_is_refused(tmp_path):
    path = tmp_path / "string.gguf"
    path.write_bytes(_raw_gguf(struct.pack("<Q", 50_000_000) + b"x" * 10, 1))
    with pytest.raises(InspectError, match=r"inside a string \(it needs 50000000 bytes from byte 32\)"):
        inspect(str(path))


def test_a_tensor_with_100000_dimensions_is_refused(tmp_path):
    tensor = (
        _s("t") + struct.pack("<I", 100_000) + struct.pack("<Q", 2**40) * 100_000 + struct.pack("<IQ", 0, 0)
    )
    path = tmp_path / "dims.gguf"
    path.write_bytes(_raw_gguf(tensors=tensor, tensor_count=1))
    with pytest.raises(InspectError, match="tensor 't' has 100000 dimensions; GGUF allows at most 4"):
        inspect(str(path))


def test_arrays_nested_200000_deep_are_refused_not_a_recursion_error(tmp_path):
    nested = struct.pack("<IQ", 9, 1) * 200_000 + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)
    path = tmp_path / "deep.gguf"
    path.write_bytes(_raw_gguf(_s("x.deep") + struct.pack("<I", 9) + nested, 1))
    with pytest.raises(InspectError, match="nests arrays more than 8 deep"):
        inspect(str(path))


def test_lint_reports_a_damaged_header_and_still_checks_the_good_model(tmp_path):
    from tests.unit.helpers import by_rule, run

    write_gguf(tmp_path / "good.gguf", "gemma3", layers=6, window=512)
    nested = struct.pack("<IQ", 9, 1) * 200_000 + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)
    (tmp_path / "bad.gguf").write_bytes(_raw_gguf(_s("x.deep") + struct.pack("<I", 9) + nested, 1))
    models = {
        f"{n}.yaml": (
            f"name: {n}\nsource: ../{n}.gguf\ncontext_length: 2048\n"
            "profiles:\n  - name: cpu\n    engine: llamacpp\n"
        )
        for n in ("bad", "good")
    }
    fleet = "nodes:\n  - {name: n1, address: 127.0.0.1, memory_gb: 8, engines: [llamacpp]}\n"
    result = run(tmp_path, models, fleet)
    [finding] = by_rule(result, "gguf-header")
    assert "bad.gguf nests arrays more than 8 deep" in finding.message
    good = next(e for e in result.entries if e.spec.name == "good")
    memory = good.memory(good.spec.profiles[0])
    assert memory is not None and "architecture from the GGUF header" in memory.basis


def test_cli_damaged_header_exits_2_with_the_sentence(llmgw, tmp_path):
    (tmp_path / "x.gguf").write_bytes(_raw_gguf(kv_count=900_000))
    run = llmgw("inspect", "x.gguf", cwd=tmp_path)
    assert run.code == 2, run
    assert "inside the 900000 metadata keys" in run.stderr and "Traceback" not in run.stderr
