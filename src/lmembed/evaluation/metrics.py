"""Retrieval metrics computed the way MTEB computes them.

nDCG@k, MAP@k, Recall@k, Precision@k and hit rate@k come from pytrec_eval (trec_eval's
``ndcg_cut``, ``map_cut``, ``recall``, ``P`` and ``success`` measures). MRR@k is MTEB's own
measure, not trec_eval's: for each query it is ``1 / rank`` of the first document with relevance
above 0 among the top ``k``, else 0.

How MTEB aggregates, and so how we do:

* per-query values are averaged over the queries that have both judgments and a run entry
  (pytrec_eval's own selection; a query whose run is empty counts as 0);
* the pytrec_eval averages are rounded to 5 decimals; the MRR averages are not rounded;
* documents are ranked as trec_eval ranks them: by score descending, ties broken by document id
  descending. MRR uses the same order, so it agrees with the other measures on ties;
* with ``ignore_identical_ids`` a retrieved document whose id equals the query id is removed from
  the run before scoring (MTEB's ArguAna setting). This happens *after* retrieval, so such a
  query is scored on its remaining hits.

``main_score`` is ``ndcg_at_10``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pytrec_eval

K_VALUES: tuple[int, ...] = (1, 3, 5, 10, 20, 100, 1000)
MAIN_METRIC = "ndcg_at_10"
ROUND_DIGITS = 5

Run = Mapping[str, Mapping[str, float]]
QrelsLike = Mapping[str, Mapping[str, int]]

# trec_eval measure → MTEB key prefix
_TREC_MEASURES: dict[str, str] = {
    "ndcg_cut": "ndcg",
    "map_cut": "map",
    "recall": "recall",
    "P": "precision",
    "success": "hit_rate",
}


@dataclass
class RetrievalScores:
    """Averaged scores under MTEB's keys, plus the per-query values they came from."""

    scores: dict[str, float]
    per_query: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def main_score(self) -> float:
        return self.scores["main_score"]

    @property
    def num_queries(self) -> int:
        return len(self.per_query)


def drop_identical_ids(run: Run) -> dict[str, dict[str, float]]:
    """A copy of ``run`` without documents whose id equals their query's id."""
    return {qid: {did: s for did, s in docs.items() if did != qid} for qid, docs in run.items()}


def trec_order(docs: Mapping[str, float]) -> list[str]:
    """Document ids in trec_eval's ranking order: score descending, then id descending."""
    return [doc_id for doc_id, _ in sorted(docs.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def first_relevant_rank(ranked: Iterable[str], judged: Mapping[str, int]) -> int | None:
    """1-based rank of the first document judged relevant (> 0), or ``None``."""
    for rank, doc_id in enumerate(ranked, start=1):
        if judged.get(doc_id, 0) > 0:
            return rank
    return None


def trec_rank_of_first_relevant(docs: Mapping[str, float], judged: Mapping[str, int]) -> int | None:
    """1-based rank, in trec_eval's order, of the best-ranked relevant document, or ``None``.

    Equivalent to ``first_relevant_rank(trec_order(docs), judged)`` without sorting the run.
    """
    relevant = [(docs[d], d) for d, rel in judged.items() if rel > 0 and d in docs]
    if not relevant:
        return None
    best_score, best_id = max(relevant)
    ahead = sum(1 for d, s in docs.items() if s > best_score or (s == best_score and d > best_id))
    return ahead + 1


def mrr_at_k(docs: Mapping[str, float], judged: Mapping[str, int], k_values: Sequence[int]) -> dict[int, float]:
    """MTEB's MRR@k for one query's run ``{doc id: score}``, for each ``k``."""
    rank = trec_rank_of_first_relevant(docs, judged)
    return {k: (1.0 / rank if rank is not None and rank <= k else 0.0) for k in k_values}


def _pytrec_per_query(qrels: QrelsLike, run: Run, k_values: Sequence[int]) -> dict[str, dict[str, float]]:
    ks = ",".join(str(k) for k in k_values)
    measures = {f"{measure}.{ks}" for measure in _TREC_MEASURES}
    evaluator = pytrec_eval.RelevanceEvaluator({q: dict(d) for q, d in qrels.items()}, measures)
    try:
        return evaluator.evaluate(run)
    except TypeError:  # pytrec_eval wants built-in floats (numpy scalars are refused)
        return evaluator.evaluate({q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()})


def _mteb_key(trec_key: str) -> str:
    """``ndcg_cut_10`` → ``ndcg_at_10``, ``P_5`` → ``precision_at_5`` ..."""
    measure, k = trec_key.rsplit("_", 1)
    return f"{_TREC_MEASURES[measure]}_at_{k}"


def per_query_scores(qrels: QrelsLike, run: Run, k_values: Sequence[int] = K_VALUES) -> dict[str, dict[str, float]]:
    """Every metric for every scored query, under MTEB's keys."""
    trec = _pytrec_per_query(qrels, run, k_values)
    out: dict[str, dict[str, float]] = {}
    for query_id, values in trec.items():
        row = {_mteb_key(key): float(v) for key, v in values.items()}
        mrr = mrr_at_k(run[query_id], qrels[query_id], k_values)
        row.update({f"mrr_at_{k}": v for k, v in mrr.items()})
        out[query_id] = row
    return out


def _ordered_keys(k_values: Sequence[int]) -> list[str]:
    prefixes = ["ndcg", "map", "recall", "precision", "mrr", "hit_rate"]
    return [f"{p}_at_{k}" for p in prefixes for k in k_values]


def average_scores(
    per_query: Mapping[str, Mapping[str, float]],
    k_values: Sequence[int] = K_VALUES,
    *,
    round_digits: int | None = ROUND_DIGITS,
) -> dict[str, float]:
    """Average per-query values as MTEB does; adds ``main_score``."""
    n = len(per_query)
    scores: dict[str, float] = {}
    for key in _ordered_keys(k_values):
        mean = sum(row[key] for row in per_query.values()) / n if n else 0.0
        if round_digits is not None and not key.startswith("mrr_"):
            mean = round(mean, round_digits)
        scores[key] = mean
    scores["main_score"] = scores[MAIN_METRIC]
    return scores


def evaluate_run(
    qrels: QrelsLike,
    run: Run,
    k_values: Sequence[int] = K_VALUES,
    *,
    ignore_identical_ids: bool = False,
    round_digits: int | None = ROUND_DIGITS,
) -> RetrievalScores:
    """Score a run against judgments, returning MTEB-keyed averages and per-query values."""
    k_values = sorted(set(k_values) | {10})
    if ignore_identical_ids:
        run = drop_identical_ids(run)
    per_query = per_query_scores(qrels, run, k_values)
    return RetrievalScores(average_scores(per_query, k_values, round_digits=round_digits), per_query)
