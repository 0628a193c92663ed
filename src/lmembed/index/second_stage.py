"""Reranking search results: a first stage (dense, BM25 or hybrid) finds candidates, a
:class:`~lmembed.rerank.Reranker` reads each query with each candidate's text and reorders them.

:func:`candidate_pairs` and :func:`reorder_hits` are the two halves, for callers that score the pairs their own
way (the server, through its batcher)."""

from __future__ import annotations

from collections.abc import Sequence

from lmembed.index.index import Hit
from lmembed.rerank.base import Reranker


def candidate_pairs(queries: Sequence[str], results: Sequence[Sequence[Hit]]) -> list[tuple[str, str]]:
    """Every (query, hit text) pair, query by query, hits in order."""
    if len(queries) != len(results):
        raise ValueError(f"{len(queries)} queries for {len(results)} result lists")
    return [(query, hit.text) for query, hits in zip(queries, results, strict=True) for hit in hits]


def reorder_hits(results: Sequence[Sequence[Hit]], scores: Sequence[float], k: int) -> list[list[Hit]]:
    """Each query's hits by descending ``scores`` (flat, in :func:`candidate_pairs`' order; ties keep the first
    stage's order), the ``k`` best, with those scores and new ranks."""
    reranked, start = [], 0
    for hits in results:
        mine = [float(s) for s in scores[start : start + len(hits)]]
        start += len(hits)
        order = sorted(range(len(hits)), key=lambda i: (-mine[i], i))[:k]
        reranked.append(
            [Hit(hits[i].id, mine[i], hits[i].text, rank, hits[i].metadata) for rank, i in enumerate(order, 1)]
        )
    return reranked


def rerank_hits(
    reranker: Reranker, queries: Sequence[str], results: Sequence[Sequence[Hit]], k: int
) -> list[list[Hit]]:
    """Each query's hits reordered by the reranker's score, the ``k`` best. All pairs go to the reranker at once,
    so its passes fill across queries."""
    pairs = candidate_pairs(queries, results)
    scores = reranker.score_pairs(pairs).tolist() if pairs else []
    return reorder_hits(results, scores, k)
