"""Reranking search results: a first stage (dense, BM25 or hybrid) finds candidates, a
:class:`~lmembed.rerank.Reranker` reads each query with each candidate's text and reorders them."""

from __future__ import annotations

from collections.abc import Sequence

from lmembed.index.index import Hit
from lmembed.rerank.base import Reranker


def rerank_hits(
    reranker: Reranker, queries: Sequence[str], results: Sequence[Sequence[Hit]], k: int
) -> list[list[Hit]]:
    """Each query's hits reordered by the reranker's score (ties keep the first stage's order), the ``k`` best,
    with that score and new ranks. All pairs go to the reranker at once, so passes fill across queries."""
    if len(queries) != len(results):
        raise ValueError(f"{len(queries)} queries for {len(results)} result lists")
    pairs = [(query, hit.text) for query, hits in zip(queries, results, strict=True) for hit in hits]
    scores = reranker.score_pairs(pairs).tolist() if pairs else []
    reranked, start = [], 0
    for hits in results:
        mine = scores[start : start + len(hits)]
        start += len(hits)
        order = sorted(range(len(hits)), key=lambda i: (-mine[i], i))[:k]
        reranked.append(
            [Hit(hits[i].id, float(mine[i]), hits[i].text, rank, hits[i].metadata) for rank, i in enumerate(order, 1)]
        )
    return reranked
