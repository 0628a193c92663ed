"""Reranking: order each query's candidates by cosine similarity; MAP and MRR@10.

Follows mteb 1.x's ``RerankingEvaluator`` (the protocol of the published StackOverflowDupQuestions,
SciDocsRR, AskUbuntuDupQuestions numbers):

* data rows ``{"query": str, "positive": [...], "negative": [...]}``; rows without a positive or
  without a negative are dropped;
* queries are embedded with ``encode_queries`` (the instruction, if any, goes there), candidates
  with ``encode_corpus``; a row whose ``query`` is a *list* of strings is scored by the best match of
  any of them, and those sub-queries are embedded like documents, as mteb 1.x did;
* per row: ``AP`` = scikit-learn's ``average_precision_score`` of the cosine scores against the
  relevance flags, ``MRR@10`` = 1/rank of the first positive within the top 10 (0 otherwise);
  candidates with equal scores keep their input order, positives first;
* ``map`` (main score) and ``mrr`` are the means over rows. No per-item values are reported.

mteb 2.x runs these tasks through its retrieval machinery and names the same quantities
``map_at_1000`` and ``mrr_at_10``; both names are reported (candidate lists are far below 1000).

:meth:`RerankingTask.evaluate_reranker` scores the same rows with a second-stage
:class:`~lmembed.rerank.Reranker` instead of cosines (the instruction is not used; a list-valued query is
scored by its best sub-query), with the same metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from sklearn.metrics import average_precision_score

from lmembed.evaluation.base import TaskResult, TextsToEmbed
from lmembed.evaluation.tasks._common import (
    TaskBase,
    TaskDataError,
    as_matrix,
    encode_unique,
    read_numbered_jsonl,
    row_error,
    stopwatch,
    text_value,
    unique_texts,
)
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import RetrievalEncoder

if TYPE_CHECKING:  # the reranker pulls in torch; tasks load without it
    from lmembed.rerank.base import Reranker

MRR_AT = 10


@dataclass
class RerankSample:
    """One query with its relevant and irrelevant candidates."""

    query: str | list[str]
    positive: list[str]
    negative: list[str]


def candidate_scores(query_embeddings: np.ndarray, doc_embeddings: np.ndarray) -> np.ndarray:
    """Cosine of each candidate to the query (the best over sub-queries when there are several)."""
    similarities = unit_rows(query_embeddings, dtype=None) @ unit_rows(doc_embeddings, dtype=None).T
    return similarities.max(axis=0)


def mrr_at_k(relevant: Sequence[bool], scores: np.ndarray, k: int = MRR_AT) -> float:
    """1/rank of the first relevant candidate among the top ``k``. Ties rank as mteb 2 ranks them: by document id,
    descending, its ids being ``apositive_{q}_{i:05}`` and ``negative_{q}_{i:05}``, so a tied negative comes
    before a tied positive, and within each the later candidate first (candidates: positives, then negatives)."""
    positions = np.arange(len(relevant))
    ranking = np.lexsort((-positions, np.asarray(relevant, dtype=np.int8), -np.asarray(scores)))
    for rank, index in enumerate(ranking[:k], start=1):
        if relevant[index]:
            return 1.0 / rank
    return 0.0


def rerank_metrics(relevant: Sequence[bool], scores: np.ndarray, *, k: int = MRR_AT) -> dict[str, float]:
    """Average precision and MRR@k of one ranked candidate list."""
    return {
        "ap": float(average_precision_score(list(relevant), np.asarray(scores, dtype=np.float64))),
        "mrr": mrr_at_k(relevant, scores, k),
    }


def load_rerank_samples(path: str | Path) -> list[RerankSample]:
    """Read ``{"query", "positive", "negative"}`` rows."""
    samples = []
    for line_no, row in read_numbered_jsonl(path):
        query, positive, negative = row.get("query"), row.get("positive"), row.get("negative")
        if not isinstance(positive, list) or not isinstance(negative, list):
            raise row_error(path, line_no, "needs list-valued 'positive' and 'negative'")
        if isinstance(query, list):
            query = [text_value(q, f"field 'query[{i}]'", path, line_no) for i, q in enumerate(query)]
        else:
            query = text_value(query, "field 'query'", path, line_no)
        positives = [text_value(d, f"field 'positive[{i}]'", path, line_no) for i, d in enumerate(positive)]
        negatives = [text_value(d, f"field 'negative[{i}]'", path, line_no) for i, d in enumerate(negative)]
        samples.append(RerankSample(query, positives, negatives))
    return samples


@dataclass
class RerankingTask(TaskBase):
    """One reranking dataset; ``instruction`` (optional) goes on the queries only."""

    name: str
    samples: list[RerankSample]
    split: str = "test"
    mrr_at: int = MRR_AT
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "Reranking"
    main_metric: ClassVar[str] = "map"
    item_fields: ClassVar[tuple[str, ...]] = ("samples",)

    @classmethod
    def _read(cls, file: Path) -> tuple[list[RerankSample]]:
        return (load_rerank_samples(file),)

    def usable_samples(self) -> list[RerankSample]:
        """Rows with at least one positive and one negative (the others are skipped, as in MTEB)."""
        return [s for s in self.samples if s.positive and s.negative]

    def embedded_texts(self) -> list[TextsToEmbed]:
        """The queries (with the instruction), the sub-queries of listed queries, then the candidates."""
        samples = self.usable_samples()
        plain = unique_texts([s.query for s in samples if isinstance(s.query, str)])
        listed = unique_texts([q for s in samples if isinstance(s.query, list) for q in s.query])
        documents = unique_texts([d for s in samples for d in (*s.positive, *s.negative)])
        calls = [TextsToEmbed(plain, "query", self.instruction), TextsToEmbed(listed, "document")]
        return [call for call in (*calls, TextsToEmbed(documents, "document")) if call.texts]

    def _embed_queries(
        self, encoder: RetrievalEncoder, samples: list[RerankSample], batch_size: int
    ) -> list[np.ndarray]:
        """One (n_subqueries, dim) matrix per sample."""
        plain = [s.query for s in samples if isinstance(s.query, str)]
        listed = [q for s in samples if isinstance(s.query, list) for q in s.query]
        plain_emb = encode_unique(
            lambda texts: encoder.encode_queries(texts, instruction=self.instruction, batch_size=batch_size),
            plain,
        )
        listed_emb = encode_unique(lambda texts: encoder.encode_corpus(texts, batch_size=batch_size), listed)
        out, i, j = [], 0, 0
        for sample in samples:
            if isinstance(sample.query, str):
                out.append(plain_emb[i : i + 1])
                i += 1
            else:
                out.append(listed_emb[j : j + len(sample.query)])
                j += len(sample.query)
        return out

    def _samples(self) -> list[RerankSample]:
        samples = self.usable_samples()
        if not samples:
            raise TaskDataError(f"{self.name}: no row has both a positive and a negative")
        return samples

    def _scores(self, encoder: RetrievalEncoder, batch_size: int) -> tuple[dict[str, float], dict[str, Any], None]:
        """Score every usable row and average AP and MRR@k (no per-item values)."""
        samples = self._samples()
        queries = self._embed_queries(encoder, samples, batch_size)
        documents = [d for s in samples for d in (*s.positive, *s.negative)]
        doc_emb = encode_unique(lambda texts: as_matrix(encoder.encode_corpus(texts, batch_size=batch_size)), documents)
        per_sample, start = [], 0
        for sample, query_emb in zip(samples, queries, strict=True):
            count = len(sample.positive) + len(sample.negative)
            per_sample.append(candidate_scores(query_emb, doc_emb[start : start + count]))
            start += count
        return (*self._aggregate(samples, per_sample), None)

    def evaluate_reranker(self, reranker: Reranker) -> TaskResult:
        """Score the rows with ``reranker`` (one call for every pair) instead of cosines; same metrics."""
        with stopwatch() as clock:
            samples = self._samples()
            pairs = [
                (query, doc)
                for s in samples
                for query in ([s.query] if isinstance(s.query, str) else s.query)
                for doc in (*s.positive, *s.negative)
            ]
            flat = reranker.score_pairs(pairs)
            per_sample, start = [], 0
            for s in samples:
                subqueries = 1 if isinstance(s.query, str) else len(s.query)
                count = len(s.positive) + len(s.negative)
                block = flat[start : start + subqueries * count].reshape(subqueries, count)
                per_sample.append(block.max(axis=0))
                start += subqueries * count
            scores, extra = self._aggregate(samples, per_sample)
        return TaskResult(
            task_name=self.name,
            task_type=self.task_type,
            split=self.split,
            scores=scores,
            main_metric=self.main_metric,
            subset=self.subset,
            evaluation_time=clock["seconds"],
            model_name=reranker.name,
            extra={**extra, "reranker": reranker.name, "pairs": len(pairs)},
        )

    def _aggregate(
        self, samples: list[RerankSample], scores: list[np.ndarray]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """AP and MRR@k of each row's candidate scores, averaged."""
        per_row = []
        for sample, row_scores in zip(samples, scores, strict=True):
            relevant = [True] * len(sample.positive) + [False] * len(sample.negative)
            per_row.append(rerank_metrics(relevant, row_scores, k=self.mrr_at))
        mean_ap = float(np.mean([row["ap"] for row in per_row]))
        mean_mrr = float(np.mean([row["mrr"] for row in per_row]))
        scores_out = {
            "map": mean_ap,
            "mrr": mean_mrr,
            "map_at_1000": mean_ap,
            f"mrr_at_{self.mrr_at}": mean_mrr,
            "main_score": mean_ap,
        }
        return scores_out, {"num_queries": len(samples), "skipped": len(self.samples) - len(samples)}
