"""Loss functions for embedding training, one concept per module, pure torch.

===================== ==================================================================
module                holds
===================== ==================================================================
:mod:`.infonce`       ``InfoNCELoss`` (in-batch + hard negatives), similarity helpers
:mod:`.gte`           ``GTELoss``, GTE's improved contrastive loss (enlarged partition function)
:mod:`.triplet`       ``TripletLoss`` with a margin
:mod:`.angle`         ``AnglELoss`` (CoSENT + in-batch + angle terms) for scored pairs
:mod:`.matryoshka`    ``MatryoshkaLoss``, any loss over nested leading dimensions
:mod:`.rerank`        ``PointwiseBCELoss``, ``ListwiseSoftmaxLoss``: a reranker's logits of groups
                      (``Tensor[B, 1 + N]``, positive first), registered with ``reranks=True``
:mod:`.matryoshka_2d` ``Matryoshka2DLoss`` (2DMSE): MRL at the last and a sampled shallower layer + alignment
:mod:`.distill`       ``MarginMSELoss``, ``ListwiseKLLoss``: distillation from the rows' ``teacher_scores``
:mod:`.factory`       ``build_training_loss``: the trainer's loss from a ``TrainConfig``
===================== ==================================================================

Retrieval losses share one call signature::

    loss(query: Tensor[B, D], positive: Tensor[B, D], negatives: Tensor[B, N, D] | None) -> Tensor

Embeddings arrive un-normalised; losses with a ``similarity`` option normalise internally for
``"cosine"``. ``AnglELoss`` is the exception: it scores labelled pairs, ``(text1, text2, scores)``.
``MatryoshkaLoss`` wraps any of them. Reranker losses (``listwise_softmax``, ``pointwise_bce``) take the logits of
a reranker's groups instead, ``loss(logits: Tensor[B, 1 + N])``; the trainer uses them when it trains a reranker.
The distillation losses (``margin_mse``, ``distill_kl``) take ``teacher_scores: Tensor[B, 1 + N]`` as a keyword
besides (:func:`~.distill.reads_teacher_scores`).

``build_loss(name, **kwargs)`` (here) constructs a loss from a config-friendly name::

    build_loss("infonce", temperature=0.02)
    build_loss("matryoshka", inner="gte", dims=[768, 256, 64], inner_kwargs={"temperature": 0.05})
    build_loss("2dmse", inner="infonce", dims=[384, 128, 64], kl_temperature=1.0)

Each name is registered once, as a :class:`LossSpec` that declares what the loss is: its class (or factory),
which of the trainer's shared settings (:data:`SHARED_OPTIONS`) it takes, and, for a loss the contrastive
trainer cannot drive, why. Names are spelled by the one rule of :mod:`lmembed.training.loss_names`
(case, ``-``/``_``, aliases), which every caller that compares loss names goes through.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from lmembed.citations import check_keys
from lmembed.errors import ConfigError, UnknownNameError
from lmembed.training.loss_names import MATRYOSHKA, canonical_loss_name
from lmembed.training.losses.angle import AnglELoss, angle_similarity, cosent_loss
from lmembed.training.losses.distill import ListwiseKLLoss, MarginMSELoss, reads_teacher_scores
from lmembed.training.losses.gte import GTELoss
from lmembed.training.losses.infonce import InfoNCELoss, Similarity, pairwise_similarity, similarity_matrix
from lmembed.training.losses.matryoshka import MatryoshkaLoss
from lmembed.training.losses.matryoshka_2d import LayerwiseLoss, Matryoshka2DLoss
from lmembed.training.losses.rerank import ListwiseSoftmaxLoss, PointwiseBCELoss
from lmembed.training.losses.triplet import TripletLoss

__all__ = [
    "LOSSES",
    "MATRYOSHKA",
    "SHARED_OPTIONS",
    "AnglELoss",
    "GTELoss",
    "InfoNCELoss",
    "LayerwiseLoss",
    "ListwiseKLLoss",
    "ListwiseSoftmaxLoss",
    "LossSpec",
    "MarginMSELoss",
    "Matryoshka2DLoss",
    "MatryoshkaLoss",
    "PointwiseBCELoss",
    "Similarity",
    "TripletLoss",
    "angle_similarity",
    "available_losses",
    "build_loss",
    "canonical_loss_name",
    "check_keywords",
    "cosent_loss",
    "loss_citations",
    "loss_spec",
    "pairwise_similarity",
    "reads_false_negatives",
    "reads_teacher_scores",
    "register_loss",
    "similarity_matrix",
]

LossFactory = Callable[..., nn.Module]

#: The settings a training config holds for every loss (``temperature``, ``similarity``,
#: ``in_batch_negatives``) and the trainer's cross-process ``gather`` hook; a loss declares which it takes.
SHARED_OPTIONS = frozenset({"temperature", "similarity", "in_batch_negatives", "gather"})


@dataclass(frozen=True)
class LossSpec:
    """One registered loss: how to build it and what it declares about itself.

    ``takes``: the :data:`SHARED_OPTIONS` its factory accepts (the trainer passes exactly these);
    ``not_contrastive``: why the contrastive trainer cannot use it (``None``: it can); ``wraps``: it takes another
    loss as ``inner`` (by name, with ``inner_kwargs``), to which the trainer's shared settings go; ``reranks``: it
    scores a reranker's groups of logits (the trainer's reranker mode), not embeddings; ``cites``: its papers."""

    factory: LossFactory
    takes: frozenset[str] = frozenset()
    not_contrastive: str | None = None
    wraps: bool = False
    reranks: bool = False
    #: the papers the loss comes from (keys of :data:`lmembed.citations.CITATIONS`); a saved model's card cites them
    cites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if unknown := self.takes - SHARED_OPTIONS:
            raise ValueError(f"takes: {sorted(unknown)} are not shared options ({', '.join(sorted(SHARED_OPTIONS))})")
        check_keys(self.cites, f"loss {getattr(self.factory, '__name__', self.factory)!r}")


def _inner_loss(inner: str | nn.Module, inner_kwargs: Mapping[str, Any] | None) -> nn.Module:
    """A wrapper's inner loss: a module as it is, or a name built with ``inner_kwargs``."""
    if isinstance(inner, nn.Module):
        if inner_kwargs:
            raise ConfigError("inner_kwargs only apply when inner is given by name")
        return inner
    return build_loss(inner, **dict(inner_kwargs or {}))


