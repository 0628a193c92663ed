"""Unsupervised SimCSE (Gao et al., 2021), LLM2Vec's second training step.

Each text of a batch is embedded twice with dropout on. The two passes differ only in their dropout
masks, so the pair is a minimal "augmentation" of one another; InfoNCE with in-batch negatives then
asks every first view to pick out its own second view among the second views of the whole batch
(temperature 0.05 as in SimCSE). No labels are needed.

Decoders such as Llama ship with attention dropout 0 (and often no other dropout), which would make
both views identical; :func:`set_attention_dropout` sets the rate on every attention module for the
duration of training (LLM2Vec uses 0.3 for this step). The saved model's config is left unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.training.losses import InfoNCELoss


def set_attention_dropout(model: nn.Module, rate: float) -> int:
    """Set ``attention_dropout`` on every module that has a float one; returns how many were set."""
    if not 0 <= rate < 1:
        raise ConfigError(f"dropout rate {rate} must be in [0, 1)")
    count = 0
    for module in model.modules():
        value = getattr(module, "attention_dropout", None)
        if isinstance(value, float) and not isinstance(value, bool):
            module.attention_dropout = rate
            count += 1
    return count


def has_active_dropout(model: nn.Module) -> bool:
    """True when some dropout in ``model`` would change a forward pass in training mode."""
    for module in model.modules():
        if isinstance(module, nn.Dropout) and module.p > 0:
            return True
        value = getattr(module, "attention_dropout", None)
        if isinstance(value, float) and value > 0:
            return True
    return False


class SimCSEObjective:
    """Unsupervised SimCSE on a :class:`~lmembed.training.trainable.TrainableEmbedder`.

    Args:
        model: the trainable embedder (its own pooling and attention strategy are used).
        temperature: InfoNCE temperature.
        dropout: attention-dropout rate to apply to decoder attention modules (``None``: keep); 0.1 by default
            (SimCSE's), the LLM2Vec recipe sets its 0.3.
    """

    data_kind = "texts"

    def __init__(self, model: Any, *, temperature: float = 0.05, dropout: float | None = 0.1) -> None:
        self.model = model
        if dropout is not None:
            set_attention_dropout(model.model, dropout)
        if not has_active_dropout(model):
            raise ConfigError("SimCSE needs dropout: both views would be identical (set dropout > 0)")
        self.criterion = InfoNCELoss(temperature=temperature, similarity="cosine", in_batch_negatives=True)

    def embed_views(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Two dropout views of every text, from one forward pass over the doubled batch."""
        if len(texts) < 2:
            raise ConfigError("SimCSE needs at least 2 texts per batch (the others are its negatives)")
        vectors = self.model.embed(list(texts) + list(texts))
        return vectors[: len(texts)], vectors[len(texts) :]

    def loss(self, texts: list[str]) -> tuple[Tensor, dict[str, float]]:
        self.model.train()
        first, second = self.embed_views(texts)
        value = self.criterion(first, second, None)
        with torch.no_grad():
            agreement = torch.nn.functional.cosine_similarity(first, second).mean()
        return value, {"view_cosine": float(agreement)}
