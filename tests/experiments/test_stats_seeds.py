"""The seed-to-seed spread of training in the paired tests: an arm of several runs is judged over seeds and items."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lmembed.experiments.stats import (
    HOLDS,
    ITEMS,
    NOT_DISTINGUISHABLE,
    SEEDS_AND_ITEMS,
    bootstrap_interval,
    compare,
    paired_bootstrap,
    paired_randomization_test,
    seed_level_test,
)


def test_seeds_that_disagree_make_a_certain_item_level_gain_uncertain():
    """Every item gains exactly 0.1 on the seed average, so over items alone the gain is certain (the item test:
    p = 1/5001, interval [0.1, 0.1], "holds"), but arm a's three seeds shifted its whole score by +0.3, -0.1 and
    +0.1: over seeds the gain is 0.1 ± 0.2 / sqrt(3), a t of 0.87 with 2 degrees of freedom."""
    base = np.random.default_rng(0).random(50)
    a = np.array([base + shift for shift in (0.3, -0.1, 0.1)])
    b = np.array([base, base, base])
    assert paired_randomization_test(a, b) == pytest.approx(1 / 5001)  # the items see no doubt at all
    result = compare(a, b, expected=+1)
    assert result.verdict == NOT_DISTINGUISHABLE and result.p_value > 0.4
    se = np.std([0.3, -0.1, 0.1], ddof=1) / np.sqrt(3)
    assert result.p_value == pytest.approx(2 * scipy_stats.t.sf(0.1 / se, 2))
    assert result.low == pytest.approx(0.1 - scipy_stats.t.ppf(0.975, 2) * se)
    assert result.method == SEEDS_AND_ITEMS and result.difference == pytest.approx(0.1)
    assert result.df == pytest.approx(2.0)


def test_the_seed_level_test_is_welchs_t_when_items_do_not_vary():
    """Each run the same value on every item: the only spread is between seeds, and the test is Welch's t test of
    the runs' scores (Welch-Satterthwaite degrees of freedom), which scipy computes independently."""
    rng = np.random.default_rng(1)
    a_scores, b_scores = rng.normal(0.5, 0.05, 3), rng.normal(0.45, 0.02, 4)
    a = np.repeat(a_scores[:, None], 30, axis=1)
    b = np.repeat(b_scores[:, None], 30, axis=1)
    welch = scipy_stats.ttest_ind(a_scores, b_scores, equal_var=False)
    result = seed_level_test(a, b)
    assert result.difference == pytest.approx(a_scores.mean() - b_scores.mean())
    assert result.p_value == pytest.approx(welch.pvalue) and result.item_variance == 0.0
    assert result.df == pytest.approx(welch.df)


def test_equal_arms_with_seed_noise_are_rarely_distinguishable():
    """No true difference, three seeds per arm, each seed shifting its run's whole score (sd 0.04) besides item
    noise: the item-only test (seed-averaged items, as the tests were before) calls 87 of these 200 pairs
    "distinguishable" at alpha 0.05; over seeds and items, 11."""
    rng = np.random.default_rng(2)
    distinguishable = item_only = 0
    experiments = 200
    for rep in range(experiments):
        base = rng.random(50)
        arms = [
            base + rng.normal(0, 0.05, 50) + rng.normal(0, 0.04, (3, 1)) + rng.normal(0, 0.1, (3, 50)) for _ in "ab"
        ]
        result = compare(arms[0], arms[1], seed=rep)
        distinguishable += result.verdict != NOT_DISTINGUISHABLE
        item_only += paired_randomization_test(arms[0], arms[1], permutations=200, seed=rep) < 0.05
    assert distinguishable <= 0.08 * experiments, distinguishable
    assert item_only >= 0.25 * experiments, item_only  # what ignoring the seeds gives on the same experiments


def test_a_real_gain_is_found_over_seeds():
    """A true gain of 0.08 over five seeds per arm (seed sd 0.02): found in nearly every experiment (power: 97 of
    100), and the interval holds the truth in about 95 % of them."""
    rng = np.random.default_rng(3)
    holds = covered = 0
    experiments = 100
    for rep in range(experiments):
        base = rng.random(50)
        a, b = (
            base + rng.normal(0, 0.05, 50) + rng.normal(0, 0.02, (5, 1)) + rng.normal(0, 0.1, (5, 50)) for _ in "ab"
        )
        result = compare(a + 0.08, b, expected=+1, seed=rep)
        holds += result.verdict == HOLDS
        covered += result.low <= 0.08 <= result.high
    assert holds >= 0.85 * experiments and covered >= 0.88 * experiments, (holds, covered)


def test_one_run_per_arm_is_judged_over_items_as_before():
    rng = np.random.default_rng(4)
    b = rng.random(40)
    a = b + rng.normal(0.03, 0.1, 40)
    result = compare(a, b, seed=5)
    assert result.method == ITEMS and result.df is None
    assert result.p_value == paired_randomization_test(a, b, seed=5)
    interval = paired_bootstrap(a, b, seed=5)
    assert (result.low, result.high) == (interval.low, interval.high)
    # given as lists of one run each: the same
    assert compare([a], [b], seed=5) == result


