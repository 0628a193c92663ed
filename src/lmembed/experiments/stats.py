"""Statistics of an experiment: spread over seeds, and paired tests between arms over the same items.

An *item* is the unit a task scores: a query (retrieval: its nDCG@10), a sentence pair (STS: its predicted
similarity, judged against the gold score by Spearman's rho), a pair with a 0/1 label (pair classification:
average precision of the predicted similarity), a source text (summarization: its own Spearman), a
clustering set (its V-measure) or a training step (its loss). Two arms scored on the same items are
compared *paired*: both see the same queries, so the query-to-query spread (usually far larger than the
difference between arms) cancels out.

* :func:`mean_std`: mean and sample standard deviation of an arm's score over seeds;
* :func:`seed_average`: one value per item from several seeds (the mean; for the rank-based statistics,
  the mean of each run's fractional ranks scaled to [0, 1], so runs on different similarity scales weigh
  the same);
* :func:`paired_bootstrap`: a percentile 95 % interval of ``statistic(a) - statistic(b)``, resampling
  items with replacement (the same resample for both arms);
* :func:`paired_randomization_test`: a two-sided p-value for "no difference", swapping each item's two
  values at random (for a mean, flipping the sign of its difference; for Spearman and AP, swapping each arm's
  fractional ranks, so arms on different similarity scales stay comparable). Exact (every swap pattern) when
  there are few items, Monte Carlo with the (count + 1) / (draws + 1) estimate otherwise;
* ``minus=(c, d)`` on all three: the difference of two differences, ``(statistic(a) - statistic(b)) -
  (statistic(c) - statistic(d))`` (e.g. the gap joint − single-task training of one backbone against the same
  gap of another), over the items all four arms were scored on: the bootstrap resamples items for the four
  arms at once, and the randomization test swaps each item's (a, b) with its (c, d);
* :func:`compare`: both, and a verdict. A difference is *distinguishable* when the interval excludes 0
  **and** p < alpha; then the verdict is ``holds`` when its sign is the one the claim expects and
  ``reversed`` otherwise; if not, ``not distinguishable``. Without a claim, ``differs``.

Everything is seeded: the same inputs give the same interval and p-value.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, get_args

import numpy as np
from scipy.stats import rankdata

from lmembed.evaluation.base import Statistic

#: How the per-item values of a task become its score (the task declares which, with its items).
STATISTICS: tuple[str, ...] = get_args(Statistic)
#: Verdicts :func:`compare` gives.
HOLDS, REVERSED, NOT_DISTINGUISHABLE, DIFFERS = "holds", "reversed", "not distinguishable", "differs"

DEFAULT_RESAMPLES = 2000
DEFAULT_PERMUTATIONS = 5000
_CHUNK = 256  # resamples scored at once (bounds memory for long item lists)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0.0 for a single value) of ``values``."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return float("nan"), float("nan")
    std = float(np.std(array, ddof=1)) if array.size > 1 else 0.0
    return float(np.mean(array)), std


def _check(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; known: {', '.join(STATISTICS)}")


def fractional_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks of ``values`` (ties get their mean rank) scaled to [0, 1]."""
    array = np.asarray(values, dtype=np.float64)
    if array.size < 2:
        return np.zeros(array.size)
    return (rankdata(array) - 1.0) / (array.size - 1.0)


