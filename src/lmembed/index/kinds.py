"""The vector index kinds, on FAISS, and their parameters.

Every kind ranks by cosine similarity: vectors are L2-normalised on the way in (documents and queries
alike), so inner product is cosine, the similarity ``lmembed eval`` ranks with. ``ivf-pq`` keeps no float
vectors, so its scores are its codes' estimates of the cosine, not the cosine, and its recall is the
codes', below the other kinds' (``python bench/index_recall.py`` measures each kind against flat).

=========== ============================================================================================
kind        what it is
=========== ============================================================================================
``flat``    exact inner product over every vector (the default; the reference the others are measured by)
``hnsw``    a graph (``hnsw_m`` links per node, ``ef_construction`` at build, ``ef_search`` at query time)
``ivf-pq``  inverted lists (``nlist`` k-means cells, ``nprobe`` visited per query) of product-quantised
            codes (``pq_m`` sub-vectors of ``pq_bits`` bits); trained on the first vectors added
``binary``  one bit per dimension (the sign), searched by Hamming distance: 32x less memory than float32.
            The ``k x rescore_multiplier`` best candidates are rescored with the float query against the
            documents' ``float`` vectors or their ``int8`` scalar-quantised copies, which stay on disk
            (memory-mapped); ``rescore="none"`` ranks by Hamming distance alone.
=========== ============================================================================================

A kind is a :class:`VectorIndex`: ``add`` vectors, ``search`` them (rows in insertion order, scores
descending, ties by row), ``save`` its files into a folder and ``load`` them back. ``load`` believes nothing the
files say: a FAISS file must be of the class its kind writes, of the manifest's dimension, with inner product and
finite vectors (the stored floats of every float kind); an ``.npy`` file is checked by its header (dtype, C order,
shape, the file's size) in :func:`read_array` before it is mapped, and its floats must be finite.
"""

from __future__ import annotations

import difflib
import math
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from lmembed.errors import ConfigError
from lmembed.index.errors import IndexFormatError
from lmembed.io import read_npy_header
from lmembed.pooling.normalize import unit_rows

KINDS = ("flat", "hnsw", "ivf-pq", "binary")
RESCORE_MODES = ("float", "int8", "none")
#: Parameters that only matter at query time; an index reopened for search may override them.
SEARCH_PARAMS = ("ef_search", "nprobe", "rescore_multiplier")
#: The parameters each kind uses (the others are left out of its manifest).
KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "flat": (),
    "hnsw": ("hnsw_m", "ef_construction", "ef_search"),
    "ivf-pq": ("nlist", "pq_m", "pq_bits", "nprobe"),
    "binary": ("rescore", "rescore_multiplier"),
}
#: FAISS warns below 39 training points per k-means cell; the default ``nlist`` stays above that.
MIN_POINTS_PER_LIST = 39
#: The default ``nlist`` grows as ``4·√n`` up to this (k-means cost grows with lists x training points).
MAX_DEFAULT_NLIST = 1024
#: ivf-pq trains on at most this many vectors per list (a seeded random sample), and at least 10,000.
TRAIN_POINTS_PER_LIST = 64


