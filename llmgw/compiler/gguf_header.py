"""A GGUF file's header → what it says about the model: read from a stream, never the whole file.

    magic "GGUF" · version · tensor count · key/value count
    key/value pairs (architecture, sizes, tokenizer, chat template)
    tensor records (name, shape, type, offset)                 ← the header ends here
    tensor data (the weights: gigabytes)

gguf's own GGUFReader memory-maps the whole file, which for a file on a hub means fetching
all of it; this reads the header from any byte stream and stops where the weights begin.
The gguf package still names the keys, value types and file types, so they stay llama.cpp's.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmgw.errors import InspectError

# The header is the tokenizer, mostly: Gemma 3's 262k-token vocabulary takes 6.5 MB. Anything
# past this is not a header a model would have, and reading on would fetch the weights.
MAX_HEADER_BYTES = 64 * 1024 * 1024
# Longer arrays (the vocabulary, its scores and merges) are counted and skipped, not kept.
KEEP_ARRAY_ITEMS = 4096
SUPPORTED_VERSIONS = (2, 3)
# Lint reads headers on every pull request, so a damaged or hostile file must be refused in
# milliseconds: every count the header claims is checked against the bytes it could still
# occupy before anything is allocated or looped over. The bounds below are far past any model.
MAX_DIMS = 8  # GGUF's own limit is 4
MAX_ARRAY_DEPTH = 8  # arrays of arrays: llama.cpp writes one level, never more
MAX_LAYERS = 65_536  # per-layer tuples are built from this; the largest models have ~200
# The fewest bytes one item can take, so a count × this must fit in what is left:
KV_MIN_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
TENSOR_MIN_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset
STRING_MIN_BYTES = 8  # its length
ARRAY_MIN_BYTES = 4 + 8  # item type, count

# Where llama.cpp's loader fixes the sliding-window layout in code rather than reading it
# from the file: every n-th layer attends globally, the others to the window (set_swa_pattern).
SWA_PERIOD_BY_ARCHITECTURE = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, "cohere2": 4, "gpt-oss": 2}


class Stream(Protocol):
    """Bytes in order: `read(n)` gives the next bytes (about n; a remote reader gives what
    arrived), and b"" at the end."""

    def read(self, n: int) -> bytes: ...


@dataclass(frozen=True)
class Header:
    """What the header says. A field is None when the file does not say it."""

    version: int
    header_bytes: int  # where the weights begin
    architecture: str | None
    name: str | None
    parameters: int
    tensors: int
    file_type: str | None  # llama.cpp's name for the quantization, e.g. Q4_K_M
    context_length: int | None  # the context the model was trained for
    layers: int | None
    heads: int | None
    kv_heads: int | None
    key_length: int | None
    value_length: int | None
    sliding_window: int | None
    local_layers: tuple[bool, ...] | None  # per layer: True when it attends to the window only
    embedding_length: int | None
    feed_forward_length: int | None
    vocab_size: int | None
    chat_template: bool
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def sliding_window_layers(self) -> int:
        return sum(self.local_layers) if self.local_layers else 0


@dataclass(frozen=True)
class _LongArray:
    item_type: int
    count: int


def read_header(stream: Stream, where: str, size: int | None = None) -> Header:
    """`where` names the source in every sentence, so a person knows which file is wrong;
    `size`, the whole file's, when known, bounds what the header may claim more tightly."""
    return _Parser(stream, where, size).header()


