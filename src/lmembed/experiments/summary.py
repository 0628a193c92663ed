"""The summary of an experiment, built from its finished runs: per-arm spread over seeds and paired tests.

For every arm and task: the task's main score as mean ± sample std over the arm's runs (seeds), and a 95 %
interval of the arm's score (:func:`~lmembed.experiments.stats.bootstrap_interval`: over items for an arm of one
run, over seeds and items for an arm of several, whose score is the mean of its runs'). For every comparison
(``compare`` in the file, default: each arm against the first) and task: the paired difference over the items both
arms were scored on, its interval and two-sided p (:func:`~lmembed.experiments.stats.compare`: with one run per arm
the item bootstrap and the paired randomization test, ``method`` "items"; when an arm has several runs, a t test
whose variance adds each arm's seed-to-seed spread to the items', ``method`` "seeds and items" with its ``df``),
that p adjusted by Holm's method over the experiment's comparisons (``p_holm``, one family) and the verdict judged
with it (:func:`~lmembed.experiments.stats.holm`); a comparison with ``minus: [c, d]`` tests the gap a − b against
the gap c − d over the items all four share. Every run of an arm goes to the tests as its own row of item values.

Arms that train also get a ``train loss`` row: the per-step loss of their last training stage. Two such arms are
compared on means of blocks of steps (same seeds, same data order), lower being better; the blocks are laid out
by the step-to-step correlation of the compared per-step difference (:func:`loss_block_layout`: spaced batch
means whose neighbours correlate at most 0.02 under an AR(1) fitted to it), the same blocks for every run. A
seeded loop in tests/experiments/test_stats_loss.py counts false "distinguishable" at strong step correlation. A
comparison left with one block of one run per arm says *too few blocks*. The arm's own loss cell is blocked by
its mean curve, whose fall makes it one block: an interval over its seeds, none for one run.

``summary.json`` is written here; the Markdown and the PNG are drawn from it by
:mod:`lmembed.experiments.report` (which ``lmembed report`` uses too).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as student_t

from lmembed.atomic import atomic_write_json
from lmembed.experiments.plan import PlannedRun
from lmembed.experiments.report import SUMMARY_FILE, SUMMARY_FORMAT, write_experiment_report
from lmembed.experiments.spec import CompareSpec, ExperimentSpec
from lmembed.experiments.stats import bootstrap_interval, compare, holm, mean_std, verdict

log = logging.getLogger(__name__)

LOSS_TASK = "train loss"
CLAIM_NAMES = {1: "better", -1: "worse", 0: "none"}


def _finished(runs: Sequence[PlannedRun]) -> list[tuple[PlannedRun, dict[str, Any], dict[str, Any]]]:
    out = []
    for run in runs:
        record = run.record()
        if record is None:
            continue
        out.append((run, record, run.items()))
    return out


def _task_rows(finished: Sequence[tuple[PlannedRun, dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for _, record, items in finished:
        for name, task in record["tasks"].items():
            tasks.setdefault(
                name,
                {
                    "name": name,
                    "task_type": task["task_type"],
                    "main_metric": task["main_metric"],
                    "statistic": (items.get(name) or {}).get("statistic"),
                    "higher_is_better": True,
                    "scale": 100.0,
                },
            )
    rows = list(tasks.values())
    if any(record.get("losses") for _, record, _ in finished):
        rows.append(
            {
                "name": LOSS_TASK,
                "task_type": "Training",
                "main_metric": "loss (last stage; compared on means of step blocks laid out by their correlation)",
                "statistic": "mean",
                "higher_is_better": False,
                "scale": 1.0,
            }
        )
    return rows


#: The largest correlation between neighbouring block means that :func:`loss_block_layout` accepts.
BLOCK_CORRELATION = 0.02
#: Below this many steps no layout is estimated (blocks of one step): five items or fewer cannot bring the
#: randomization test's p below 0.05 (2 / 32), and with several seeds the runs' spread carries the steps' correlation.
MIN_STEPS_FOR_BLOCKS = 6


def _lag_one(series: np.ndarray) -> float:
    """The lag-1 autocorrelation of ``series``: least squares on the centred series, corrected for its downward
    bias in short series (Kendall 1954; Marriott & Pope 1954: E[phi_hat] ~ phi - (1 + 3 phi) / n)."""
    centred = series - series.mean()
    denominator = float(np.dot(centred[:-1], centred[:-1]))
    if denominator <= 0:
        return 0.0  # a constant series: no correlation to speak of
    phi_hat = float(np.dot(centred[1:], centred[:-1])) / denominator
    return phi_hat + (1 + 3 * phi_hat) / series.size


def _block_mean_correlation(phi: float, lengths: np.ndarray) -> np.ndarray:
    """The correlation of neighbouring means of ``lengths`` consecutive values of a stationary AR(1) process with
    lag-1 correlation ``phi`` (0 < phi < 1): ``phi (1 - phi^L)^2 / (L (1 - phi^2) - 2 phi (1 - phi^L))``; with a
    gap of g values between the blocks, ``phi^g`` times that."""
    power = phi**lengths
    return phi * (1 - power) ** 2 / (lengths * (1 - phi * phi) - 2 * phi * (1 - power))


def _block_mean_variance(phi: float, lengths: np.ndarray) -> np.ndarray:
    """The variance of the mean of ``lengths`` consecutive AR(1) values, in units of one value's variance."""
    power = phi**lengths
    return (lengths + 2 * phi * (lengths * (1 - phi) - 1 + power) / (1 - phi) ** 2) / lengths**2


