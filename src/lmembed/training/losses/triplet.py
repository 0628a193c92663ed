"""Triplet margin loss (Schroff et al., 2015, "FaceNet"; Reimers & Gurevych, 2019, "Sentence-BERT").

For a (query, positive, negative) triple the loss is ``max(0, d(q, p) - d(q, n) + margin)``: the
positive must be closer to the query than the negative by at least ``margin``. This is the objective
of the task-tuned DistilBERT baseline in the layer-wise decoder-vs-encoder study.

Distances:

* ``"euclidean"`` (default): L2 distance between the raw, un-normalised embeddings. The default
  margin is 5.0, the sentence-transformers ``TripletLoss`` default used by that DistilBERT recipe.
* ``"cosine"``: ``1 - cos(a, b)``, bounded in ``[0, 2]``; the default margin is 0.5.

With ``N`` hard negatives per query every (q, p, n_k) triple counts and the loss is the mean over
all ``B * N`` triples. There are no in-batch negatives: at least one hard negative is required.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.training.losses.infonce import normalize_negatives, pairwise_similarity

__all__ = ["TripletDistance", "TripletLoss"]

TripletDistance = Literal["euclidean", "cosine"]
_DEFAULT_MARGINS: dict[str, float] = {"euclidean": 5.0, "cosine": 0.5}


def _distance(a: Tensor, b: Tensor, kind: TripletDistance) -> Tensor:
    """Row-wise distance over the last dim, broadcasting like :func:`pairwise_similarity`."""
    if kind == "cosine":
        return 1.0 - pairwise_similarity(a, b, "cosine")
    return (a - b).norm(dim=-1)


class TripletLoss(nn.Module):
    """Hinge on the gap between the query-positive and query-negative distances.

    Args:
        margin: required distance gap; ``None`` picks 5.0 for euclidean and 0.5 for cosine.
        distance: ``"euclidean"`` or ``"cosine"`` (see the module docstring).

    Call with ``query [B, D]``, ``positive [B, D]`` and ``negatives [B, N, D]`` (``N >= 1``; a
    ``[B, D]`` tensor is read as ``N = 1``).
    """

    def __init__(self, margin: float | None = None, distance: TripletDistance = "euclidean") -> None:
        super().__init__()
        if distance not in _DEFAULT_MARGINS:
            raise ConfigError(f"distance must be one of {tuple(_DEFAULT_MARGINS)}, got {distance!r}")
        self.distance: TripletDistance = distance
        self.margin = _DEFAULT_MARGINS[distance] if margin is None else float(margin)

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> Tensor:
        negatives = normalize_negatives(negatives, query)
        if negatives.size(1) == 0:
            raise ValueError("TripletLoss needs at least one negative per query")
        to_positive = _distance(query, positive, self.distance).unsqueeze(1)  # [B, 1]
        to_negatives = _distance(query.unsqueeze(1), negatives, self.distance)  # [B, N]
        return (to_positive - to_negatives + self.margin).clamp(min=0).mean()

    def extra_repr(self) -> str:
        return f"margin={self.margin}, distance={self.distance}"