class _Parser:
    def __init__(self, stream: Stream, where: str, size: int | None = None) -> None:
        self.stream = stream
        self.where = where
        self.limit = min(MAX_HEADER_BYTES, size) if size is not None else MAX_HEADER_BYTES
        self.buffer = bytearray()
        self.at = 0  # bytes consumed from the start of the file
        self.order = "<"

    def header(self) -> Header:
        import gguf

        magic = self._exact(4, "the magic number")
        if magic != struct.pack("<I", gguf.GGUF_MAGIC):
            raise InspectError(
                f"{self.where} is not a GGUF file: it starts with {bytes(magic)!r}, not b'GGUF'. "
                "llama.cpp reads GGUF only; give a .gguf file, or convert the weights with "
                "llama.cpp's convert_hf_to_gguf.py."
            )
        version = self._version()
        tensor_count, kv_count = self._u64(), self._u64()
        if kv_count > 1_000_000 or tensor_count > 10_000_000:
            raise InspectError(
                f"{self.where} claims {kv_count} metadata keys and {tensor_count} tensors, which no "
                "model has: the header is damaged. Download the file again."
            )
        self._fits(kv_count, KV_MIN_BYTES, "metadata keys")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._string()
            metadata[key] = self._value(self._u32())
        self._fits(tensor_count, TENSOR_MIN_BYTES, "tensors")
        parameters = 0
        for _ in range(tensor_count):
            name = self._string()
            n_dims = self._u32()
            if n_dims > MAX_DIMS:
                raise InspectError(
                    f"{self.where} says tensor {name[:80]!r} has {n_dims} dimensions; GGUF allows at "
                    "most 4: the header is damaged. Download the file again."
                )
            dims = [self._u64() for _ in range(n_dims)]
            self._u32(), self._u64()  # type, offset
            parameters += math.prod(dims)
        return _facts(self.where, version, self.at, metadata, parameters, tensor_count)

    def _version(self) -> int:
        (version,) = struct.unpack("<I", self._exact(4, "the version"))
        if version & 0xFFFF == 0 and version:
            # A big-endian file: GGUF allows one, and says so only through the byte order.
            self.order = ">"
            (version,) = struct.unpack(">I", struct.pack("<I", version))
        if version not in SUPPORTED_VERSIONS:
            raise InspectError(
                f"{self.where} is GGUF version {version}; llmgw reads versions 2 and 3, as llama.cpp "
                "does. Convert the file again with a current llama.cpp."
            )
        return int(version)

    def _fits(self, count: int, each: int, what: str) -> None:
        """Refuses a count whose items could not fit in the rest of the header (or file),
        before a loop over them starts: a 155-byte file may claim 2**60 of anything."""
        left = self.limit - self.at
        if count * each <= left:
            return
        if self.limit < MAX_HEADER_BYTES:
            raise InspectError(
                f"{self.where} ends {self.limit} bytes in, inside the {count} {what} its header "
                f"claims at byte {self.at} (at least {count * each} bytes): the GGUF header is "
                "truncated or damaged. Fetch the file again."
            )
        raise InspectError(
            f"{self.where} claims {count} {what} at byte {self.at}, which need at least "
            f"{count * each} bytes, more than a {MAX_HEADER_BYTES // 2**20} MiB header holds: "
            "the header is damaged. Download the file again."
        )

    def _exact(self, n: int, what: str = "the header") -> bytes:
        if self.at + n > self.limit:
            if self.limit < MAX_HEADER_BYTES:
                raise InspectError(
                    f"{self.where} ends {self.limit} bytes in, inside {what} (it needs {n} bytes from "
                    f"byte {self.at}): the GGUF header is truncated or damaged. The "
                    "download was cut short, or the file is broken; fetch it again."
                )
            raise InspectError(
                f"{self.where} has a header longer than {MAX_HEADER_BYTES // 2**20} MiB, which no "
                "model needs: the file is damaged or not a model. Download it again."
            )
        while len(self.buffer) < n:
            chunk = self.stream.read(max(n - len(self.buffer), 1 << 16))
            if not chunk:
                raise InspectError(
                    f"{self.where} ends {self.at + len(self.buffer)} bytes in, inside {what}: the "
                    "GGUF header is truncated. The download was cut short; fetch the file again."
                )
            self.buffer += chunk
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.at += n
        return out

    def _unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack(self.order + fmt, self._exact(size))[0]

    def _u32(self) -> int:
        return int(self._unpack("I"))

    def _u64(self) -> int:
        return int(self._unpack("Q"))

    def _string(self) -> str:
        return self._exact(self._u64(), "a string").decode("utf-8", errors="replace")

    def _value(self, kind: int, depth: int = 0) -> Any:
        import gguf

        if kind == gguf.GGUFValueType.STRING:
            return self._string()
        if kind == gguf.GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                # Read by recursion: unbounded, a deep file would end in RecursionError.
                raise InspectError(
                    f"{self.where} nests arrays more than {MAX_ARRAY_DEPTH} deep at byte {self.at}; "
                    "no model's metadata does: the header is damaged. Download the file again."
                )
            item_type, count = self._u32(), self._u64()
            self._fits(count, _min_item_bytes(item_type), "array items")
            if count > KEEP_ARRAY_ITEMS:
                self._skip_items(item_type, count)
                return _LongArray(item_type, count)
            return [self._value(item_type, depth + 1) for _ in range(count)]
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise InspectError(
                f"{self.where} has a metadata value of unknown type {kind} at byte {self.at}: the "
                "header is damaged or newer than this llmgw. Download the file again, or upgrade llmgw."
            )
        value = self._unpack(fmt)
        return bool(value) if kind == gguf.GGUFValueType.BOOL else value

    def _skip_items(self, item_type: int, count: int) -> None:
        import gguf

        if item_type == gguf.GGUFValueType.STRING:
            for _ in range(count):
                self._exact(self._u64(), "a string")
            return
        fmt = _SCALARS.get(item_type)
        if fmt is None:
            raise InspectError(
                f"{self.where} has an array of type {item_type} at byte {self.at}, which GGUF does "
                "not allow this long: the header is damaged. Download the file again."
            )
        remaining = struct.calcsize(fmt) * count
        while remaining:
            step = min(remaining, 1 << 20)
            self._exact(step)
            remaining -= step


