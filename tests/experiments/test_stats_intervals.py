"""The item intervals at few items: bootstrap-t for means, expanded percentile for Spearman and AP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lmembed.experiments.stats import (
    BOOTSTRAP_T,
    EXPANDED_PERCENTILE,
    _resampled,
    bootstrap_interval,
    expanded_levels,
    paired_bootstrap,
)


def test_a_mean_interval_at_few_items_covers_as_often_as_it_says():
    """Percentile intervals of a mean are too narrow at few items (z instead of t, and a spread with divisor n):
    over these 300 seeded experiments the percentile interval covered the true difference 272 times at 12 items
    (normal differences) and 258 times at 20 skewed per-query differences (half unchanged, the rest Exp(0.2) -
    0.1). The bootstrap-t covers 284 and 282."""
    rng = np.random.default_rng(12)
    normal = skewed = 0
    for rep in range(300):
        d = rng.normal(0.1, 0.3, 12)
        interval = paired_bootstrap(d, np.zeros(12), resamples=400, seed=rep)
        normal += interval.low <= 0.1 <= interval.high
        b = rng.beta(0.7, 1.2, 20)
        gain = np.where(rng.random(20) < 0.5, 0.0, rng.exponential(0.2, 20) - 0.1)
        interval = paired_bootstrap(b + gain, b, resamples=400, seed=rep)
        skewed += interval.low <= 0.05 <= interval.high
    assert normal >= 0.93 * 300 and skewed >= 0.91 * 300, (normal, skewed)
    assert interval.method == BOOTSTRAP_T


def test_the_mean_interval_is_about_students_at_few_symmetric_items():
    values = scipy_stats.norm.ppf((np.arange(10) + 0.5) / 10)  # ten symmetric, evenly spread differences
    low, high = bootstrap_interval(values, seed=3)
    half = scipy_stats.t.ppf(0.975, 9) * values.std(ddof=1) / math.sqrt(10)
    assert low == pytest.approx(-half, rel=0.2) and high == pytest.approx(half, rel=0.2)
    assert high - low >= 0.95 * 2 * half  # the percentile interval: about 0.82 of it at ten items


def test_expanded_levels_match_students_t():
    for n in (5, 20, 200):
        low, high = expanded_levels(0.95, n)
        assert low == pytest.approx(1 - high)
        assert scipy_stats.norm.ppf(high) * math.sqrt((n - 1) / n) == pytest.approx(scipy_stats.t.ppf(0.975, n - 1))
    assert expanded_levels(0.95, 1) == pytest.approx((0.025, 0.975))


def test_rank_statistics_widen_the_percentile_interval_at_few_items_only():
    """Spearman and AP: the percentiles of the same resamples, at levels further out the fewer the items."""
    rng = np.random.default_rng(4)
    for n, least, most in ((12, 1.1, 1.6), (200, 1.0, 1.03)):
        gold = rng.normal(size=n)
        a, b = gold + 0.5 * rng.normal(size=n), gold + rng.normal(size=n)
        interval = paired_bootstrap(a, b, "spearman", gold, resamples=500, seed=1)
        arms = [a[None, :], b[None, :]]
        plain = np.percentile(_resampled("spearman", arms, gold, 500, 1), [2.5, 97.5])
        assert interval.low <= plain[0] and interval.high >= plain[1]
        assert least <= (interval.high - interval.low) / (plain[1] - plain[0]) <= most
        assert interval.method == EXPANDED_PERCENTILE
    labels = (rng.random(30) < 0.4).astype(float)
    scores = labels + rng.normal(size=30)
    low, high = bootstrap_interval(scores, "ap", labels, resamples=500)
    assert 0.0 <= low < high <= 1.0


def test_a_few_distinct_values_among_equal_ones_give_finite_bounds():
    """Resamples of only the 18 zeros have no standard error (an infinite t): the bound they reach is the expanded
    percentile one."""
    gains = np.zeros(20)
    gains[:2] = (0.3, 0.5)
    interval = paired_bootstrap(gains, np.zeros(20))
    assert np.isfinite(interval.low) and np.isfinite(interval.high)
    assert interval.low <= 0.04 <= interval.high <= 0.5
