"""One run of an experiment: train (where its arm trains), score the model on the suite, write the run's files.

:func:`execute_run` is what :mod:`lmembed.experiments.runner` does for each planned run, in its own process or
in a worker (:mod:`lmembed.experiments.parallel`); the module docstring of the runner says what each kind of arm
trains and scores. ``items.json`` (per-item scores) is written first and ``run.json`` (scores, timings, losses)
last and atomically, so a run without ``run.json`` is an unfinished one.
"""

from __future__ import annotations

import copy
import datetime
import fcntl
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmembed.atomic import atomic_write_json
from lmembed.errors import LmembedError
from lmembed.evaluation.base import Task
from lmembed.evaluation.runner import parse_layer_value
from lmembed.experiments.plan import ITEMS_FILE, PlannedRun, source_run
from lmembed.experiments.scoring import score_task
from lmembed.experiments.spec import ExperimentSpec
from lmembed.io import loads_json, sha256_file
from lmembed.training.recipes import parse_recipe, resolve_data, run_recipe
from lmembed.training.train_config import TrainConfig


class ExperimentError(LmembedError, RuntimeError):
    """An experiment cannot run as asked (an output folder in use, a missing model of another arm ...)."""


#: The folder (in an experiment's output folder) of the runs' lock files.
LOCKS_DIR = ".locks"


class RunInUseError(ExperimentError):
    """Another process is running this run (it holds the run's lock): it is left alone, not started over."""


@contextmanager
def run_lock(run: PlannedRun) -> Iterator[None]:
    """Hold ``run``'s lock while it runs: an exclusive ``flock`` on ``.locks/ARM.SEED.lock`` in the output folder
    (outside the run's folder, which an interrupted run deletes and makes again). The system drops the lock when the
    process ends, killed or not, so a crash never leaves a run locked. Raises :class:`RunInUseError` when another
    process holds it: processes given one output folder (``--resume`` with overlapping ``--only``) never delete each
    other's runs."""
    path = run.folder.parents[2] / LOCKS_DIR / f"{run.arm.name}.{run.folder.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunInUseError(f"{run.id}: another process is running it (it holds {path})") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- training