def _build_matryoshka_2d(
    dims: Sequence[int],
    inner: str | nn.Module = "infonce",
    weights: Sequence[float] | None = None,
    inner_kwargs: Mapping[str, Any] | None = None,
    last_weight: float = 1.0,
    shallow_weight: float = 1.0,
    kl_weight: float = 1.0,
    kl_temperature: float = 1.0,
    min_layer: int = 1,
) -> Matryoshka2DLoss:
    return Matryoshka2DLoss(
        _inner_loss(inner, inner_kwargs),
        dims,
        weights,
        last_weight=last_weight,
        shallow_weight=shallow_weight,
        kl_weight=kl_weight,
        kl_temperature=kl_temperature,
        min_layer=min_layer,
    )


LOSSES: dict[str, LossSpec] = {
    "infonce": LossSpec(
        InfoNCELoss, frozenset({"temperature", "similarity", "in_batch_negatives", "gather"}), cites=("oord2018cpc",)
    ),
    "gte": LossSpec(GTELoss, frozenset({"temperature", "similarity", "gather"}), cites=("li2023gte",)),
    "triplet": LossSpec(TripletLoss, cites=("reimers2019sbert",)),
    "angle": LossSpec(
        AnglELoss,
        not_contrastive="AnglE scores labelled text pairs, not (query, positive, negatives) rows",
        cites=("li2023angle",),
    ),
    "matryoshka_2d": LossSpec(_build_matryoshka_2d, wraps=True, cites=("li2024twodmse",)),  # 2DMSE (alias "2dmse")
    "listwise_softmax": LossSpec(ListwiseSoftmaxLoss, frozenset({"temperature"}), reranks=True, cites=("gao2021lce",)),
    "pointwise_bce": LossSpec(PointwiseBCELoss, reranks=True, cites=("nogueira2019monobert",)),
    "margin_mse": LossSpec(MarginMSELoss, frozenset({"similarity"}), cites=("hofstatter2020marginmse",)),
    "distill_kl": LossSpec(ListwiseKLLoss, frozenset({"temperature", "similarity"})),  # alias "kl", "listwise_kl"
}
#: the papers of the Matryoshka wrapper (not a :class:`LossSpec`: it is built by :func:`build_loss` itself)
MATRYOSHKA_CITES = ("kusupati2022mrl",)


