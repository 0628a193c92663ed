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

A run is finished when its ``run.json`` exists, carries the fingerprint of what it was run with
(:meth:`~lmembed.experiments.spec.ArmSpec.fingerprint`) and the sha256 of its ``items.json``, and both files have
the shape lmembed writes (:class:`RunRecord`, :data:`ITEMS`); a run interrupted before that is started over, and
so is one whose files were damaged or changed since (said once, naming the file and the field).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from lmembed.errors import LmembedError, UnknownNameError
from lmembed.experiments.spec import ArmSpec, ExperimentSpec
from lmembed.io import check_recorded_files
from lmembed.schema import RecordModel, read_checked_json

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
ITEMS_FILE = "items.json"
RUNS_DIR = "runs"


class RunFileError(LmembedError, ValueError):
    """A run's ``run.json`` or ``items.json`` that is not as lmembed wrote it (damaged, changed, another shape)."""


#: a number a run records: finite (a NaN score ended in an internal TypeError in the summary, an infinite time left
#: every later run "not started")
_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Seconds = Annotated[float, Field(allow_inf_nan=False, ge=0)]
#: a task's main score: a fraction, or a correlation, never past this (1e9 was shown as an nDCG of 100,000,000,000)
_Score = Annotated[float, Field(allow_inf_nan=False, ge=-1e3, le=1e3)]


class _TaskRecord(RecordModel):
    """What is read of one task in ``run.json``."""

    task_type: str
    main_metric: str
    main_score: _Score | None


class RunRecord(RecordModel):
    """The fields of ``run.json`` that the planner, the runner and the summary read."""

    key: str
    arm: str
    seed: int | None
    steps: int = Field(ge=0)
    seconds: dict[str, _Seconds]
    losses: dict[str, list[_Finite]]
    tasks: dict[str, _TaskRecord]
    files: dict[str, str]  # file name -> sha256: items.json


class ItemScores(BaseModel):
    """One task's per-item scores in ``items.json``."""

    model_config = ConfigDict(extra="forbid")
    statistic: str | None
    ids: list[str]
    values: list[_Finite]
    reference: list[_Finite] | None

    @model_validator(mode="after")
    def _one_value_per_item(self) -> ItemScores:
        if len(self.values) != len(self.ids) or (self.reference is not None and len(self.reference) != len(self.ids)):
            raise ValueError("ids, values and reference must have one entry per item")
        repeated = [i for i, n in Counter(self.ids).items() if n > 1]  # arms are paired by id: one value would stay
        if repeated:
            raise ValueError(f"item id {repeated[0]!r} appears more than once (each item must have its own id)")
        return self


#: ``items.json``: task name -> its items.
ITEMS = TypeAdapter(dict[str, ItemScores])
#: Damaged run files already said (the planner and the runner both ask whether a run finished).
_SAID: set[str] = set()


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
        """This run's ``run.json`` when it finished with the current settings and its ``items.json`` is the one it
        recorded, else ``None`` (a damaged or changed file is logged once, naming it and the field)."""
        if not self.run_file.is_file():
            return None
        try:
            record = read_checked_json(self.run_file, RunRecord, RunFileError, "a run record")
            if record["key"] != self.key:  # run with other settings: stale, not damaged
                return None
            check_recorded_files(
                self.folder, self.run_file, record["files"], [ITEMS_FILE], key="files", error=RunFileError
            )
        except RunFileError as exc:
            if str(exc) not in _SAID:
                _SAID.add(str(exc))
                log.warning("%s; the run %s is started over", exc, self.id)
            return None
        return record

    def items(self) -> dict[str, dict[str, Any]]:
        """The per-item scores of a finished run (:meth:`record` checked the file's sha256), checked for their
        shape; :class:`RunFileError` names the file and the field otherwise."""
        return read_checked_json(self.items_file, ITEMS, RunFileError, "a run's per-item scores")

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
