"""Checking a GGUF file's header before a library parses it.

A GGUF file (a bundled model's, or one assembled under ``$LMEMBED_HOME/gguf``) is read by transformers' ``gguf``
reader, which trusts every count, length and type it finds: a truncated or forged file ends in ``struct.error``,
``TypeError`` or an allocation of exabytes. :func:`check_gguf_file` walks the header, the metadata and the tensor
table first, checking each count and length against the bytes left in the file before reading it, each value type
against the known list and the types of the fields lmembed uses, and raises :class:`ModelLoadError` naming the file
and the key or field.
"""

from __future__ import annotations

import mmap
import struct
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


class _Reader:
    """Bounds-checked little-endian reads from a buffer; ``where`` names what is being read."""

    def __init__(self, data: Any, path: Path) -> None:
        self.data, self.path, self.pos, self.size = data, path, 0, len(data)

    def refuse(self, where: str, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: not a usable GGUF file: {where}: {why} (at byte {self.pos})")

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

    def string(self, where: str, *, keep: bool = True) -> str:
        length = self.u64(f"{where} (string length)")
        self.need(length, f"{where} (string of {length} bytes)")
        raw = bytes(self.data[self.pos : self.pos + length]) if keep else b""
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse(where, "the string is not UTF-8") from None

    def value(self, kind: int, where: str, depth: int = 0) -> Any:
        """One value of type ``kind``; an array's items are checked and skipped (its length is returned)."""
        if kind in _SCALARS:
            return self.scalar(*_SCALARS[kind], where)
        if kind == STRING:
            return self.string(where, keep=depth == 0)
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
        key = _shown(reader.string(f"metadata key #{index}"))
        kind = reader.u32(f"metadata {key!r} (value type)")
        if kind not in _TYPE_NAMES:
            raise reader.refuse(f"metadata {key!r}", f"value type {kind} is not a GGUF type (0-12)")
        expected = _EXPECTED_TYPES.get(key, (ARRAY,) if key in _ARRAY_FIELDS else None)
        if expected is not None and kind not in expected:
            names = " or ".join(_TYPE_NAMES[k] for k in expected)
            raise reader.refuse(f"metadata {key!r}", f"stored as {_TYPE_NAMES[kind]}, not {names}")
        metadata[key] = reader.value(kind, f"metadata {key!r}")
    if "general.architecture" not in metadata:
        raise reader.refuse("metadata 'general.architecture'", "missing")
    alignment = int(metadata.get("general.alignment", 32))
    if alignment <= 0 or alignment & (alignment - 1):
        raise reader.refuse("metadata 'general.alignment'", f"{alignment} is not a power of two")
    extents = []
    for index in range(tensors):
        name = _shown(reader.string(f"tensor #{index} (name)", keep=True))
        where = f"tensor {name!r}"
        dims = reader.u32(f"{where} (dimension count)")
        if not 1 <= dims <= _MAX_DIMS:
            raise reader.refuse(where, f"{dims} dimensions (1-{_MAX_DIMS} allowed)")
        shape = [reader.u64(f"{where} (dimension {d})") for d in range(dims)]
        kind = reader.u32(f"{where} (type)")
        offset = reader.u64(f"{where} (offset)")
        extents.append((where, shape, kind, offset))
    start = -(-reader.pos // alignment) * alignment
    _check_extents(reader, extents, start)
    return metadata


def _check_extents(reader: _Reader, extents: list[tuple[str, list[int], int, int]], start: int) -> None:
    """Each tensor's bytes lie inside the file (sizes from the ``gguf`` package's table, when it is installed)."""
    try:
        from gguf.constants import GGML_QUANT_SIZES  # lazy: only for a conversion; the table is the reader's own
    except ImportError:  # pragma: no cover - transformers' GGUF support needs it
        GGML_QUANT_SIZES = {}
    sizes = {int(kind): value for kind, value in GGML_QUANT_SIZES.items()}
    available = reader.size - start
    for where, shape, kind, offset in extents:
        if sizes and kind not in sizes:
            raise reader.refuse(where, f"tensor type {kind} is not a known GGML type")
        elements = 1
        for dim in shape:
            elements *= dim
        block, block_bytes = sizes.get(kind, (1, 0))
        if elements % block:
            raise reader.refuse(where, f"{elements} elements is not a whole number of {block}-element blocks")
        nbytes = elements // block * block_bytes
        if offset > available or nbytes > available - offset:
            raise reader.refuse(
                where, f"its {nbytes} bytes at offset {offset} end past the file's {available} bytes of tensor data"
            )


__all__ = ["check_gguf_file"]
