"""Small GGUF files written with the gguf package, the way llama.cpp's converter writes them."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int | None = 2,
    embedding: int = 256,
    feed_forward: int = 512,
    context: int = 4096,
    window: int | None = None,
    pattern: int | list[bool] | None = None,
    key_length: int | None = None,
    value_length: int | None = None,
    vocab: int = 300,
    chat_template: str | None = None,
    file_type: gguf.LlamaFileType = gguf.LlamaFileType.MOSTLY_F16,
    quantized: gguf.GGMLQuantizationType | None = None,
    endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
    pooling: int | None = None,
) -> Path:
    w = gguf.GGUFWriter(str(path), arch, endianess=endian)
    w.add_name(f"test {arch}")
    w.add_context_length(context)
    w.add_block_count(layers)
    w.add_embedding_length(embedding)
    w.add_feed_forward_length(feed_forward)
    w.add_head_count(heads)
    if kv_heads is not None:
        w.add_head_count_kv(kv_heads)
    if key_length is not None:
        w.add_key_length(key_length)
    if value_length is not None:
        w.add_value_length(value_length)
    if window is not None:
        w.add_sliding_window(window)
    if isinstance(pattern, int):
        w.add_uint32(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch), pattern)
    elif pattern is not None:
        w.add_array(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch), pattern)
    w.add_file_type(file_type)
    if pooling is not None:  # llama.cpp's pooling type, as converted embedding models carry it
        w.add_uint32(f"{arch}.pooling_type", pooling)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", np.zeros((vocab, embedding), dtype=np.float16))
    if quantized is not None:
        block, size = gguf.GGML_QUANT_SIZES[quantized]
        raw = np.zeros((feed_forward, embedding // block * size), dtype=np.uint8)
        w.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=quantized)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def header_length(path: Path) -> int:
    """Where the tensor data starts: the bytes a header read needs."""
    stat = path.stat()
    return _data_offset(str(path), stat.st_size, stat.st_mtime_ns)


@functools.cache
def _data_offset(path: str, size: int, mtime_ns: int) -> int:
    # gguf's reader parses every token and tensor: 45 s for Gemma's 262k-token vocabulary on a
    # loaded machine, which four tests paid each. Once a file (as it is on disk) is enough.
    return int(gguf.GGUFReader(path).data_offset)
