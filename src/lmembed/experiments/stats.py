"""Statistics of an experiment: spread over seeds, and paired tests between arms over the same items.

An *item* is the unit a task scores: a query (retrieval: its nDCG@10), a sentence pair (STS: its predicted
similarity, judged against the gold score by Spearman's rho), a pair with a 0/1 label (pair classification:
average precision of the predicted similarity), a source text (summarization: its own Spearman), a
clustering set (its V-measure) or a block of training steps (its mean loss). Two arms scored on the same items are
compared *paired*: both see the same queries, so the query-to-query spread (usually far larger than the
difference between arms) cancels out. An arm given as several runs (one list of item values per seed) scores as
the mean of its runs' statistics, as the scores table does.

* :func:`mean_std`: mean and sample standard deviation of an arm's score over seeds;
* :func:`seed_average`: one value per item from several seeds (the mean; for the rank-based statistics,
  the mean of each run's fractional ranks scaled to [0, 1], so runs on different similarity scales weigh
  the same);
* :func:`paired_bootstrap`: a 95 % interval of ``statistic(a) - statistic(b)``. With **one run per arm** it
  resamples items with replacement (the same resample for both arms): for a mean, the studentized bootstrap
  (bootstrap-t: the quantiles of ``(mean* - mean) / se*`` over resamples, set around the observed mean with its
  standard error; Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, ch. 12), which corrects both the
  too narrow percentile interval and the skew of per-query differences (where resamples of identical values reach
  a quantile, that bound is the expanded percentile one); for Spearman and AP, whose per-resample standard error
  would need a second bootstrap, Hesterberg's *expanded percentile* interval (Hesterberg 2015, "What teachers
  should know about the bootstrap", The American Statistician 69(4); ``ExpandProbs`` of the R package
  ``resample``): the percentiles at the levels where ``z * sqrt((n - 1) / n)`` equals Student's t with n - 1
  degrees of freedom, which widens the percentile interval by about the factor it is too narrow at few items. A
  seeded loop in tests/experiments/test_stats_intervals.py checks the coverage at few items. BCa was not taken:
  resampling duplicates items, which Spearman and AP see as ties, and its bias correction then moves the interval
  the wrong way;
* :func:`paired_randomization_test`: a two-sided p-value for "no difference" over items, swapping each item's two
  values at random (for a mean, flipping the sign of its difference; for Spearman and AP, swapping each arm's
  fractional ranks, so arms on different similarity scales stay comparable). Exact (every swap pattern) when
  there are few items, Monte Carlo with the (count + 1) / (draws + 1) estimate otherwise. It sees items only
  (several runs are seed-averaged first), so :func:`compare` uses it only when every arm has one run;
* :func:`seed_level_test`: when **an arm has several runs** (seeds), the interval and p-value of the difference
  with the seed-to-seed spread of training in them. The runs × items scores of an arm are a crossed design
  (every run scores every item); no resampling scheme of it is exact (McCullagh 2000, "Resampling and exchangeable
  arrays", Bernoulli 6(2)), and resampling two or three runs cannot show their spread (the bootstrap variance of a
  mean of R runs is (R - 1) / R of the real one, with R = 2 there are three distinct values, and there is no t
  tail; Cameron, Gelbach & Miller 2008 on few clusters). So the variance of the difference D is estimated by its
  components, as in a two-way random-effects ANOVA: ``Var(D) = V_items + sum_k c_k**2 * max(0, S2_k - N_k) /
  R_k``. ``V_items`` is the variance over items of the seed-averaged contrast, divided by n (exact for a mean; for
  Spearman and AP the paired item bootstrap's variance, runs fixed, times n / (n - 1)); ``R_k`` is arm k's runs,
  ``c_k`` its sign in the contrast, ``S2_k`` the sample variance of its runs' statistics, and ``N_k`` the part of
  ``S2_k`` that item noise alone gives runs (for a mean the run × item interaction mean square over n, so that
  ``S2_k - N_k`` is the ANOVA estimate of the seed variance; for Spearman and AP the bootstrap variance of each
  run's deviation from the arm's mean): that part is already in ``V_items`` and is not counted twice. ``D /
  sqrt(Var(D))`` is referred to Student's t with Satterthwaite's (1946) degrees of freedom for a sum of mean
  squares, ``Var(D)**2 / (V_items**2 / (n - 1) + sum_k (c_k**2 * S2_k / R_k)**2 / (R_k - 1))`` (the seed term
  varies as the runs' sample variance does, with R_k - 1 degrees of freedom; the floored component instead is
  anti-conservative); the interval is ``D ± t * sqrt(Var(D))``, cut to the values a
  Spearman or AP contrast can take, so it excludes 0 exactly when p < alpha. An arm of one run adds no seed term
  (right for an arm that does not train; a trained arm of one seed is then judged as that one model). With two
  runs per arm a seed term has one degree of freedom: when the seeds disagree, t's quantile is large (12.7 at df
  1) and the test is weak, which is what two seeds can show. A seeded loop in tests/experiments/test_stats_seeds.py
  counts false "distinguishable" with no true difference and noisy seeds, against the item-only test;
* ``minus=(c, d)`` on all of them: the difference of two differences, ``(statistic(a) - statistic(b)) -
  (statistic(c) - statistic(d))`` (e.g. the gap joint − single-task training of one backbone against the same
  gap of another), over the items all four arms were scored on: the bootstrap resamples items for the four
  arms at once, the randomization test swaps each item's (a, b) with its (c, d), and the seed-level test adds each
  distinct arm's seed term once (an arm given twice, as b and d, with its signs summed);
* :func:`compare`: both, and a verdict. A difference is *distinguishable* when the interval excludes 0
  **and** p < alpha; then the verdict is ``holds`` when its sign is the one the claim expects and
  ``reversed`` otherwise; if not, ``not distinguishable``. Without a claim, ``differs``. Its ``method`` says how
  it was judged (:data:`ITEMS`: item bootstrap and randomization test; :data:`SEEDS_AND_ITEMS`:
  :func:`seed_level_test`), ``df`` the t's degrees of freedom;
* :func:`bootstrap_interval`: one arm's interval (the plot's error bars), by the same two rules.

Everything is seeded: the same inputs give the same interval and p-value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, get_args

import numpy as np
from scipy.stats import norm, rankdata
from scipy.stats import t as student_t

from lmembed.evaluation.base import Statistic

#: How the per-item values of a task become its score (the task declares which, with its items).
STATISTICS: tuple[str, ...] = get_args(Statistic)
#: Verdicts :func:`compare` gives.
HOLDS, REVERSED, NOT_DISTINGUISHABLE, DIFFERS = "holds", "reversed", "not distinguishable", "differs"
#: How a difference was judged: over items (one run per arm), or over seeds and items (an arm of several runs).
ITEMS, SEEDS_AND_ITEMS = "items", "seeds and items"
#: The item intervals: studentized bootstrap (means), expanded percentile bootstrap (Spearman, AP).
BOOTSTRAP_T, EXPANDED_PERCENTILE, SEED_T = "bootstrap-t", "expanded percentile", "t over seeds and items"

DEFAULT_RESAMPLES = 2000
DEFAULT_PERMUTATIONS = 5000
_CHUNK = 256  # resamples scored at once (bounds memory for long item lists)
_SIGNS = {1: (1,), 2: (1, -1), 4: (1, -1, -1, 1)}  # an arm; a - b; (a - b) - (c - d)


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
    return _as_runs(arms, reference)


def _as_runs(
    arms: Sequence[np.ndarray], reference: Sequence[float] | None
) -> tuple[list[np.ndarray], np.ndarray | None]:
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
    signs = _SIGNS[len(arms)]
    return sum(sign * _arm_rows(statistic, x, ref) for sign, x in zip(signs, arms, strict=True))  # type: ignore[return-value]


def _run_rows(statistic: Statistic, x: np.ndarray, ref: np.ndarray | None) -> np.ndarray:
    """Each run's statistic on each row: ``x`` of shape ``(runs, rows, items)`` gives ``(runs, rows)``."""
    runs, rows, items = x.shape
    tiled = None if ref is None else np.broadcast_to(ref, (runs, rows, items)).reshape(runs * rows, items)
    return _score_rows(statistic, x.reshape(runs * rows, items), tiled).reshape(runs, rows)


