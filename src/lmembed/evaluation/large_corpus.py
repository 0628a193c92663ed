"""Retrieval over corpora whose embeddings do not fit in memory: memory-mapped matrices, chunked top-k.

A corpus embedding matrix may be a read-only memory map of an ``.npy`` file (what a sharded job of
:mod:`lmembed.scale` writes into the embedding cache), stored as float32 or float16. Nothing here reads
it whole: both search methods walk the corpus in chunks (each converted to float32 and, for cosine,
normalised) and keep a running top-k, so memory holds one chunk, the queries and ``queries × top_k``
candidates, whatever the corpus size.

* ``method="exact"``: :func:`lmembed.evaluation.search.exact_search` over the memory map. By default it
  cuts the corpus exactly as the in-memory path does (chunks of ``2**24 / min(queries, 1024)`` rows: 16,384
  rows from 1,024 queries up), so its scores are the in-memory path's, bit for bit, with float32
  storage (BLAS results depend on the shape of each product, so any other chunking moves scores in
  the last bit). ``chunk_bytes`` caps the chunk instead, for few queries and wide vectors: scores
  then agree to float32 rounding (about 1e-7).
* ``method="faiss"``: FAISS's exact inner-product kernel (``faiss.knn``) per chunk, the chunks' top-k
  merged with the same order (score descending, then corpus row ascending). Scores agree with the
  exact path to float32 rounding; candidates tied at the cut-off may differ.

float16 storage halves the disk and the reads, and rounds every component to 11 significant bits:
scores move by about 1e-3, enough to swap near-ties. :func:`storage_of` describes what was used, and
retrieval results record it (``extra["corpus_embeddings"]``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from lmembed.errors import ConfigError
from lmembed.evaluation.search import SearchResult, Similarity, exact_search
from lmembed.pooling.normalize import unit_rows

SearchMethod = Literal["exact", "faiss"]
SEARCH_METHODS = ("exact", "faiss")
#: Largest float32 corpus chunk scored at once by ``method="faiss"``.
DEFAULT_CHUNK_BYTES = 256 << 20
STORAGE_DTYPES = (np.float32, np.float16)


def is_memory_mapped(array: Any) -> bool:
    """True when ``array`` (or the array it views) is a ``numpy.memmap``."""
    while array is not None:
        if isinstance(array, np.memmap):
            return True
        array = getattr(array, "base", None)
    return False


def _file_of(array: Any) -> str | None:
    while array is not None:
        name = getattr(array, "filename", None)
        if name:
            return str(name)
        array = getattr(array, "base", None)
    return None


def is_large_corpus(array: Any) -> bool:
    """True for corpus embeddings this module should search: memory-mapped, or stored as float16."""
    return is_memory_mapped(array) or getattr(array, "dtype", None) == np.float16


def storage_of(array: Any) -> dict[str, Any]:
    """How a corpus matrix is stored, for results: dtype, memory-mapped or not, and its file."""
    return {
        "dtype": str(np.dtype(array.dtype)),
        "memory_mapped": is_memory_mapped(array),
        "file": _file_of(array),
        "shape": [int(n) for n in array.shape],
    }


def corpus_matrix(array: Any, rows: int, what: str = "corpus embeddings") -> np.ndarray:
    """Check a corpus matrix (2-D, one row per document) without copying it when it is a float32 or
    float16 array or memory map; anything else becomes a float32 array."""
    if isinstance(array, np.ndarray) and array.dtype in STORAGE_DTYPES:
        matrix = array
    else:
        matrix = np.asarray(array, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != rows:
        raise ValueError(f"{what}: expected a ({rows}, dim) matrix, got shape {matrix.shape}")
    return matrix


def chunk_rows(dim: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Corpus rows per chunk so that one float32 chunk stays within ``chunk_bytes``."""
    return max(1, chunk_bytes // (4 * max(1, dim)))


def _merge(
    scores: np.ndarray, index: np.ndarray, more_scores: np.ndarray, more_index: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of two candidate lists per query: score descending, then corpus row ascending."""
    all_scores = np.hstack([scores, more_scores])
    all_index = np.hstack([index, more_index])
    order = np.lexsort((all_index, -all_scores), axis=-1)[:, :k]
    return np.take_along_axis(all_scores, order, 1), np.take_along_axis(all_index, order, 1)


def _faiss_search(
    queries: np.ndarray,
    corpus: np.ndarray,
    top_k: int,
    similarity: Similarity,
    exclude: np.ndarray | None,
    rows_per_chunk: int,
) -> SearchResult:
    import faiss  # lazy: FAISS is only needed for this method, and evaluation imports without it

    q = unit_rows(queries) if similarity == "cosine" else np.ascontiguousarray(queries, dtype=np.float32)
    n_q, k = len(q), min(top_k, len(corpus))
    want = min(k + (1 if exclude is not None else 0), len(corpus))
    best_scores = np.full((n_q, 0), -np.inf, dtype=np.float32)
    best_index = np.full((n_q, 0), -1, dtype=np.int64)
    for start in range(0, len(corpus), rows_per_chunk):
        chunk = corpus[start : start + rows_per_chunk]
        docs = unit_rows(chunk) if similarity == "cosine" else np.ascontiguousarray(chunk, dtype=np.float32)
        scores, index = faiss.knn(q, docs, min(want, len(docs)), metric=faiss.METRIC_INNER_PRODUCT)
        index = np.where(index >= 0, index + start, -1)
        scores = np.where(index >= 0, scores, -np.inf).astype(np.float32)
        best_scores, best_index = _merge(best_scores, best_index, scores, index, want)
    if exclude is not None:
        dropped = best_index == np.asarray(exclude, dtype=np.int64)[:, None]
        best_scores = np.where(dropped, -np.inf, best_scores).astype(np.float32)
        best_index = np.where(dropped, -1, best_index)
        best_scores, best_index = _merge(best_scores, best_index, best_scores[:, :0], best_index[:, :0], k)
    best_scores, best_index = best_scores[:, :k], best_index[:, :k]
    missing = top_k - best_scores.shape[1]
    if missing > 0:
        best_scores = np.hstack([best_scores, np.full((n_q, missing), -np.inf, dtype=np.float32)])
        best_index = np.hstack([best_index, np.full((n_q, missing), -1, dtype=np.int64)])
    return SearchResult(indices=best_index, scores=best_scores.astype(np.float32, copy=False))


def search_corpus(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    *,
    top_k: int = 1000,
    similarity: Similarity = "cosine",
    exclude: np.ndarray | None = None,
    method: SearchMethod = "exact",
    chunk_bytes: int | None = None,
) -> SearchResult:
    """Top-``top_k`` of every query over a corpus matrix that may be memory-mapped and float16 (see the
    module doc). ``exclude``: per query, one corpus row to leave out before the top-k (``-1`` for none).
    ``chunk_bytes``: the largest float32 chunk (default: the in-memory path's chunking for ``exact``,
    :data:`DEFAULT_CHUNK_BYTES` for ``faiss``)."""
    if method not in SEARCH_METHODS:
        raise ConfigError(f"unknown search method {method!r}; use one of {', '.join(SEARCH_METHODS)}")
    queries = np.asarray(query_embeddings, dtype=np.float32)
    if queries.ndim != 2 or corpus_embeddings.ndim != 2 or queries.shape[1] != corpus_embeddings.shape[1]:
        raise ValueError(f"shapes do not match: queries {queries.shape}, corpus {corpus_embeddings.shape}")
    dim = corpus_embeddings.shape[1]
    if method == "faiss":
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} must be at least 1")
        rows_per_chunk = chunk_rows(dim, chunk_bytes or DEFAULT_CHUNK_BYTES)
        return _faiss_search(queries, corpus_embeddings, top_k, similarity, exclude, rows_per_chunk)
    chunk_size = None if chunk_bytes is None else chunk_rows(dim, chunk_bytes)
    return exact_search(
        queries, corpus_embeddings, top_k=top_k, similarity=similarity, exclude=exclude, chunk_size=chunk_size
    )
