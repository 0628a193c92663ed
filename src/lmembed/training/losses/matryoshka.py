"""Matryoshka Representation Learning (Kusupati et al., 2022).

MRL trains one embedding so that each of its prefixes (the first ``m`` coordinates, for a chosen set of
``m``) is usable on its own, which lets a deployment trade accuracy for index size by truncating. The
recipe is simple: evaluate the same objective on every truncation and minimise a weighted sum,

    loss = Σ_m  c_m · L(embeddings[..., :m])

``MatryoshkaLoss`` wraps any loss in this package. It truncates every embedding argument (tensors with
two or more dimensions: ``[B, D]`` or ``[B, N, D]``) along the last dimension and passes everything
else (``None``, AnglE's ``[B]`` scores, keyword options) through untouched, and so are the distillation losses'
``teacher_scores`` (``[B, 1 + N]``, scores rather than embeddings). Normalisation is left to
the inner loss, so a cosine loss re-normalises each prefix, as MRL requires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from lmembed.errors import ConfigError

__all__ = ["MatryoshkaLoss", "truncate_embeddings"]

#: keyword arguments that hold scores or masks, not embeddings: never truncated
SCORE_KEYWORDS = frozenset({"teacher_scores", "false_negatives"})


def truncate_embeddings(value: Any, dim: int) -> Any:
    """Keep the first ``dim`` coordinates of an embedding tensor; return anything else unchanged."""
    if isinstance(value, Tensor) and value.dim() >= 2:
        if value.size(-1) < dim:
            raise ConfigError(f"dims: cannot truncate embeddings of size {value.size(-1)} to {dim}")
        return value[..., :dim]
    return value


class MatryoshkaLoss(nn.Module):
    """Weighted sum of an inner loss evaluated on nested prefixes of the embeddings.

    Args:
        loss: the inner objective (any module with the package's call signature, or AnglE's).
        dims: prefix sizes, e.g. ``[768, 512, 256, 128, 64]``; each must not exceed the embedding size.
        weights: one importance weight per entry of ``dims``; all 1.0 when omitted.

    The call signature is the inner loss's own.
    """

    def __init__(self, loss: nn.Module, dims: Sequence[int], weights: Sequence[float] | None = None) -> None:
        super().__init__()
        if not dims:
            raise ConfigError("dims must list at least one embedding size")
        if any(int(d) <= 0 for d in dims):
            raise ConfigError(f"dims must be positive, got {list(dims)}")
        weights = [1.0] * len(dims) if weights is None else list(weights)
        if len(weights) != len(dims):
            raise ConfigError(f"got {len(weights)} weights for {len(dims)} dims")
        self.loss = loss
        self.dims = [int(d) for d in dims]
        self.weights = [float(w) for w in weights]

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        total: Tensor | None = None
        for dim, weight in zip(self.dims, self.weights, strict=True):
            inner_args = [truncate_embeddings(a, dim) for a in args]
            inner_kwargs = {k: v if k in SCORE_KEYWORDS else truncate_embeddings(v, dim) for k, v in kwargs.items()}
            term = weight * self.loss(*inner_args, **inner_kwargs)
            total = term if total is None else total + term
        assert total is not None  # dims is non-empty
        return total

    def extra_repr(self) -> str:
        return f"dims={self.dims}, weights={self.weights}"
