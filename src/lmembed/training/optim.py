"""The optimiser and learning-rate schedule every training loop uses (contrastive runs and objective
stages alike): AdamW with weight decay on matrices only, linear warm-up then linear decay to zero.

The config passed in needs ``lr``, ``weight_decay``, ``warmup_steps`` and ``steps``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["WarmupLinearDecay", "build_optimizer", "build_scheduler"]


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

    Raises ``error`` (the caller's config error) when nothing is trainable.
    """
    decay, plain = [], []
    for _, param in model.named_trainable_parameters():
        (decay if param.ndim >= 2 else plain).append(param)
    if not decay and not plain:
        raise error("the model has no trainable parameters")
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr)


def build_scheduler(optimizer: torch.optim.Optimizer, config: Any) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupLinearDecay(config.warmup_steps, config.steps))
