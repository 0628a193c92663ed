"""Embedding cache: compute once, evaluate many.

Layout: ``<root>/<model key>/<strategy fingerprint>/<shard>.npz``; the model key is the backbone's fingerprint
(weights, model config and tokenizer: everything of the model that decides a vector) plus the backend and
precision (:func:`model_key`), the strategy fingerprint covers the rest. A shard holds ``keys``
(rows of 16-byte BLAKE2 digests of the instruction and the text), ``vectors`` (raw pooled float32
vectors, before normalisation and Matryoshka truncation, so those options share entries) and ``owner`` (the
``<model key>/<strategy key>`` it was written under, :func:`shard_owner`): a shard copied or moved into another
model's or strategy's folder is still a valid file, and would be served as that model's vectors without it.

Writes are atomic: a shard is written to a temporary file in the same folder, flushed to disk and
renamed into place, so a process killed mid-write leaves either the whole shard or none of it;
stray temporary files are ignored on read and removed by ``clear``.

Reads believe nothing: a shard is read only when it is a plain file (not a link), its arrays' headers say
(n, 16) uint8 keys and (n, width) float32 vectors of this model's width, no more bytes than the file holds, its
owner is the folder it lies in, and every vector is finite (:func:`read_shard`). A shard that fails is skipped
with a warning naming it and why (its texts are computed again); it never fills a row with a broadcast, a cast or
a NaN.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import struct
import threading
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmembed.atomic import TEMP_PREFIX, atomic_write
from lmembed.errors import ConfigError, LmembedError
from lmembed.io import read_npy_header
from lmembed.paths import embedding_cache_dir

log = logging.getLogger(__name__)

KEY_BYTES = 16
#: The version of the code between a text and its vector that no fingerprint sees (how inputs are built, cut and
#: pooled): raised whenever a change to it can change a vector, so the cache (and an experiment's runs) made by an
#: earlier lmembed are not served as this one's. 2: a wrapped long text is cut as a whole at the limit, a left-
#: truncating tokenizer keeps a text's end (stop 59). 3: a whole text pools every token, one of no text of its own
#: (a byte-level BPE's prefix space) included (stop 60).
ENCODING_VERSION = 3
#: the names the cache gives its folders: ``<model key>/<strategy key>/`` (:func:`model_key`: the backbone's
#: fingerprint, then the backend's tag; ``EmbeddingConfig.fingerprint``)
MODEL_DIR_NAME = re.compile(r"[0-9a-f]{32}(-[\w.]+)*")
STRATEGY_DIR_NAME = re.compile(r"[0-9a-f]{16}")
#: the longest ``owner`` a shard may hold (a model key and a strategy key are far shorter)
MAX_OWNER_BYTES = 256
#: a ZIP member's local header: signature, versions, flags, method, time, date, crc, sizes, name and extra lengths
LOCAL_HEADER = struct.Struct("<4s5H3L2H")


class CacheShardError(LmembedError, ValueError):
    """A cache shard that is not as lmembed writes it: damaged, changed, a link, or of another width."""


def default_cache_dir() -> Path:
    """The embedding cache's root: ``$LMEMBED_CACHE``, else ``$LMEMBED_HOME/embeddings`` (:mod:`lmembed.paths`)."""
    return embedding_cache_dir()


def model_key(model_fingerprint: str, backend_tag: str = "") -> str:
    """The model part of a cache key: the backbone's fingerprint (``Backbone.fingerprint``: weights, model config,
    tokenizer), plus the backend and precision that computed the vectors (``backend_tag``, e.g.
    ``onnx-int8-<calibration>``; empty for the torch reference at the model's own dtype), so an int8 or ONNX vector
    is never served as a torch float32 one, and :data:`ENCODING_VERSION`, so a vector an earlier lmembed made is not
    served as this one's."""
    key = f"{model_fingerprint}-e{ENCODING_VERSION}"
    return f"{key}-{backend_tag}" if backend_tag else key


def text_key(text: str, instruction: str | None = None) -> bytes:
    """The text part of a cache key: the instruction's length, the instruction, the text. The length keeps the two
    apart where a separator could not: either may hold any character (NUL included), and ``("a", "b\x00c")`` and
    ``("a\x00b", "c")`` joined by a NUL were one key, so one was served the other's vector."""
    head = (instruction or "").encode()
    digest = hashlib.blake2b(digest_size=KEY_BYTES)
    digest.update(len(head).to_bytes(8, "little"))
    digest.update(head)
    digest.update(text.encode())
    return digest.digest()


