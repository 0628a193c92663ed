"""The contrastive trainer's loss: a :class:`~lmembed.training.train_config.TrainConfig` turned into a loss module.

:func:`build_loss` (the package's registry) builds a loss from a name and keyword arguments;
:func:`build_training_loss` decides those arguments from a training config: the config's
``temperature``, ``similarity`` and ``in_batch_negatives`` where the loss accepts them, then
``loss_kwargs`` on top, and under several processes the :func:`gather_with_grad` hook.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from torch import nn

from lmembed.training.distributed import gather_with_grad
from lmembed.training.losses import build_loss
from lmembed.training.train_config import TrainConfig, TrainConfigError

__all__ = ["UNSUPPORTED_LOSSES", "build_training_loss"]

log = logging.getLogger(__name__)

UNSUPPORTED_LOSSES = {"angle": "AnglE scores labelled text pairs, not (query, positive, negatives) rows"}


def _accepted(factory: Any, options: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(factory).parameters
    return {k: v for k, v in options.items() if k in params}


def build_training_loss(config: TrainConfig, distributed: bool = False) -> nn.Module:
    """The loss named in the config, with the config's temperature/similarity where the loss takes them.

    ``loss_kwargs`` override those defaults. Under several processes, losses that accept a ``gather``
    hook get :func:`gather_with_grad`, so in-batch negatives span the global batch.
    """
    name = config.loss.strip().lower().replace("-", "_")
    if name in UNSUPPORTED_LOSSES:
        raise TrainConfigError(f"loss={config.loss!r} is not usable by the trainer: {UNSUPPORTED_LOSSES[name]}")
    defaults: dict[str, Any] = {"similarity": config.similarity, "in_batch_negatives": config.in_batch_negatives}
    if config.temperature is not None:
        defaults["temperature"] = config.temperature
    if distributed:
        defaults["gather"] = gather_with_grad
    kwargs = dict(config.loss_kwargs)
    if name in ("matryoshka", "mrl"):
        inner = kwargs.pop("inner", "infonce")
        inner_class = type(build_loss(inner)) if isinstance(inner, str) else None
        inner_defaults = _accepted(inner_class, defaults) if inner_class else {}
        kwargs["inner_kwargs"] = {**inner_defaults, **kwargs.get("inner_kwargs", {})}
        return build_loss(name, inner=inner, **kwargs)
    probe = build_loss(name)
    loss = build_loss(name, **{**_accepted(type(probe), defaults), **kwargs})
    if distributed and "gather" not in inspect.signature(type(probe)).parameters:
        log.warning("loss %s has no gather hook: in-batch negatives stay within each process", name)
    return loss
