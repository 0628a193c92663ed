"""Running an experiment: train (where an arm trains) and evaluate every planned run, then summarise.

:func:`run_experiment` walks the plan (:mod:`lmembed.experiments.plan`):

* an arm without training loads its model with its strategy and is scored on the suite;
* an arm with ``train`` is one contrastive run of :class:`~lmembed.training.trainer.Trainer` (the shared
  ``train`` options + the arm's, the run's seed, output in the run folder); an arm with ``recipe`` runs the
  recipe through :func:`~lmembed.training.recipes.run_recipe` with the arm's overrides, the experiment's
  model, device and the run's seed (prepared data is kept once per arm, shared by its seeds); an arm with
  ``model_from`` scores a stage of another arm's recipe run of the same seed;
* the trained model is scored on the suite (:mod:`lmembed.experiments.scoring`); embeddings go through the
  embedding cache, so re-scoring a model costs nothing;
* ``run.json`` (scores, timings, losses) is written last and atomically: a run killed before it is started
  over, one that has it is skipped by ``--resume``.

``workers`` > 1 runs that many runs at once, each in its own process (:mod:`lmembed.experiments.parallel`:
the CPU's cores split between them, or one GPU each).

``budget_minutes``: once a run has been timed, every remaining run's time is estimated (seconds per
training step and per evaluation, from the finished runs of the same arm, else of arms on the same backbone); a
run that would end past the budget is not started and is reported, so ``--resume`` can finish it later. A run on
a backbone not timed yet has no estimate: like the first run, it starts while some of the budget is left.

After the runs, the summary (:mod:`lmembed.experiments.summary`) is written from every finished run.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmembed.atomic import atomic_write_text
from lmembed.evaluation.base import Task
from lmembed.experiments.execute import ExperimentError, RunInUseError, execute_run, load_arm_model
from lmembed.experiments.parallel import run_parallel
from lmembed.experiments.plan import RUNS_DIR, PlannedRun, plan_runs
from lmembed.experiments.scoring import build_suite
from lmembed.experiments.spec import ExperimentSpec
from lmembed.experiments.summary import write_summary
from lmembed.training.recipes import parse_recipe
from lmembed.training.train_config import TrainConfig

log = logging.getLogger(__name__)

SPEC_FILE = "experiment.yaml"
Progress = Callable[[str], None]


@dataclass
class ExperimentOutcome:
    """What :func:`run_experiment` did: runs finished now, reused, skipped (with why), and the summary."""

    output: Path
    finished: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- shared passes
def warm_cache(
    spec: ExperimentSpec, runs: Sequence[PlannedRun], tasks: Sequence[Task], say: Progress | None = None
) -> int:
    """Embed the suite's texts once for all runs without training that read the same model, with every
    such arm's strategy at once (:meth:`~lmembed.embedder.Embedder.encode_strategies` shares the forward
    passes between strategies that only pool differently, e.g. layers), filling the embedding cache so
    that scoring each arm afterwards computes nothing. Returns the number of strategies warmed."""
    groups: dict[str, list[PlannedRun]] = {}
    for run in runs:
        if not run.arm.per_seed:
            groups.setdefault(run.arm.model, []).append(run)
    warmed = 0
    for model, group in groups.items():
        if len(group) < 2:
            continue
        configs = []
        for run in group:  # each arm's exact strategy, as its own load resolves it (then the model is freed)
            configs.append(load_arm_model(spec, run, model).config)
        shared = load_arm_model(spec, group[0], model)
        if say is not None:
            say(f"shared forward passes: {len(configs)} strategies of {model} ({', '.join(r.arm.name for r in group)})")
        for task in tasks:
            for call in task.embedded_texts():
                shared.encode_strategies(
                    call.texts, configs, instruction=call.instruction, batch_size=spec.evaluation.batch_size
                )
        warmed += len(configs)
        del shared
    return warmed


# ---------------------------------------------------------------------------------------------- budget
def _planned_steps(run: PlannedRun) -> int:
    """The optimisation steps a run will take (0 without training)."""
    if run.arm.train is not None:
        return int(run.arm.train.get("steps", TrainConfig.steps))
    if run.arm.recipe is not None:
        recipe = parse_recipe(copy.deepcopy(dict(run.arm.recipe)))
        override = run.arm.overrides.get("steps")
        return sum(int(override or stage.get("steps") or 0) for stage in recipe.stages)
    return 0


def estimate_seconds(
    run: PlannedRun, records: Sequence[dict[str, Any]], backbones: Mapping[str, str] | None = None
) -> float | None:
    """Seconds ``run`` will take, from finished runs: the same arm's, else those of arms on the same backbone
    (``backbones``: arm name -> model). ``None`` while nothing on that backbone has been timed: one model's
    seconds say little about another's (a 135M decoder's step is not a 22M encoder's)."""
    backbones = backbones or {}
    same = [r for r in records if r.get("arm") == run.arm.name]
    pool = same or [r for r in records if backbones.get(str(r.get("arm"))) == run.arm.model]
    if not pool:
        return None
    evaluate = sum(r["seconds"]["evaluate"] for r in pool) / len(pool)
    steps = _planned_steps(run)
    if not steps:
        return evaluate
    trained = [r for r in pool if r.get("steps")] or [
        r for r in records if r.get("steps") and backbones.get(str(r.get("arm"))) == run.arm.model
    ]
    if not trained:
        return None
    per_step = sum(r["seconds"]["train"] / r["steps"] for r in trained) / len(trained)
    return evaluate + per_step * steps