def shard_owner(folder: Path) -> np.ndarray:
    """What a shard in ``folder`` (``<root>/<model key>/<strategy key>``) records as its owner: the two keys, as
    uint8 bytes. Compared on every read, so a shard that lies in another folder than the one it was written for
    (copied, moved or renamed there) is not served as this folder's model's vectors."""
    return np.frombuffer(f"{folder.parent.name}/{folder.name}".encode(), dtype=np.uint8).copy()


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write an .npz so that ``path`` is either absent or complete, never partial."""
    atomic_write(path, lambda handle: np.savez(handle, **arrays))


@dataclass(frozen=True)
class _Shard:
    """Where a shard's vectors lie in its file (an uncompressed ``.npz``: ``vectors.npy``'s data at ``offset``), and
    the file as it was when its keys were read: a lookup reads the rows it needs from there, and a file changed since
    is read again whole (its checks with it) before any row of it is served."""

    path: Path
    offset: int
    rows: int
    width: int
    stat: tuple[int, int, int, int]  # inode, size, modification and status-change times (ns)


def _stat_of(path: Path | int) -> tuple[int, int, int, int]:
    """A file's identity and last change (of a path, or of an open file's descriptor): inode, size, modification and
    status-change times. The status-change time moves with every write and cannot be set back, as the modification
    time can (``os.utime``): a shard rewritten in place with its old time restored was served its old row map."""
    info = os.fstat(path) if isinstance(path, int) else path.stat()
    return info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


#: a lookup that wants more than this share of a shard's rows reads its vectors whole (one read), else row by row
WHOLE_SHARD_SHARE = 0.125


class EmbeddingCache:
    """Raw pooled vectors of one (model, strategy) pair, looked up by text. Its folder's shards are read once each:
    a lookup reads only the shards written since the last one (by this process or another), so an engine that keeps
    its cache across calls does not read every earlier call's shard again at each call.

    Only the keys stay in memory, each with its shard and row; a lookup reads the vectors it finds from the shard
    files. The cache of a long run (an index build, a corpus encoded with the cache on) held every vector it had
    computed, as much again as the vectors being built."""

    def __init__(self, root: Path, model_fingerprint: str, strategy_fingerprint: str, width: int | None = None) -> None:
        self.dir = Path(root) / model_fingerprint / strategy_fingerprint
        self.width = width  # the raw vectors' width, where the caller knows it: a shard of another is skipped
        self._index: dict[bytes, tuple[int, int]] | None = None  # key -> (shard number, row)
        self._shards: list[_Shard | None] = []  # None: a shard found changed, whose rows are no longer served
        self._slot_of: dict[str, int] = {}  # each shard file's slot, by name
        self._read: set[str] = set()  # the shards in the index (read, skipped as damaged, or written here)
        self._lock = threading.Lock()  # threads sharing an engine share its caches

    def _load(self) -> dict[bytes, tuple[int, int]]:
        shards = sorted(self.dir.glob("*.npz")) if self.dir.exists() else []
        if self._index is None or not self._read <= {shard.name for shard in shards}:
            self._index, self._shards, self._read = {}, [], set()  # first read, or shards removed: read all again
            self._slot_of = {}
        for shard in shards:
            if shard.name.startswith(TEMP_PREFIX) or shard.name in self._read:
                continue
            self._read.add(shard.name)
            try:
                before = _stat_of(shard)
                keys, vectors = read_shard(shard, self.width)
                self._register(shard, keys, vectors.shape, before)
            except (CacheShardError, OSError, ValueError, zipfile.BadZipFile) as exc:
                root = self.dir.parent.parent
                log.warning(
                    "skipping %s; its texts are encoded again (`lmembed cache clear --damaged --directory %s` "
                    "removes such shards)",
                    exc,
                    root,
                )
        return self._index

    def _register(self, path: Path, keys: np.ndarray, shape: tuple[int, ...], stat: tuple[int, int, int, int]) -> None:
        """Index a shard whose arrays were read and checked from the file as ``stat`` describes it."""
        assert self._index is not None
        if _stat_of(path) != stat:  # replaced while it was read: read again at the next lookup
            self._read.discard(path.name)
            return
        earlier = self._slot_of.get(path.name)
        if earlier is not None:  # a named shard written again: its old rows are gone
            self._shards[earlier] = None
        slot = self._slot_of[path.name] = len(self._shards)
        self._shards.append(_Shard(path, vectors_offset(path), int(shape[0]), int(shape[1]), stat))
        for row, key in enumerate(keys):
            self._index[key.tobytes()] = (slot, row)

    def __len__(self) -> int:
        with self._lock:
            return len(self._load())

    def lookup(self, keys: Sequence[bytes]) -> tuple[list[np.ndarray | None], list[int]]:
        """Cached vectors in order (None where missing) and the positions that are missing."""
        found: list[np.ndarray | None] = [None] * len(keys)

        def keep(positions: np.ndarray, vectors: np.ndarray) -> None:
            for i, vector in zip(positions.tolist(), vectors, strict=True):
                found[i] = vector

        with self._lock:
            self._each_block(keys, keep)
        return found, [i for i, v in enumerate(found) if v is None]

    def fill(self, out: np.ndarray, keys: Sequence[bytes]) -> list[int]:
        """Write the cached vector of each of ``keys`` into its row of ``out``, a shard's rows at a time (one shard's
        read held besides ``out``); returns the positions that are missing."""
        served = np.zeros(len(keys), dtype=bool)

        def write(positions: np.ndarray, vectors: np.ndarray) -> None:
            out[positions] = vectors
            served[positions] = True

        with self._lock:
            self._each_block(keys, write)
        return np.flatnonzero(~served).tolist()

    def _each_block(self, keys: Sequence[bytes], take: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """``take(positions in keys, their vectors)`` for each shard that holds some of ``keys``, one at a time."""
        index = self._load()
        wanted: dict[int, tuple[list[int], list[int]]] = {}
        for i, key in enumerate(keys):
            place = index.get(key)
            if place is not None and self._shards[place[0]] is not None:
                positions, rows = wanted.setdefault(place[0], ([], []))
                positions.append(i)
                rows.append(place[1])
        for slot, (positions, rows) in wanted.items():
            vectors = self._rows(slot, self._shards[slot], rows)
            if vectors is not None:
                take(np.asarray(positions, dtype=np.int64), vectors)

    def _rows(self, slot: int, shard: _Shard | None, rows: list[int]) -> np.ndarray | None:
        """``rows`` of a shard's vectors, read from its file; None (and the shard dropped from the index, to be read
        again whole at the next lookup) when the file is no longer the one whose keys were read (checked on the file
        opened, not on its name before), or its rows fail."""
        if shard is None:
            return None
        try:
            row_bytes = shard.width * 4
            with shard.path.open("rb") as handle:
                if _stat_of(handle.fileno()) != shard.stat:
                    raise CacheShardError(f"{shard.path}: changed since its keys were read")
                if len(rows) > WHOLE_SHARD_SHARE * shard.rows:
                    handle.seek(shard.offset)
                    block = np.fromfile(handle, dtype=np.float32, count=shard.rows * shard.width)
                    out = block.reshape(shard.rows, shard.width)[rows]
                else:
                    out = np.empty((len(rows), shard.width), dtype=np.float32)
                    for j, row in enumerate(rows):
                        handle.seek(shard.offset + row * row_bytes)
                        out[j] = np.frombuffer(handle.read(row_bytes), dtype=np.float32)
            if not np.isfinite(out).all():
                raise CacheShardError(f"{shard.path}: vectors hold NaN or infinite values")
            return out
        except (CacheShardError, OSError, ValueError) as exc:
            log.warning("not serving %s; its texts are encoded again", exc)
            self._drop(slot)
            return None

    def _drop(self, slot: int) -> None:
        """Serve nothing more of a shard's slot (its keys still point there, and find it empty, until the file is
        read again whole, with its checks, at the next lookup; rebuilding the index per dropped shard made a lookup
        over many changed shards take seconds)."""
        shard = self._shards[slot]
        if shard is None:
            return
        self._shards[slot] = None
        self._read.discard(shard.path.name)

    def store(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        if len(keys) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        key_array = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, KEY_BYTES)
        path = self.dir / f"{uuid.uuid4().hex}.npz"
        for attempt in (1, 2):  # `cache clear` in another process may remove the folder while this one writes
            try:
                atomic_save_npz(path, keys=key_array, vectors=vectors, owner=shard_owner(self.dir))
                break
            except FileNotFoundError as exc:
                if attempt == 2:  # the vectors are the caller's all the same: only their cache entry is lost
                    log.warning("%s: not cached (%s); the vectors are returned, and encoded again next time", path, exc)
                    return
        self._written(path, key_array, vectors.shape)

    def _written(self, path: Path, keys: np.ndarray, shape: tuple[int, ...]) -> None:
        """Index a shard this cache has just written (an index not read yet finds it when it is)."""
        with self._lock:
            if self._index is None:
                return
            self._read.add(path.name)
            try:
                self._register(path, keys, shape, _stat_of(path))
            except (OSError, ValueError, zipfile.BadZipFile) as exc:  # removed or replaced at once by another process
                log.debug("%s: not indexed after writing (%s)", path, exc)
                self._read.discard(path.name)

    # ------------------------------------------------------------------ named shards (sharded jobs)
    def shard_path(self, name: str) -> Path:
        """Where the named shard ``name`` of a sharded encoding job (:mod:`lmembed.scale`) lives."""
        if not name or name.startswith(TEMP_PREFIX) or "/" in name:
            raise ValueError(f"invalid shard name {name!r}")
        return self.dir / f"{name}.npz"

    def has_shard(self, name: str) -> bool:
        """True when the named shard is complete on disk (it is written atomically, so present = complete)."""
        return self.shard_path(name).is_file()

    def store_shard(self, name: str, keys: np.ndarray, vectors: np.ndarray) -> Path:
        """Write a named shard atomically: ``keys`` are (n, 16) uint8 text digests (:func:`key_array`),
        ``vectors`` the raw pooled float32 vectors in the same order. Lookups by text see it like any
        other shard; a sharded job finds it again by name, so a resumed job skips it."""
        keys = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, KEY_BYTES)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if len(keys) != len(vectors):
            raise ValueError(f"shard {name!r}: {len(keys)} keys for {len(vectors)} vectors")
        path = self.shard_path(name)
        atomic_save_npz(path, keys=keys, vectors=vectors, owner=shard_owner(self.dir))
        self._written(path, keys, vectors.shape)
        return path


def key_array(keys: Sequence[bytes]) -> np.ndarray:
    """Text digests (:func:`text_key`) as one (n, 16) uint8 array, the form shards store."""
    if not keys:
        return np.empty((0, KEY_BYTES), dtype=np.uint8)
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, KEY_BYTES).copy()


def read_shard(path: str | Path, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, vectors)`` of one shard file: (n, 16) uint8 digests and (n, ``width``) raw float32 vectors, checked
    from the arrays' headers before they are read, written for the folder the file lies in (its ``owner``), and
    finite; :class:`CacheShardError` names the file and the array otherwise."""
    path = Path(path)
    if path.is_symlink():
        raise CacheShardError(f"{path}: a link; a cache shard is a plain file lmembed wrote")
    try:
        with zipfile.ZipFile(path) as archive:
            keys_header = _npy_header(archive, "keys.npy")
            vectors_header = _npy_header(archive, "vectors.npy")
            owner_header = _npy_header(archive, "owner.npy") if "owner.npy" in archive.namelist() else None
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CacheShardError(f"{path}: not a readable cache shard ({exc})") from exc
    (keys_shape, keys_dtype), (shape, dtype) = keys_header, vectors_header
    if keys_dtype != np.uint8 or len(keys_shape) != 2 or keys_shape[1] != KEY_BYTES:
        raise CacheShardError(f"{path}: keys are {keys_dtype} {list(keys_shape)}, not (n, {KEY_BYTES}) uint8 digests")
    if dtype != np.float32 or len(shape) != 2 or shape[0] != keys_shape[0]:
        raise CacheShardError(f"{path}: vectors are {dtype} {list(shape)}, not ({keys_shape[0]}, width) float32")
    if width is not None and shape[1] != width:
        raise CacheShardError(f"{path}: vectors are {shape[1]} wide; this model's are {width}")
    if owner_header is None:
        raise CacheShardError(f"{path}: no owner (a shard of an earlier lmembed, or not lmembed's)")
    owner_shape, owner_dtype = owner_header
    if owner_dtype != np.uint8 or len(owner_shape) != 1 or owner_shape[0] > MAX_OWNER_BYTES:
        raise CacheShardError(f"{path}: owner is {owner_dtype} {list(owner_shape)}, not a uint8 name")
    try:
        with np.load(path, allow_pickle=False) as data:
            keys, vectors, owner = data["keys"], data["vectors"], data["owner"]
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CacheShardError(f"{path}: not a readable cache shard ({exc})") from exc
    expected = shard_owner(path.parent)
    if not np.array_equal(owner, expected):
        written = owner.tobytes().decode(errors="replace")
        raise CacheShardError(
            f"{path}: owner is {written!r}, written for another folder than {expected.tobytes().decode()!r}"
        )
    if not np.isfinite(vectors).all():
        raise CacheShardError(f"{path}: vectors hold NaN or infinite values")
    return keys, vectors


