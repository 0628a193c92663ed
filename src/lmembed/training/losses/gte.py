"""GTE's improved contrastive loss (Li et al., 2023, "Towards General Text Embeddings with Multi-stage
Contrastive Learning").

Plain InfoNCE only asks each query to prefer its positive over the other documents. GTE enlarges the
partition function with three more kinds of in-batch contrasts, so that for row ``i``

    loss_i = -log( exp(s(q_i, d_i)/τ) / Z_i )

    Z_i =   Σ_j      exp(s(q_i, d_j)/τ)    query vs. every document (positives and hard negatives)
          + Σ_{j≠i}  exp(s(q_i, q_j)/τ)    query vs. the other queries
          + Σ_{j≠i}  exp(s(q_j, d_i)/τ)    positive vs. the other queries
          + Σ_{j≠i}  exp(s(d_j, d_i)/τ)    positive vs. the other documents

The paper's batches hold (q, d) pairs only. Here hard negatives, when present, join the query-document
term (as in InfoNCE) and the document-document term as documents of *other* rows; a row's own hard
negatives are kept out of its document-document term because they were mined to resemble its query.
The loss is the mean over rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.training.losses.infonce import (
    Similarity,
    check_similarity,
    flatten_negatives,
    normalize_negatives,
    similarity_matrix,
)

__all__ = ["GTELoss"]


def _mask_diagonal(scores: Tensor) -> Tensor:
    """Set ``scores[i, i]`` to -inf so those terms drop out of the softmax."""
    eye = torch.eye(scores.size(0), scores.size(1), dtype=torch.bool, device=scores.device)
    return scores.masked_fill(eye, float("-inf"))


def _own_documents_mask(batch: int, num_negatives: int, device: torch.device) -> Tensor:
    """``[B, B + B*N]`` mask of the columns that belong to row ``i`` (its positive and its negatives)."""
    rows = torch.arange(batch, device=device)
    own_positive = rows.unsqueeze(1) == rows.unsqueeze(0)
    negative_owner = torch.arange(batch * num_negatives, device=device) // max(num_negatives, 1)
    own_negatives = rows.unsqueeze(1) == negative_owner.unsqueeze(0)
    return torch.cat([own_positive, own_negatives], dim=1)


class GTELoss(nn.Module):
    """Improved contrastive loss with query-query, document-query and document-document terms.

    Args:
        temperature: logits are ``similarity / temperature``; 0.01 by default (a sharp setting typical
            of GTE-style cosine training; recipes may override it).
        similarity: ``"cosine"`` (GTE's choice, embeddings normalised here) or ``"dot"``.

    Call with ``query [B, D]``, ``positive [B, D]`` and ``negatives [B, N, D]`` (or ``None``).
    With ``B = 1`` and no negatives every extra term is empty and the loss is 0.
    """

    def __init__(self, temperature: float = 0.01, similarity: Similarity = "cosine") -> None:
        super().__init__()
        check_similarity(similarity)
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature
        self.similarity: Similarity = similarity

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> Tensor:
        negatives = normalize_negatives(negatives, query)
        batch, num_negatives = negatives.shape[:2]
        documents = torch.cat([positive, flatten_negatives(negatives)])  # [B + B*N, D]

        def score(a: Tensor, b: Tensor) -> Tensor:
            return similarity_matrix(a, b, self.similarity) / self.temperature

        query_doc = score(query, documents)
        query_query = _mask_diagonal(score(query, query))
        doc_query = _mask_diagonal(score(positive, query))
        doc_doc = score(positive, documents).masked_fill(
            _own_documents_mask(batch, num_negatives, query.device), float("-inf")
        )
        logits = torch.cat([query_doc, query_query, doc_query, doc_doc], dim=1)
        targets = torch.arange(batch, device=query.device)  # s(q_i, d_i) sits in the first block
        return F.cross_entropy(logits, targets)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, similarity={self.similarity}"