# ---------------------------------------------------------------------------------------------- the experiment
def _check_output(spec: ExperimentSpec, output: Path, resume: bool) -> None:
    runs = output / RUNS_DIR
    if runs.is_dir() and any(runs.iterdir()) and not resume:
        raise ExperimentError(
            f"{output} already holds runs of an experiment; pass --resume to continue it (finished runs are "
            "kept) or choose another --output"
        )


def run_experiment(
    spec: ExperimentSpec,
    output: str | Path,
    *,
    resume: bool = False,
    only: Sequence[str] | None = None,
    budget_minutes: float | None = None,
    progress: Progress | None = None,
    workers: int = 1,
) -> ExperimentOutcome:
    """Run every planned run of ``spec`` into ``output`` (see the module docstring) and write the summary."""
    say = progress or (lambda line: log.info("%s", line))
    if workers < 1:
        raise ExperimentError(f"workers: at least 1, got {workers}")
    if workers > 1 and budget_minutes is not None:
        raise ExperimentError("a time budget estimates runs one after another: use it with one worker")
    output = Path(output)
    _check_output(spec, output, resume)
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / SPEC_FILE, _spec_yaml(spec))
    try:
        runs = plan_runs(spec, output, only)
    except KeyError as exc:
        raise ExperimentError(str(exc.args[0])) from exc
    outcome = ExperimentOutcome(output)
    records = [record for run in runs if (record := run.record()) is not None]
    pending = [run for run in runs if run.record() is None]
    outcome.reused = [run.id for run in runs if run not in pending]
    if outcome.reused:
        say(f"{len(outcome.reused)} run(s) finished earlier: {', '.join(outcome.reused)}")
    tasks = build_suite(spec.evaluation) if pending else []
    if tasks:
        say(f"suite: {', '.join(task.name for task in tasks)}")
        warm_cache(spec, pending, tasks, say)

    def finish(run: PlannedRun, record: dict[str, Any]) -> None:
        records.append(record)
        outcome.finished.append(run.id)
        cells = ", ".join(f"{name} {100 * t['main_score']:.2f}" for name, t in record["tasks"].items())
        say(f"    {run.id}: {cells} ({record['seconds']['total']:.0f} s)")

    def skip(run: PlannedRun, reason: str) -> None:
        outcome.skipped[run.id] = reason
        say(f"    {run.id}: not run ({reason})")

    if workers > 1 and pending:
        finished_arms = {str(record.get("arm")) for record in records}
        run_parallel(
            spec, pending, output, workers, finished_arms=finished_arms, on_finished=finish, on_skipped=skip, say=say
        )
    else:
        started = time.perf_counter()
        budget = None if budget_minutes is None else 60.0 * budget_minutes
        announced = False
        backbones = {arm.name: arm.model for arm in spec.arms}
        for number, run in enumerate(pending, start=1):
            if budget is not None:
                estimate = estimate_seconds(run, records, backbones)
                elapsed = time.perf_counter() - started
                if estimate is not None and not announced:
                    announced = True
                    _announce_budget(pending[number - 1 :], records, backbones, budget - elapsed, say)
                # no estimate (its backbone not timed yet): the run goes ahead unless the budget is spent; only an
                # experiment with no run timed at all starts its first run whatever the budget (so one is timed),
                # so `--resume --budget-minutes 0` writes the summary without starting anything
                over = (bool(records) and elapsed >= budget) if estimate is None else elapsed + estimate > budget
                if over:
                    left = f"{max(0.0, budget - elapsed) / 60:.1f} min of the budget left"
                    reason = f"needs ~{estimate / 60:.1f} min, {left}" if estimate is not None else f"{left}"
                    outcome.skipped[run.id] = reason
                    say(f"[{number}/{len(pending)}] {run.id}: not started ({reason})")
                    continue
            say(f"[{number}/{len(pending)}] {run.id}: {'training + ' if run.arm.trains else ''}evaluation")
            try:
                finish(run, execute_run(spec, run, tasks, output))
            except RunInUseError as exc:
                skip(run, str(exc))
    all_runs = plan_runs(spec, output)
    outcome.summary, outcome.files = write_summary(spec, all_runs, output, skipped=outcome.skipped)
    return outcome


def _announce_budget(
    remaining: Sequence[PlannedRun],
    records: Sequence[dict[str, Any]],
    backbones: Mapping[str, str],
    left: float,
    say: Progress,
) -> None:
    """Print the estimated time of the remaining runs and which of them will not fit in the budget."""
    total, fits, out, untimed = 0.0, [], [], []
    for run in remaining:
        estimate = estimate_seconds(run, records, backbones)
        if estimate is None:
            untimed.append(run.id)
            continue
        if total + estimate <= left:
            total += estimate
            fits.append(run.id)
        else:
            out.append(f"{run.id} (~{estimate / 60:.1f} min)")
    say(f"budget: ~{total / 60:.1f} min for {len(fits)} run(s) of {left / 60:.1f} min left")
    if out:
        say(f"budget: will not fit: {', '.join(out)} (run again with --resume and more --budget-minutes)")
    if untimed:
        say(f"budget: not estimated yet (their backbone has not been timed): {', '.join(untimed)}")


def _spec_yaml(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(dict(spec.raw), sort_keys=False)