def loss_block_layout(series: Sequence[float], max_correlation: float = BLOCK_CORRELATION) -> tuple[int, int]:
    """The loss row's blocks for ``series`` (for a comparison: the per-step difference of the arms' losses, whose
    correlation is what the test must not take for independent items): ``(length, gap)``, blocks of ``length``
    consecutive steps with ``gap`` steps left out between neighbours (spaced batch means: Fox, Goldsman & Swain
    1991, Operations Research Letters 10(5)).

    The step-to-step correlation phi is the series' bias-corrected lag-1 autocorrelation (:func:`_lag_one`). Under
    an AR(1) with that phi, each block length L gets the smallest gap g (at most L) that brings the correlation of
    neighbouring block means to ``max_correlation`` (:data:`BLOCK_CORRELATION`, 0.02) or below, and of those layouts
    the one whose 95 % t interval of the mean difference would be shortest (the variance of the mean of the B
    blocks that fit, times Student's t with B - 1 degrees of freedom) is taken. Uncorrelated steps stay single
    items; at phi = 0.5 (median over simulated series) 300 steps give 23 blocks of 11 steps 2 apart, 1000 steps 50
    of 19; at phi = 0.9 300 steps give 6 blocks of 30 steps 22 apart, 1000 steps 13 of 62 steps 15 apart; where no
    layout holds two blocks (phi near 1, or few steps), one block of all steps. That is what such a curve holds: n
    steps at lag-1 correlation phi carry about n (1 - phi) / (1 + phi) independent values, and fewer than six
    blocks can never make the randomization test's p fall below 0.05. Fewer than :data:`MIN_STEPS_FOR_BLOCKS`
    steps: blocks of one step, no gap."""
    x = np.asarray(series, dtype=np.float64)
    n = x.size
    if n < MIN_STEPS_FOR_BLOCKS:
        return 1, 0
    phi = _lag_one(x)
    if phi <= 0:
        return 1, 0
    if phi >= 1:
        return n, 0
    lengths = np.arange(1, n + 1, dtype=np.float64)
    correlation = _block_mean_correlation(phi, lengths)
    with np.errstate(divide="ignore"):
        gaps = np.where(
            correlation <= max_correlation, 0.0, np.ceil(np.log(max_correlation / correlation) / math.log(phi))
        )
    blocks = np.floor((n + gaps) / (lengths + gaps))
    usable = (gaps <= lengths) & (blocks >= 2)
    if not usable.any():
        return n, 0
    half_width = np.full(n, np.inf)
    half_width[usable] = student_t.ppf(0.975, blocks[usable] - 1) * np.sqrt(
        _block_mean_variance(phi, lengths[usable]) / blocks[usable]
    )
    best = int(np.argmin(half_width))
    return int(lengths[best]), int(gaps[best])


