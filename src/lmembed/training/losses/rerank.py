"""Losses of a reranker trained on groups: each row is one query with its positive first and its mined negatives
after it, scored by the reranker as logits ``Tensor[B, 1 + N]`` (not embeddings).

* :class:`PointwiseBCELoss`: every pair on its own, binary cross-entropy of its logit against 1 (the positive)
  or 0 (a negative), averaged over pairs (the classic cross-encoder objective);
* :class:`ListwiseSoftmaxLoss`: the group as one softmax, cross-entropy of the positive (RankNet's listwise
  successor as trained for RankLLaMA and most LLM rerankers), with an optional temperature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.errors import ConfigError


def _check(logits: Tensor) -> None:
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits must have shape (rows, 1 + negatives) with at least one negative, got {logits.shape}")


class PointwiseBCELoss(nn.Module):
    """Binary cross-entropy of each (query, document) logit: column 0 is relevant, the others are not."""

    def forward(self, logits: Tensor) -> Tensor:
        _check(logits)
        target = torch.zeros_like(logits)
        target[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(logits.float(), target.float())


class ListwiseSoftmaxLoss(nn.Module):
    """Cross-entropy of the positive (column 0) under a softmax over each row's documents."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if temperature <= 0:
            raise ConfigError(f"temperature={temperature} must be > 0")
        self.temperature = temperature

    def forward(self, logits: Tensor) -> Tensor:
        _check(logits)
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits.float() / self.temperature, target)
