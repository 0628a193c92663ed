"""2D Matryoshka Sentence Embeddings (2DMSE; Li et al., 2024, arXiv:2402.14776, as covered in
../shared/papers/review-universal-text-embeddings-mteb.txt): embeddings usable at a shallower layer *and* a
shorter prefix, so inference can stop the forward pass early (``layer=k``, :mod:`lmembed.models.depth`) and
truncate the vector (``dim=m``).

Per training step, with ``X^m_l`` the first ``m`` coordinates of the pooled embedding of layer ``l``:

* the last layer ``L`` is trained with the full Matryoshka objective: the inner loss on the full vector
  (``L^d_L``, eq. 7) and on every nested prefix ``m`` of ``dims`` (``L^m_L``, eq. 9);
* one shallower layer ``l ~ U(1, L-1)`` is drawn (uniformly, with torch's RNG, so a resumed run draws the same
  layers) and trained the same way (``L^d_l``, eq. 8, and ``L^m_l``, eq. 10);
* the shallow layer is aligned with the last one (eq. 11) by the KL divergence between the two full vectors read
  as distributions over their coordinates, ``KL(softmax(X_L / T) || softmax(X_l / T))``, averaged over every
  embedded text (queries, positives and negatives). The last layer is the target and gets no gradient from this
  term (self-distillation); the term is scaled by ``T²`` so its gradient does not shrink with the temperature.
  The paper writes plain ``KLDiv(X_l, X_L)``: the default ``T = 1``.

::

    loss = last_weight · MRL(X_L) + shallow_weight · MRL(X_l) + kl_weight · T² · KL

where ``MRL(X) = Σ_m c_m · inner(X[..., :m])`` over ``dims`` plus the full size when ``dims`` does not list it.

The loss needs each text's pooled vectors at several layers. It declares which (:meth:`Matryoshka2DLoss.layers_to_read`)
and the trainer's model returns them side by side along the last axis, the strategy's own layer first
(``[rows, (1 + K) · D]``), so the trainer's batching, hard-negative reshaping and GradCache are unchanged.
Under several processes each draws its own shallow layer, so in-batch negatives stay within a process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lmembed.errors import ConfigError
from lmembed.training.losses.matryoshka import truncate_embeddings

__all__ = ["LayerwiseLoss", "Matryoshka2DLoss", "alignment_kl"]


class LayerwiseLoss(nn.Module):
    """A loss over pooled vectors of several layers. The trainer asks :meth:`layers_to_read` once, then passes
    each text's vectors of the strategy's layer and of those layers concatenated along the last axis."""

    def layers_to_read(self, top: int) -> tuple[int, ...]:
        """The layers (besides ``top``, the deepest one the strategy reads) whose vectors the loss needs."""
        raise NotImplementedError


def alignment_kl(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``T² · KL(softmax(teacher / T) || softmax(student / T))`` over the last axis, averaged over the rows of
    every leading axis; ``teacher`` is treated as a constant."""
    target = F.softmax(teacher.detach().flatten(0, -2) / temperature, dim=-1)
    log_student = F.log_softmax(student.flatten(0, -2) / temperature, dim=-1)
    return F.kl_div(log_student, target, reduction="batchmean") * temperature**2