def loss_citations(name: str, inner: str | None = None) -> tuple[str, ...]:
    """The papers of loss ``name`` (and of ``inner``, the loss a wrapper wraps)."""
    own = MATRYOSHKA_CITES if canonical_loss_name(name) == MATRYOSHKA else loss_spec(name).cites
    wraps = canonical_loss_name(name) == MATRYOSHKA or loss_spec(name).wraps
    return own + (loss_citations(inner) if wraps and inner else ())


def register_loss(name: str, factory: LossFactory | LossSpec) -> None:
    """Make a loss reachable by ``build_loss``: a :class:`LossSpec`, or a bare factory (a loss class or a
    function returning a module) that takes none of the shared options."""
    key = canonical_loss_name(name)
    if key == MATRYOSHKA:
        raise ValueError(f"{MATRYOSHKA!r} is reserved for the wrapper")
    LOSSES[key] = factory if isinstance(factory, LossSpec) else LossSpec(factory)


def available_losses() -> list[str]:
    """Registered names, including the ``"matryoshka"`` wrapper."""
    return sorted([*LOSSES, MATRYOSHKA])


def loss_spec(name: str) -> LossSpec:
    """The registered :class:`LossSpec` for ``name`` (any spelling :func:`canonical_loss_name` accepts)."""
    key = canonical_loss_name(name)
    if key not in LOSSES:
        raise UnknownNameError(f"unknown loss {name!r}; available: {', '.join(available_losses())}")
    return LOSSES[key]


def check_keywords(
    what: str, target: Callable[..., Any], given: Mapping[str, Any], error: type[Exception] = ConfigError, skip: int = 0
) -> None:
    """Refuse an option ``target`` (a loss factory, an objective class) has no parameter for, naming the ones it has
    (``what``: ``"loss 'infonce'"``); ``skip`` leading parameters are not options (an objective's model). A target
    that takes ``**kwargs`` passes them on and is not checked here."""
    params = list(inspect.signature(target).parameters.values())[skip:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    takes = [p.name for p in params]
    if unknown := sorted(set(given) - set(takes)):
        raise error(f"{what} has no option {', '.join(unknown)}; it takes {', '.join(takes) or 'none'}")


def _build_matryoshka(
    inner: str | nn.Module,
    dims: Sequence[int],
    weights: Sequence[float] | None = None,
    inner_kwargs: Mapping[str, Any] | None = None,
) -> MatryoshkaLoss:
    return MatryoshkaLoss(_inner_loss(inner, inner_kwargs), dims=dims, weights=weights)


def build_loss(name: str, **kwargs: Any) -> nn.Module:
    """Instantiate a loss by name (case-insensitive; ``-`` and ``_`` are interchangeable).

    ``"matryoshka"`` takes ``inner`` (a name or a module), ``dims``, optional ``weights`` and, when
    ``inner`` is a name, optional ``inner_kwargs``. Every other name passes ``kwargs`` to its class.
    """
    if canonical_loss_name(name) == MATRYOSHKA:
        check_keywords(f"loss {MATRYOSHKA!r}", _build_matryoshka, kwargs)
        return _build_matryoshka(**kwargs)
    factory = loss_spec(name).factory
    check_keywords(f"loss {name!r}", factory, kwargs)
    return factory(**kwargs)


def reads_false_negatives(loss: nn.Module) -> bool:
    """Whether ``loss`` (or the loss a Matryoshka wrapper holds) leaves a batch's copies of a row's positive out of
    its in-batch negatives when given ``false_negatives`` (:attr:`lmembed.training.rows.TrainBatch.false_negatives`)."""
    if isinstance(loss, MatryoshkaLoss):
        return reads_false_negatives(loss.loss)
    return isinstance(loss, InfoNCELoss) and loss.in_batch_negatives
