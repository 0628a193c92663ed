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

Cut-offs: :data:`K_VALUES` holds 20 of them, the number the decoder-vs-encoder paper reports every metric
at (it names 1, 2, 3, 5, 10, 20, 30, 100 "etc."; we fill the rest on a roughly logarithmic grid up to the
1,000 hits that are retrieved). It contains MTEB's own seven (:data:`MTEB_K_VALUES`: 1, 3, 5, 10, 20, 100,
1000), so every key MTEB reports is there with MTEB's value.

Areas under the curve: MTEB also reports ``nauc_<metric>_at_<k>_<max|std|diff1>``, the normalised area
under an *abstention curve* (Gisserot-Boukhlef et al., 2024): each query gets a confidence from its
retrieved scores (``max``: the top score; ``std``: their standard deviation; ``diff1``: the gap between
the first and second score); queries are dropped, least confident first, at rates 0, 0.1, ..., 0.9, and
the mean metric of the queries kept traces a curve. Its area is rescaled so that 0 is a useless
confidence (a flat curve) and 1 the oracle (dropping the worst queries first). Computed for nDCG, MAP,
recall, precision and MRR at every cut-off (:func:`nauc_scores`); a group of queries with equal
confidence counts with its mean metric, so the value does not depend on the order of the queries
(mteb's current rule). Not rounded, as in MTEB; ``NaN`` where every query has the same metric value.

Two different "AUC"s, never to be confused:

* ``nauc_<metric>_at_<k>_<confidence>`` (MTEB's, above): the area under an *abstention* curve, one per
  cut-off, which measures whether the retriever's own scores know which queries it gets right;
* ``cutoff_auc_<metric>`` (the decoder-vs-encoder paper's): the area under the *metric@k curve* over the
  cut-offs themselves (:func:`cutoff_auc`), one number per metric that summarises how the metric grows
  from k = 1 to the retrieval depth. The curve is drawn against log k (the cut-offs are spaced roughly
  logarithmically, so every decade of k weighs the same) and the area is divided by the width of that
  log range, so it lies in [0, 1]: 1 means the metric is 1 at every cut-off. It is computed per query and
  averaged like the other metrics, and it is only present where there are at least two cut-offs.
  ``lmembed report`` draws the curves (``cutoffs.png``).

``main_score`` is ``ndcg_at_10``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytrec_eval

from lmembed.errors import ConfigError
from lmembed.io import whole_number

#: MTEB's retrieval cut-offs.
MTEB_K_VALUES: tuple[int, ...] = (1, 3, 5, 10, 20, 100, 1000)
#: The default cut-offs: 20 of them (the decoder-vs-encoder paper's count), MTEB's seven included.
K_VALUES: tuple[int, ...] = (1, 2, 3, 5, 7, 10, 15, 20, 25, 30, 40, 50, 70, 100, 150, 200, 300, 500, 700, 1000)
#: The metrics MTEB reports an nAUC for (hit rate has none).
NAUC_METRICS: tuple[str, ...] = ("ndcg", "map", "recall", "precision", "mrr")
#: The confidence functions of the abstention curves.
CONFIDENCES: tuple[str, ...] = ("max", "std", "diff1")
#: The metrics that get a metric@k curve and its area (:func:`cutoff_auc`).
CURVE_METRICS: tuple[str, ...] = ("ndcg", "map", "recall", "precision", "mrr", "hit_rate")
#: Abstention rates at which the curve is sampled: MTEB's ``numpy.linspace(0, 1, 11)[:-1]``, bit for bit
#: (``0.30000000000000004`` rather than ``0.3`` decides how a count such as 4.5 rounds).
ABSTENTION_RATES: tuple[float, ...] = tuple(float(x) for x in np.linspace(0.0, 1.0, 11)[:-1])
MAIN_METRIC = "ndcg_at_10"


def check_k_values(k_values: Any, argument: str = "k_values") -> tuple[int, ...]:
    """``k_values`` as a tuple of ints: a non-empty list of whole numbers >= 1 (no bools), else a
    :class:`ConfigError` naming ``argument`` (pytrec_eval ends the whole process on a cut-off of 0)."""
    if isinstance(k_values, str | bytes | Mapping) or not isinstance(k_values, Iterable):
        raise ConfigError(f"{argument}={k_values!r:.40} must be a list of whole numbers >= 1, e.g. [1, 10, 100]")
    values = list(k_values)
    if not values:
        raise ConfigError(f"{argument} is empty; give at least one cut-off, e.g. [10]")
    return tuple(whole_number(k, f"{argument}[{i}]") for i, k in enumerate(values))


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
    k_values = check_k_values(k_values)
    trec = _pytrec_per_query(qrels, run, k_values)
    out: dict[str, dict[str, float]] = {}
    for query_id, values in trec.items():
        row = {_mteb_key(key): float(v) for key, v in values.items()}
        mrr = mrr_at_k(run[query_id], qrels[query_id], k_values)
        row.update({f"mrr_at_{k}": v for k, v in mrr.items()})
        row.update(cutoff_aucs(row, k_values))
        out[query_id] = row
    return out


def cutoff_auc(values: Sequence[float], k_values: Sequence[int]) -> float:
    """Normalised area under the curve ``metric@k`` against ``log k`` (see the module docstring): the
    trapezoid area divided by ``log(max k / min k)``, so a metric of 1 at every cut-off gives 1."""
    if len(k_values) < 2:
        raise ValueError("a metric@k curve needs at least two cut-offs")
    x = np.log(np.asarray(k_values, dtype=np.float64))
    return _trapezoid(np.asarray(values, dtype=np.float64), x) / float(x[-1] - x[0])


def cutoff_aucs(row: Mapping[str, float], k_values: Sequence[int]) -> dict[str, float]:
    """``cutoff_auc_<metric>`` for every curve metric of one query's (or an average's) row; empty with fewer
    than two cut-offs."""
    ks = sorted(set(k_values))
    if len(ks) < 2:
        return {}
    return {f"cutoff_auc_{m}": cutoff_auc([row[f"{m}_at_{k}"] for k in ks], ks) for m in CURVE_METRICS}


def _ordered_keys(k_values: Sequence[int]) -> list[str]:
    keys = [f"{p}_at_{k}" for p in CURVE_METRICS for k in k_values]
    if len(set(k_values)) >= 2:
        keys += [f"cutoff_auc_{p}" for p in CURVE_METRICS]
    return keys


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
        if round_digits is not None and not key.startswith(("mrr_", "cutoff_auc_mrr")):
            mean = round(mean, round_digits)
        scores[key] = mean
    scores["main_score"] = scores[MAIN_METRIC]
    return scores


# ---------------------------------------------------------------------------------------------- nAUC
def confidence_scores(scores: Iterable[float]) -> dict[str, float]:
    """One query's confidences from its retrieved scores: ``max``, ``std`` and ``diff1`` (top minus
    second score); all 0 for an empty run, ``diff1`` 0 for a single hit."""
    values = sorted((float(s) for s in scores), reverse=True)
    if not values:
        return {"max": 0.0, "std": 0.0, "diff1": 0.0}
    diff1 = values[0] - values[1] if len(values) > 1 else 0.0
    return {"max": values[0], "std": float(np.std(values)), "diff1": diff1}


def abstention_curve(
    confidence: np.ndarray, metric: np.ndarray, rates: Sequence[float] = ABSTENTION_RATES
) -> np.ndarray:
    """Mean ``metric`` of the queries kept when the least confident fraction ``rate`` is dropped, per rate.

    Queries with equal confidence count with their group's mean metric (the expected value under a
    random tie-break); at least one query is always kept."""
    n = len(confidence)
    if n == 0:
        return np.full(len(rates), np.nan)
    order = np.argsort(confidence, kind="stable")
    conf_sorted, metric_sorted = confidence[order], metric[order]
    starts = np.flatnonzero(np.r_[True, conf_sorted[1:] != conf_sorted[:-1]])
    sizes = np.diff(np.r_[starts, n])
    smoothed = np.repeat(np.add.reduceat(metric_sorted, starts) / sizes, sizes)
    return np.array([smoothed[min(round(rate * n), n - 1) :].mean() for rate in rates])


def _trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    """Area under the piecewise-linear curve through (x, y) (``numpy.trapezoid``, on any numpy)."""
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)))


