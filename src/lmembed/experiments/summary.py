"""The summary of an experiment, built from its finished runs: per-arm spread over seeds and paired tests.

For every arm and task: the task's main score as mean ± sample std over the arm's runs (seeds), and a
95 % bootstrap interval of the arm's score over items (its per-item values averaged over seeds, see
:func:`~lmembed.experiments.stats.seed_average`). For every comparison (``compare`` in the file, default:
each arm against the first) and task: the paired difference over the items both arms were scored on, its
bootstrap interval, the randomization-test p-value, that p adjusted by Holm's method over the experiment's
comparisons (``p_holm``, one family) and the verdict judged with it (:func:`~lmembed.experiments.stats.compare`,
:func:`~lmembed.experiments.stats.holm`); a comparison with ``minus: [c, d]`` tests the gap a − b against the gap
c − d over the items all four share. An arm of several seeds scores as the mean of its runs' statistic.

Arms that train also get a ``train loss`` row: the per-step loss of their last training stage (mean over
seeds); two such arms are compared on means of blocks of about √n consecutive steps (:func:`loss_blocks`; same
seeds, same data order), lower being better.

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

from lmembed.atomic import atomic_write_json
from lmembed.experiments.plan import PlannedRun
from lmembed.experiments.report import SUMMARY_FILE, write_experiment_report
from lmembed.experiments.spec import CompareSpec, ExperimentSpec
from lmembed.experiments.stats import bootstrap_interval, compare, holm, mean_std, seed_average, verdict

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
                "main_metric": "loss (last stage; compared on means of consecutive-step blocks)",
                "statistic": "mean",
                "higher_is_better": False,
                "scale": 1.0,
            }
        )
    return rows


def loss_blocks(losses: Sequence[float]) -> list[float]:
    """The means of consecutive blocks of about √n steps (batch means; a last short block joins the one before):
    the items a loss comparison pairs. Consecutive steps' losses are correlated, and taken as independent items
    they made "differs" come out far more often than 5 % with no difference at all; block means are closer to the
    independent items the randomization test assumes (docs/experiments.md)."""
    n = len(losses)
    size = max(1, math.isqrt(n))
    blocks = max(1, n // size)
    edges = [i * size for i in range(blocks)] + [n]  # the remainder goes to the last block
    return [float(np.mean(losses[edges[i] : edges[i + 1]])) for i in range(blocks)]


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
        if task == LOSS_TASK:
            losses = _last_stage_losses(record)
            if losses:
                out.append(({str(i): v for i, v in enumerate(loss_blocks(losses))}, None))
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
    """The runs' values over ``ids`` (one row per run: a Spearman or AP arm scores as the mean of its runs', as
    the scores table does, not as the statistic of their averaged ranks) and the reference values in that order."""
    matrix = np.array([[run[0][i] for i in ids] for run in per_run], dtype=np.float64)
    if statistic == "mean":
        matrix = seed_average(matrix, statistic)[None, :]  # the same difference, one row
    reference = per_run[0][1]
    return matrix, (np.array([reference[i] for i in ids]) if reference is not None else None)


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
                if len(ids) >= 2:
                    runs, reference = _aligned(per_run, ids, statistic)
                    cell["interval"] = list(bootstrap_interval(runs, statistic, reference))
                    cell["items"] = len(ids)
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
            if task["statistic"] and len(ids) >= 2:
                items = [_aligned(runs, ids, task["statistic"]) for runs in arm_runs]
                reference = items[0][1]
                minus = (items[2][0], items[3][0]) if pair.minus else None
                result = compare(
                    items[0][0], items[1][0], task["statistic"], reference, minus=minus, expected=sign * pair.expected
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
                        "verdict": "no per-item scores",
                        "items": 0,
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