def seed_average(runs: Sequence[Sequence[float]], statistic: Statistic = "mean") -> np.ndarray:
    """One value per item from the runs of one arm (one row per seed, items in the same order)."""
    _check(statistic)
    matrix = np.asarray(runs, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        raise ValueError("seed_average needs one row of item values per run")
    if statistic == "mean":
        return matrix.mean(axis=0)
    return np.mean([fractional_ranks(row) for row in matrix], axis=0)  # one run too: every arm on one scale


def _spearman_rows(values: np.ndarray, reference_ranks: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of ``values`` against one reference, given the reference's ranks per row."""
    ranks = rankdata(values, axis=1)
    x = ranks - ranks.mean(axis=1, keepdims=True)
    y = reference_ranks - reference_ranks.mean(axis=1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (x * y).sum(axis=1) / denominator, np.nan)


def _score_rows(statistic: Statistic, values: np.ndarray, reference: np.ndarray | None) -> np.ndarray:
    """The statistic of every row of ``values`` (``reference`` has the same shape, or is ``None``)."""
    if statistic == "mean":
        return values.mean(axis=1)
    if reference is None:
        raise ValueError(f"statistic {statistic!r} needs the reference (gold scores or labels)")
    if statistic == "spearman":
        return _spearman_rows(values, rankdata(reference, axis=1))
    return _average_precision_rows(values, reference)


def _average_precision_rows(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Average precision of each row, as scikit-learn's ``average_precision_score`` gives it (items of one score are
    one threshold): the mean over positives of the precision among the items scored at least as high. NaN for a row
    whose labels are all one class."""
    if not np.isin(labels, (0.0, 1.0)).all():
        raise ValueError("average precision needs labels of 0 and 1")
    at_least = rankdata(-scores, method="max", axis=1).astype(np.int64)  # items scored >= each item's score
    order = np.argsort(-scores, axis=1, kind="stable")
    positives_before = np.cumsum(np.take_along_axis(labels, order, axis=1), axis=1)
    positives_at_least = np.take_along_axis(positives_before, at_least - 1, axis=1)
    total = labels.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = (labels * positives_at_least / at_least).sum(axis=1) / total
    return np.where((total > 0) & (total < labels.shape[1]), ap, np.nan)


def statistic_value(statistic: Statistic, values: Sequence[float], reference: Sequence[float] | None = None) -> float:
    """The task score from per-item values: their mean, or Spearman / AP against ``reference``."""
    _check(statistic)
    row = np.asarray(values, dtype=np.float64)[None, :]
    ref = None if reference is None else np.asarray(reference, dtype=np.float64)[None, :]
    return float(_score_rows(statistic, row, ref)[0])


Minus = tuple[Sequence[float], Sequence[float]]


def _as_arms(
    a: Sequence[Any], b: Sequence[Any], reference: Sequence[float] | None, minus: Minus | None = None
) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The arms as 2-D arrays, one row per run (a list of item values is one run): ``[a, b]``, or
    ``[a, b, c, d]`` with ``minus=(c, d)``; every run of every arm has the same items, arms may differ in runs."""
    arms = [np.asarray(v, dtype=np.float64) for v in (a, b, *(minus or ()))]
    if minus is not None and len(minus) != 2:
        raise ValueError(f"minus: two arms (c, d), got {len(minus)}")
    arms = [x[None, :] if x.ndim == 1 else x for x in arms]
    if any(x.ndim != 2 or x.shape[1] != arms[0].shape[1] or not x.shape[0] for x in arms) or not arms[0].shape[1]:
        shapes = " and ".join(str(x.shape) for x in arms)
        raise ValueError(f"paired scores need equally long, non-empty lists (got {shapes})")
    ref = None if reference is None else np.asarray(reference, dtype=np.float64)
    if ref is not None and ref.shape != (arms[0].shape[1],):
        raise ValueError(f"the reference has {ref.size} items, the scores {arms[0].shape[1]}")
    return arms, ref


def _contrast_rows(statistic: Statistic, arms: Sequence[np.ndarray], ref: np.ndarray | None) -> np.ndarray:
    """Row by row: ``statistic(arms[0])``, ``statistic(arms[0]) - statistic(arms[1])``, or with four arms
    ``(statistic(arms[0]) - statistic(arms[1])) - (statistic(arms[2]) - statistic(arms[3]))``. An arm of shape
    ``(rows, items)`` is one run; ``(runs, rows, items)`` several, its statistic the mean of its runs' (as the
    scores table's means are: Spearman and AP of averaged ranks would be another number)."""
    signs = {1: (1,), 2: (1, -1), 4: (1, -1, -1, 1)}[len(arms)]
    return sum(sign * _arm_rows(statistic, x, ref) for sign, x in zip(signs, arms, strict=True))  # type: ignore[return-value]


def _arm_rows(statistic: Statistic, x: np.ndarray, ref: np.ndarray | None) -> np.ndarray:
    if x.ndim == 2:
        return _score_rows(statistic, x, ref)
    runs, rows, items = x.shape
    tiled = None if ref is None else np.broadcast_to(ref, (runs, rows, items)).reshape(runs * rows, items)
    return _score_rows(statistic, x.reshape(runs * rows, items), tiled).reshape(runs, rows).mean(axis=0)


def _observed(statistic: Statistic, arms: Sequence[np.ndarray], ref: np.ndarray | None) -> float:
    """The contrast on the items as they are (each arm ``(runs, items)``)."""
    return float(_contrast_rows(statistic, [x[:, None, :] for x in arms], None if ref is None else ref[None, :])[0])


def _resampled(
    statistic: Statistic, arms: Sequence[np.ndarray], ref: np.ndarray | None, resamples: int, seed: int
) -> np.ndarray:
    """The contrast of ``arms`` (each ``(runs, items)``; see :func:`_contrast_rows`) on item resamples drawn with
    replacement; the same resample serves every run of every arm."""
    rng = np.random.default_rng(seed)
    size = arms[0].shape[1]
    out = []
    for start in range(0, resamples, _CHUNK):
        index = rng.integers(0, size, size=(min(_CHUNK, resamples - start), size))
        out.append(_contrast_rows(statistic, [x[:, index] for x in arms], None if ref is None else ref[index]))
    return np.concatenate(out) if out else np.zeros(0)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return float("nan"), float("nan")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class Interval:
    """A difference with its percentile bootstrap interval."""

    difference: float
    low: float
    high: float
    confidence: float
    resamples: int


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Statistic = "mean",
    reference: Sequence[float] | None = None,
    *,
    minus: Minus | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Percentile interval of ``statistic(a) - statistic(b)`` (minus ``statistic(c) - statistic(d)`` with
    ``minus=(c, d)``) over items resampled with replacement. An arm given as several runs (one list of item values
    per seed) scores as the mean of its runs' statistics."""
    _check(statistic)
    arms, ref = _as_arms(a, b, reference, minus)
    observed = _observed(statistic, arms, ref)
    low, high = _percentiles(_resampled(statistic, arms, ref, resamples, seed), confidence)
    return Interval(observed, low, high, confidence, resamples)


def _swap_patterns(n: int, permutations: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Boolean rows, one per draw: True where an item's two values are swapped. Every pattern when
    ``2**n <= permutations`` (exact test), else random draws."""
    if n <= 20 and 2**n <= permutations:
        return np.array(list(itertools.product((False, True), repeat=n)), dtype=bool), True
    return rng.random((permutations, n)) < 0.5, False


def paired_randomization_test(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Statistic = "mean",
    reference: Sequence[float] | None = None,
    *,
    minus: Minus | None = None,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
) -> float:
    """Two-sided p-value of ``statistic(a) - statistic(b)`` under "the arms are exchangeable per item"; with
    ``minus=(c, d)``, of the difference of differences under "each item's (a, b) and (c, d) are exchangeable"."""
    _check(statistic)
    arms, ref = _as_arms(a, b, reference, minus)
    arms = [seed_average(x, statistic) if x.shape[0] > 1 else x[0] for x in arms]  # one value per item and arm
    if statistic != "mean":
        # Spearman and AP see only each arm's ordering; swapping raw values between arms on different similarity
        # scales (one model's cosines in [0.2, 0.9], another's in [0.7, 1]) would scramble both orderings and
        # inflate p. Each arm's fractional ranks leave its statistic unchanged and put both on one scale.
        arms = [fractional_ranks(x) for x in arms]
    half = len(arms) // 2  # the first half of the arms against the second: a vs b, or (a, b) vs (c, d)
    observed = abs(_contrast_rows(statistic, [x[None, :] for x in arms], None if ref is None else ref[None, :])[0])
    if not np.isfinite(observed):
        return float("nan")
    tolerance = 1e-12 * max(1.0, observed)
    patterns, exact = _swap_patterns(arms[0].size, permutations, np.random.default_rng(seed))
    extreme = 0
    for start in range(0, len(patterns), _CHUNK):
        swap = patterns[start : start + _CHUNK]
        first = [np.where(swap, y, x) for x, y in zip(arms[:half], arms[half:], strict=True)]
        second = [np.where(swap, x, y) for x, y in zip(arms[:half], arms[half:], strict=True)]
        refs = None if ref is None else np.broadcast_to(ref, swap.shape)
        values = np.abs(_contrast_rows(statistic, [*first, *second], refs))
        extreme += int(np.sum(values >= observed - tolerance))
    if exact:
        return extreme / len(patterns)
    return (extreme + 1) / (len(patterns) + 1)


@dataclass(frozen=True)
class Comparison:
    """Arm ``a`` against arm ``b`` on one task: the difference, its interval, the p-value and the verdict."""

    difference: float
    low: float
    high: float
    p_value: float
    verdict: str
    items: int
    statistic: str
    expected: int  # +1: the claim says a > b on this score; -1: a < b; 0: no claim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (one family): the i-th smallest p times ``m - i`` (i from 0),
    made non-decreasing in that order and capped at 1. Rejecting where the adjusted p is below α keeps the chance of
    any false "distinguishable" in the family at most α, whatever the dependence between the tests."""
    order = np.argsort(np.asarray(p_values, dtype=np.float64), kind="stable")
    m = len(order)
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted.tolist()


def verdict(difference: float, low: float, high: float, p_value: float, expected: int, alpha: float = 0.05) -> str:
    """``holds`` / ``reversed`` / ``not distinguishable`` (``differs`` without a claim); see the module doc."""
    distinguishable = bool(np.isfinite(p_value) and p_value < alpha and (low > 0 or high < 0))
    if not distinguishable:
        return NOT_DISTINGUISHABLE
    if expected == 0:
        return DIFFERS
    return HOLDS if np.sign(difference) == np.sign(expected) else REVERSED


def compare(
    a: Sequence[float],
    b: Sequence[float],
    statistic: Statistic = "mean",
    reference: Sequence[float] | None = None,
    *,
    minus: Minus | None = None,
    expected: int = 0,
    alpha: float = 0.05,
    resamples: int = DEFAULT_RESAMPLES,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
) -> Comparison:
    """Paired bootstrap interval + randomization test of ``a`` against ``b`` (with ``minus=(c, d)``: of the
    gap a − b against the gap c − d), and the verdict.

    ``expected`` is the sign the claim predicts for ``statistic(a) - statistic(b)`` (+1, -1, or 0 for none),
    or for the difference of differences.
    """
    interval = paired_bootstrap(
        a, b, statistic, reference, minus=minus, resamples=resamples, confidence=1 - alpha, seed=seed
    )
    p_value = paired_randomization_test(a, b, statistic, reference, minus=minus, permutations=permutations, seed=seed)
    return Comparison(
        difference=interval.difference,
        low=interval.low,
        high=interval.high,
        p_value=p_value,
        verdict=verdict(interval.difference, interval.low, interval.high, p_value, expected, alpha),
        items=np.asarray(a, dtype=np.float64).shape[-1],
        statistic=statistic,
        expected=int(np.sign(expected)),
    )


def bootstrap_interval(
    values: Sequence[float],
    statistic: Statistic = "mean",
    reference: Sequence[float] | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of one arm's score over resampled items (the error bars of the plot); ``values`` one
    list of item values, or one per run (the arm's score then the mean of its runs')."""
    _check(statistic)
    x = np.asarray(values, dtype=np.float64)
    ref = None if reference is None else np.asarray(reference, dtype=np.float64)
    scores = _resampled(statistic, [x[None, :] if x.ndim == 1 else x], ref, resamples, seed)
    return _percentiles(scores, confidence)