def normalised_auc(confidence: np.ndarray, metric: np.ndarray, rates: Sequence[float] = ABSTENTION_RATES) -> float:
    """The abstention curve's area rescaled between a flat curve (0) and the oracle's (1); NaN when the
    oracle is flat too (every query has the same metric value)."""
    x = np.asarray(rates, dtype=np.float64)
    curve = abstention_curve(confidence, metric, rates)
    oracle = abstention_curve(metric, metric, rates)
    area, oracle_area = _trapezoid(curve, x), _trapezoid(oracle, x)
    flat_area = float(oracle[0] * (x[-1] - x[0]))
    if oracle_area == flat_area:
        return float("nan")
    return (area - flat_area) / (oracle_area - flat_area)


def nauc_scores(
    run: Run, per_query: Mapping[str, Mapping[str, float]], k_values: Sequence[int] = K_VALUES
) -> dict[str, float]:
    """MTEB's ``nauc_<metric>_at_<k>_<confidence>`` for nDCG, MAP, recall, precision and MRR at each
    cut-off, over the scored queries of ``per_query`` (confidences from their hits in ``run``)."""
    query_ids = list(per_query)
    if not query_ids:
        return {}
    confidences = [confidence_scores(run.get(q, {}).values()) for q in query_ids]
    by_function = {name: np.array([c[name] for c in confidences]) for name in CONFIDENCES}
    out: dict[str, float] = {}
    for metric in NAUC_METRICS:
        for k in k_values:
            values = np.array([per_query[q][f"{metric}_at_{k}"] for q in query_ids], dtype=np.float64)
            for name, confidence in by_function.items():
                out[f"nauc_{metric}_at_{k}_{name}"] = normalised_auc(confidence, values)
    return out


def evaluate_run(
    qrels: QrelsLike,
    run: Run,
    k_values: Sequence[int] = K_VALUES,
    *,
    ignore_identical_ids: bool = False,
    round_digits: int | None = ROUND_DIGITS,
    nauc: bool = True,
) -> RetrievalScores:
    """Score a run against judgments, returning MTEB-keyed averages and per-query values.

    With ``nauc`` (the default) the averages also hold MTEB's nAUC keys (:func:`nauc_scores`)."""
    k_values = sorted(set(check_k_values(k_values)) | {10})
    if ignore_identical_ids:
        run = drop_identical_ids(run)
    per_query = per_query_scores(qrels, run, k_values)
    scores = average_scores(per_query, k_values, round_digits=round_digits)
    if nauc:
        main = scores.pop("main_score")
        scores.update(nauc_scores(run, per_query, k_values))
        scores["main_score"] = main
    return RetrievalScores(scores, per_query)
