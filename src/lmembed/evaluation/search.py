"""Exact (brute-force) nearest-neighbour search with a bounded memory footprint.

The corpus is scored in chunks; after each chunk only the best ``top_k`` candidates per query are
kept, so the full query × corpus score matrix never exists. Queries are processed in blocks for
the same reason. Scores are float32 throughout.

Ranking within a query is by descending score, ties broken by ascending corpus position, so the
result does not depend on the chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lmembed.errors import ConfigError
from lmembed.pooling.normalize import unit_rows

Similarity = Literal["cosine", "dot"]
Backend = Literal["numpy", "torch"]

#: Upper bound on the float32 values held for one (query block, corpus chunk) pair: its scores, and the chunk's
#: normalised copy (with few queries the scores alone allowed a chunk of millions of rows, copied whole).
DEFAULT_MAX_BLOCK_ELEMENTS = 1 << 24  # 64 MiB of float32 per block


@dataclass
class SearchResult:
    """Top-k hits per query.

    ``indices[i, j]`` is the corpus row of query ``i``'s ``j``-th best hit and ``scores[i, j]``
    its similarity. Rows with fewer than ``top_k`` hits are padded with index ``-1`` and score
    ``-inf``.
    """

    indices: np.ndarray  # (n_queries, k) int64
    scores: np.ndarray  # (n_queries, k) float32

    def hits(self, query: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices and scores of one query's real hits (padding removed)."""
        keep = self.indices[query] >= 0
        return self.indices[query][keep], self.scores[query][keep]

    def ids(self, corpus_ids: Sequence[str]) -> list[list[str]]:
        """Ranked document ids per query."""
        return [[corpus_ids[j] for j in self.hits(i)[0]] for i in range(len(self.indices))]

    def to_run(self, query_ids: Sequence[str], corpus_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """The hits as a TREC-style run ``{query id: {doc id: score}}`` (what pytrec_eval reads)."""
        if len(query_ids) != len(self.indices):
            raise ValueError(f"{len(query_ids)} query ids for {len(self.indices)} result rows")
        ids = np.asarray(corpus_ids, dtype=object)
        run: dict[str, dict[str, float]] = {}
        for i, query_id in enumerate(query_ids):
            idx, sc = self.hits(i)
            run[query_id] = dict(zip(ids[idx].tolist(), sc.tolist(), strict=True))
        return run


def _as_matrix(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {x.shape}")
    return x


def identical_id_positions(query_ids: Sequence[str], corpus_ids: Sequence[str]) -> np.ndarray:
    """For each query, the corpus row with the same id, or -1."""
    position = {doc_id: j for j, doc_id in enumerate(corpus_ids)}
    return np.array([position.get(q, -1) for q in query_ids], dtype=np.int64)


def _chunk_scores(queries: np.ndarray, docs: np.ndarray, similarity: Similarity, backend: Backend) -> np.ndarray:
    """Similarity of a query block to a corpus chunk, as a float32 numpy array."""
    docs = unit_rows(docs) if similarity == "cosine" else np.asarray(docs, dtype=np.float32)
    if backend == "torch":
        import torch  # lazy: evaluation runs without torch unless this backend is chosen

        scores = (torch.from_numpy(queries) @ torch.from_numpy(np.ascontiguousarray(docs)).T).numpy()
    else:
        scores = queries @ docs.T
    if np.isnan(scores).any():  # MTEB turns NaN similarities into -1
        scores[np.isnan(scores)] = -1.0
    return scores


def _top_candidates(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the ``k`` best columns per row (unordered), with their corpus indices.

    Ties at the cut-off are resolved in favour of the smaller corpus index, so the kept set is
    the same however the corpus was chunked.
    """
    if scores.shape[1] <= k:
        return scores, index
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top_scores = np.take_along_axis(scores, part, 1)
    top_index = np.take_along_axis(index, part, 1)
    kth = top_scores.min(axis=1)
    crowded = np.flatnonzero((scores >= kth[:, None]).sum(axis=1) > k)
    for row in crowded:  # more candidates tie with the k-th score than there is room for
        above = np.flatnonzero(scores[row] > kth[row])
        tied = np.flatnonzero(scores[row] == kth[row])
        tied = tied[np.argsort(index[row, tied], kind="stable")[: k - len(above)]]
        chosen = np.concatenate([above, tied])
        top_scores[row] = scores[row, chosen]
        top_index[row] = index[row, chosen]
    return top_scores, top_index


def _sort_rows(scores: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order each row by score descending, then corpus index ascending."""
    order = np.argsort(-scores, axis=1)
    scores = np.take_along_axis(scores, order, 1)
    index = np.take_along_axis(index, order, 1)
    tied_rows = np.flatnonzero((scores[:, 1:] == scores[:, :-1]).any(axis=1))
    if len(tied_rows):  # only rows with equal scores need the secondary key
        fix = np.lexsort((index[tied_rows], -scores[tied_rows]), axis=1)
        scores[tied_rows] = np.take_along_axis(scores[tied_rows], fix, 1)
        index[tied_rows] = np.take_along_axis(index[tied_rows], fix, 1)
    return scores, index


def _search_block(
    queries: np.ndarray,
    corpus: np.ndarray,
    top_k: int,
    chunk_size: int,
    similarity: Similarity,
    backend: Backend,
    exclude: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Running top-k of one query block over the whole corpus, in corpus chunks."""
    n_q = len(queries)
    best_scores = np.empty((n_q, 0), dtype=np.float32)
    best_index = np.empty((n_q, 0), dtype=np.int64)
    rows = np.arange(n_q)
    for start in range(0, len(corpus), chunk_size):
        stop = min(start + chunk_size, len(corpus))
        scores = _chunk_scores(queries, corpus[start:stop], similarity, backend)
        if exclude is not None:
            hit = (exclude >= start) & (exclude < stop)
            scores[rows[hit], exclude[hit] - start] = -np.inf
        index = np.broadcast_to(np.arange(start, stop, dtype=np.int64), scores.shape)
        chunk_scores, chunk_index = _top_candidates(scores, index, top_k)
        best_scores, best_index = _top_candidates(
            np.hstack([best_scores, chunk_scores]), np.hstack([best_index, chunk_index]), top_k
        )
    best_scores, best_index = _sort_rows(best_scores, best_index)
    if exclude is not None:
        dropped = best_index == exclude[:, None]
        best_index = np.where(dropped, -1, best_index)
    return best_scores, best_index


def _pad(scores: np.ndarray, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    missing = k - scores.shape[1]
    if missing <= 0:
        return scores, index
    n = len(scores)
    return (
        np.hstack([scores, np.full((n, missing), -np.inf, dtype=np.float32)]),
        np.hstack([index, np.full((n, missing), -1, dtype=np.int64)]),
    )


def exact_search(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    *,
    top_k: int = 1000,
    similarity: Similarity = "cosine",
    chunk_size: int | None = None,
    query_batch_size: int = 1024,
    exclude: np.ndarray | None = None,
    backend: Backend = "numpy",
    max_block_elements: int = DEFAULT_MAX_BLOCK_ELEMENTS,
) -> SearchResult:
    """Exact top-``top_k`` search of every query against the corpus.

    ``similarity`` is ``"cosine"`` (rows L2-normalised first) or ``"dot"``. ``chunk_size`` is the
    number of corpus rows scored at once; by default it is chosen so a query block's score matrix
    stays under ``max_block_elements`` floats. ``exclude`` optionally gives, per query, one corpus
    row to leave out *before* the top-k is taken (``-1`` for none); see
    :func:`identical_id_positions`. Excluded rows never appear, so those queries still get
    ``top_k`` hits when the corpus is large enough.
    """
    queries = _as_matrix(np.asarray(query_embeddings), "query_embeddings")
    corpus = _as_matrix(np.asarray(corpus_embeddings), "corpus_embeddings")
    if queries.shape[1] != corpus.shape[1]:
        raise ValueError(f"dimension mismatch: queries {queries.shape[1]}, corpus {corpus.shape[1]}")
    if top_k < 1:
        raise ConfigError(f"top_k={top_k} must be at least 1")
    if similarity not in ("cosine", "dot"):
        raise ConfigError(f"unknown similarity {similarity!r}; use 'cosine' or 'dot'")
    if exclude is not None and len(exclude) != len(queries):
        raise ValueError("exclude must hold one entry per query")
    k = min(top_k, len(corpus))
    block = max(1, min(query_batch_size, len(queries)))
    if chunk_size is None:  # bounded by the scores of a block and by the chunk's own float32 copy (normalised)
        chunk_size = max(1024, min(max_block_elements // block, max_block_elements // corpus.shape[1]))
    all_scores, all_index = [], []
    for start in range(0, len(queries), block):
        q = queries[start : start + block]
        q = unit_rows(q) if similarity == "cosine" else np.ascontiguousarray(q, dtype=np.float32)
        ex = None if exclude is None else np.asarray(exclude[start : start + block], dtype=np.int64)
        s, i = _search_block(q, corpus, k, chunk_size, similarity, backend, ex)
        all_scores.append(s)
        all_index.append(i)
    if not all_scores:
        return SearchResult(np.empty((0, k), np.int64), np.empty((0, k), np.float32))
    scores, index = _pad(np.vstack(all_scores), np.vstack(all_index), top_k)
    return SearchResult(indices=index, scores=scores.astype(np.float32, copy=False))


def search(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    query_ids: Sequence[str],
    corpus_ids: Sequence[str],
    *,
    top_k: int = 1000,
    similarity: Similarity = "cosine",
    ignore_identical_ids: bool = False,
    chunk_size: int | None = None,
    backend: Backend = "numpy",
) -> dict[str, dict[str, float]]:
    """Search and return a run ``{query id: {doc id: score}}``.

    With ``ignore_identical_ids`` a document whose id equals the query id is removed before the
    top-k is taken, so each query still gets ``top_k`` other documents.
    """
    if len(query_ids) != len(query_embeddings) or len(corpus_ids) != len(corpus_embeddings):
        raise ValueError("ids and embedding rows must correspond one to one")
    exclude = identical_id_positions(query_ids, corpus_ids) if ignore_identical_ids else None
    result = exact_search(
        query_embeddings,
        corpus_embeddings,
        top_k=top_k,
        similarity=similarity,
        chunk_size=chunk_size,
        exclude=exclude,
        backend=backend,
    )
    return result.to_run(query_ids, corpus_ids)
