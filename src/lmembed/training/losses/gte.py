"""GTE's improved contrastive loss (Li et al., 2023, "Towards General Text Embeddings with Multi-stage
Contrastive Learning").

Plain InfoNCE only asks each query to prefer its positive over the other documents. GTE enlarges the
partition function with three more kinds of in-batch contrasts, so that for row ``i``

    loss_i = -log( exp(s(q_i, d_i)/τ) / Z_i )

    Z_i =   Σ_j      exp(s(q_i, d_j)/τ)    query vs. every document (positives and hard negatives)
          + Σ_{j≠i}  exp(s(q_i, q_j)/τ)    query vs. the other queries
          + Σ_j      exp(s(q_j, d_i)/τ)    positive vs. every query (its own too, as the paper's eq. 3 sums)
          + Σ_{j≠i}  exp(s(d_j, d_i)/τ)    positive vs. the other documents

The paper's batches hold (q, d) pairs only. Here hard negatives, when present, join the query-document
term (as in InfoNCE) and the document-document term as documents of *other* rows; a row's own hard
negatives are kept out of its document-document term because they were mined to resemble its query.
The loss is the mean over rows.

Under data parallelism a ``gather`` hook (:func:`lmembed.training.distributed.gather_with_grad`) widens
every in-batch term to the global batch: local queries and positives are scored against the queries,
positives and negatives of all processes, and "row i" means the local row's global index.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.training.distributed import global_batch_offset
from lmembed.training.losses.infonce import (
    GatherFn,
    Similarity,
    check_similarity,
    flatten_negatives,
    normalize_negatives,
    similarity_matrix,
)

__all__ = ["GTELoss"]


def _mask_own_columns(scores: Tensor, offset: int) -> Tensor:
    """Set ``scores[i, offset + i]`` to -inf (a row's own query or positive) so it drops out."""
    rows = torch.arange(scores.size(0), device=scores.device)
    own = (rows + offset).unsqueeze(1) == torch.arange(scores.size(1), device=scores.device).unsqueeze(0)
    return scores.masked_fill(own, float("-inf"))


def _own_documents_mask(batch: int, offset: int, total: int, num_negatives: int, device: torch.device) -> Tensor:
    """``[B, T + T*N]`` mask of the document columns of local row ``i`` (global row ``offset + i``) among
    ``T`` gathered rows: its positive and its negatives."""
    rows = (torch.arange(batch, device=device) + offset).unsqueeze(1)
    own_positive = rows == torch.arange(total, device=device).unsqueeze(0)
    negative_owner = torch.arange(total * num_negatives, device=device) // max(num_negatives, 1)
    return torch.cat([own_positive, rows == negative_owner.unsqueeze(0)], dim=1)


def _identity(tensor: Tensor) -> Tensor:
    return tensor


class GTELoss(nn.Module):
    """Improved contrastive loss with query-query, document-query and document-document terms.

    Args:
        temperature: logits are ``similarity / temperature``; 0.01 by default (a sharp setting typical
            of GTE-style cosine training; recipes may override it).
        similarity: ``"cosine"`` (GTE's choice, embeddings normalised here) or ``"dot"``.
        gather: optional hook that concatenates a tensor across processes (see the module docstring).

    Call with ``query [B, D]``, ``positive [B, D]`` and ``negatives [B, N, D]`` (or ``None``).
    With ``B = 1`` and no negatives ``Z`` holds the positive twice (first and third terms): the loss is ``log 2``.
    """

    def __init__(
        self, temperature: float = 0.01, similarity: Similarity = "cosine", gather: GatherFn | None = None
    ) -> None:
        super().__init__()
        self.gather = gather
        check_similarity(similarity)
        if temperature <= 0:
            raise ConfigError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.similarity: Similarity = similarity

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> Tensor:
        negatives = normalize_negatives(negatives, query)
        batch, num_negatives = negatives.shape[:2]
        gather = self.gather or _identity
        all_queries, all_positives = gather(query), gather(positive)
        flat = flatten_negatives(negatives)
        documents = torch.cat([all_positives, gather(flat) if num_negatives else flat])  # [T + T*N, D]
        offset = global_batch_offset(batch, query.device) if self.gather is not None else 0

        def score(a: Tensor, b: Tensor) -> Tensor:
            return similarity_matrix(a, b, self.similarity) / self.temperature

        own_documents = _own_documents_mask(batch, offset, all_positives.size(0), num_negatives, query.device)
        logits = torch.cat(
            [
                score(query, documents),
                _mask_own_columns(score(query, all_queries), offset),
                score(positive, all_queries),  # j = i too: s(q_i, d_i) counts again here (eq. 3)
                score(positive, documents).masked_fill(own_documents, float("-inf")),
            ],
            dim=1,
        )
        targets = torch.arange(batch, device=query.device) + offset  # s(q_i, d_i) sits in the first block
        return F.cross_entropy(logits, targets)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, similarity={self.similarity}, gather={self.gather is not None}"
