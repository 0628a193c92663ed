"""InfoNCE: softmax cross-entropy over similarity scores (van den Oord et al., 2018).

This is the contrastive objective behind E5-mistral ("Improving Text Embeddings with Large Language
Models", Wang et al., 2023; τ = 0.02) and NV-Embed (Lee et al., 2024). Each query must pick out its
positive document among a set of candidates; the logits are similarities divided by a temperature τ.

Candidate sets:

* ``in_batch_negatives=True`` (E5-mistral, NV-Embed stage 1): every positive and every hard negative
  in the batch is a candidate for every query, i.e. ``B + B*N`` columns. Under DDP the ``gather``
  hook widens this to the positives and hard negatives of all processes.
* ``in_batch_negatives=False`` (NV-Embed stage 2): each query only competes its own positive against
  its own ``N`` hard negatives, i.e. ``1 + N`` columns. Useful for classification/clustering data
  where another row's positive may well be a correct answer.

This module also holds the small helpers shared by the other losses (similarity functions and the
handling of the optional hard-negative tensor), because they are the InfoNCE building blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.training.distributed import global_batch_offset

__all__ = [
    "GatherFn",
    "InfoNCELoss",
    "Similarity",
    "check_similarity",
    "flatten_negatives",
    "normalize_negatives",
    "pairwise_similarity",
    "similarity_matrix",
]

Similarity = Literal["cosine", "dot"]
GatherFn = Callable[[Tensor], Tensor]
_SIMILARITIES = ("cosine", "dot")


def check_similarity(similarity: str) -> None:
    """Raise a clear error for an unknown similarity name."""
    if similarity not in _SIMILARITIES:
        raise ConfigError(f"similarity must be one of {_SIMILARITIES}, got {similarity!r}")


def similarity_matrix(a: Tensor, b: Tensor, similarity: Similarity = "cosine") -> Tensor:
    """All-pairs scores: ``[M, D] x [K, D] -> [M, K]``; cosine normalises both sides first."""
    if similarity == "cosine":
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    return a @ b.transpose(-1, -2)


def pairwise_similarity(a: Tensor, b: Tensor, similarity: Similarity = "cosine") -> Tensor:
    """Row-wise scores over the last dim, with broadcasting (``[B, 1, D]`` vs ``[B, N, D]`` -> ``[B, N]``)."""
    if similarity == "cosine":
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    return (a * b).sum(dim=-1)


def normalize_negatives(negatives: Tensor | None, query: Tensor) -> Tensor:
    """Return hard negatives as ``[B, N, D]``; ``None`` becomes ``N = 0`` and ``[B, D]`` becomes ``N = 1``."""
    batch, dim = query.shape
    if negatives is None:
        return query.new_zeros((batch, 0, dim))
    if negatives.dim() == 2:
        negatives = negatives.unsqueeze(1)
    if negatives.dim() != 3 or negatives.size(0) != batch or negatives.size(2) != dim:
        raise ValueError(f"negatives must be [B={batch}, N, D={dim}], got {tuple(negatives.shape)}")
    return negatives


def flatten_negatives(negatives: Tensor) -> Tensor:
    """``[B, N, D] -> [B*N, D]``, query-major (row ``i*N + k`` is query ``i``'s ``k``-th negative)."""
    return negatives.reshape(-1, negatives.size(-1))


class InfoNCELoss(nn.Module):
    """Contrastive cross-entropy of each query against its positive and the negatives.

    Args:
        temperature: logits are ``similarity / temperature`` (0.02 as in E5-mistral / NV-Embed).
        similarity: ``"cosine"`` (embeddings are L2-normalised here) or ``"dot"`` (raw inner product).
        in_batch_negatives: score each query against all positives and hard negatives in the batch
            (True) or only against its own positive and its own hard negatives (False).
        symmetric: also add the document-to-query direction (each positive must pick out its query
            among all queries) and average the two directions. Needs in-batch negatives.
        gather: optional hook that concatenates a tensor across processes in rank order, keeping the
            gradient of the local slice (e.g. :func:`lmembed.training.distributed.gather_with_grad`).
            When set, candidates come from every process and the targets are shifted by
            :func:`~lmembed.training.distributed.global_batch_offset`; queries stay local. All
            processes must then call the loss together and with the same number of negatives.

    Call with ``query [B, D]``, ``positive [B, D]`` and ``negatives [B, N, D]`` (or ``None``); returns
    the mean loss over the local queries.
    """

    def __init__(
        self,
        temperature: float = 0.02,
        similarity: Similarity = "cosine",
        in_batch_negatives: bool = True,
        symmetric: bool = False,
        gather: GatherFn | None = None,
    ) -> None:
        super().__init__()
        check_similarity(similarity)
        if temperature <= 0:
            raise ConfigError(f"temperature must be positive, got {temperature}")
        if symmetric and not in_batch_negatives:
            raise ValueError(
                "symmetric=True needs in_batch_negatives=True (the reverse term contrasts against other queries)"
            )
        self.temperature = temperature
        self.similarity: Similarity = similarity
        self.in_batch_negatives = in_batch_negatives
        self.symmetric = symmetric
        self.gather = gather

    def forward(
        self,
        query: Tensor,
        positive: Tensor,
        negatives: Tensor | None = None,
        false_negatives: Tensor | None = None,
    ) -> Tensor:
        """``false_negatives`` (``[B, T + T·N]`` booleans over the gathered documents, see
        :attr:`lmembed.training.rows.TrainBatch.false_negatives`): columns left out of a row's softmax (and, in the
        symmetric term, the queries of those positives), being copies of its own positive."""
        negatives = normalize_negatives(negatives, query)
        if not self.in_batch_negatives:
            return self._own_candidates_loss(query, positive, negatives)
        return self._in_batch_loss(query, positive, negatives, false_negatives)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, similarity={self.similarity}, "
            f"in_batch_negatives={self.in_batch_negatives}, symmetric={self.symmetric}, "
            f"gather={self.gather is not None}"
        )

    def _own_candidates_loss(self, query: Tensor, positive: Tensor, negatives: Tensor) -> Tensor:
        """NV-Embed stage 2: column 0 is the own positive, columns 1..N the own hard negatives."""
        candidates = torch.cat([positive.unsqueeze(1), negatives], dim=1)
        logits = pairwise_similarity(query.unsqueeze(1), candidates, self.similarity) / self.temperature
        targets = torch.zeros(query.size(0), dtype=torch.long, device=query.device)
        return F.cross_entropy(logits, targets)

    def _in_batch_loss(
        self, query: Tensor, positive: Tensor, negatives: Tensor, false_negatives: Tensor | None = None
    ) -> Tensor:
        """Every (gathered) positive and hard negative is a candidate for every local query, except the copies of
        its own positive ``false_negatives`` marks."""
        gather = self.gather or _identity
        all_positives = gather(positive)
        candidates = [all_positives]
        if negatives.size(1) > 0:
            candidates.append(gather(flatten_negatives(negatives)))
        offset = global_batch_offset(query.size(0), query.device) if self.gather is not None else 0
        targets = torch.arange(query.size(0), device=query.device) + offset
        logits = similarity_matrix(query, torch.cat(candidates), self.similarity) / self.temperature
        if false_negatives is not None:
            if false_negatives.shape != logits.shape:
                raise ValueError(
                    f"false_negatives has shape {tuple(false_negatives.shape)}, the logits {tuple(logits.shape)}"
                )
            logits = logits.masked_fill(false_negatives, float("-inf"))
        loss = F.cross_entropy(logits, targets)
        if not self.symmetric:
            return loss
        reverse = similarity_matrix(positive, gather(query), self.similarity) / self.temperature
        if false_negatives is not None:  # the query of another copy of this positive is this positive's query too
            reverse = reverse.masked_fill(false_negatives[:, : reverse.size(1)], float("-inf"))
        return 0.5 * (loss + F.cross_entropy(reverse, targets))


def _identity(tensor: Tensor) -> Tensor:
    return tensor
