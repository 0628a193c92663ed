"""Checking a GGUF file's header before a library parses it.

A GGUF file (a bundled model's, or one assembled under ``$LMEMBED_HOME/gguf``) is read by transformers' ``gguf``
reader, which trusts every count, length and type it finds: a truncated or forged file ends in ``struct.error``,
``TypeError`` or an allocation of exabytes. :func:`check_gguf_file` walks the header, the metadata and the tensor
table first, checking each count and length against the bytes left in the file before reading it, each value type
against the known list and the types of the fields lmembed uses, and raises :class:`ModelLoadError` naming the file
and the key or field.

Past the layout it checks what the conversion builds from the file: every string (those inside arrays too) is UTF-8,
each tensor dimension is between 1 and a bound, tensor data ranges lie in the file without overlapping, the model
sizes (``<arch>.embedding_length``, ``<arch>.block_count``, head counts, ...) are whole numbers within bounds that
agree with each other, ``<arch>.block_count`` is the number of ``blk.N`` blocks the tensor table holds, and the
tensors whose shape follows from those sizes (embeddings, output, attention, feed-forward, norms) have that shape.
A forged size would otherwise reach transformers, which divides by it, allocates by it or trips over the mismatch.
"""

from __future__ import annotations

import itertools
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
#: fixed-size value types: type id -> (struct format, size in bytes)
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # uint8
    1: ("<b", 1),  # int8
    2: ("<H", 2),  # uint16
    3: ("<h", 2),  # int16
    4: ("<I", 4),  # uint32
    5: ("<i", 4),  # int32
    6: ("<f", 4),  # float32
    7: ("<?", 1),  # bool
    10: ("<Q", 8),  # uint64
    11: ("<q", 8),  # int64
    12: ("<d", 8),  # float64
}
STRING, ARRAY = 8, 9
_TYPE_NAMES = {
    0: "uint8",
    1: "int8",
    2: "uint16",
    3: "int16",
    4: "uint32",
    5: "int32",
    6: "float32",
    7: "bool",
    8: "string",
    9: "array",
    10: "uint64",
    11: "int64",
    12: "float64",
}
#: the fewest bytes one metadata entry / one tensor entry can take (an empty name, the smallest value)
_MIN_KV, _MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NESTING = 4
#: the fields lmembed (and transformers' conversion) relies on, with the value type each must have
_EXPECTED_TYPES: dict[str, tuple[int, ...]] = {
    "general.architecture": (STRING,),
    "general.alignment": (4,),
}
_ARRAY_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
#: the largest tensor dimension accepted (2**40 elements along one axis is far past any real model)
_MAX_DIM = 1 << 40
#: the model sizes read under the architecture's prefix, with the largest value each may take; each must be a whole
#: number from 1 up (a per-layer array, which some architectures use, is left to the tensor checks it cannot feed)
_SIZE_LIMITS: dict[str, int] = {
    "block_count": 4096,
    "context_length": 1 << 24,
    "embedding_length": 1 << 17,
    "feed_forward_length": 1 << 20,
    "vocab_size": 1 << 22,
    "attention.head_count": 1 << 12,
    "attention.head_count_kv": 1 << 12,
    "attention.key_length": 1 << 14,
    "attention.value_length": 1 << 14,
    "rope.dimension_count": 1 << 14,
}
#: the most tokens a tokenizer.ggml.tokens array may list
_MAX_VOCAB = _SIZE_LIMITS["vocab_size"]
#: architectures whose transformers config takes its head size from ``rope.dimension_count``
_HEAD_DIM_FROM_ROPE = ("llama", "mistral")
#: architectures whose attention tensors all have the one layout the head counts give (others may vary per layer)
_UNIFORM_ATTENTION = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
_BLOCK_NAME = re.compile(r"blk\.([0-9]{1,9})\.(.+)")