# struct formats by GGUFValueType number (UINT8 … FLOAT64; STRING and ARRAY are read apart).
# Numbers rather than the enum, so the table is built without importing gguf and numpy.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _min_item_bytes(item_type: int) -> int:
    if item_type == _STRING:
        return STRING_MIN_BYTES
    if item_type == _ARRAY:
        return ARRAY_MIN_BYTES
    fmt = _SCALARS.get(item_type)
    # An unknown type is refused when its first item is read; 1 keeps the bound honest till then.
    return struct.calcsize(fmt) if fmt else 1


def _facts(
    where: str, version: int, size: int, meta: dict[str, Any], parameters: int, tensors: int
) -> Header:
    import gguf

    arch = meta.get(gguf.Keys.General.ARCHITECTURE)
    arch = arch if isinstance(arch, str) else None

    def key(template: str) -> Any:
        return meta.get(template.format(arch=arch)) if arch else None

    layers = _int(key(gguf.Keys.LLM.BLOCK_COUNT))
    if layers is not None and not 0 <= layers <= MAX_LAYERS:
        # Checked before per-layer tuples are built: 2**27 layers took 51 s and 2.3 GB.
        raise InspectError(
            f"{where} says the model has {layers} layers; no model has more than {MAX_LAYERS}: "
            "the header is damaged. Download the file again."
        )
    heads = _most(key(gguf.Keys.Attention.HEAD_COUNT))
    kv_heads = _most(key(gguf.Keys.Attention.HEAD_COUNT_KV))
    embedding = _int(key(gguf.Keys.LLM.EMBEDDING_LENGTH))
    # llama.cpp's defaults when a file leaves them out: as many KV heads as heads,
    # and a head as wide as the embedding split across the heads.
    kv_heads = kv_heads if kv_heads is not None else heads
    head_size = embedding // heads if embedding and heads else None
    key_length = _int(key(gguf.Keys.Attention.KEY_LENGTH)) or head_size
    value_length = _int(key(gguf.Keys.Attention.VALUE_LENGTH)) or head_size
    window = _int(key(gguf.Keys.Attention.SLIDING_WINDOW)) or None
    vocab = meta.get(gguf.Keys.Tokenizer.LIST)
    vocab_size = vocab.count if isinstance(vocab, _LongArray) else None
    if isinstance(vocab, list):
        vocab_size = len(vocab)
    file_type = _int(meta.get(gguf.Keys.General.FILE_TYPE))
    return Header(
        version=version,
        header_bytes=size,
        architecture=arch,
        name=meta.get(gguf.Keys.General.NAME) if isinstance(meta.get(gguf.Keys.General.NAME), str) else None,
        parameters=parameters,
        tensors=tensors,
        file_type=_file_type_name(file_type),
        context_length=_int(key(gguf.Keys.LLM.CONTEXT_LENGTH)),
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=value_length,
        sliding_window=window,
        local_layers=_local_layers(arch, layers, window, key(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN)),
        embedding_length=embedding,
        feed_forward_length=_most(key(gguf.Keys.LLM.FEED_FORWARD_LENGTH)),
        vocab_size=vocab_size or _int(key(gguf.Keys.LLM.VOCAB_SIZE)),
        chat_template=isinstance(meta.get(gguf.Keys.Tokenizer.CHAT_TEMPLATE), str),
        metadata=meta,
    )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _most(value: Any) -> int | None:
    """Some files give a count per layer (an array): the largest is what memory must hold."""
    if isinstance(value, list):
        numbers = [v for v in value if isinstance(v, int)]
        return max(numbers) if numbers else None
    return _int(value)


def _file_type_name(value: int | None) -> str | None:
    import gguf

    if value is None:
        return None
    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"type {value}"


def _local_layers(
    arch: str | None, layers: int | None, window: int | None, pattern: Any
) -> tuple[bool, ...] | None:
    """Which layers attend to the window only, as llama.cpp's loader decides it."""
    if not window or not layers:
        return None
    if isinstance(pattern, list) and len(pattern) == layers:
        return tuple(bool(p) for p in pattern)
    period = _int(pattern) or SWA_PERIOD_BY_ARCHITECTURE.get(arch or "")
    if period is None:
        # An architecture whose layout we do not know: counting every layer as global
        # overstates the cache, which places a model on a bigger node, never a smaller one.
        return None
    return tuple(period == 0 or i % period < period - 1 for i in range(layers))
