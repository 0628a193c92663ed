"""Fusing two or more ranked runs of one query (dense and BM25, typically) into one ranking.

* ``rrf``: reciprocal rank fusion (Cormack et al., 2009), ``sum_i w_i / (k + rank_i(d))`` with 1-based ranks and
  ``k = 60``; a document missing from a run gets nothing from it. Only ranks count, so runs on any scale mix.
* ``minmax``: each run's scores mapped to [0, 1] by its own minimum and maximum (a run whose scores are all equal
  maps them to 1), then ``sum_i w_i * score_i(d)``, a missing document counting 0.

Weights default to equal. Ties are broken by where a document first appears (runs in order, each best first), so
fusion is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from lmembed.errors import ConfigError

K = TypeVar("K")
FUSIONS = ("rrf", "minmax")
RRF_K = 60


def _ranked(run: Mapping[K, float]) -> list[K]:
    return sorted(run, key=lambda key: -run[key])  # stable: equal scores keep the run's own order


def _weights(count: int, weights: Sequence[float] | None) -> list[float]:
    if weights is None:
        return [1.0] * count
    if len(weights) != count or any(w < 0 for w in weights):
        raise ConfigError(f"weights={list(weights)} must be {count} non-negative numbers, one per run")
    return list(weights)


def reciprocal_rank_fusion(
    runs: Sequence[Mapping[K, float]], *, k: int = RRF_K, weights: Sequence[float] | None = None
) -> dict[K, float]:
    fused: dict[K, float] = {}
    for weight, run in zip(_weights(len(runs), weights), runs, strict=True):
        for rank, key in enumerate(_ranked(run), start=1):
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return fused


def minmax_fusion(runs: Sequence[Mapping[K, float]], *, weights: Sequence[float] | None = None) -> dict[K, float]:
    fused: dict[K, float] = {}
    for weight, run in zip(_weights(len(runs), weights), runs, strict=True):
        if not run:
            continue
        low, high = min(run.values()), max(run.values())
        for key in _ranked(run):
            normalised = (run[key] - low) / (high - low) if high > low else 1.0
            fused[key] = fused.get(key, 0.0) + weight * normalised
    return fused


def fuse(
    runs: Sequence[Mapping[K, float]],
    method: str = "rrf",
    *,
    weights: Sequence[float] | None = None,
    tie_key: Callable[[K], Any] | None = None,
) -> list[tuple[K, float]]:
    """One ranking of every document of ``runs``, best first, with its fused score. Equal scores (frequent under
    RRF: ranks 1 and 3 make what ranks 2 and 2 make) rank by ``tie_key`` descending when given (a document's id:
    trec_eval's order, so a run is scored in the order it is served), else by first appearance in ``runs``."""
    if method == "rrf":
        fused = reciprocal_rank_fusion(runs, weights=weights)
    elif method == "minmax":
        fused = minmax_fusion(runs, weights=weights)
    else:
        raise ConfigError(f"fusion={method!r} is unknown; choose one of {', '.join(FUSIONS)}")
    if tie_key is not None:
        return sorted(fused.items(), key=lambda item: (item[1], tie_key(item[0])), reverse=True)
    order: dict[K, int] = {}
    for key in (key for run in runs for key in _ranked(run)):
        order.setdefault(key, len(order))
    return sorted(fused.items(), key=lambda item: (-item[1], order[item[0]]))


def fuse_rows(
    runs: Sequence[tuple[np.ndarray, np.ndarray]],
    k: int,
    method: str = "rrf",
    *,
    weights: Sequence[float] | None = None,
    tie_key: Callable[[int], Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse search results given as ``(scores, rows)`` arrays (one row of each per query; row ``-1`` is a miss)
    into the ``k`` best ``(scores, rows)`` per query, misses padded with ``-1``. With ``tie_key`` (a row's
    document id) equal scores rank as trec_eval ranks them, compared as the float32 scores returned."""
    queries = len(runs[0][0])
    scores = np.zeros((queries, k), dtype=np.float32)
    rows = np.full((queries, k), -1, dtype=np.int64)
    for q in range(queries):
        per_run = [
            {int(r): float(s) for s, r in zip(run_scores[q], run_rows[q], strict=True) if r >= 0}
            for run_scores, run_rows in runs
        ]
        ranked = fuse(per_run, method, weights=weights)
        if tie_key is not None:  # the order of the scores as returned (float32), ties by id as trec_eval
            ranked.sort(key=lambda item: (np.float32(item[1]), tie_key(item[0])), reverse=True)
        for j, (row, score) in enumerate(ranked[:k]):
            rows[q, j] = row
            scores[q, j] = score
    return scores, rows