class Matryoshka2DLoss(LayerwiseLoss):
    """The 2DMSE objective (see the module docstring) around any retrieval loss of this package.

    Args:
        loss: the inner objective, called as ``loss(query, positive, negatives)``.
        dims: the Matryoshka prefix sizes trained at both layers (the full size is always trained).
        weights: one weight ``c_m`` per entry of ``dims``; all 1.0 when omitted.
        last_weight, shallow_weight, kl_weight: the three terms' weights (all 1.0 in the paper).
        kl_temperature: ``T`` of the alignment term; 0 turns the term off.
        min_layer: the shallowest layer drawn (1: the first block's output; 0 would be the embeddings).
    """

    def __init__(
        self,
        loss: nn.Module,
        dims: Sequence[int],
        weights: Sequence[float] | None = None,
        *,
        last_weight: float = 1.0,
        shallow_weight: float = 1.0,
        kl_weight: float = 1.0,
        kl_temperature: float = 1.0,
        min_layer: int = 1,
    ) -> None:
        super().__init__()
        if not dims or any(int(d) <= 0 for d in dims):
            raise ConfigError(f"dims must list positive embedding sizes, got {list(dims)}")
        weights = [1.0] * len(dims) if weights is None else [float(w) for w in weights]
        if len(weights) != len(dims):
            raise ConfigError(f"got {len(weights)} weights for {len(dims)} dims")
        if kl_temperature < 0:
            raise ConfigError(f"kl_temperature must be >= 0 (0 turns the alignment term off), got {kl_temperature}")
        if min_layer < 0:
            raise ConfigError(f"min_layer must be >= 0, got {min_layer}")
        self.loss = loss
        self.dims = [int(d) for d in dims]
        self.weights = weights
        self.last_weight = float(last_weight)
        self.shallow_weight = float(shallow_weight)
        self.kl_weight = float(kl_weight)
        self.kl_temperature = float(kl_temperature)
        self.min_layer = int(min_layer)
        self.shallow_layers: tuple[int, ...] = ()
        self.last_drawn: int | None = None  # the layer drawn by the latest call (for logs and tests)

    def layers_to_read(self, top: int) -> tuple[int, ...]:
        """Every layer ``min_layer .. top - 1``: one of them is drawn per step."""
        layers = tuple(range(self.min_layer, top))
        if not layers:
            raise ConfigError(f"2DMSE needs a layer below the strategy's layer {top} (min_layer={self.min_layer})")
        self.shallow_layers = layers
        return layers

    def matryoshka(self, query: Tensor, positive: Tensor, negatives: Tensor | None) -> Tensor:
        """``Σ_m c_m · inner(X[..., :m])`` over ``dims``, plus the full size when ``dims`` does not list it."""
        full = query.size(-1)
        terms = list(zip(self.dims, self.weights, strict=True))
        if full not in self.dims:
            terms.insert(0, (full, 1.0))
        total = query.new_zeros(())
        for dim, weight in terms:
            parts = [truncate_embeddings(x, dim) for x in (query, positive, negatives)]
            total = total + weight * self.loss(*parts)
        return total

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> Tensor:
        count = 1 + len(self.shallow_layers)
        views = [_split_layers(x, count) if x is not None else None for x in (query, positive, negatives)]
        pick = 1 + int(torch.randint(len(self.shallow_layers), (1,)).item())
        self.last_drawn = self.shallow_layers[pick - 1]
        last = [v[0] if v is not None else None for v in views]
        shallow = [v[pick] if v is not None else None for v in views]
        total = self.last_weight * self.matryoshka(*last) + self.shallow_weight * self.matryoshka(*shallow)
        if self.kl_temperature > 0 and self.kl_weight:
            students = torch.cat([x.reshape(-1, x.size(-1)) for x in shallow if x is not None])
            teachers = torch.cat([x.reshape(-1, x.size(-1)) for x in last if x is not None])
            total = total + self.kl_weight * alignment_kl(students, teachers, self.kl_temperature)
        return total

    def extra_repr(self) -> str:
        return (
            f"dims={self.dims}, weights={self.weights}, last_weight={self.last_weight}, "
            f"shallow_weight={self.shallow_weight}, kl_weight={self.kl_weight}, kl_temperature={self.kl_temperature}"
        )


def _split_layers(value: Tensor, count: int) -> list[Tensor]:
    """``[..., count · D]`` → ``count`` views ``[..., D]`` (the strategy's layer first)."""
    if count < 2:
        raise ConfigError(
            "2DMSE got the vectors of one layer only: the trainer must read the layers of layers_to_read() "
            "(lmembed's Trainer does; call layers_to_read and pass each text's vectors side by side)"
        )
    if value.size(-1) % count:
        raise ConfigError(f"embeddings of size {value.size(-1)} do not split into {count} layers")
    return list(value.chunk(count, dim=-1))