def _refuse(path: Path, where: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: not a usable GGUF file: {where}: {why}")


class _Reader:
    """Bounds-checked little-endian reads from a buffer; ``where`` names what is being read."""

    def __init__(self, data: Any, path: Path) -> None:
        self.data, self.path, self.pos, self.size = data, path, 0, len(data)

    def refuse(self, where: str, why: str) -> ModelLoadError:
        return _refuse(self.path, where, f"{why} (at byte {self.pos})")

    def need(self, count: int, where: str) -> None:
        if count < 0 or count > self.size - self.pos:
            raise self.refuse(where, f"needs {count} bytes, only {self.size - self.pos} left in the file")

    def scalar(self, fmt: str, size: int, where: str) -> Any:
        self.need(size, where)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def u32(self, where: str) -> int:
        return int(self.scalar("<I", 4, where))

    def u64(self, where: str) -> int:
        return int(self.scalar("<Q", 8, where))

    def string(self, where: str) -> str:
        length = self.u64(f"{where} (string length)")
        self.need(length, f"{where} (string of {length} bytes)")
        raw = bytes(self.data[self.pos : self.pos + length])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse(where, "the string is not UTF-8") from None
        self.pos += length
        return text

    def value(self, kind: int, where: str, depth: int = 0) -> Any:
        """One value of type ``kind``; an array's items are checked (strings decoded) and skipped (its length is
        returned)."""
        if kind in _SCALARS:
            return self.scalar(*_SCALARS[kind], where)
        if kind == STRING:
            return self.string(where)
        if kind != ARRAY:
            raise self.refuse(where, f"value type {kind} is not a GGUF type (0-12)")
        if depth >= _MAX_NESTING:
            raise self.refuse(where, f"arrays nested more than {_MAX_NESTING} deep")
        item = self.u32(f"{where} (array item type)")
        if item not in _TYPE_NAMES:
            raise self.refuse(where, f"array item type {item} is not a GGUF type (0-12)")
        count = self.u64(f"{where} (array length)")
        if item in _SCALARS:
            self.need(count * _SCALARS[item][1], f"{where} (array of {count} {_TYPE_NAMES[item]})")
            self.pos += count * _SCALARS[item][1]
        else:
            smallest = 8 if item == STRING else 12
            self.need(count * smallest, f"{where} (array of {count} {_TYPE_NAMES[item]})")
            for index in range(count):
                self.value(item, f"{where}[{index}]", depth + 1)
        return ("array", item, count)


def _shown(text: str, limit: int = 80) -> str:
    """A name from the file, cut short for a message."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def check_gguf_file(path: str | Path) -> dict[str, Any]:
    """Check the GGUF file at ``path`` (header, metadata, tensor table, tensor extents) without trusting any count;
    returns its scalar and string metadata (arrays as ``("array", item type, length)``). Raises
    :class:`ModelLoadError` naming the file and the key or field."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            if size < 4 + 4 + 8 + 8:
                raise ModelLoadError(f"{path}: not a usable GGUF file: {size} bytes, shorter than a GGUF header")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _check(_Reader(data, path))
    except struct.error as exc:  # a read the bounds checks missed: still a refusal naming the file
        raise ModelLoadError(f"{path}: not a usable GGUF file: {exc}") from None
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read the GGUF file: {exc}") from None


def _check(reader: _Reader) -> dict[str, Any]:
    magic = bytes(reader.data[:4])
    if magic != MAGIC:
        raise reader.refuse("magic", f"starts with {magic!r}, not {MAGIC!r}")
    reader.pos = 4
    version = reader.u32("version")
    if version not in VERSIONS:
        raise reader.refuse("version", f"version {version} is not one of {list(VERSIONS)}")
    tensors = reader.u64("tensor count")
    keys = reader.u64("metadata key count")
    reader.need(keys * _MIN_KV, f"metadata key count {keys}")
    reader.need(tensors * _MIN_TENSOR + keys * _MIN_KV, f"tensor count {tensors}")
    metadata: dict[str, Any] = {}
    for index in range(keys):
        full_key = reader.string(f"metadata key #{index}")
        key = _shown(full_key)
        if full_key in metadata:
            raise reader.refuse(f"metadata {key!r}", "the key appears twice")
        kind = reader.u32(f"metadata {key!r} (value type)")
        if kind not in _TYPE_NAMES:
            raise reader.refuse(f"metadata {key!r}", f"value type {kind} is not a GGUF type (0-12)")
        expected = _EXPECTED_TYPES.get(full_key, (ARRAY,) if full_key in _ARRAY_FIELDS else None)
        if expected is not None and kind not in expected:
            names = " or ".join(_TYPE_NAMES[k] for k in expected)
            raise reader.refuse(f"metadata {key!r}", f"stored as {_TYPE_NAMES[kind]}, not {names}")
        metadata[full_key] = reader.value(kind, f"metadata {key!r}")
    if "general.architecture" not in metadata:
        raise reader.refuse("metadata 'general.architecture'", "missing")
    alignment = int(metadata.get("general.alignment", 32))
    if alignment <= 0 or alignment & (alignment - 1):
        raise reader.refuse("metadata 'general.alignment'", f"{alignment} is not a power of two")
    extents: list[_Tensor] = []
    names: set[str] = set()
    for index in range(tensors):
        name = reader.string(f"tensor #{index} (name)")
        where = f"tensor {_shown(name)!r}"
        if name in names:
            raise reader.refuse(where, "the name appears twice in the tensor table")
        names.add(name)
        dims = reader.u32(f"{where} (dimension count)")
        if not 1 <= dims <= _MAX_DIMS:
            raise reader.refuse(where, f"{dims} dimensions (1-{_MAX_DIMS} allowed)")
        shape = [reader.u64(f"{where} (dimension {d})") for d in range(dims)]
        for d, dim in enumerate(shape):
            if not 1 <= dim <= _MAX_DIM:
                raise reader.refuse(f"{where} (dimension {d})", f"{dim} is not between 1 and {_MAX_DIM}")
        kind = reader.u32(f"{where} (type)")
        offset = reader.u64(f"{where} (offset)")
        if offset % alignment:
            raise reader.refuse(f"{where} (offset)", f"{offset} is not a multiple of the {alignment}-byte alignment")
        extents.append(_Tensor(name, where, tuple(shape), kind, offset))
    start = -(-reader.pos // alignment) * alignment
    _check_extents(reader, extents, start)
    _check_model(reader.path, metadata, extents)
    return metadata


@dataclass(frozen=True)
class _Tensor:
    """One entry of the tensor table: ``shape`` in GGUF order (the fastest-varying dimension first)."""

    name: str
    where: str
    shape: tuple[int, ...]
    kind: int
    offset: int


def _check_extents(reader: _Reader, extents: list[_Tensor], start: int) -> None:
    """Each tensor's bytes lie inside the file and no two tensors share a byte (sizes from the ``gguf`` package's
    table, when it is installed)."""
    try:
        from gguf.constants import GGML_QUANT_SIZES  # lazy: only for a conversion; the table is the reader's own
    except ImportError:  # pragma: no cover - transformers' GGUF support needs it
        GGML_QUANT_SIZES = {}
    sizes = {int(kind): value for kind, value in GGML_QUANT_SIZES.items()}
    available = reader.size - start
    ranges: list[tuple[int, int, str]] = []
    for tensor in extents:
        where, kind, offset = tensor.where, tensor.kind, tensor.offset
        if sizes and kind not in sizes:
            raise reader.refuse(where, f"tensor type {kind} is not a known GGML type")
        elements = 1
        for dim in tensor.shape:
            elements *= dim
        block, block_bytes = sizes.get(kind, (1, 0))
        if elements % block:
            raise reader.refuse(where, f"{elements} elements is not a whole number of {block}-element blocks")
        nbytes = elements // block * block_bytes
        if offset > available or nbytes > available - offset:
            raise reader.refuse(
                where, f"its {nbytes} bytes at offset {offset} end past the file's {available} bytes of tensor data"
            )
        ranges.append((offset, offset + nbytes, where))
    ranges.sort()
    for (_, end, before), (offset, _, where) in itertools.pairwise(ranges):
        if offset < end:
            why = f"its data at offset {offset} overlaps that of {before} (which ends at {end})"
            raise _refuse(reader.path, f"{where} (offset)", why)


def _size(path: Path, metadata: dict[str, Any], key: str) -> int | None:
    """The model size stored under ``key`` (a whole number within its bound), or None when it is absent or a
    per-layer array."""
    if key not in metadata:
        return None
    value = metadata[key]
    if isinstance(value, tuple):  # ("array", item type, length): per-layer values, not checked here
        return None
    limit = _SIZE_LIMITS[key.split(".", 1)[1]]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(path, f"metadata {key!r}", f"{_shown(repr(value))} is not a whole number")
    if not 1 <= value <= limit:
        raise _refuse(path, f"metadata {key!r}", f"{value} is not between 1 and {limit}")
    return value


def _check_model(path: Path, metadata: dict[str, Any], extents: list[_Tensor]) -> None:
    """The model sizes are in bounds and agree with each other, with the tensor table's blocks and with the shapes
    of the tensors they determine."""
    arch = metadata["general.architecture"]
    sizes = {name: _size(path, metadata, f"{arch}.{name}") for name in _SIZE_LIMITS}

    def key(name: str) -> str:
        return f"metadata {arch + '.' + name!r}"

    # the vocabulary: the tokens listed, which a stored vocab_size must repeat
    vocab = sizes["vocab_size"]
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, tuple):
        count = tokens[2]
        if not 1 <= count <= _MAX_VOCAB:
            raise _refuse(path, "metadata 'tokenizer.ggml.tokens'", f"{count} tokens is not between 1 and {_MAX_VOCAB}")
        if vocab is not None and vocab != count:
            raise _refuse(path, key("vocab_size"), f"{vocab}, but 'tokenizer.ggml.tokens' lists {count} tokens")
        vocab = count

    # attention heads
    embed, heads, kv_heads = sizes["embedding_length"], sizes["attention.head_count"], sizes["attention.head_count_kv"]
    if kv_heads is not None and heads is not None and heads % kv_heads:
        raise _refuse(path, key("attention.head_count_kv"), f"{kv_heads} does not divide the head count {heads}")
    head_dim = sizes["attention.key_length"]
    if head_dim is None and embed is not None and heads is not None:
        if embed % heads:
            raise _refuse(path, key("attention.head_count"), f"{heads} does not divide the embedding length {embed}")
        head_dim = embed // heads
    rope = sizes["rope.dimension_count"]
    if rope is not None and head_dim is not None:
        if arch in _HEAD_DIM_FROM_ROPE and rope != head_dim:
            raise _refuse(path, key("rope.dimension_count"), f"{rope}, but the head size is {head_dim}")
        if rope > head_dim:
            raise _refuse(path, key("rope.dimension_count"), f"{rope} is more than the head size {head_dim}")
    value_dim = sizes["attention.value_length"] or head_dim
    kv_heads = kv_heads or heads

    # blocks: block_count is the number of blk.N blocks in the tensor table, each with at least one tensor
    blocks: dict[int, list[_Tensor]] = {}
    for tensor in extents:
        match = _BLOCK_NAME.fullmatch(tensor.name)
        if match:
            blocks.setdefault(int(match.group(1)), []).append(tensor)
    count = sizes["block_count"]
    if blocks and count is None:
        raise _refuse(path, key("block_count"), f"missing, but the file has tensors for {len(blocks)} blocks")
    if count is not None:
        if count > len(blocks):
            missing = next(n for n in range(len(blocks) + 1) if n not in blocks)
            raise _refuse(path, key("block_count"), f"gives {count}, but the file has no tensors for block {missing}")
        beyond = max(blocks)
        if beyond >= count:
            raise _refuse(path, key("block_count"), f"gives {count}, but the file has tensors for block {beyond}")

    # the shapes that follow from the sizes (GGUF order: the input dimension first)
    ffn = sizes["feed_forward_length"]
    expected: dict[str, tuple[int | None, ...]] = {
        "token_embd.weight": (embed, vocab),
        "output.weight": (embed, vocab),
        "output_norm.weight": (embed,),
    }
    per_block: dict[str, tuple[int | None, ...]] = {
        "attn_norm.weight": (embed,),
        "ffn_norm.weight": (embed,),
        "ffn_gate.weight": (embed, ffn),
        "ffn_up.weight": (embed, ffn),
        "ffn_down.weight": (ffn, embed),
    }
    if arch in _UNIFORM_ATTENTION:
        q_width = heads * head_dim if heads and head_dim else None
        per_block.update(
            {
                "post_attention_norm.weight": (embed,),
                "post_ffw_norm.weight": (embed,),
                "attn_q.weight": (embed, q_width),
                "attn_k.weight": (embed, kv_heads * head_dim if kv_heads and head_dim else None),
                "attn_v.weight": (embed, kv_heads * value_dim if kv_heads and value_dim else None),
                "attn_output.weight": (heads * value_dim if heads and value_dim else None, embed),
            }
        )
    for tensor in extents:
        match = _BLOCK_NAME.fullmatch(tensor.name)
        shape = per_block.get(match.group(2)) if match else expected.get(tensor.name)
        if shape is None or None in shape:
            continue
        if tensor.shape != shape:
            raise _refuse(
                path,
                tensor.where,
                f"shape {list(tensor.shape)}, but the metadata ({_sources(arch, tensor.name)}) makes it {list(shape)}",
            )


def _sources(arch: str, name: str) -> str:
    """The metadata keys a tensor's expected shape comes from, for a message."""
    used = [f"{arch}.embedding_length"]
    if name in ("token_embd.weight", "output.weight"):
        used.append("tokenizer.ggml.tokens")
    elif "ffn_" in name and "norm" not in name:
        used.append(f"{arch}.feed_forward_length")
    elif "attn_" in name and "norm" not in name:
        used += [f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"]
    return ", ".join(f"'{k}'" for k in used)


__all__ = ["check_gguf_file"]