def loss_block_length(series: Sequence[float], max_correlation: float = BLOCK_CORRELATION) -> int:
    """The block length of :func:`loss_block_layout` (the steps one loss block takes)."""
    return loss_block_layout(series, max_correlation)[0]


def loss_blocks(losses: Sequence[float], length: int | None = None, gap: int = 0) -> list[float]:
    """The means of blocks of ``length`` consecutive steps, ``gap`` steps apart (default: the layout
    :func:`loss_block_layout` gives for ``losses`` themselves; the steps after the last whole block join it): the
    items a loss comparison pairs. Consecutive steps' losses are correlated, and taken as independent items they
    made "differs" come out far more often than 5 % with no difference at all; blocks of a fixed √n steps (the rule
    before) still did at strong step-to-step correlation (tests/experiments/test_stats_loss.py). Blocks laid out by
    the measured correlation are close to the independent items the randomization test assumes."""
    n = len(losses)
    if length is None:
        length, gap = loss_block_layout(losses)
    size = max(1, min(n, int(length)))
    gap = max(0, int(gap))
    blocks = max(1, (n + gap) // (size + gap))
    starts = [i * (size + gap) for i in range(blocks)]
    ends = [start + size for start in starts[:-1]] + [n]  # the steps after the last whole block join it
    return [float(np.mean(losses[start:end])) for start, end in zip(starts, ends, strict=True)]


def _last_stage_losses(record: Mapping[str, Any]) -> list[float]:
    losses = record.get("losses") or {}
    return list(losses[list(losses)[-1]]) if losses else []


def _arm_items(
    finished: Sequence[tuple[PlannedRun, dict[str, Any], dict[str, Any]]], arm: str, task: str
) -> list[tuple[dict[str, float], list[float] | None]]:
    """Per run of ``arm``: {item id: value} on ``task`` and the reference values (by item order)."""
    out = []
    for run, record, items in finished:
        if run.arm.name != arm:
            continue
        if task == LOSS_TASK:  # steps as items; blocked once the runs compared are known (_blocked)
            losses = _last_stage_losses(record)
            if losses:
                out.append(({str(i): v for i, v in enumerate(losses)}, None))
            continue
        entry = items.get(task)
        if not entry or entry.get("statistic") is None:
            continue
        values = dict(zip(entry["ids"], entry["values"], strict=True))
        reference = entry.get("reference")
        ref_by_id = dict(zip(entry["ids"], reference, strict=True)) if reference is not None else None
        out.append((values, ref_by_id))  # type: ignore[arg-type]
    return out


def _aligned(
    per_run: Sequence[tuple[dict[str, float], Any]], ids: Sequence[str], statistic: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """The runs' values over ``ids`` (one row per run: an arm scores as the mean of its runs' statistics, as the
    scores table does, and the tests see the runs apart, so the seed-to-seed spread enters them) and the reference
    values in that order."""
    matrix = np.array([[run[0][i] for i in ids] for run in per_run], dtype=np.float64)
    reference = per_run[0][1]
    return matrix, (np.array([reference[i] for i in ids]) if reference is not None else None)


def _blocked(arms: Sequence[np.ndarray], series: np.ndarray) -> list[np.ndarray]:
    """The loss row's items: every run of every arm (``(runs, steps)``) cut into the same blocks of consecutive steps,
    laid out by the step-to-step correlation of ``series`` (:func:`loss_block_layout`)."""
    length, gap = loss_block_layout(series)
    return [np.array([loss_blocks(list(run), length, gap) for run in x]) for x in arms]


def _testable(arms: Sequence[np.ndarray], task: str) -> bool:
    """Enough items to judge: two, or for the loss row one block when an arm has several runs (their spread is the
    test then)."""
    items = arms[0].shape[1]
    return items >= 2 or (task == LOSS_TASK and items == 1 and any(x.shape[0] > 1 for x in arms))


def _common_ids(*groups: Sequence[tuple[dict[str, float], Any]], task: str = "") -> list[str]:
    """The item ids every run of every group scored (in the first run's order); fewer than a run has is said in
    the log, as the comparison then pairs only the shared items."""
    sets = [set(run[0]) for group in groups for run in group]
    if not sets:
        return []
    common = set.intersection(*sets)
    if task != LOSS_TASK and any(len(s) != len(common) for s in sets):
        log.warning(
            "%s: the runs compared scored different items (%d to %d); the comparison pairs the %d they share",
            task or "a task",
            min(map(len, sets)),
            max(map(len, sets)),
            len(common),
        )
    first = groups[0][0][0]
    return [i for i in first if i in common]


def _matches(requested: str, task: str) -> bool:
    return task == requested or task.startswith(f"{requested}[") or task.lower() == requested.lower()


def _score_table(
    spec: ExperimentSpec,
    finished: Sequence[tuple[PlannedRun, dict[str, Any], dict[str, Any]]],
    tasks: Sequence[dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for arm in spec.arms:
        records = [record for run, record, _ in finished if run.arm.name == arm.name]
        row: dict[str, Any] = {}
        for task in tasks:
            name = task["name"]
            if name == LOSS_TASK:
                values = [float(np.mean(losses)) for r in records if (losses := _last_stage_losses(r))]
            else:
                values = [r["tasks"][name]["main_score"] for r in records if name in r["tasks"]]
            if not values:
                continue
            mean, std = mean_std(values)
            cell: dict[str, Any] = {"mean": mean, "std": std, "n": len(values), "values": values, "interval": None}
            per_run = _arm_items(finished, arm.name, name)
            statistic = task["statistic"]
            if per_run and statistic:
                ids = _common_ids(per_run, task=name)
                if ids:
                    runs, reference = _aligned(per_run, ids, statistic)
                    if name == LOSS_TASK:  # blocks from the arm's mean curve (a falling curve: often one block)
                        runs = _blocked([runs], runs.mean(axis=0))[0]
                    if _testable([runs], name):
                        cell["interval"] = list(bootstrap_interval(runs, statistic, reference))
                        cell["items"] = runs.shape[1]
            if name == LOSS_TASK:
                curves = [_last_stage_losses(r) for r in records if _last_stage_losses(r)]
                length = min(len(c) for c in curves)
                cell["curve"] = np.mean([c[:length] for c in curves], axis=0).tolist()
            row[name] = cell
        table[arm.name] = row
    return table


def _comparisons(
    spec: ExperimentSpec,
    finished: Sequence[tuple[PlannedRun, dict[str, Any], dict[str, Any]]],
    tasks: Sequence[dict[str, Any]],
    scores: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    out = []
    for pair in spec.compare:
        for task in tasks:
            name = task["name"]
            if not _wanted(pair, name):
                continue
            arms = [pair.a, pair.b, *(pair.minus or ())]
            cells = [scores.get(arm, {}).get(name) for arm in arms]
            if any(cell is None for cell in cells):
                continue
            means = [cell["mean"] for cell in cells]  # type: ignore[index]
            sign = 1 if task["higher_is_better"] else -1
            entry: dict[str, Any] = {
                "a": pair.a,
                "b": pair.b,
                "task": name,
                "claim": CLAIM_NAMES[pair.expected],
                "a_mean": means[0],
                "b_mean": means[1],
                "seeds": [cell["n"] for cell in cells],  # type: ignore[index]
            }
            if pair.minus:  # the gap a − b against the gap c − d
                entry.update({"minus": list(pair.minus), "c_mean": means[2], "d_mean": means[3]})
            arm_runs = [_arm_items(finished, arm, name) for arm in arms]
            ids = _common_ids(*arm_runs, task=name) if all(arm_runs) else []
            matrices: list[np.ndarray] = []
            reference = None
            if task["statistic"] and ids:
                aligned = [_aligned(runs, ids, task["statistic"]) for runs in arm_runs]
                matrices, reference = [m for m, _ in aligned], aligned[0][1]
                if name == LOSS_TASK:  # blocks from the correlation of the compared per-step difference
                    signs = (1, -1, -1, 1)
                    contrast = sum(sgn * m.mean(axis=0) for sgn, m in zip(signs, matrices, strict=False))
                    matrices = _blocked(matrices, np.asarray(contrast))
            if matrices and _testable(matrices, name):
                minus = (matrices[2], matrices[3]) if pair.minus else None
                result = compare(
                    matrices[0], matrices[1], task["statistic"], reference, minus=minus, expected=sign * pair.expected
                )
                entry.update(result.to_dict())
            else:
                gaps = means[0] - means[1] - (means[2] - means[3] if pair.minus else 0.0)
                entry.update(
                    {
                        "difference": gaps,
                        "low": None,
                        "high": None,
                        "p_value": None,
                        "verdict": "too few blocks" if matrices and name == LOSS_TASK else "no per-item scores",
                        "items": matrices[0].shape[1] if matrices and name == LOSS_TASK else 0,
                        "statistic": None,
                        "expected": sign * pair.expected,
                    }
                )
            out.append(entry)
    _adjust(out)
    return out


def _adjust(comparisons: list[dict[str, Any]]) -> None:
    """Holm's correction over the experiment's judged comparisons (one family): each keeps its own ``p_value`` and
    gets ``p_holm``, and its verdict is judged with ``p_holm``; without it, every claim tested at 0.05 on its own,
    one experiment of a dozen comparisons finds something by chance alone (bench/experiments_rejudge.py)."""
    judged = [c for c in comparisons if isinstance(c.get("p_value"), float) and math.isfinite(c["p_value"])]
    for c, adjusted in zip(judged, holm([c["p_value"] for c in judged]), strict=True):
        c["p_holm"] = adjusted
        c["verdict"] = verdict(c["difference"], c["low"], c["high"], adjusted, c["expected"])


def _wanted(pair: CompareSpec, task: str) -> bool:
    if pair.tasks is None:
        return True
    return any(_matches(requested, task) for requested in pair.tasks)


def build_summary(
    spec: ExperimentSpec, runs: Sequence[PlannedRun], *, skipped: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The summary of every finished run of ``runs`` (see the module docstring)."""
    finished = _finished(runs)
    tasks = _task_rows(finished)
    scores = _score_table(spec, finished, tasks)
    arms = []
    for arm in spec.arms:
        planned = [run for run in runs if run.arm.name == arm.name]
        records = [record for run, record, _ in finished if run.arm.name == arm.name]
        arms.append(
            {
                "name": arm.name,
                "model": arm.model,
                "description": arm.description,
                "kind": "recipe"
                if arm.recipe
                else "train"
                if arm.train
                else "stage"
                if arm.model_from
                else "no training",
                "runs": len(records),
                "planned": len(planned),
                "seconds": mean_std([r["seconds"]["total"] for r in records])[0] if records else None,
                "train_seconds": mean_std([r["seconds"]["train"] for r in records])[0] if records else None,
                "steps": records[0].get("steps") if records else None,
            }
        )
    finished_ids = {run.id for run, _, _ in finished}
    return {
        "format": SUMMARY_FORMAT,
        "experiment": spec.header(),
        "arms": arms,
        "tasks": tasks,
        "scores": scores,
        "comparisons": _comparisons(spec, finished, tasks, scores),
        "runs": {
            "finished": sorted(finished_ids),
            "missing": sorted(run.id for run in runs if run.id not in finished_ids),
            "skipped": dict(skipped or {}),
        },
    }


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by ``None`` (plain JSON has no NaN)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_summary(
    spec: ExperimentSpec, runs: Sequence[PlannedRun], output: str | Path, *, skipped: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Build the summary and write ``summary.json``, ``summary.md`` and ``summary.png`` into ``output``."""
    output = Path(output)
    summary = _finite(build_summary(spec, runs, skipped=skipped))
    files = {"json": atomic_write_json(output / SUMMARY_FILE, summary)}
    files.update(write_experiment_report(summary, output))
    return summary, files
