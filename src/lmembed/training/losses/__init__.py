"""Loss functions for embedding training, one concept per module, pure torch.

=================== ==================================================================
module              holds
=================== ==================================================================
:mod:`.infonce`     ``InfoNCELoss`` (in-batch + hard negatives), similarity helpers
:mod:`.gte`         ``GTELoss``, GTE's improved contrastive loss (enlarged partition function)
:mod:`.triplet`     ``TripletLoss`` with a margin
:mod:`.angle`       ``AnglELoss`` (CoSENT + in-batch + angle terms) for scored pairs
:mod:`.matryoshka`  ``MatryoshkaLoss``, any loss over nested leading dimensions
:mod:`.factory`     ``build_training_loss``: the trainer's loss from a ``TrainConfig``
=================== ==================================================================

Retrieval losses share one call signature::

    loss(query: Tensor[B, D], positive: Tensor[B, D], negatives: Tensor[B, N, D] | None) -> Tensor

Embeddings arrive un-normalised; losses with a ``similarity`` option normalise internally for
``"cosine"``. ``AnglELoss`` is the exception: it scores labelled pairs, ``(text1, text2, scores)``.
``MatryoshkaLoss`` wraps any of them.

``build_loss(name, **kwargs)`` (here) constructs a loss from a config-friendly name::

    build_loss("infonce", temperature=0.02)
    build_loss("matryoshka", inner="gte", dims=[768, 256, 64], inner_kwargs={"temperature": 0.05})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from lmembed.training.losses.angle import AnglELoss, angle_similarity, cosent_loss
from lmembed.training.losses.gte import GTELoss
from lmembed.training.losses.infonce import InfoNCELoss, Similarity, pairwise_similarity, similarity_matrix
from lmembed.training.losses.matryoshka import MatryoshkaLoss
from lmembed.training.losses.triplet import TripletLoss

__all__ = [
    "LOSSES",
    "AnglELoss",
    "GTELoss",
    "InfoNCELoss",
    "MatryoshkaLoss",
    "Similarity",
    "TripletLoss",
    "angle_similarity",
    "available_losses",
    "build_loss",
    "cosent_loss",
    "pairwise_similarity",
    "register_loss",
    "similarity_matrix",
]

LossFactory = Callable[..., nn.Module]

LOSSES: dict[str, LossFactory] = {
    "infonce": InfoNCELoss,
    "triplet": TripletLoss,
    "gte": GTELoss,
    "angle": AnglELoss,
}
_ALIASES = {
    "info_nce": "infonce",
    "contrastive": "infonce",
    "mnrl": "infonce",
    "gte_icl": "gte",
    "improved_contrastive": "gte",
    "cosent_angle": "angle",
    "mrl": "matryoshka",
}


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)


def register_loss(name: str, factory: LossFactory) -> None:
    """Make ``factory`` (a loss class or a function returning a module) reachable by ``build_loss``."""
    key = _canonical(name)
    if key == "matryoshka":
        raise ValueError("'matryoshka' is reserved for the wrapper")
    LOSSES[key] = factory


def available_losses() -> list[str]:
    """Registered names, including the ``"matryoshka"`` wrapper."""
    return sorted([*LOSSES, "matryoshka"])


def _build_matryoshka(
    inner: str | nn.Module,
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
    inner_kwargs: Mapping[str, Any] | None = None,
) -> MatryoshkaLoss:
    if isinstance(inner, nn.Module):
        if inner_kwargs:
            raise ValueError("inner_kwargs only apply when inner is given by name")
        inner_loss = inner
    else:
        inner_loss = build_loss(inner, **dict(inner_kwargs or {}))
    return MatryoshkaLoss(inner_loss, dims=dims, weights=weights)


def build_loss(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate a loss by name (case-insensitive; ``-`` and ``_`` are interchangeable).

    ``"matryoshka"`` takes ``inner`` (a name or a module), ``dims``, optional ``weights`` and, when
    ``inner`` is a name, optional ``inner_kwargs``. Every other name passes ``kwargs`` to its class.
    """
    key = _canonical(name)
    if key == "matryoshka":
        return _build_matryoshka(**kwargs)
    if key not in LOSSES:
        raise KeyError(f"unknown loss {name!r}; available: {', '.join(available_losses())}")
    return LOSSES[key](**kwargs)
