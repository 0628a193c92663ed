"""Running a pre-training stage: build it by name, train it, save the model the next stage loads.

:func:`build_objective` instantiates a stage from :data:`OBJECTIVES`; :func:`train_steps` runs its
optimisation steps through the trainer's :class:`~lmembed.training.optim.OptimisationStep` (AdamW,
linear warm-up and decay, gradient clipping, ``metrics.jsonl`` records) and draws the loss curve;
:func:`run_objective` does all of it from an :class:`~lmembed.training.train_config.ObjectiveConfig`
and saves an ordinary Embedder directory (``<output>/model``, LoRA merged).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor

from lmembed.training.losses import check_keywords
from lmembed.training.metrics_log import CURVE_FILE, METRICS_FILE, MetricsLog
from lmembed.training.optim import OptimisationStep
from lmembed.training.seeding import set_seed
from lmembed.training.stages.anchor import AnchorObjective
from lmembed.training.stages.angle import AnglEPairObjective
from lmembed.training.stages.batches import BatchStream, load_items
from lmembed.training.stages.grit import GritObjective
from lmembed.training.stages.mntp import MNTPObjective
from lmembed.training.stages.simcse import SimCSEObjective
from lmembed.training.train_config import ObjectiveConfig, ObjectiveConfigError
from lmembed.training.trainable import build_trainable

__all__ = ["OBJECTIVES", "ObjectiveResult", "build_objective", "check_objective", "run_objective", "train_steps"]

log = logging.getLogger(__name__)

# Keyed by train_config.OBJECTIVE_NAMES, the names an ObjectiveConfig accepts.
OBJECTIVES: dict[str, type] = {
    "mntp": MNTPObjective,
    "simcse": SimCSEObjective,
    "anchor": AnchorObjective,
    "angle": AnglEPairObjective,
    "grit": GritObjective,
}
MODEL_DIR = "model"
CONFIG_FILE = "objective_config.json"


def check_objective(name: str, options: Mapping[str, Any]) -> type:
    """The objective class called ``name``, once ``options`` are all options it takes (before any model is built);
    else :class:`ObjectiveConfigError` naming the option and those it takes."""
    key = name.strip().lower()
    if key not in OBJECTIVES:
        raise ObjectiveConfigError(f"objective {name!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    objective = OBJECTIVES[key]
    check = getattr(objective, "check_options", None)  # an objective whose options go on to its loss checks them
    if check is not None:
        check(dict(options))
    else:
        check_keywords(f"objective {key!r}", objective, options, ObjectiveConfigError, skip=1)  # after the model
    return objective


def build_objective(name: str, model: Any, **options: Any) -> Any:
    """Instantiate the objective called ``name`` around ``model``."""
    return check_objective(name, options)(model, **options)


@dataclass
class ObjectiveResult:
    """What :func:`run_objective` did."""

    output: Path
    model_dir: Path
    losses: list[float]
    seconds: float


def train_steps(
    objective: Any,
    stream: BatchStream,
    config: ObjectiveConfig,
    *,
    log_path: Path | None = None,
) -> list[float]:
    """Run ``config.steps`` optimisation steps of ``objective``; returns the loss of every step.

    With ``log_path``, records go to that JSON-lines file and the loss curve is drawn beside it.
    """
    metrics = MetricsLog(log_path or Path(METRICS_FILE), enabled=log_path is not None)
    model = objective.model
    step = OptimisationStep.for_config(model, config, metrics, ObjectiveConfigError)
    losses = []
    model.train()
    for index in range(config.steps):
        losses.append(step(index + 1, partial(_backpropagate, objective, stream, index))["loss"])
    if log_path is not None:
        metrics.plot(log_path.parent / CURVE_FILE)
    return losses


def _backpropagate(objective: Any, stream: BatchStream, index: int) -> tuple[Tensor, dict[str, float]]:
    """Loss of batch ``index`` (0-based), back-propagated; the detached loss and the stage's extra metrics."""
    value, extra = objective.loss(stream.batch(index))
    value.backward()
    return value.detach(), extra


def run_objective(config: ObjectiveConfig, *, embedder: Any | None = None) -> ObjectiveResult:
    """Train ``config.objective`` and save the result under ``<output>/model``."""
    started = time.perf_counter()
    check_objective(config.objective, config.options)  # before the model is loaded
    set_seed(config.seed)
    model = build_trainable(config, embedder)
    objective = build_objective(config.objective, model, **config.options)
    items = load_items(objective.data_kind, config.data, max_items=config.max_texts, seed=config.seed)
    stream = BatchStream(items, config.batch_size, config.seed)
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2, default=str))
    log_path = output / METRICS_FILE
    log_path.unlink(missing_ok=True)
    log.info("%s: %d items, %d steps of %d", config.objective, len(items), config.steps, config.batch_size)
    losses = train_steps(objective, stream, config, log_path=log_path)
    model.eval()
    model_dir = model.save(output / MODEL_DIR, merge_lora=True, in_place=True)
    return ObjectiveResult(output, Path(model_dir), losses, time.perf_counter() - started)
