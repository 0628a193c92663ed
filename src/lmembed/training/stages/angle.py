"""AnglE on scored text pairs as a training stage (Li & Li, 2023).

:class:`AnglEPairObjective` embeds both sides of ``(text1, text2, score)`` pairs and applies
:class:`~lmembed.training.losses.AnglELoss` (CoSENT, in-batch and angle terms). The contrastive
trainer cannot use this loss (its rows are query, positive, negatives), so it runs as a stage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lmembed.training.losses import AnglELoss, check_keywords
from lmembed.training.train_config import ObjectiveConfigError

__all__ = ["AnglEPairObjective"]


class AnglEPairObjective:
    """AnglE (cosine + in-batch + angle terms, :class:`~lmembed.training.losses.AnglELoss`) on scored
    pairs ``(text1, text2, score)``; ``options`` go to the loss (e.g. ``positive_threshold``)."""

    data_kind = "scored_pairs"

    def __init__(self, model: Any, **loss_options: Any) -> None:
        self.model = model
        self.criterion = AnglEPairObjective.check_options(loss_options)

    @staticmethod
    def check_options(loss_options: dict[str, Any]) -> AnglELoss:
        """The loss the options make (it has no weights: cheap), refusing an option it does not take by name."""
        check_keywords("objective 'angle'", AnglELoss, loss_options, ObjectiveConfigError)
        return AnglELoss(**loss_options)

    def loss(self, batch: list[tuple[str, str, float]]) -> tuple[Tensor, dict[str, float]]:
        first = [a for a, _, _ in batch]
        second = [b for _, b, _ in batch]
        vectors = self.model.embed(first + second)
        scores = torch.tensor([s for _, _, s in batch], dtype=torch.float32, device=vectors.device)
        return self.criterion(vectors[: len(batch)], vectors[len(batch) :], scores), {}
