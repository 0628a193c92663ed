"""Chunk -> document rows of an index whose vectors are chunks of long documents (:mod:`lmembed.encoding.chunking`).

Vector row ``i`` is a chunk of document row ``doc_rows[i]`` (non-decreasing: a document's chunks are consecutive).
A search runs over chunks and returns documents, each scored by its best chunk (MaxP); since a document's best
chunk is the first of its chunks in a ranked list, collapsing keeps each document's first hit. The search asks for
:data:`OVERFETCH` times ``k`` chunks, which usually hold ``k`` distinct documents; a query whose chunks do not
(one long document filling the window with its own chunks) is searched again ``WIDEN`` times deeper, until it has
``k`` documents or every chunk was fetched.

On disk: ``{stem}.chunks.npy``, an int64 array, listed in the manifest's files (so its sha256 is checked).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lmembed.index.errors import IndexFormatError
from lmembed.index.integrity import remedy
from lmembed.index.kinds import read_array
from lmembed.io import read_npy_header

#: Chunks fetched per document wanted.
OVERFETCH = 8
#: How much deeper a query that found fewer than ``k`` documents is searched again.
WIDEN = 4
#: The dtype of the document rows, in memory and on disk (a file of another dtype is refused).
DTYPE = "int64"


class ChunkMap:
    """Which document row each chunk vector belongs to."""

    def __init__(self, doc_rows: np.ndarray) -> None:
        self.doc_rows = np.asarray(doc_rows, dtype=DTYPE)
        if self.doc_rows.ndim != 1 or np.any(np.diff(self.doc_rows) < 0):
            raise IndexFormatError("chunk document rows must be a non-decreasing 1-D array")

    def __len__(self) -> int:
        return len(self.doc_rows)

    def extend(self, doc_rows: np.ndarray) -> None:
        self.doc_rows = np.concatenate([self.doc_rows, np.asarray(doc_rows, dtype=DTYPE)])

    def check(self, vectors: int, documents: int, where: str) -> None:
        """Refuse a map that does not cover ``vectors`` chunks of ``documents`` documents, each with a chunk."""
        covered = len(np.unique(self.doc_rows)) == documents and (not documents or self.doc_rows[-1] == documents - 1)
        if len(self) != vectors or not covered:
            raise IndexFormatError(
                f"{where}: the chunk map holds {len(self)} chunks of {len(np.unique(self.doc_rows))} documents, "
                f"the index {vectors} vectors of {documents} documents"
            )

    def depth(self, k: int) -> int:
        """How many chunks to fetch for ``k`` documents."""
        return max(1, min(len(self), k * OVERFETCH))

    def search(
        self, search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]], vectors: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best documents of each query vector, ``search(vectors, depth)`` ranking chunks; a query that
        found fewer than ``k`` documents (of those there are) is searched again deeper (see the module doc)."""
        depth = self.depth(k)
        scores, rows = self.collapse(*search(vectors, depth), k)
        wanted = min(k, int(self.doc_rows[-1]) + 1 if len(self) else 0)
        while depth < len(self):
            short = np.flatnonzero((rows >= 0).sum(axis=1) < wanted)
            if not len(short):
                break
            depth = min(len(self), depth * WIDEN)
            scores[short], rows[short] = self.collapse(*search(vectors[short], depth), k)
        return scores, rows

    def collapse(self, scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Ranked chunk hits ``(scores, rows)`` to the ``k`` best documents, each at its best chunk's score;
        missing places are row ``-1``, score ``-inf``."""
        out_scores = np.full((len(rows), k), -np.inf, dtype=np.float32)
        out_rows = np.full((len(rows), k), -1, dtype=np.int64)
        for q, (score_row, chunk_row) in enumerate(zip(scores, rows, strict=True)):
            seen: set[int] = set()
            for score, chunk in zip(score_row.tolist(), chunk_row.tolist(), strict=True):
                if chunk < 0 or len(seen) == k:
                    break
                doc = int(self.doc_rows[chunk])
                if doc not in seen:
                    out_scores[q, len(seen)], out_rows[q, len(seen)] = score, doc
                    seen.add(doc)
        return out_scores, out_rows

    def save(self, folder: Path, stem: str) -> dict[str, str]:
        name = f"{stem}.chunks.npy"
        with (folder / name).open("wb") as handle:
            np.save(handle, self.doc_rows, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        return {"chunks": name}

    @classmethod
    def load(cls, path: Path) -> ChunkMap:
        """The chunk map at ``path``, read through the index's one ``.npy`` reader
        (:func:`lmembed.index.kinds.read_array`): the header must claim a 1-D array of :data:`DTYPE` that fills the
        file exactly, checked before anything is allocated; the rows must then be document rows (0 or more, never
        going back). The length is the header's own: :meth:`check` holds it to the index's vectors. A refusal names
        the file and the field, and says what to do (rebuild, or restore the previous generation)."""
        try:
            return cls(_read_rows(path))
        except IndexFormatError as exc:
            raise IndexFormatError(f"{exc}; {remedy(path.parent)}") from exc


def _read_rows(path: Path) -> np.ndarray:
    try:
        with path.open("rb") as handle:
            shape = read_npy_header(handle, path.stat().st_size).shape
    except (OSError, ValueError, EOFError) as exc:
        raise IndexFormatError(f"{path}: not a readable NumPy array file ({exc})") from exc
    if len(shape) != 1:
        raise IndexFormatError(f"{path}: shape is {list(shape)}; a chunk map is 1-D (one document row per chunk)")
    rows = read_array(path, dtype=DTYPE, shape=shape)  # dtype, order and the file's size, before np.load
    if len(rows) and rows[0] < 0:
        raise IndexFormatError(f"{path}: values: {int(rows[0])} is not a document row (rows start at 0)")
    if np.any(np.diff(rows) < 0):
        raise IndexFormatError(f"{path}: values: the document rows go back (a document's chunks are consecutive)")
    return rows
