"""The contrastive trainer's loss: a :class:`~lmembed.training.train_config.TrainConfig` turned into a loss module.

:func:`build_loss` (the package's registry) builds a loss from a name and keyword arguments;
:func:`build_training_loss` decides those arguments from a training config: the config's
``temperature``, ``similarity`` and ``in_batch_negatives`` where the loss's :class:`LossSpec` says it
takes them, then ``loss_kwargs`` on top, and under several processes the :func:`gather_with_grad` hook. A run
that trains a reranker (``reranker`` set) takes a loss registered with ``reranks=True``, and only such a run does.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from lmembed.training.distributed import gather_with_grad
from lmembed.training.loss_names import MATRYOSHKA, canonical_loss_name
from lmembed.training.losses import Matryoshka2DLoss, available_losses, build_loss, loss_spec, reads_teacher_scores
from lmembed.training.train_config import TrainConfig, TrainConfigError

__all__ = ["build_training_loss", "reads_temperature"]

log = logging.getLogger(__name__)


def _shared_settings(config: TrainConfig, distributed: bool) -> dict[str, Any]:
    """The config's settings every loss may take (each loss keeps those its spec declares)."""
    settings: dict[str, Any] = {"similarity": config.similarity, "in_batch_negatives": config.in_batch_negatives}
    if config.temperature is not None:
        settings["temperature"] = config.temperature
    if distributed:
        settings["gather"] = gather_with_grad
    return settings


def _settings_for(name: str, settings: dict[str, Any], distributed: bool) -> dict[str, Any]:
    spec = loss_spec(name)
    if spec.not_contrastive:
        raise TrainConfigError(f"loss={name!r} is not usable by the trainer: {spec.not_contrastive}")
    if distributed and "gather" not in spec.takes and not spec.reranks:
        log.warning("loss %s has no gather hook: in-batch negatives stay within each process", name)
    if "temperature" in settings and "temperature" not in spec.takes:  # given: the loss would run without it
        raise TrainConfigError(f"temperature={settings['temperature']}: loss {name!r} has no temperature")
    if settings.get("similarity", "cosine") != "cosine" and "similarity" not in spec.takes:
        raise TrainConfigError(f"similarity={settings['similarity']!r}: loss {name!r} scores by its own similarity")
    return {key: value for key, value in settings.items() if key in spec.takes}


def reads_temperature(name: str, inner: str = "infonce") -> bool:
    """Whether the loss ``name`` reads the config's temperature (a wrapper's: whether its ``inner`` loss does)."""
    if canonical_loss_name(name) == MATRYOSHKA or loss_spec(name).wraps:
        return "temperature" in loss_spec(inner).takes
    return "temperature" in loss_spec(name).takes


def _check_kind(config: TrainConfig) -> None:
    """A reranker is trained with a loss of groups of logits, an embedder with one of embeddings."""
    reranks = canonical_loss_name(config.loss) != MATRYOSHKA and loss_spec(config.loss).reranks
    if config.reranker is not None and not reranks:
        rerank_losses = ", ".join(name for name in available_losses() if name != MATRYOSHKA and loss_spec(name).reranks)
        raise TrainConfigError(f"loss={config.loss!r} trains an embedder; a reranker is trained with {rerank_losses}")
    if config.reranker is None and reranks:
        raise TrainConfigError(
            f"loss={config.loss!r} scores a reranker's groups: set reranker (cross-encoder, llm or auto) "
            "to train the model as a reranker"
        )


def build_training_loss(config: TrainConfig, distributed: bool = False) -> nn.Module:
    """The loss named in the config, with the config's temperature/similarity where the loss takes them.

    ``loss_kwargs`` override those defaults. Under several processes, losses that accept a ``gather``
    hook get :func:`gather_with_grad`, so in-batch negatives span the global batch.
    """
    _check_kind(config)
    settings = _shared_settings(config, distributed)
    kwargs = dict(config.loss_kwargs)
    wrapper = canonical_loss_name(config.loss) == MATRYOSHKA or loss_spec(config.loss).wraps
    if not wrapper:
        return build_loss(config.loss, **{**_settings_for(config.loss, settings, distributed), **kwargs})
    inner = kwargs.pop("inner", "infonce")
    if distributed and canonical_loss_name(config.loss) != MATRYOSHKA:
        # 2DMSE draws its shallow layer in each process: other processes' vectors are of other layers
        log.warning("loss %s: in-batch negatives stay within each process", config.loss)
        settings.pop("gather", None)
    if isinstance(inner, str):
        kwargs["inner_kwargs"] = {**_settings_for(inner, settings, distributed), **kwargs.get("inner_kwargs", {})}
    loss = build_loss(config.loss, inner=inner, **kwargs)
    if isinstance(loss, Matryoshka2DLoss) and reads_teacher_scores(loss.loss):
        raise TrainConfigError(f"loss={config.loss!r} cannot wrap a distillation loss ({inner}): use matryoshka")
    return loss
