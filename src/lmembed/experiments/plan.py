"""The runs an experiment consists of, where each one writes, and which are already finished.

One run per (arm, seed) for arms that train (or read another arm's per-seed model); one run for an arm
that needs no training (a strategy on a model as it is), whatever the seeds. Order: the arms without
training first (cheap, and a budget estimate is then based on a measured run), then seed by seed the
arms in the file's order, an arm that reads another arm's model after it.

Folder layout of an experiment::

    <output>/experiment.yaml                the experiment as run (after --set)
    <output>/runs/<arm>/eval/               an arm without training
    <output>/runs/<arm>/seed-<seed>/        an arm with training: train/ or recipe/ (the trained model),
                                            run.json (scores, timings, losses), items.json (per-item scores)
    <output>/summary.json|.md|.png          written after the runs

A run is finished when its ``run.json`` exists and carries the fingerprint of what it was run with
(:meth:`~lmembed.experiments.spec.ArmSpec.fingerprint`); a run interrupted before that is started over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.errors import UnknownNameError
from lmembed.experiments.spec import ArmSpec, ExperimentSpec

RUN_FILE = "run.json"
ITEMS_FILE = "items.json"
RUNS_DIR = "runs"


@dataclass(frozen=True)
class PlannedRun:
    """One (arm, seed) of an experiment; ``seed`` is ``None`` for an arm without training."""

    arm: ArmSpec
    seed: int | None
    folder: Path
    key: str

    @property
    def id(self) -> str:
        return f"{self.arm.name}/{'eval' if self.seed is None else f'seed-{self.seed}'}"

    @property
    def run_file(self) -> Path:
        return self.folder / RUN_FILE

    @property
    def items_file(self) -> Path:
        return self.folder / ITEMS_FILE

    def record(self) -> dict[str, Any] | None:
        """This run's ``run.json`` when it finished with the current settings, else ``None``."""
        if not self.run_file.is_file():
            return None
        try:
            record = json.loads(self.run_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return record if record.get("key") == self.key else None

    @property
    def finished(self) -> bool:
        return self.record() is not None

    @property
    def started(self) -> bool:
        """True when the run's folder holds something (a finished run, or one interrupted part way)."""
        return self.folder.is_dir() and any(self.folder.iterdir())


def _ordered_arms(arms: Sequence[ArmSpec]) -> list[ArmSpec]:
    """Arms in file order, each one that reads another arm's model moved after that arm."""
    ordered: list[ArmSpec] = []
    pending = list(arms)
    while pending:
        for arm in pending:
            source = arm.model_from[0] if arm.model_from else None
            if source is None or any(done.name == source for done in ordered):
                ordered.append(arm)
                pending.remove(arm)
                break
        else:  # a cycle cannot be written with model_from (its source must be a recipe arm); keep the rest
            ordered.extend(pending)
            break
    return ordered


def plan_runs(spec: ExperimentSpec, output: str | Path, only: Sequence[str] | None = None) -> list[PlannedRun]:
    """Every run of ``spec`` (or of the arms named in ``only``, plus the arms they read models from)."""
    output = Path(output)
    wanted = set(only) if only else None
    if wanted is not None:
        unknown = sorted(wanted - {arm.name for arm in spec.arms})
        if unknown:
            raise UnknownNameError(
                f"--only {', '.join(unknown)}: no such arm; arms: {', '.join(a.name for a in spec.arms)}"
            )
        for arm in spec.arms:  # an arm evaluating another arm's model needs that arm's runs
            if arm.name in wanted and arm.model_from:
                wanted.add(arm.model_from[0])
    arms = [arm for arm in _ordered_arms(spec.arms) if wanted is None or arm.name in wanted]
    runs = [
        PlannedRun(arm, None, output / RUNS_DIR / arm.name / "eval", run_key(spec, arm, None))
        for arm in arms
        if not arm.per_seed
    ]
    for seed in spec.seeds:
        for arm in arms:
            if arm.per_seed:
                runs.append(
                    PlannedRun(arm, seed, output / RUNS_DIR / arm.name / f"seed-{seed}", run_key(spec, arm, seed))
                )
    return runs


def run_key(spec: ExperimentSpec, arm: ArmSpec, seed: int | None) -> str:
    """The fingerprint of one run; an arm reading another arm's model includes that arm's fingerprint."""
    key = arm.fingerprint(spec.evaluation, seed, spec.dtype)
    if arm.model_from:
        key = f"{key}+{spec.arm(arm.model_from[0]).fingerprint(spec.evaluation, seed, spec.dtype)}"
    return key


def source_run(spec: ExperimentSpec, run: PlannedRun, output: str | Path) -> PlannedRun:
    """The run whose recipe produced the model ``run`` evaluates (an arm with ``model_from``)."""
    if run.arm.model_from is None:
        raise ValueError(f"run {run.id} reads no other arm's model")
    source = spec.arm(run.arm.model_from[0])
    folder = Path(output) / RUNS_DIR / source.name / f"seed-{run.seed}"
    return PlannedRun(source, run.seed, folder, run_key(spec, source, run.seed))