def _read_losses(folder: Path) -> list[float]:
    """The ``loss`` of every step record in a training folder's ``metrics.jsonl``."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    losses = []
    for line in path.read_text().splitlines():
        try:
            record = loads_json(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("loss"), int | float) and "step" in record:
            losses.append(float(record["loss"]))
    return losses


def _train_contrastive(spec: ExperimentSpec, run: PlannedRun) -> tuple[Path, dict[str, list[float]]]:
    from lmembed.training.trainer import Trainer  # lazy: torch loads only when a run trains

    options = copy.deepcopy(dict(run.arm.train or {}))
    options["data"] = resolve_data(options.get("data") or [])
    for key in ("pooling", "attention", "max_length"):
        if key in run.arm.strategy and key not in options:
            options[key] = run.arm.strategy[key]
    options.setdefault("device", spec.device)
    options.setdefault("dtype", spec.dtype)
    options.update(model=run.arm.model, output=str(run.folder / "train"), seed=run.seed, progress=False)
    result = Trainer(TrainConfig.from_dict(options)).train()
    if result.model_dir is None:
        raise ExperimentError(f"run {run.id}: the trainer saved no model")
    return Path(result.model_dir), {"train": [float(x) for x in result.losses]}


def _train_recipe(spec: ExperimentSpec, run: PlannedRun, output: Path) -> tuple[Path, dict[str, list[float]]]:
    raw = copy.deepcopy(dict(run.arm.recipe or {}))
    for step in raw.get("prepare") or []:  # prepared (and mined) data: once per arm, shared by its seeds
        step.setdefault("output", str(output / "prepared" / run.arm.name / f"{step['name']}.jsonl"))
    recipe = parse_recipe(raw, Path(run.arm.recipe_path) if run.arm.recipe_path else None)
    overrides = {
        **dict(run.arm.overrides),
        "model": run.arm.model,
        "output": str(run.folder / "recipe"),
        "seed": run.seed,
        "device": spec.device,
    }
    result = run_recipe(recipe, overrides=overrides)
    if result.model_dir is None:
        raise ExperimentError(f"run {run.id}: the recipe saved no model")
    losses = {stage.name: _read_losses(stage.model_dir.parent) for stage in result.stages}
    return Path(result.model_dir), losses


def _model_of(spec: ExperimentSpec, run: PlannedRun, output: Path) -> Path:
    """The stage model an arm with ``model_from`` scores (its source run must have finished)."""
    source = source_run(spec, run, output)
    stage = run.arm.model_from[1] if run.arm.model_from else ""
    model = source.folder / "recipe" / stage / "model"
    if not source.finished or not model.is_dir():
        raise ExperimentError(f"run {run.id} scores {source.id}'s stage {stage!r}, which has not finished")
    return model


# ---------------------------------------------------------------------------------------------- evaluation
def _device(name: str) -> str:
    if name != "auto":
        return name
    import torch  # lazy: torch loads only when a model is

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_arm_model(spec: ExperimentSpec, run: PlannedRun, model: str | Path) -> Any:
    """The Embedder a run scores: ``model`` read out with the arm's strategy (named layers resolved)."""
    from lmembed.embedder import Embedder  # lazy: torch loads only when a model is

    strategy = dict(run.arm.strategy)
    layer = strategy.pop("layer", None)
    if spec.evaluation.max_length is not None:
        strategy.setdefault("max_length", spec.evaluation.max_length)
    if layer is not None and not isinstance(layer, str):
        strategy["layer"] = tuple(layer) if isinstance(layer, list) else layer
    embedder = Embedder.from_pretrained(
        str(model), device=_device(spec.device), dtype=spec.dtype, show_progress=False, **strategy
    )
    if isinstance(layer, str):
        resolved = parse_layer_value(layer, embedder.backbone.num_layers)
        embedder = embedder.with_config(embedder.config.with_options(layer=resolved))
    return embedder


def execute_run(spec: ExperimentSpec, run: PlannedRun, tasks: Sequence[Task], output: Path) -> dict[str, Any]:
    """Train (if the arm trains) and score one run, holding its lock (:func:`run_lock`); write ``items.json`` then
    ``run.json``; return the record."""
    with run_lock(run):
        record = run.record()
        if record is not None:  # another process finished it after this one planned it: kept, not run again
            return record
        return _execute(spec, run, tasks, output)


def _execute(spec: ExperimentSpec, run: PlannedRun, tasks: Sequence[Task], output: Path) -> dict[str, Any]:
    if run.started:
        shutil.rmtree(run.folder)  # an earlier attempt was interrupted (or ran with other settings)
    run.folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    losses: dict[str, list[float]] = {}
    if run.arm.train is not None:
        model, losses = _train_contrastive(spec, run)
    elif run.arm.recipe is not None:
        model, losses = _train_recipe(spec, run, output)
    elif run.arm.model_from is not None:
        model = _model_of(spec, run, output)
    else:
        model = Path(run.arm.model) if Path(run.arm.model).exists() else run.arm.model  # type: ignore[assignment]
    trained = time.perf_counter()
    embedder = load_arm_model(spec, run, model)
    scores = {}
    for task in tasks:
        scores[task.name] = score_task(task, embedder, batch_size=spec.evaluation.batch_size)
    done = time.perf_counter()
    atomic_write_json(run.items_file, {name: score.items() for name, score in scores.items()})
    record = {
        "key": run.key,
        "arm": run.arm.name,
        "seed": run.seed,
        "model": str(model),
        "trained": run.arm.trains,
        "strategy": embedder.config.to_dict(),
        "device": str(embedder.backbone.device),
        "seconds": {"train": trained - started, "evaluate": done - trained, "total": done - started},
        "steps": sum(len(v) for v in losses.values()),
        "losses": losses,
        "tasks": {name: score.summary() for name, score in scores.items()},
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "files": {ITEMS_FILE: sha256_file(run.items_file)},  # checked before items.json is read again
    }
    atomic_write_json(run.run_file, record)
    return record