def vectors_offset(path: Path) -> int:
    """Where the data of a shard's ``vectors.npy`` begins in the file: the member's local header (whose name and extra
    field lengths are read from the file itself, not the central directory) and the array's ``.npy`` header."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("vectors.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}: vectors.npy is compressed; lmembed writes shards uncompressed")
        with archive.open(info) as member:
            read_npy_header(member, info.file_size)
            header_bytes = member.tell()
    with path.open("rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(LOCAL_HEADER.size)
    if len(local) != LOCAL_HEADER.size or local[:4] != b"PK\x03\x04":
        raise ValueError(f"{path}: vectors.npy has no local header where the archive says")
    name_length, extra_length = LOCAL_HEADER.unpack(local)[-2:]
    return info.header_offset + LOCAL_HEADER.size + name_length + extra_length + header_bytes


def _npy_header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the array ``name`` of an .npz, from its header; refused when the header claims more bytes
    than the archive holds for it (nothing is allocated first)."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:  # its sizes would be the archive's word, not the file's bytes
        raise ValueError(f"{name} is compressed; lmembed writes shards uncompressed")
    with archive.open(info) as handle:
        try:
            header = read_npy_header(handle, info.file_size)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    if header.dtype.hasobject:
        raise ValueError(f"{name} holds Python objects")
    if header.claimed_bytes > header.data_bytes:
        raise ValueError(f"{name}'s header claims {list(header.shape)} {header.dtype}, more than the file holds")
    return header.shape, header.dtype


def _cache_root(root: Path | None) -> Path:
    root = Path(root or default_cache_dir())
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise ConfigError(f"{root}: not a folder; the embedding cache is a folder of model folders")
    return root


def cache_entries(root: Path) -> list[Path]:
    """The strategy folders of ``root`` that are the cache's own (``<model key>/<strategy key>/``, named as lmembed
    names them): what :func:`clear_cache` removes and :func:`cache_size` counts. Nothing else under ``root``."""
    if not root.is_dir():
        return []
    return [
        strategy
        for model in sorted(root.iterdir())
        if model.is_dir() and not model.is_symlink() and MODEL_DIR_NAME.fullmatch(model.name)
        for strategy in sorted(model.iterdir())
        if strategy.is_dir() and not strategy.is_symlink() and STRATEGY_DIR_NAME.fullmatch(strategy.name)
    ]


def damaged_shards(root: Path | None = None) -> list[tuple[Path, str]]:
    """``(shard, why)`` of every shard under ``root`` (its :func:`cache_entries`) that :func:`read_shard` refuses:
    those a lookup skips, with a warning, on every run. Each shard is read whole, so this takes as long as the cache
    is large."""
    damaged = []
    for strategy in cache_entries(_cache_root(root)):
        widths: dict[Path, int] = {}
        for shard in sorted(strategy.glob("*.npz")):
            if shard.name.startswith(TEMP_PREFIX):
                continue
            try:
                widths[shard] = read_shard(shard)[1].shape[1]
            except CacheShardError as exc:
                damaged.append((shard, str(exc).removeprefix(f"{shard}: ")))
        # one folder holds one model's vectors: a shard wider or narrower than most of its neighbours is not its own
        counts = Counter(widths.values()).most_common()
        if len(counts) > 1 and counts[0][1] > counts[1][1]:
            common = counts[0][0]
            damaged += [
                (shard, f"vectors are {width} wide; the other shards of its folder are {common}")
                for shard, width in widths.items()
                if width != common
            ]
    return damaged


def clear_damaged(root: Path | None = None) -> list[tuple[Path, str]]:
    """Delete the shards :func:`damaged_shards` names (a link is removed, not what it points to); returns them."""
    damaged = damaged_shards(root)
    for shard, _ in damaged:
        shard.unlink()
    return damaged


def clear_cache(root: Path | None = None) -> int:
    """Delete every cached embedding under ``root`` (its :func:`cache_entries`, and a model folder they leave
    empty); returns the number of shard files removed. Anything else in ``root`` is left where it is: a folder
    named by mistake is not emptied."""
    root = _cache_root(root)
    count = 0
    for strategy in cache_entries(root):
        count += sum(1 for _ in strategy.rglob("*.npz"))
        shutil.rmtree(strategy)
        if not any(strategy.parent.iterdir()):
            strategy.parent.rmdir()
    return count


def cache_size(root: Path | None = None) -> tuple[int, int]:
    """(number of shard files, total bytes) of the cache under ``root`` (its :func:`cache_entries`)."""
    files = [p for strategy in cache_entries(_cache_root(root)) for p in strategy.rglob("*.npz") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)
