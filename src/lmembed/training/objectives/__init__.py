"""Training objectives other than the contrastive trainer's: pre-training stages and pair scoring.

=========== ================================================================ ================
name        what it trains                                                    data
=========== ================================================================ ================
``mntp``    LLM2Vec masked next-token prediction (:mod:`.mntp`)               texts
``simcse``  unsupervised SimCSE, two dropout views (:mod:`.simcse`)           texts
``anchor``  Anchor stage I, EBQ2D + EBD2Q reconstruction (:mod:`.anchor`)     (query, doc)
``angle``   AnglE/CoSENT on scored pairs (:class:`AnglEPairObjective`)        scored pairs
=========== ================================================================ ================

An objective wraps a :class:`~lmembed.training.model.TrainableEmbedder` and exposes
``loss(batch) -> (tensor, metrics)``; :func:`run_objective` drives any of them with AdamW, linear
warm-up and decay, gradient clipping, ``metrics.jsonl`` logging and a loss-curve PNG, and saves an
ordinary Embedder directory (``<output>/model``, LoRA merged) that the next stage loads.

Data (``ObjectiveConfig.data``) are trainer data sources (JSON-lines rows or BEIR folders; texts are
the queries and positives, pairs are (query, first positive)), plain ``.txt`` files (one text per line,
texts only), or, for ``angle``, JSON-lines files of ``{sentence1, sentence2, score}``.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lmembed.config import unknown_options
from lmembed.training.optim import build_optimizer, build_scheduler
from lmembed.training.train_config import ModelOptions, check_at_least

log = logging.getLogger(__name__)

OBJECTIVES: dict[str, str] = {
    "mntp": "lmembed.training.objectives.mntp:MNTPObjective",
    "simcse": "lmembed.training.objectives.simcse:SimCSEObjective",
    "anchor": "lmembed.training.objectives.anchor:AnchorObjective",
    "angle": "lmembed.training.objectives:AnglEPairObjective",
}
METRICS_FILE = "metrics.jsonl"
MODEL_DIR = "model"


class ObjectiveConfigError(ValueError):
    """An objective-stage option is invalid."""


@dataclass
class ObjectiveConfig(ModelOptions):
    """Settings of one objective stage (see the module table for ``objective``).

    The model-side fields come from :class:`~lmembed.training.train_config.ModelOptions`. ``options`` go
    to the objective's constructor (``mask_probability``, ``temperature``, ``dropout``, ``alpha``,
    ``max_target_length`` ...). ``lora=None`` means LoRA for decoders, full fine-tuning for encoders (the
    Anchor paper trains stage I with all parameters: set ``lora: false``).
    """

    device: str = "cpu"
    objective: str = "mntp"
    data: list[Any] = field(default_factory=list)
    output: str = "runs/objective"
    steps: int = 100
    batch_size: int = 16
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float | None = 1.0
    seed: int = 42
    max_texts: int | None = None
    log_every: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.objective = self.objective.strip().lower()
        if self.objective not in OBJECTIVES:
            known = ", ".join(OBJECTIVES)
            raise ObjectiveConfigError(f"objective {self.objective!r} is unknown; choose one of {known}")
        check_at_least(ObjectiveConfigError, 1, steps=self.steps, batch_size=self.batch_size, log_every=self.log_every)
        if self.lr <= 0:
            raise ObjectiveConfigError(f"lr={self.lr} must be positive")
        check_at_least(ObjectiveConfigError, 0, warmup_steps=self.warmup_steps)
        self.check_model_options(ObjectiveConfigError)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ObjectiveConfig:
        unknown = unknown_options(cls, data)
        if unknown:
            raise ObjectiveConfigError(f"unknown objective option(s): {', '.join(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------------------------------------- AnglE pairs
class AnglEPairObjective:
    """AnglE (cosine + in-batch + angle terms, :class:`~lmembed.training.losses.AnglELoss`) on scored
    pairs ``(text1, text2, score)``; ``options`` go to the loss (e.g. ``positive_threshold``)."""

    data_kind = "scored_pairs"

    def __init__(self, model: Any, **loss_options: Any) -> None:
        from lmembed.training.losses import AnglELoss

        self.model = model
        self.criterion = AnglELoss(**loss_options)

    def loss(self, batch: list[tuple[str, str, float]]) -> tuple[Tensor, dict[str, float]]:
        first = [a for a, _, _ in batch]
        second = [b for _, b, _ in batch]
        vectors = self.model.embed(first + second)
        scores = torch.tensor([s for _, _, s in batch], dtype=torch.float32, device=vectors.device)
        return self.criterion(vectors[: len(batch)], vectors[len(batch) :], scores), {}


def build_objective(name: str, model: Any, **options: Any) -> Any:
    """Instantiate the objective called ``name`` around ``model``."""
    key = name.strip().lower()
    if key not in OBJECTIVES:
        raise ObjectiveConfigError(f"objective {name!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    module_name, class_name = OBJECTIVES[key].split(":")
    factory = getattr(importlib.import_module(module_name), class_name)
    return factory(model, **options)


# ---------------------------------------------------------------------------------------------- data
class BatchStream:
    """Batches of items in a fresh seeded permutation per epoch; ``batch(step)`` is deterministic."""

    def __init__(self, items: Sequence[Any], batch_size: int, seed: int = 0) -> None:
        if not items:
            raise ObjectiveConfigError("no training items for the objective")
        self.items = list(items)
        self.batch_size = batch_size
        self.seed = seed
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.items))}
        return self._orders[epoch]

    def batch(self, step: int) -> list[Any]:
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(position, len(self.items))
            out.append(self.items[int(self._order(epoch)[offset])])
        return out


def _read_scored_pairs(path: Path) -> list[tuple[str, str, float]]:
    pairs = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                pairs.append((str(row["sentence1"]), str(row["sentence2"]), float(row["score"])))
    return pairs


def _source_path(spec: Any) -> Path:
    if isinstance(spec, str | Path):
        return Path(spec)
    if isinstance(spec, dict):
        return Path(spec.get("path", ""))
    return Path(getattr(spec, "path", ""))


def _examples(spec: Any) -> list[Any]:
    from lmembed.training.data import DataSource, load_source

    return load_source(DataSource.parse(spec)).examples


def load_items(kind: str, sources: Sequence[Any], *, max_items: int | None = None, seed: int = 0) -> list[Any]:
    """The training items of ``kind`` (``texts``, ``pairs`` or ``scored_pairs``) from ``sources``."""
    items: list[Any] = []
    for spec in sources:
        path = _source_path(spec)
        if kind == "scored_pairs":
            items += _read_scored_pairs(path)
        elif kind == "texts" and path.suffix == ".txt":
            items += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        elif kind == "texts":
            items += [t for ex in _examples(spec) for t in (ex.query, *ex.positives)]
        else:
            items += [(ex.query, ex.positives[0]) for ex in _examples(spec)]
    if kind == "texts":
        items = list(dict.fromkeys(items))
    if max_items and len(items) > max_items:
        keep = np.sort(np.random.default_rng(seed).choice(len(items), size=max_items, replace=False))
        items = [items[int(i)] for i in keep]
    return items


# ---------------------------------------------------------------------------------------------- running
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
    from lmembed.training.trainer import CURVE_FILE, MetricsLog

    metrics = MetricsLog(log_path or Path(METRICS_FILE), enabled=log_path is not None)
    model = objective.model
    optimizer = build_optimizer(model, config, ObjectiveConfigError)
    schedule = build_scheduler(optimizer, config)
    params = [p for _, p in model.named_trainable_parameters()]
    losses = []
    model.train()
    for step in range(config.steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        value, extra = objective.loss(stream.batch(step))
        value.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm or float("inf"))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        schedule.step()
        model.weights_changed()
        losses.append(float(value.detach()))
        record = {"step": step + 1, "loss": losses[-1], "lr": lr, "grad_norm": float(norm), **extra}
        record["seconds"] = time.perf_counter() - started
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            metrics.write(record)
    if log_path is not None:
        metrics.plot(log_path.parent / CURVE_FILE)
    return losses


def run_objective(config: ObjectiveConfig, *, embedder: Any | None = None) -> ObjectiveResult:
    """Train ``config.objective`` and save the result under ``<output>/model``."""
    from lmembed.training.model import build_trainable
    from lmembed.training.trainer import set_seed

    started = time.perf_counter()
    set_seed(config.seed)
    model = build_trainable(config, embedder)
    objective = build_objective(config.objective, model, **config.options)
    items = load_items(objective.data_kind, config.data, max_items=config.max_texts, seed=config.seed)
    stream = BatchStream(items, config.batch_size, config.seed)
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "objective_config.json").write_text(json.dumps(config.to_dict(), indent=2, default=str))
    log_path = output / METRICS_FILE
    log_path.unlink(missing_ok=True)
    log.info("%s: %d items, %d steps of %d", config.objective, len(items), config.steps, config.batch_size)
    losses = train_steps(objective, stream, config, log_path=log_path)
    model.eval()
    model_dir = model.save(output / MODEL_DIR, merge_lora=True, in_place=True)
    return ObjectiveResult(output, Path(model_dir), losses, time.perf_counter() - started)


__all__ = [
    "OBJECTIVES",
    "AnglEPairObjective",
    "BatchStream",
    "ObjectiveConfig",
    "ObjectiveConfigError",
    "ObjectiveResult",
    "build_objective",
    "load_items",
    "run_objective",
    "train_steps",
]