@dataclass(frozen=True)
class IndexParams:
    """Build and search parameters of every kind (each kind reads only its own, see ``KIND_PARAMS``).

    ``nlist``, ``pq_m`` are chosen from the data when left ``None`` (``4·√n`` lists, at most ``n/39`` and
    1,024; 8 dimensions per sub-quantiser); the values used are what the manifest records. An ivf-pq index
    is trained on the first vectors added (a seeded sample of at most ``64·nlist`` of them).
    """

    kind: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int | None = None
    pq_m: int | None = None
    pq_bits: int = 8
    nprobe: int = 16
    rescore: str = "float"
    rescore_multiplier: int = 4

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"index kind {self.kind!r} is unknown; choose one of {', '.join(KINDS)}")
        if self.rescore not in RESCORE_MODES:
            raise ConfigError(f"rescore={self.rescore!r} is unknown; choose one of {', '.join(RESCORE_MODES)}")
        for name in ("hnsw_m", "ef_construction", "ef_search", "nlist", "pq_m", "pq_bits", "nprobe"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if not isinstance(self.rescore_multiplier, int) or self.rescore_multiplier < 1:
            raise ConfigError(f"rescore_multiplier={self.rescore_multiplier!r} must be a positive integer")
        if self.pq_bits > 16:
            raise ConfigError(f"pq_bits={self.pq_bits} must be at most 16")

    def to_dict(self) -> dict[str, Any]:
        """The kind and the parameters it uses."""
        data = asdict(self)
        return {"kind": self.kind, **{name: data[name] for name in KIND_PARAMS[self.kind]}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown index parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def of(cls, kind: str, **given: Any) -> IndexParams:
        """The parameters of a ``kind`` index built from keyword arguments (``Index.build(kind=..., hnsw_m=...)``):
        a name no kind reads is refused with the names this kind reads, and so is another kind's parameter, which
        would change nothing (``nlist=`` on a flat index)."""
        if kind not in KINDS:
            raise ConfigError(f"index kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")
        known = {f.name for f in fields(cls)} - {"kind"}
        reads = ", ".join(KIND_PARAMS[kind]) or "none"
        if unknown := sorted(set(given) - known):
            near = {name: difflib.get_close_matches(name, sorted(known), n=1) for name in unknown}
            said = "; ".join(f"{n!r}" + (f" (did you mean {m[0]!r}?)" if m else "") for n, m in near.items())
            raise ConfigError(f"unknown index parameter {said}; a {kind} index reads: {reads}")
        if unread := sorted(set(given) - set(KIND_PARAMS[kind])):
            kinds_of = {k: [other for other, names in KIND_PARAMS.items() if k in names] for k in unread}
            said = "; ".join(f"{k} is a parameter of {' and '.join(kinds_of[k])} indexes" for k in unread)
            raise ConfigError(f"{said}: a {kind} index does not read it (it reads: {reads})")
        return cls(kind=kind, **given)

    def with_search(self, **overrides: int | None) -> IndexParams:
        """A copy with query-time parameters changed (``None`` keeps the current value)."""
        unknown = sorted(set(overrides) - set(SEARCH_PARAMS))
        if unknown:
            raise ConfigError(f"{', '.join(unknown)} cannot change after the build; only {', '.join(SEARCH_PARAMS)}")
        if unread := sorted(k for k, v in overrides.items() if v is not None and k not in KIND_PARAMS[self.kind]):
            kinds_of = {k: [kind for kind, names in KIND_PARAMS.items() if k in names] for k in unread}
            said = "; ".join(f"{k} is a parameter of {' and '.join(kinds_of[k])} indexes" for k in unread)
            raise ConfigError(f"{said}: this index is {self.kind}, which does not read it")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def check_dim(self, dim: int) -> None:
        """Refuse parameters that cannot work for ``dim``-dimensional vectors (before any encoding)."""
        if self.kind == "binary" and dim % 8:
            raise ConfigError(f"kind='binary' needs a dimension that is a multiple of 8; this index has {dim}")
        if self.kind == "ivf-pq" and self.pq_m is not None and dim % self.pq_m:
            raise ConfigError(f"pq_m={self.pq_m} must divide the dimension {dim}")

    def resolved(self, n: int, dim: int) -> IndexParams:
        """Data-dependent defaults filled in for ``n`` training vectors of ``dim`` dimensions."""
        self.check_dim(dim)
        if self.kind != "ivf-pq":
            return self
        if n < 2:
            raise ConfigError(f"kind='ivf-pq' needs at least 2 documents to train on; got {n}")
        nlist = self.nlist or max(1, min(round(4 * math.sqrt(n)), n // MIN_POINTS_PER_LIST, MAX_DEFAULT_NLIST))
        if nlist > n:
            raise ConfigError(f"nlist={nlist} is more than the {n} documents to train on")
        pq_m = self.pq_m or _default_pq_m(dim)
        pq_bits = min(self.pq_bits, max(1, int(math.log2(n))))  # k-means needs 2^bits points at least
        return replace(self, nlist=nlist, pq_m=pq_m, pq_bits=pq_bits)


def _default_pq_m(dim: int) -> int:
    """8 dimensions per sub-quantiser where that divides ``dim``, else the nearest divisor below."""
    target = max(1, dim // 8)
    return next(m for m in range(target, 0, -1) if dim % m == 0)


def order_hits(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` per query: score descending, ties by row ascending, misses (row -1) last."""
    if rows.shape[1] < k:  # fewer candidates than asked: pad as FAISS does
        missing = k - rows.shape[1]
        rows = np.hstack([rows, np.full((len(rows), missing), -1, dtype=rows.dtype)])
        scores = np.hstack([scores, np.full((len(scores), missing), -np.inf, dtype=np.float32)])
    scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
    order = np.lexsort((np.where(rows < 0, np.iinfo(np.int64).max, rows), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _faiss_reason(exc: BaseException) -> str:
    """FAISS's own reason, without the C++ function signature and source location it starts with."""
    text = str(exc).strip()
    return text.rsplit("Error: ", 1)[-1].strip() or type(exc).__name__


_FAISS_READ = threading.Lock()  # FAISS's vector byte limit is the process's: one read sets it at a time


def read_faiss(path: Path, *, binary: bool = False) -> Any:
    """``faiss.read_index`` (or ``read_index_binary``), its errors turned into one that names the file. FAISS sizes
    each array it reads by the length the file declares and allocates (and zero-fills) it before reading: a
    109-byte file declaring 4 GiB took 4 GiB. No array of a file can be longer than the file, so the read is
    bounded by its size (FAISS's ``deserialization_vector_byte_limit``), and a longer claim is refused at once."""
    size = path.stat().st_size
    try:
        with _FAISS_READ:
            limit = faiss.get_deserialization_vector_byte_limit()
            faiss.set_deserialization_vector_byte_limit(max(size, 1))
            try:
                return faiss.read_index_binary(str(path)) if binary else faiss.read_index(str(path))
            finally:
                faiss.set_deserialization_vector_byte_limit(limit)
    except (RuntimeError, MemoryError) as exc:
        raise IndexFormatError(f"{path}: not a readable FAISS index ({_faiss_reason(exc)})") from exc


#: The float32 candidate vectors a binary index rescores at once (queries are rescored a block at a time).
RESCORE_BLOCK_BYTES = 64 * 2**20
#: Rows checked for finiteness at a time, so a memory-mapped array is never copied whole.
FINITE_BLOCK_ROWS = 65_536


def read_array(path: Path, *, dtype: str, shape: tuple[int, ...], mmap: bool = False) -> np.ndarray:
    """The one reader of an index's ``.npy`` files: the header is read first and the array refused, naming the
    file and the field, unless it is ``dtype``, C order, exactly ``shape`` and the file holds exactly those bytes;
    then ``np.load`` (never a pickle), and a float array must hold finite values only."""
    try:
        with path.open("rb") as handle:
            header = read_npy_header(handle, path.stat().st_size)
    except (ValueError, OSError, EOFError) as exc:
        raise IndexFormatError(f"{path}: not a readable NumPy array file ({exc})") from exc
    if header.dtype != np.dtype(dtype):
        raise IndexFormatError(f"{path}: dtype is {header.dtype}, expected {dtype}")
    if header.fortran:
        raise IndexFormatError(f"{path}: fortran_order is true; lmembed writes arrays in C order")
    if header.shape != shape:
        raise IndexFormatError(f"{path}: shape is {list(header.shape)}, expected {list(shape)}")
    if header.claimed_bytes != header.data_bytes:
        raise IndexFormatError(
            f"{path}: shape {list(shape)} of {dtype} does not match the file's size ({header.data_bytes} bytes of data)"
        )
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise IndexFormatError(f"{path}: not a readable NumPy array file ({exc})") from exc
    if array.dtype.kind == "f" and not all_finite(array):
        raise IndexFormatError(f"{path}: values: NaN or infinite values; the index cannot be trusted")
    return array


def all_finite(array: np.ndarray) -> bool:
    """Whether every value is finite, checked a block of rows at a time (a memory-mapped array stays on disk)."""
    return all(np.isfinite(array[i : i + FINITE_BLOCK_ROWS]).all() for i in range(0, len(array), FINITE_BLOCK_ROWS))


def _save_array(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as handle:
        np.save(handle, np.ascontiguousarray(array))
        handle.flush()
        os.fsync(handle.fileno())


class VectorIndex(ABC):
    """One kind's vectors: what :class:`~lmembed.index.index.Index` stores beside its documents."""

    def __init__(self, params: IndexParams, dim: int) -> None:
        self.params = params
        self.dim = dim

    @property
    @abstractmethod
    def ntotal(self) -> int:
        """Number of vectors held."""

    @abstractmethod
    def add(self, vectors: np.ndarray, *, own: bool = False) -> None:
        """Append vectors (rows get the next positions); they are L2-normalised here. ``own=True``: the caller gives
        the array away, and it is normalised in place (no copy of its size)."""

    @property
    def streams(self) -> bool:
        """Whether vectors added a part at a time make the index one call with all of them makes (a build then adds
        each encoded part as it comes, holding one part besides the index, not the whole corpus's vectors twice).
        Not so for a kind that fixes something from its first vectors (ivf-pq's training, int8 rescoring's ranges),
        nor for hnsw, whose graph FAISS builds one ``add`` at a time (added in parts, its results would depend on the
        build's chunk size)."""
        return True

    @abstractmethod
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)``, each ``(n_queries, k)``; rows ``-1`` (score ``-inf``) where fewer exist."""

    @abstractmethod
    def save(self, folder: Path, stem: str) -> dict[str, str]:
        """Write this index's files into ``folder``, named from ``stem``; return ``{role: file name}``."""

    @classmethod
    @abstractmethod
    def load(cls, folder: Path, files: dict[str, str], params: IndexParams, dim: int) -> VectorIndex:
        """Read back what :meth:`save` wrote."""

    @abstractmethod
    def memory_bytes(self) -> int:
        """Bytes this kind keeps in memory for search (memory-mapped rescoring vectors not counted)."""

    def _check(self, vectors: np.ndarray, own: bool = False) -> np.ndarray:
        # given away, an array is scaled in place only when it owns its memory: a view's rows are someone else's
        out = unit_rows(vectors, in_place=own and isinstance(vectors, np.ndarray) and vectors.flags.owndata)
        if out.shape[1] != self.dim:
            raise ValueError(f"vectors have {out.shape[1]} dimensions; this index holds {self.dim}")
        return out


class FaissIndex(VectorIndex):
    """``flat``, ``hnsw`` and ``ivf-pq``: one FAISS float index with inner-product metric."""

    def __init__(self, params: IndexParams, dim: int, index: faiss.Index | None = None) -> None:
        super().__init__(params, dim)
        self.index = index

    def _create(self, n_train: int) -> faiss.Index:
        p = self.params = self.params.resolved(n_train, self.dim)
        spec = {
            "flat": "Flat",
            "hnsw": f"HNSW{p.hnsw_m},Flat",
            "ivf-pq": f"IVF{p.nlist},PQ{p.pq_m}x{p.pq_bits}",
        }[p.kind]
        index = faiss.index_factory(self.dim, spec, faiss.METRIC_INNER_PRODUCT)
        if p.kind == "hnsw":
            faiss.downcast_index(index).hnsw.efConstruction = p.ef_construction
        if p.kind == "ivf-pq":  # polysemous codes only speed up Hamming pre-filtering, which is not used here
            faiss.downcast_index(faiss.extract_index_ivf(index)).do_polysemous_training = False
        return index

    @property
    def ntotal(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    @property
    def streams(self) -> bool:  # FAISS builds an HNSW graph one add() at a time: in parts, another graph
        return self.params.kind == "flat"

    def add(self, vectors: np.ndarray, *, own: bool = False) -> None:
        x = self._check(vectors, own)
        if len(x) == 0:
            return
        if self.index is None:
            self.index = self._create(len(x))
        if not self.index.is_trained:
            self.index.train(self._training_sample(x))
        self.index.add(x)

    def _training_sample(self, x: np.ndarray) -> np.ndarray:
        limit = max(TRAIN_POINTS_PER_LIST * (self.params.nlist or 1), 10_000)
        if len(x) <= limit:
            return x
        return x[np.sort(np.random.default_rng(0).choice(len(x), size=limit, replace=False))]

    def _search_params(self, k: int) -> faiss.SearchParameters | None:
        """Per-call parameters (so concurrent searches with different settings do not interfere)."""
        if self.params.kind == "hnsw":  # the beam must hold at least k candidates
            return faiss.SearchParametersHNSW(efSearch=max(self.params.ef_search, k))
        if self.params.kind == "ivf-pq":
            return faiss.SearchParametersIVF(nprobe=self.params.nprobe)
        return None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._check(queries)
        if self.ntotal == 0 or len(q) == 0:
            return np.full((len(q), k), -np.inf, np.float32), np.full((len(q), k), -1, np.int64)
        params = self._search_params(k)
        scores, rows = self.index.search(q, k, params=params) if params is not None else self.index.search(q, k)
        return order_hits(scores, rows, k)

    def save(self, folder: Path, stem: str) -> dict[str, str]:
        if self.index is None:  # nothing added yet (an ivf-pq index cannot exist before its training data)
            return {}
        name = f"{stem}.faiss"
        faiss.write_index(self.index, str(folder / name))
        _fsync(folder / name)
        return {"vectors": name}

    @classmethod
    def load(cls, folder: Path, files: dict[str, str], params: IndexParams, dim: int) -> FaissIndex:
        if "vectors" not in files:
            return cls(params, dim)
        path = folder / files["vectors"]
        index = read_faiss(path)
        expected = FAISS_CLASSES[params.kind]
        if type(index) is not expected:
            raise IndexFormatError(
                f"{path}: holds {type(index).__name__}; the manifest's kind {params.kind} "
                f"is stored as {expected.__name__}"
            )
        if index.d != dim:
            raise IndexFormatError(f"{path}: d is {index.d}; the manifest's dim is {dim}")
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexFormatError(f"{path}: metric_type is {index.metric_type}, not inner product")
        if not all(all_finite(part) for part in _stored_floats(index)):
            raise IndexFormatError(f"{path}: vectors: NaN or infinite values; the index cannot be trusted")
        return cls(params, dim, index)

    def memory_bytes(self) -> int:
        """Approximate: the vectors or codes, plus the graph links or the list ids and centroids."""
        n, d, p = self.ntotal, self.dim, self.params
        if p.kind == "flat":
            return n * d * 4
        if p.kind == "hnsw":
            return n * d * 4 + n * p.hnsw_m * 2 * 4
        return n * (p.pq_m or 1) * p.pq_bits // 8 + n * 8 + (p.nlist or 0) * d * 4


#: The FAISS class each float kind writes (``faiss.read_index`` returns it downcast).
FAISS_CLASSES: dict[str, type] = {
    "flat": faiss.IndexFlatIP,
    "hnsw": faiss.IndexHNSWFlat,
    "ivf-pq": faiss.IndexIVFPQ,
}


def _stored_floats(index: Any) -> list[np.ndarray]:
    """The float arrays a FAISS index of one of :data:`FAISS_CLASSES` keeps and scores with, as views: the vectors
    of a flat or HNSW index, the coarse centroids and product-quantiser centroids of an IVF-PQ one."""
    if isinstance(index, faiss.IndexHNSWFlat):
        index = faiss.downcast_index(index.storage)
    if isinstance(index, faiss.IndexFlat):
        if index.ntotal == 0:
            return []
        return [faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(-1, max(index.d, 1))]
    if isinstance(index, faiss.IndexIVFPQ):
        quantizer = faiss.downcast_index(index.quantizer)
        return [*_stored_floats(quantizer), faiss.vector_to_array(index.pq.centroids)]
    return []


class BinaryIndex(VectorIndex):
    """``binary``: sign bits searched by Hamming distance, candidates rescored (see the module doc)."""

    def __init__(
        self,
        params: IndexParams,
        dim: int,
        codes: faiss.IndexBinary | None = None,
        rescore_vectors: np.ndarray | None = None,
        ranges: np.ndarray | None = None,
    ) -> None:
        super().__init__(params.resolved(0, dim), dim)
        self.codes = codes if codes is not None else faiss.IndexBinaryFlat(dim)
        empty = np.empty((0, dim), dtype=np.int8 if params.rescore == "int8" else np.float32)
        self.rescore_vectors = rescore_vectors if rescore_vectors is not None else empty
        self.ranges = ranges  # int8 rescoring: per-dimension (low, high), fixed by the first vectors added

    @property
    def ntotal(self) -> int:
        return int(self.codes.ntotal)

    @property
    def streams(self) -> bool:  # rescoring keeps every float (or int8) vector: added once, they are not copied again
        return self.params.rescore == "none"

    def add(self, vectors: np.ndarray, *, own: bool = False) -> None:
        x = self._check(vectors, own)
        if len(x) == 0:
            return
        self.codes.add(np.packbits(x > 0, axis=1))
        if self.params.rescore == "none":
            return
        if self.params.rescore == "int8":
            if self.ranges is None:
                self.ranges = np.stack([x.min(axis=0), x.max(axis=0)]).astype(np.float32)
            x = self._quantize(x)
        held = np.asarray(self.rescore_vectors)
        self.rescore_vectors = x if len(held) == 0 else np.concatenate([held, x])  # x is this index's own

    def _quantize(self, x: np.ndarray) -> np.ndarray:
        low, high = self.ranges
        step = np.maximum(high - low, 1e-12) / 255.0
        return (np.clip(np.rint((x - low) / step), 0, 255) - 128).astype(np.int8)

    def _dequantize(self, codes: np.ndarray) -> np.ndarray:
        low, high = self.ranges
        step = np.maximum(high - low, 1e-12) / 255.0
        return (codes.astype(np.float32) + 128) * step + low

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._check(queries)
        if self.ntotal == 0 or len(q) == 0:
            return np.full((len(q), k), -np.inf, np.float32), np.full((len(q), k), -1, np.int64)
        wanted = k if self.params.rescore == "none" else k * self.params.rescore_multiplier
        hamming, rows = self.codes.search(np.packbits(q > 0, axis=1), min(wanted, self.ntotal))
        if self.params.rescore == "none":
            return order_hits(1.0 - 2.0 * hamming.astype(np.float32) / self.dim, rows, k)
        # rescored a block of queries at a time: every query's candidates at once were queries x k x multiplier
        # full vectors, gigabytes for a thousand queries at k=1000, whatever the corpus
        per_query = rows.shape[1] * self.dim * 4
        block = max(1, RESCORE_BLOCK_BYTES // max(per_query, 1))
        scores = np.empty(rows.shape, dtype=np.float32)
        for start in range(0, len(q), block):
            part = rows[start : start + block]
            candidates = np.asarray(self.rescore_vectors[np.maximum(part, 0).ravel()])
            if self.params.rescore == "int8":
                candidates = self._dequantize(candidates)
            candidates = candidates.reshape(len(part), part.shape[1], self.dim)
            scores[start : start + block] = np.einsum("qd,qcd->qc", q[start : start + block], candidates)
        return order_hits(scores, rows, k)

    def save(self, folder: Path, stem: str) -> dict[str, str]:
        files = {"codes": f"{stem}.bfaiss"}
        faiss.write_index_binary(self.codes, str(folder / files["codes"]))
        _fsync(folder / files["codes"])
        if self.params.rescore != "none":
            files["rescore"] = f"{stem}.rescore.npy"
            _save_array(folder / files["rescore"], np.asarray(self.rescore_vectors))
        if self.ranges is not None:
            files["ranges"] = f"{stem}.ranges.npy"
            _save_array(folder / files["ranges"], self.ranges)
        return files

    @classmethod
    def load(cls, folder: Path, files: dict[str, str], params: IndexParams, dim: int) -> BinaryIndex:
        if "codes" not in files:
            raise IndexFormatError(
                f"{folder}: the manifest's files.codes is missing; kind binary keeps its codes in it"
            )
        codes = read_faiss(folder / files["codes"], binary=True)
        if type(codes) is not faiss.IndexBinaryFlat:
            raise IndexFormatError(
                f"{folder / files['codes']}: holds {type(codes).__name__}; kind binary is stored as IndexBinaryFlat"
            )
        if codes.d != dim:
            raise IndexFormatError(f"{folder / files['codes']}: d is {codes.d}; the manifest's dim is {dim}")
        n = int(codes.ntotal)
        for role, wanted in (("rescore", params.rescore != "none"), ("ranges", params.rescore == "int8" and n > 0)):
            if wanted and role not in files:
                raise IndexFormatError(
                    f"{folder}: the manifest's files.{role} is missing; rescore={params.rescore} needs that file"
                )
        rescore = ranges = None
        if params.rescore != "none":
            dtype = "int8" if params.rescore == "int8" else "float32"
            rescore = read_array(folder / files["rescore"], dtype=dtype, shape=(n, dim), mmap=True)
        if params.rescore == "int8" and "ranges" in files:
            ranges = read_array(folder / files["ranges"], dtype="float32", shape=(2, dim))
        return cls(params, dim, codes, rescore, ranges)

    def memory_bytes(self) -> int:
        in_memory = 0 if isinstance(self.rescore_vectors, np.memmap) else self.rescore_vectors.nbytes
        return self.ntotal * self.dim // 8 + in_memory


def create(params: IndexParams, dim: int) -> VectorIndex:
    """An empty index of ``params.kind`` for ``dim``-dimensional vectors."""
    return BinaryIndex(params, dim) if params.kind == "binary" else FaissIndex(params, dim)


def load(folder: Path, files: dict[str, str], params: IndexParams, dim: int) -> VectorIndex:
    """Read an index of ``params.kind`` from the files its manifest names."""
    cls = BinaryIndex if params.kind == "binary" else FaissIndex
    return cls.load(folder, files, params, dim)
