"""The optimisation every training loop uses (contrastive runs and pre-training stages alike).

* :func:`build_optimizer`: AdamW with weight decay on matrices only;
* :func:`build_scheduler`: linear warm-up then linear decay to zero (:class:`WarmupLinearDecay`);
* :class:`OptimisationStep`: one step (zero the gradients, forward and backward, clip, step the
  optimiser and the schedule, tell the model its weights changed) and its ``metrics.jsonl`` record.
* :class:`EngineOptimisationStep`: the same through a DeepSpeed engine (which zeroes, clips and steps).

A step whose loss or gradient norm is not finite stops the run (:class:`DivergedError`) before it updates a
weight: the model keeps the previous step's weights, and the last checkpoint is intact.

The config passed in needs ``lr``, ``weight_decay``, ``warmup_steps`` and ``steps``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from lmembed.errors import LmembedError
from lmembed.training.metrics_log import MetricsLog

__all__ = [
    "DivergedError",
    "EngineOptimisationStep",
    "ForwardBackward",
    "OptimisationStep",
    "WarmupLinearDecay",
    "build_optimizer",
    "build_scheduler",
]

# Computes the step's loss and back-propagates it; returns the loss (detached) and extra metrics to log.
ForwardBackward = Callable[[], tuple[torch.Tensor, dict[str, float]]]


class DivergedError(LmembedError, RuntimeError):
    """A step's loss or gradient norm is NaN or infinite; raised before the step updates any weight."""

    def __init__(self, step: int, what: str, value: float) -> None:
        super().__init__(
            f"step {step}: the {what} is {value} (not finite); training stopped before this step changed a weight. "
            "Look for a row with extreme values or a learning rate too high for the model"
        )
        self.step = step


class WarmupLinearDecay:
    """Learning-rate multiplier: linear warm-up to 1 over ``warmup`` steps, then linear decay to 0."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        remaining = self.total - step
        return max(0.0, remaining / max(1, self.total - self.warmup))


def build_optimizer(model: Any, config: Any, error: type[Exception] = ValueError) -> torch.optim.AdamW:
    """AdamW over ``model.named_trainable_parameters()``; biases, norms and other vectors are not decayed.

    With ``config.head_lr`` set, the parameters the model names in ``head_parameter_names()`` (a reranker's new
    score head) take that learning rate instead (the same schedule scales both). Raises ``error`` (the caller's
    config error) when nothing is trainable.
    """
    head_lr = getattr(config, "head_lr", None)
    head = (
        set(model.head_parameter_names()) if head_lr is not None and hasattr(model, "head_parameter_names") else set()
    )
    decay, plain, head_decay, head_plain = [], [], [], []
    for name, param in model.named_trainable_parameters():
        if name in head:
            (head_decay if param.ndim >= 2 else head_plain).append(param)
        else:
            (decay if param.ndim >= 2 else plain).append(param)
    if not decay and not plain and not head_decay and not head_plain:
        raise error("the model has no trainable parameters")
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": plain, "weight_decay": 0.0},
        {"params": head_decay, "weight_decay": config.weight_decay, "lr": head_lr},
        {"params": head_plain, "weight_decay": 0.0, "lr": head_lr},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr)


def build_scheduler(optimizer: torch.optim.Optimizer, config: Any) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupLinearDecay(config.warmup_steps, config.steps))


class OptimisationStep:
    """One optimisation step of a :class:`~lmembed.training.trainable.TrainableEmbedder`, with its record.

    ``model`` is the trainable model (its ``named_trainable_parameters`` are clipped and it is told
    ``weights_changed`` after the update); the forward pass may go through a wrapper of it (DDP) inside
    the ``forward_backward`` callable. Records of step ``n`` go to ``metrics`` when ``n`` is a multiple
    of ``log_every`` or the last of ``total_steps``.
    """

    def __init__(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        max_grad_norm: float | None,
        metrics: MetricsLog,
        log_every: int,
        total_steps: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.max_grad_norm = max_grad_norm
        self.metrics = metrics
        self.log_every = log_every
        self.total_steps = total_steps

    @classmethod
    def for_config(
        cls, model: Any, config: Any, metrics: MetricsLog, error: type[Exception] = ValueError
    ) -> OptimisationStep:
        """The step with AdamW and the warm-up/decay schedule of ``config`` (``lr``, ``weight_decay``,
        ``warmup_steps``, ``steps``, ``max_grad_norm``, ``log_every``); ``error`` for a bad setting."""
        optimizer = build_optimizer(model, config, error)
        return cls(
            model,
            optimizer,
            build_scheduler(optimizer, config),
            max_grad_norm=config.max_grad_norm,
            metrics=metrics,
            log_every=config.log_every,
            total_steps=config.steps,
        )

    def __call__(
        self,
        step: int,
        forward_backward: ForwardBackward,
        *,
        reduce: Callable[[torch.Tensor], float] = float,
        rows: int | None = None,
    ) -> dict[str, Any]:
        """Run step number ``step`` (1-based) and return its record.

        ``forward_backward`` computes the loss and back-propagates it (in one pass, or chunk by chunk
        as GradCache does). ``reduce`` turns the loss into the logged number (e.g. the mean over
        processes); with ``rows`` (rows in the step's batch) the record also gives ``rows_per_s``.
        """
        started = time.perf_counter()
        self.zero_grad()
        loss, extra = forward_backward()
        value = reduce(loss)
        if not math.isfinite(value):
            self.zero_grad()
            raise DivergedError(step, "loss", value)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self.clip_and_step(step)
        self.scheduler.step()
        self.model.weights_changed()
        seconds = time.perf_counter() - started
        record: dict[str, Any] = {"step": step, "loss": value, "lr": lr, "grad_norm": grad_norm, **extra}
        if rows is not None:
            record["rows_per_s"] = rows / seconds
        record["seconds"] = seconds
        if step % self.log_every == 0 or step == self.total_steps:
            self.metrics.write(record)
        return record

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def clip_and_step(self, step: int) -> float:
        """Clip the gradients and update the parameters; returns the gradient norm before clipping. A norm that
        is not finite stops the run before the update (:class:`DivergedError`)."""
        grad_norm = self.clip_gradients()
        if not math.isfinite(grad_norm):
            self.zero_grad()
            raise DivergedError(step, "gradient norm", grad_norm)
        self.optimizer.step()
        return grad_norm

    def clip_gradients(self) -> float:
        """Clip the gradient norm to ``max_grad_norm`` (no limit when unset); returns the norm before clipping."""
        params = [p for _, p in self.model.named_trainable_parameters() if p.grad is not None]
        if not params:
            return 0.0
        limit = self.max_grad_norm if self.max_grad_norm else math.inf
        return float(torch.nn.utils.clip_grad_norm_(params, limit))


class EngineOptimisationStep(OptimisationStep):
    """:class:`OptimisationStep` through a DeepSpeed engine, which zeroes the gradients, clips them (to the
    ``gradient_clipping`` of its configuration) and updates the parameters in ``engine.step()``. The
    ``forward_backward`` callable must back-propagate with ``engine.backward``. ``optimizer`` is the client
    optimizer the engine was given: the schedule keeps driving its learning rates."""

    def __init__(self, engine: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = engine

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def clip_and_step(self, step: int) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0
