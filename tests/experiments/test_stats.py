"""Experiment statistics on constructed per-item scores whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmembed.experiments.stats import (
    HOLDS,
    NOT_DISTINGUISHABLE,
    REVERSED,
    bootstrap_interval,
    compare,
    fractional_ranks,
    mean_std,
    paired_bootstrap,
    paired_randomization_test,
    seed_average,
    statistic_value,
)


def test_mean_and_sample_std_over_seeds():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert mean_std([0.4]) == (0.4, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))


def test_a_constant_gain_is_certain():
    rng = np.random.default_rng(0)
    b = rng.random(50)
    a = b + 0.1  # every query gains exactly 0.1
    interval = paired_bootstrap(a, b)
    assert interval.difference == pytest.approx(0.1)
    assert interval.low == pytest.approx(0.1) and interval.high == pytest.approx(0.1)
    # only the all-kept and all-swapped patterns are as extreme: 2 / 2**50, so no draw of 5000 reaches it
    assert paired_randomization_test(a, b, permutations=5000) == pytest.approx(1 / 5001)
    assert compare(a, b, expected=+1).verdict == HOLDS
    assert compare(a, b, expected=-1).verdict == REVERSED
    assert compare(b, a, expected=+1).verdict == REVERSED


def test_exact_randomization_test_by_enumeration():
    # five items: all 32 swap patterns are enumerated; |mean| >= 3 only for all-kept and all-swapped
    a, b = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.zeros(5)
    assert paired_randomization_test(a, b) == 2 / 32
    # differences that cancel: every pattern is at least as extreme as an observed 0
    assert paired_randomization_test([1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]) == 1.0
    # with p = 0.0625 five items can never be distinguishable at alpha 0.05
    assert compare(a, b, expected=+1).verdict == NOT_DISTINGUISHABLE


def test_identical_arms_are_not_distinguishable():
    a = np.random.default_rng(1).random(40)
    result = compare(a, a.copy(), expected=+1)
    assert result.difference == 0.0 and result.low == 0.0 and result.high == 0.0
    assert result.p_value == 1.0 and result.verdict == NOT_DISTINGUISHABLE


def test_interval_matches_the_normal_approximation():
    rng = np.random.default_rng(2)
    differences = rng.normal(0.05, 0.1, size=400)
    b = rng.random(400)
    a = b + differences
    interval = paired_bootstrap(a, b, resamples=4000, seed=3)
    half_width = 1.96 * differences.std(ddof=1) / math.sqrt(400)
    assert interval.difference == pytest.approx(differences.mean())
    assert interval.low == pytest.approx(differences.mean() - half_width, abs=0.15 * half_width)
    assert interval.high == pytest.approx(differences.mean() + half_width, abs=0.15 * half_width)
    # t = 0.05 / (0.1 / 20) = 10: no random sign pattern of 5000 comes close
    assert paired_randomization_test(a, b, seed=3) < 0.001
    assert compare(a, b, expected=+1, seed=3).verdict == HOLDS


def test_a_small_noisy_difference_is_not_distinguishable():
    rng = np.random.default_rng(4)
    b = rng.random(30)
    a = b + rng.normal(0.0, 0.2, size=30)  # no real difference, much noise
    result = compare(a, b, expected=+1)
    assert result.low < 0 < result.high and result.p_value > 0.05
    assert result.verdict == NOT_DISTINGUISHABLE


def test_spearman_statistic_and_paired_tests():
    gold = np.arange(40, dtype=float)
    noise = np.random.default_rng(5).normal(0, 0.01, 40)
    right, wrong = gold + noise, -gold + noise  # rho = +1 and -1
    assert statistic_value("spearman", right, gold) == pytest.approx(1.0)
    assert statistic_value("spearman", wrong, gold) == pytest.approx(-1.0)
    result = compare(right, wrong, "spearman", gold, expected=+1)
    assert result.difference == pytest.approx(2.0)
    assert result.low > 1.5 and result.p_value < 0.001 and result.verdict == HOLDS
    # scores on another scale but in the same order are the same prediction
    same = compare(right, 100 * right + 7, "spearman", gold, expected=+1)
    assert same.difference == 0.0 and same.verdict == NOT_DISTINGUISHABLE


def test_average_precision_statistic():
    labels = np.array([1, 1, 0, 0, 1, 0], dtype=float)
    perfect = np.array([0.9, 0.8, 0.1, 0.2, 0.7, 0.3])
    assert statistic_value("ap", perfect, labels) == pytest.approx(1.0)
    inverted = -perfect
    assert statistic_value("ap", inverted, labels) == pytest.approx((1 / 4 + 2 / 5 + 3 / 6) / 3)


def test_average_precision_equals_scikit_learn_with_ties_and_one_class_rows():
    """Every resample's AP is computed at once over rows; each must be scikit-learn's, ties taken as one threshold."""
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(3)
    for n in (2, 5, 40):
        for scores in (rng.normal(size=(20, n)), rng.integers(0, 4, size=(20, n)).astype(float)):
            labels = (rng.random((20, n)) < 0.4).astype(float)
            labels[0] = 0.0  # one class only: no AP
            for row, label in zip(scores, labels, strict=True):
                got = statistic_value("ap", row, label)
                if 0 < label.sum() < n:
                    assert got == pytest.approx(average_precision_score(label, row), abs=1e-12)
                else:
                    assert math.isnan(got)
    with pytest.raises(ValueError, match="labels of 0 and 1"):
        statistic_value("ap", [0.1, 0.2], [1.0, 2.0])


def test_seed_average():
    assert seed_average([[0.2, 0.4], [0.4, 0.8]]).tolist() == pytest.approx([0.3, 0.6])
    # rank statistics average each run's fractional ranks, so scales do not matter
    assert fractional_ranks([3.0, 1.0, 2.0]).tolist() == [1.0, 0.0, 0.5]
    averaged = seed_average([[0.1, 0.2, 0.3], [100.0, 300.0, 200.0]], "spearman")
    assert averaged.tolist() == pytest.approx([0.0, 0.75, 0.75])
    with pytest.raises(ValueError):
        seed_average([[1.0]], "median")  # type: ignore[arg-type]


def test_single_arm_interval_and_determinism():
    values = np.random.default_rng(6).random(200)
    low, high = bootstrap_interval(values, seed=1)
    assert low < values.mean() < high
    assert (low, high) == bootstrap_interval(values, seed=1)
    a, b = values, values[::-1].copy()
    assert compare(a, b, seed=9) == compare(a, b, seed=9)


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="reference"):
        paired_bootstrap([1.0, 2.0], [1.0, 2.0], "spearman", [1.0])


def test_rank_statistics_do_not_depend_on_each_arms_similarity_scale():
    """Spearman and AP see each arm's ordering only, so the p-value must not change when one arm's similarities
    are shifted and squeezed (one model's cosines sit in [0.2, 0.9], another's in [0.95, 1]). Swapping raw values
    between such arms scrambled both orderings and inflated p."""
    rng = np.random.default_rng(0)
    gold = rng.normal(size=400)
    a = gold + 0.3 * rng.normal(size=400)
    b = gold + 1.0 * rng.normal(size=400)
    same_scale = compare(a, b, "spearman", gold, expected=1)
    squeezed = compare(a, 100 + 0.01 * b, "spearman", gold, expected=1)
    assert same_scale.verdict == squeezed.verdict == "holds"
    assert squeezed.p_value == pytest.approx(same_scale.p_value) and squeezed.p_value < 0.001
    labels = (gold > 0).astype(float)
    assert compare(a, 100 + 0.01 * b, "ap", labels).p_value == pytest.approx(compare(a, b, "ap", labels).p_value)


def test_difference_of_differences_of_two_gaps():
    """``minus=(c, d)``: the gap a − b against the gap c − d (one backbone's joint − single-task gap against
    another's), on constructed items whose answer is known."""
    rng = np.random.default_rng(7)
    b, d = rng.random(50), rng.random(50)
    a, c = b - 0.05, d - 0.2  # every item: gap −0.05 against gap −0.2, so the first gap is 0.15 smaller
    result = compare(a, b, minus=(c, d), expected=+1)
    assert result.difference == pytest.approx(0.15)
    assert result.low == pytest.approx(0.15) and result.high == pytest.approx(0.15)
    assert result.p_value == pytest.approx(1 / 5001) and result.verdict == HOLDS
    assert compare(c, d, minus=(a, b), expected=+1).verdict == REVERSED
    # five items, enumerated: only the all-kept and all-swapped patterns reach |mean| = 3
    gaps = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    zero = np.zeros(5)
    assert paired_randomization_test(gaps, zero, minus=(zero, zero)) == 2 / 32
    # a second gap of 0 everywhere: the same interval and p as the plain paired test of a against b
    a, b = rng.random(40), rng.random(40)
    flat = rng.random(40)
    gaps, pair = compare(a, b, minus=(flat, flat)), compare(a, b)
    assert (gaps.difference, gaps.low, gaps.high) == pytest.approx((pair.difference, pair.low, pair.high))
    assert gaps.p_value == pair.p_value and gaps.verdict == pair.verdict


def test_difference_of_differences_with_spearman():
    rng = np.random.default_rng(8)
    gold = rng.normal(size=60)
    arms = [gold + scale * rng.normal(size=60) for scale in (0.2, 1.0, 0.5, 0.6)]
    rhos = [statistic_value("spearman", arm, gold) for arm in arms]
    result = compare(arms[0], arms[1], "spearman", gold, minus=(arms[2], arms[3]))
    assert result.difference == pytest.approx((rhos[0] - rhos[1]) - (rhos[2] - rhos[3]))
    assert result.low <= result.difference <= result.high and 0 < result.p_value <= 1
    # each arm's similarity scale does not matter (ranks only)
    squeezed = compare(arms[0], arms[1], "spearman", gold, minus=(100 + 0.01 * arms[2], arms[3]))
    assert squeezed.difference == pytest.approx(result.difference) and squeezed.p_value == result.p_value


def test_difference_of_differences_needs_four_equal_arms():
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([1.0, 2.0], [1.0, 2.0], minus=([1.0, 2.0], [1.0]))


def test_an_arm_of_several_runs_scores_as_the_mean_of_its_runs_statistics():
    """Spearman over seeds was taken of the seeds' averaged ranks, a number the scores table never printed (STS-B:
    a − b −0.97 against means differing by −2.03; the sign could flip) and one that favoured the arm with more
    seeds. Given one row per run, an arm scores as the mean of its runs' statistics, interval included."""
    from scipy.stats import spearmanr

    from lmembed.experiments.stats import bootstrap_interval, compare

    rng = np.random.default_rng(4)
    gold = rng.normal(size=40)
    a_runs = [gold + rng.normal(scale=1.0, size=40) for _ in range(3)]
    b_run = gold + rng.normal(scale=1.0, size=40)
    want = np.mean([spearmanr(run, gold)[0] for run in a_runs]) - spearmanr(b_run, gold)[0]
    result = compare(a_runs, [b_run], "spearman", gold, resamples=500, permutations=200)
    assert result.difference == pytest.approx(want, abs=1e-12) and result.items == 40
    assert result.low <= result.difference <= result.high
    averaged = spearmanr(seed_average(a_runs, "spearman"), gold)[0] - spearmanr(b_run, gold)[0]
    assert abs(averaged - want) > 1e-3  # the averaged-ranks number is another one
    low, high = bootstrap_interval(a_runs, "spearman", gold, resamples=500)
    assert low <= np.mean([spearmanr(run, gold)[0] for run in a_runs]) <= high
    mean_runs = compare(a_runs, [b_run], "mean", resamples=200, permutations=200)  # means: unchanged
    assert mean_runs.difference == pytest.approx(np.mean(a_runs) - np.mean(b_run))


def test_an_items_file_with_a_repeated_id_is_refused():
    """Arms are paired by item id: ids q1, q1, q2 with values 1.0, 0.0, 0.5 silently became two items, q1 = 0.0."""
    from pydantic import ValidationError

    from lmembed.experiments.plan import ItemScores

    with pytest.raises(ValidationError, match="item id 'q1' appears more than once"):
        ItemScores(statistic="mean", ids=["q1", "q1", "q2"], values=[1.0, 0.0, 0.5], reference=None)
    assert ItemScores(statistic="mean", ids=["q1", "q2"], values=[1.0, 0.5], reference=None).ids == ["q1", "q2"]


def test_the_loss_row_compares_means_of_consecutive_step_blocks():
    """Per-step losses are correlated: as independent items, "differs" came out 23-81 % of the time with no
    difference (AR(1) 0.5-0.95); the loss row pairs block means, laid out by the measured correlation
    (tests/experiments/test_stats_loss.py has the type-I error at strong correlation)."""
    from lmembed.experiments.summary import loss_blocks

    assert loss_blocks([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 3.5]
    assert loss_blocks([1.0] * 9 + [4.0], 3) == [1.0, 1.0, 1.75]  # blocks of 3, the last takes the rest
    assert loss_blocks(list(range(10)), 2, gap=1) == [0.5, 3.5, 7.5]  # 0-1, 3-4, then 6 to the end
    assert loss_blocks([2.0]) == [2.0] and loss_blocks([1.0, 2.0, 3.0, 4.0]) == [1.0, 2.0, 3.0, 4.0]  # < 6 steps
    rng = np.random.default_rng(0)
    alarms = {"blocks": 0, "steps": 0}
    for _ in range(40):  # no true difference, step-to-step correlation 0.8, 36 steps
        noise = np.zeros(36)
        for t in range(1, 36):
            noise[t] = 0.8 * noise[t - 1] + rng.normal()
        for kind, items in (("blocks", loss_blocks), ("steps", list)):
            values = items(list(noise))
            result = compare(values, [0.0] * len(values), permutations=500, resamples=500)
            alarms[kind] += result.verdict != "not distinguishable"
    # 36 steps at this correlation hold about four independent values: mostly too few blocks for any verdict (the
    # √n blocks before: 5 of these 40)
    assert alarms["blocks"] <= 2 and alarms["steps"] >= 10, alarms


def test_arms_that_scored_different_items_are_paired_on_the_shared_ones_and_the_log_says_so(caplog):
    from lmembed.experiments.summary import _common_ids

    a = [({"q1": 1.0, "q2": 0.5, "q3": 0.2}, None)]
    b = [({"q2": 0.4, "q3": 0.1}, None)]
    with caplog.at_level("WARNING", logger="lmembed.experiments.summary"):
        assert _common_ids(a, b, task="SciFact") == ["q2", "q3"]
    assert "SciFact: the runs compared scored different items (2 to 3); the comparison pairs the 2" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="lmembed.experiments.summary"):
        assert _common_ids(a, a, task="SciFact") == ["q1", "q2", "q3"]
    assert caplog.text == ""


def test_holm_adjusts_a_family_of_p_values_step_down():
    """Each comparison was judged at 0.05 alone. Holm's adjusted p (checked on a hand-worked family, and as the
    smallest α at which Holm's step-down procedure rejects each hypothesis) now judges an experiment's verdicts."""
    from lmembed.experiments.stats import holm

    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 -> ×4, ×3, ×2, ×1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    for alpha in (0.025, 0.05, 0.07):  # the step-down procedure by hand
        ordered = sorted(range(len(p)), key=p.__getitem__)
        rejected = set()
        for rank, i in enumerate(ordered):
            if p[i] > alpha / (len(p) - rank):
                break
            rejected.add(i)
        assert {i for i, a in enumerate(holm(p)) if a <= alpha} == rejected