def _arm_rows(statistic: Statistic, x: np.ndarray, ref: np.ndarray | None) -> np.ndarray:
    if x.ndim == 2:
        return _score_rows(statistic, x, ref)
    return _run_rows(statistic, x, ref).mean(axis=0)


def _observed(statistic: Statistic, arms: Sequence[np.ndarray], ref: np.ndarray | None) -> float:
    """The contrast on the items as they are (each arm ``(runs, items)``)."""
    return float(_contrast_rows(statistic, [x[:, None, :] for x in arms], None if ref is None else ref[None, :])[0])


def _index_chunks(size: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Item resamples drawn with replacement, ``_CHUNK`` rows at a time (each row one resample's item indices)."""
    rng = np.random.default_rng(seed)
    for start in range(0, resamples, _CHUNK):
        yield rng.integers(0, size, size=(min(_CHUNK, resamples - start), size))


def _resampled(
    statistic: Statistic, arms: Sequence[np.ndarray], ref: np.ndarray | None, resamples: int, seed: int
) -> np.ndarray:
    """The contrast of ``arms`` (each ``(runs, items)``; see :func:`_contrast_rows`) on item resamples drawn with
    replacement; the same resample serves every run of every arm."""
    out = [
        _contrast_rows(statistic, [x[:, index] for x in arms], None if ref is None else ref[index])
        for index in _index_chunks(arms[0].shape[1], resamples, seed)
    ]
    return np.concatenate(out) if out else np.zeros(0)


def _percentiles(values: np.ndarray, levels: Sequence[float]) -> tuple[float, float]:
    """The percentiles of the finite ``values`` at ``levels`` (fractions); NaN when none is finite."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return float("nan"), float("nan")
    low, high = np.percentile(finite, [100 * level for level in levels])
    return float(low), float(high)


def expanded_levels(confidence: float, n: int) -> tuple[float, float]:
    """Hesterberg's expanded percentile levels for ``n`` items: ``(Φ(-z), Φ(z))`` with ``z = sqrt(n / (n - 1)) *
    t(1 - (1 - confidence) / 2, n - 1)``, so that for a mean of symmetric values the percentile interval matches
    Student's t interval (the plain levels for fewer than two items)."""
    tail = (1 - confidence) / 2
    if n < 2:
        return tail, 1 - tail
    z = math.sqrt(n / (n - 1)) * float(student_t.ppf(1 - tail, n - 1))
    return float(norm.cdf(-z)), float(norm.cdf(z))


def _contrast_items(arms: Sequence[np.ndarray]) -> np.ndarray:
    """For a mean: each item's contrast, ``sum_k sign_k * (arm k's run-averaged value)``; its mean is the contrast."""
    return sum(sign * x.mean(axis=0) for sign, x in zip(_SIGNS[len(arms)], arms, strict=True))  # type: ignore[return-value]


def _bootstrap_t(values: np.ndarray, resamples: int, confidence: float, seed: int) -> tuple[float, float]:
    """Studentized bootstrap interval of the mean of ``values``: ``mean - q(1 - tail) * se``, ``mean - q(tail) * se``
    with q the quantiles of ``(mean* - mean) / se*`` over item resamples (taken at the outer order statistics). A
    resample of identical values has no standard error and an infinite t; where such resamples reach a quantile
    (a few distinct values among many equal ones), that bound is the expanded percentile one instead."""
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return mean, mean
    se = float(values.std(ddof=1)) / math.sqrt(n)
    tolerance = 1e-12 * max(1.0, abs(mean))
    if se <= tolerance:
        return mean, mean
    ts, all_means = [], []
    for index in _index_chunks(n, resamples, seed):
        sample = values[index]
        means = sample.mean(axis=1)
        ses = sample.std(axis=1, ddof=1) / math.sqrt(n)
        gap = means - mean
        with np.errstate(divide="ignore", invalid="ignore"):
            ts.append(
                np.where(ses > tolerance, gap / ses, np.where(np.abs(gap) <= tolerance, 0.0, np.sign(gap) * np.inf))
            )
        all_means.append(means)
    if not ts:
        return float("nan"), float("nan")  # no resamples asked for
    t_values = np.concatenate(ts)
    tail = (1 - confidence) / 2
    low = mean - float(np.quantile(t_values, 1 - tail, method="higher")) * se
    high = mean - float(np.quantile(t_values, tail, method="lower")) * se
    if not (np.isfinite(low) and np.isfinite(high)):
        fallback = _percentiles(np.concatenate(all_means), expanded_levels(confidence, n))
        low, high = (low if np.isfinite(low) else fallback[0]), (high if np.isfinite(high) else fallback[1])
    return low, high


def _item_interval(
    statistic: Statistic,
    arms: Sequence[np.ndarray],
    ref: np.ndarray | None,
    resamples: int,
    confidence: float,
    seed: int,
) -> tuple[float, float, str]:
    """The interval over items (runs fixed): bootstrap-t for a mean, expanded percentile for Spearman and AP."""
    if statistic == "mean":
        return (*_bootstrap_t(_contrast_items(arms), resamples, confidence, seed), BOOTSTRAP_T)
    levels = expanded_levels(confidence, arms[0].shape[1])
    return (*_percentiles(_resampled(statistic, arms, ref, resamples, seed), levels), EXPANDED_PERCENTILE)


@dataclass(frozen=True)
class Interval:
    """A difference with its interval: ``method`` one of :data:`BOOTSTRAP_T`, :data:`EXPANDED_PERCENTILE` (one run
    per arm) or :data:`SEED_T` (an arm of several runs; ``df`` its t's degrees of freedom)."""

    difference: float
    low: float
    high: float
    confidence: float
    resamples: int
    method: str = BOOTSTRAP_T
    df: float | None = None


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
    """Interval of ``statistic(a) - statistic(b)`` (minus ``statistic(c) - statistic(d)`` with ``minus=(c, d)``).

    One run per arm: over items resampled with replacement, the same resample for every arm; bootstrap-t for a
    mean, expanded percentile for Spearman and AP (see the module doc). An arm given as several runs (one list of
    item values per seed) scores as the mean of its runs' statistics, and the interval is then
    :func:`seed_level_test`'s, with the seed-to-seed spread in it."""
    _check(statistic)
    arms, ref = _as_arms(a, b, reference, minus)
    return _interval(statistic, arms, ref, resamples, confidence, seed)


def _interval(
    statistic: Statistic, arms: list[np.ndarray], ref: np.ndarray | None, resamples: int, confidence: float, seed: int
) -> Interval:
    if any(x.shape[0] > 1 for x in arms):
        test = _seed_level(statistic, arms, ref, resamples, confidence, seed)
        return Interval(test.difference, test.low, test.high, confidence, resamples, SEED_T, test.df)
    observed = _observed(statistic, arms, ref)
    low, high, method = _item_interval(statistic, arms, ref, resamples, confidence, seed)
    return Interval(observed, low, high, confidence, resamples, method)


@dataclass(frozen=True)
class SeedTest:
    """:func:`seed_level_test`'s answer: the difference, its interval, p, the t's degrees of freedom, and the two
    parts of the difference's variance (over items, and over seeds)."""

    difference: float
    low: float
    high: float
    p_value: float
    df: float
    item_variance: float
    seed_variance: float


def _distinct_arms(arms: Sequence[np.ndarray]) -> list[tuple[np.ndarray, int]]:
    """The arms with their signs in the contrast, an arm given twice (same runs, same values) once with its signs
    summed: its runs are the same seeds, so their spread must enter once, with the summed weight."""
    out: list[tuple[np.ndarray, int]] = []
    for sign, x in zip(_SIGNS[len(arms)], arms, strict=True):
        for k, (y, weight) in enumerate(out):
            if y.shape == x.shape and np.array_equal(x, y, equal_nan=True):
                out[k] = (y, weight + sign)
                break
        else:
            out.append((x, sign))
    return out


def _variance_parts(
    statistic: Statistic, arms: list[tuple[np.ndarray, int]], ref: np.ndarray | None, resamples: int, seed: int
) -> tuple[float, list[float], list[float]]:
    """``V_items`` (the variance over items of the seed-averaged contrast), and per arm the sample variance of its
    runs' statistics and the part of it that item noise alone gives (NaN for an arm of one run)."""
    n = arms[0][0].shape[1]
    if statistic == "mean":  # exact: the two-way (runs × items) ANOVA mean squares
        contrast = sum(weight * x.mean(axis=0) for x, weight in arms)
        items = float(np.var(contrast, ddof=1)) / n if n > 1 else 0.0
        spreads, noise = [], []
        for x, _ in arms:
            runs = x.shape[0]
            if runs < 2:
                spreads.append(float("nan"))
                noise.append(float("nan"))
                continue
            spreads.append(float(np.var(x.mean(axis=1), ddof=1)))
            interaction = x - x.mean(axis=0, keepdims=True)
            noise.append(float(np.var(interaction, axis=1, ddof=1).sum()) / (n * (runs - 1)) if n > 1 else 0.0)
        return items, spreads, noise
    # Spearman, AP: each run's statistic on the same item resamples (the paired item bootstrap, runs fixed)
    per_run: list[list[np.ndarray]] = [[] for _ in arms]
    for index in _index_chunks(n, resamples, seed):
        refs = None if ref is None else ref[index]
        for k, (x, _) in enumerate(arms):
            per_run[k].append(_run_rows(statistic, x[:, index], refs))
    boot = [np.concatenate(chunks, axis=1) for chunks in per_run]  # (runs, resamples) per arm
    finite = np.all([np.isfinite(b).all(axis=0) for b in boot], axis=0)
    scale = n / (n - 1) if n > 1 else 1.0  # the bootstrap variance of a mean is (n - 1) / n of the unbiased one
    contrast = sum(weight * b[:, finite].mean(axis=0) for b, (_, weight) in zip(boot, arms, strict=True))
    items = scale * float(np.var(contrast, ddof=1)) if finite.sum() > 1 else float("nan")
    spreads, noise = [], []
    for b, (x, _) in zip(boot, arms, strict=True):
        runs = x.shape[0]
        if runs < 2:
            spreads.append(float("nan"))
            noise.append(float("nan"))
            continue
        observed = _run_rows(statistic, x[:, None, :], None if ref is None else ref[None, :])[:, 0]
        spreads.append(float(np.var(observed, ddof=1)))
        deviations = b[:, finite] - b[:, finite].mean(axis=0, keepdims=True)
        noise.append(scale * float(np.var(deviations, axis=1, ddof=1).sum()) / (runs - 1))
    return items, spreads, noise


def _seed_level(
    statistic: Statistic, arms: list[np.ndarray], ref: np.ndarray | None, resamples: int, confidence: float, seed: int
) -> SeedTest:
    n = arms[0].shape[1]
    observed = _observed(statistic, arms, ref)
    distinct = _distinct_arms(arms)
    items, spreads, noise = _variance_parts(statistic, distinct, ref, resamples, seed)
    # Var(D) = V_items + sum_k c_k**2 * max(0, s2_k - noise_k) / R_k; the t's degrees of freedom by Satterthwaite from
    # the mean squares the estimate is made of: the seed term varies as the runs' sample variance s2_k (R_k - 1 df).
    terms, mean_squares, dfs = [], [], []
    for (x, weight), spread, part in zip(distinct, spreads, noise, strict=True):
        runs = x.shape[0]
        if runs < 2 or weight == 0:
            continue
        terms.append(weight**2 * max(0.0, spread - part) / runs if np.isfinite(spread - part) else float("nan"))
        mean_squares.append(weight**2 * spread / runs)
        dfs.append(runs - 1)
    variance = items + sum(terms)
    nan = float("nan")
    if not (np.isfinite(observed) and np.isfinite(variance)):
        return SeedTest(observed, nan, nan, nan, nan, items, sum(terms))
    denominator = (items**2 / (n - 1) if n > 1 else 0.0) + sum(
        square**2 / df for square, df in zip(mean_squares, dfs, strict=True)
    )
    df = variance**2 / denominator if denominator > 0 else float(max(n - 1, 1))
    tolerance = 1e-12 * max(1.0, abs(observed))
    if variance <= tolerance**2:
        p_value = 1.0 if abs(observed) <= tolerance else 0.0
        return SeedTest(observed, observed, observed, p_value, df, items, sum(terms))
    se = math.sqrt(variance)
    half = float(student_t.ppf(1 - (1 - confidence) / 2, df)) * se
    p_value = float(2 * student_t.sf(abs(observed) / se, df))
    low, high = _within_range(statistic, len(arms), observed - half, observed + half)
    return SeedTest(observed, low, high, p_value, df, items, sum(terms))


_RANGES = {"spearman": (-1.0, 1.0), "ap": (0.0, 1.0)}


def _within_range(statistic: Statistic, arms: int, low: float, high: float) -> tuple[float, float]:
    """A t interval of a bounded statistic cut to the values its contrast can take (Spearman in [-1, 1], AP in
    [0, 1]; a difference of two in twice that span): with few seeds t's quantile is large, and an interval beyond the
    possible values says no more than one that ends there. A mean's values have no known bounds."""
    if statistic not in _RANGES:
        return low, high
    bottom, top = _RANGES[statistic]
    signs = _SIGNS[arms]
    least = sum(sign * (bottom if sign > 0 else top) for sign in signs)
    most = sum(sign * (top if sign > 0 else bottom) for sign in signs)
    return max(low, least), min(high, most)


def seed_level_test(
    a: Sequence[Any],
    b: Sequence[Any],
    statistic: Statistic = "mean",
    reference: Sequence[float] | None = None,
    *,
    minus: Minus | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> SeedTest:
    """Interval and two-sided p of ``statistic(a) - statistic(b)`` (with ``minus=(c, d)``, of the difference of
    differences) over seeds and items: each arm one row of item values per run (seed), scoring as the mean of its
    runs' statistics; the variance is the items' part plus each arm's seed variance component over its runs, the
    reference distribution Student's t with Welch-Satterthwaite degrees of freedom (see the module doc). With one
    run per arm the seed part is 0 and this is a t test over items (:func:`compare` then uses the item bootstrap and
    the randomization test instead)."""
    _check(statistic)
    arms, ref = _as_arms(a, b, reference, minus)
    return _seed_level(statistic, arms, ref, resamples, confidence, seed)


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
    ``minus=(c, d)``, of the difference of differences under "each item's (a, b) and (c, d) are exchangeable".

    Items only: an arm of several runs is seed-averaged first (:func:`seed_average`), so the seed-to-seed spread is
    not in this p; :func:`compare` uses :func:`seed_level_test` for such arms."""
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
    """Arm ``a`` against arm ``b`` on one task: the difference, its interval, the p-value and the verdict; ``method``
    :data:`ITEMS` (one run per arm: item bootstrap and randomization test) or :data:`SEEDS_AND_ITEMS` (an arm of
    several runs: :func:`seed_level_test`, ``df`` its degrees of freedom)."""

    difference: float
    low: float
    high: float
    p_value: float
    verdict: str
    items: int
    statistic: str
    expected: int  # +1: the claim says a > b on this score; -1: a < b; 0: no claim
    method: str = ITEMS
    df: float | None = None

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
    """Interval and p of ``a`` against ``b`` (with ``minus=(c, d)``: of the gap a − b against the gap c − d), and
    the verdict. One run per arm: the item bootstrap (:func:`paired_bootstrap`) and the randomization test
    (:func:`paired_randomization_test`); an arm of several runs (seeds): :func:`seed_level_test` for both.

    ``expected`` is the sign the claim predicts for ``statistic(a) - statistic(b)`` (+1, -1, or 0 for none),
    or for the difference of differences.
    """
    _check(statistic)
    arms, ref = _as_arms(a, b, reference, minus)
    items = arms[0].shape[1]
    if any(x.shape[0] > 1 for x in arms):
        test = _seed_level(statistic, arms, ref, resamples, 1 - alpha, seed)
        difference, low, high, p_value = test.difference, test.low, test.high, test.p_value
        method, df = SEEDS_AND_ITEMS, test.df
    else:
        interval = _interval(statistic, arms, ref, resamples, 1 - alpha, seed)
        p_value = paired_randomization_test(
            a, b, statistic, reference, minus=minus, permutations=permutations, seed=seed
        )
        difference, low, high = interval.difference, interval.low, interval.high
        method, df = ITEMS, None
    return Comparison(
        difference=difference,
        low=low,
        high=high,
        p_value=p_value,
        verdict=verdict(difference, low, high, p_value, expected, alpha),
        items=items,
        statistic=statistic,
        expected=int(np.sign(expected)),
        method=method,
        df=df,
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
    """Interval of one arm's score (the error bars of the plot): ``values`` one list of item values (bootstrap-t
    over items for a mean, expanded percentile for Spearman and AP), or one per run (the arm's score then the mean
    of its runs', and the interval :func:`seed_level_test`'s, with the seed-to-seed spread in it)."""
    _check(statistic)
    arms, ref = _as_runs([np.asarray(values, dtype=np.float64)], reference)
    interval = _interval(statistic, arms, ref, resamples, confidence, seed)
    return interval.low, interval.high