def test_an_untrained_arm_of_one_run_adds_no_seed_term():
    """The arm that does not train runs once: only the trained arm's seeds spread."""
    rng = np.random.default_rng(6)
    base = rng.random(60)
    trained = base + 0.05 + rng.normal(0, 0.03, (3, 1)) + rng.normal(0, 0.05, (3, 60))
    result = seed_level_test(trained, base)
    spread = np.var(trained.mean(axis=1), ddof=1)
    assert 0 < result.seed_variance <= spread / 3
    assert result.item_variance == pytest.approx(np.var(trained.mean(axis=0) - base, ddof=1) / 60)


def test_spearman_seeds_that_disagree_are_not_a_difference():
    """Arm a's three seeds reach rho 0.98, 0.77 and 0.29, arm b's about 0.53 each: over the 300 pairs alone a
    clear gain (the item-only randomization test: p = 0.003, and the verdict before: "differs"), over seeds one run
    of a is below b, and the difference is not distinguishable."""
    rng = np.random.default_rng(0)
    gold = rng.normal(size=300)
    a = np.array([gold + s * rng.normal(size=300) for s in (0.2, 0.9, 3.0)])
    b = np.array([gold + s * rng.normal(size=300) for s in (1.4, 1.5, 1.6)])
    assert paired_randomization_test(a, b, "spearman", gold, permutations=300) < 0.01
    result = compare(a, b, "spearman", gold, resamples=300)
    assert result.verdict == NOT_DISTINGUISHABLE and result.p_value > 0.3
    assert -2.0 <= result.low < 0 < result.high <= 2.0  # a t interval cut to what a difference of rhos can be
    assert result.method == SEEDS_AND_ITEMS


def test_an_arm_given_twice_enters_the_seed_variance_once():
    """(cls − untrained) − (mean − untrained) is cls − mean: the same difference, the interval negated and the same p
    as the pair mean against cls (the untrained arm's terms cancel; each trained arm's seeds counted once)."""
    rng = np.random.default_rng(8)
    base = rng.random(30)
    mean_arm = base + rng.normal(0, 0.05, (2, 1)) + rng.normal(0, 0.1, (2, 30))
    cls_arm = base - 0.05 + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.1, (3, 30))
    untrained = base + rng.normal(0, 0.1, 30)
    pair = compare(mean_arm, cls_arm)
    gaps = compare(cls_arm, [untrained], minus=(mean_arm, [untrained]))
    assert gaps.difference == pytest.approx(-pair.difference)
    assert (gaps.low, gaps.high) == pytest.approx((-pair.high, -pair.low))
    assert gaps.p_value == pytest.approx(pair.p_value) and gaps.df == pytest.approx(pair.df)
    # the same arm as b and as d of (a − b) − (c − d): its seeds' spread cancels with its weight
    same = seed_level_test(mean_arm, cls_arm, minus=(untrained[None, :], cls_arm))
    assert same.seed_variance == pytest.approx(seed_level_test(mean_arm, untrained[None, :]).seed_variance)


def test_interval_and_p_agree_and_the_arms_interval_holds_the_seed_spread():
    rng = np.random.default_rng(9)
    for rep in range(20):
        a = rng.random(25) + rng.normal(0, 0.05, (2, 1)) + rng.normal(0.05, 0.1, (2, 25))
        b = rng.random(25)
        result = compare(a, b, seed=rep)
        assert (result.p_value < 0.05) == (result.low > 0 or result.high < 0)
    runs = np.array([np.full(20, 0.5), np.full(20, 0.7), np.full(20, 0.6)])  # items alike, seeds apart
    low, high = bootstrap_interval(runs)
    half = scipy_stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert (low, high) == pytest.approx((0.6 - half, 0.6 + half))


def test_the_report_says_what_each_comparison_covers():
    from lmembed.experiments.report import experiment_markdown

    base = {"a": "tuned", "b": "base", "claim": "better", "difference": 0.02, "low": 0.01, "high": 0.03}
    summary = {
        "experiment": {"name": "x", "seeds": [0, 1, 2]},
        "tasks": [{"name": "T", "task_type": "Retrieval", "main_metric": "ndcg_at_10", "scale": 100.0}],
        "arms": [{"name": "tuned", "kind": "train", "runs": 3}, {"name": "base", "kind": "no training", "runs": 1}],
        "scores": {},
        "comparisons": [
            {**base, "task": "T", "p_value": 0.01, "verdict": "holds", "method": "seeds and items", "df": 2.26},
            {**base, "task": "T", "p_value": 0.01, "verdict": "holds"},  # written before: over items
            {**base, "task": "train loss", "p_value": None, "verdict": "too few blocks", "low": None, "high": None},
        ],
    }
    markdown = experiment_markdown(summary)
    assert "| seeds + items (df 2.3) | **holds** |" in markdown
    assert "| items | **holds** |" in markdown and "| – | **too few blocks** |" in markdown
