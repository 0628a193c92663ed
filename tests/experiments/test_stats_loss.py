"""The training-loss row: blocks of steps laid out by the step-to-step correlation of the compared difference."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lmembed.experiments.stats import NOT_DISTINGUISHABLE, compare
from lmembed.experiments.summary import LOSS_TASK, _comparisons, loss_block_layout, loss_blocks


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """A stationary AR(1) series of lag-1 correlation ``phi`` and unit innovations."""
    x = np.empty(n)
    x[0] = rng.normal() / math.sqrt(1 - phi * phi)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + rng.normal()
    return x


def _flagged(series: np.ndarray, seed: int) -> bool:
    items = loss_blocks(list(series))
    if len(items) < 2:
        return False  # one block: the summary judges nothing
    result = compare(items, [0.0] * len(items), permutations=500, resamples=300, seed=seed)
    return result.verdict != NOT_DISTINGUISHABLE


def test_the_layout_follows_the_step_to_step_correlation():
    rng = np.random.default_rng(0)
    assert loss_block_layout(rng.normal(size=2000)) == (1, 0)  # independent steps stay single items
    length, gap = loss_block_layout(_ar1(rng, 5000, 0.9))
    assert 50 <= length <= 200 and 0 < gap <= length
    falling = np.exp(-np.arange(300) / 50) + 0.01 * rng.normal(size=300)
    assert loss_block_layout(falling) == (300, 0)  # a falling curve alone is one block
    assert loss_block_layout(np.cumsum(rng.normal(size=300))) == (300, 0)  # a random walk: nothing to block
    assert loss_block_layout([3.0, 1.0, 2.0, 5.0, 4.0]) == (1, 0)  # five steps: too few to estimate anything


def test_strongly_correlated_losses_are_rarely_called_different():
    """No true difference, the per-step difference an AR(1) of lag-1 correlation 0.95 (400 steps) or 0.99 (300
    steps), as training curves are: blocks of √n steps (the rule before) called 75 of these 200 pairs
    "distinguishable" at alpha 0.05; blocks laid out by the measured correlation call none (at most 6 % allowed)."""
    rng = np.random.default_rng(95)
    alarms = 0
    for rep in range(100):
        alarms += _flagged(_ar1(rng, 400, 0.95), rep)
        alarms += _flagged(_ar1(rng, 300, 0.99), rep)
    assert alarms <= 12, alarms


def test_a_real_loss_difference_is_still_found():
    """A constant true difference of one marginal standard deviation at lag-1 correlation 0.9 over 600 steps: found
    in 96 of 100 experiments (spaced blocks; without the gaps, blocks long enough for that correlation left too few
    of them to find it at all)."""
    rng = np.random.default_rng(90)
    found = sum(_flagged(_ar1(rng, 600, 0.9) + 1 / math.sqrt(1 - 0.81), rep) for rep in range(100))
    assert found >= 85, found


def _loss_summary(curves: dict[str, list[np.ndarray]]) -> dict:
    """The loss row's comparison of arm a against arm b, built by the summary from runs with these loss curves."""
    finished = [
        (SimpleNamespace(arm=SimpleNamespace(name=arm)), {"losses": {"train": list(curve)}}, {})
        for arm, runs in curves.items()
        for curve in runs
    ]
    spec = SimpleNamespace(compare=[SimpleNamespace(a="a", b="b", minus=None, expected=1, tasks=None)])
    tasks = [{"name": LOSS_TASK, "statistic": "mean", "higher_is_better": False}]
    scores = {arm: {LOSS_TASK: {"mean": float(np.mean(runs)), "n": len(runs)}} for arm, runs in curves.items()}
    (entry,) = _comparisons(spec, finished, tasks, scores)  # type: ignore[arg-type]
    return entry


def test_the_summary_blocks_the_compared_difference_not_each_curve():
    """Two arms share the falling curve of training; what differs between them is independent step noise and a
    lower loss for a. Each curve alone is one block (its fall is one long correlation), the difference is not: the
    comparison pairs many short blocks and finds the gain. The same arms with strongly correlated step noise get few
    blocks, and no verdict the noise could have made."""
    rng = np.random.default_rng(1)
    steps = 400
    falling = 2.0 * np.exp(-np.arange(steps) / 80) + 0.5
    a, b = falling - 0.02 + 0.05 * rng.normal(size=steps), falling + 0.05 * rng.normal(size=steps)
    assert loss_block_layout(a)[0] == steps
    entry = _loss_summary({"a": [a], "b": [b]})
    assert entry["items"] >= 100 and entry["method"] == "items" and entry["verdict"] == "holds"
    correlated = falling + 0.05 * _ar1(rng, steps, 0.99)
    entry = _loss_summary({"a": [correlated], "b": [falling]})
    assert entry["items"] <= 5 and entry["verdict"] in (NOT_DISTINGUISHABLE, "too few blocks")
    # several seeds: the runs' spread is the test even where the steps give one block
    runs = {arm: [falling + 0.05 * _ar1(rng, steps, 0.99) for _ in range(3)] for arm in "ab"}
    entry = _loss_summary(runs)
    assert entry["method"] == "seeds and items" and entry["p_value"] is not None
