"""Distillation from a teacher's scores: the student's similarities follow the teacher's over each row's candidates.

Rows carry ``teacher_scores`` (a cross-encoder's or a teacher embedder's score of the positive and of each hard
negative, as the corpus-only synthesis recipe writes them). Both losses here see only a row's own candidates
(there are no teacher scores for other rows' texts), as ``[B, 1 + N]`` tensors: column 0 the positive,
columns 1..N the hard negatives in the row's order.

* :class:`MarginMSELoss` (Hofstätter et al., 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture
  Knowledge Distillation"; GPL, Wang et al., 2022): the mean squared error between the student's margin
  ``s(q, p) - s(q, n)`` and the teacher's, over every (positive, negative) pair of a row. Only the margins are
  matched, so the student's and teacher's scores may sit on different scales' offsets.
* :class:`ListwiseKLLoss`: ``KL(softmax(t / tau_t) || softmax(s / tau_s))`` over a row's candidates, averaged over
  the rows (the listwise distillation of RocketQAv2 and of cross-encoder-to-bi-encoder training).

Call signature: the retrieval losses' ``(query, positive, negatives)`` plus ``teacher_scores`` (keyword,
required). :func:`reads_teacher_scores` tells the trainer whether a built loss needs them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.training.losses.infonce import Similarity, check_similarity, normalize_negatives, pairwise_similarity
from lmembed.training.losses.matryoshka import MatryoshkaLoss

__all__ = ["DistillationLoss", "ListwiseKLLoss", "MarginMSELoss", "reads_teacher_scores"]


class DistillationLoss(nn.Module):
    """The shared part: the student's ``[B, 1 + N]`` candidate scores and the teacher's, checked to match."""

    def __init__(self, similarity: Similarity = "cosine") -> None:
        super().__init__()
        check_similarity(similarity)
        self.similarity: Similarity = similarity

    def candidate_scores(
        self, query: Tensor, positive: Tensor, negatives: Tensor | None, teacher_scores: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The student's scores of each row's positive and negatives, and the teacher's, both ``[B, 1 + N]``."""
        negatives = normalize_negatives(negatives, query)
        if negatives.size(1) == 0:
            raise ValueError(f"{type(self).__name__} needs at least one hard negative per row (num_negatives >= 1)")
        if teacher_scores is None:
            raise ValueError(f"{type(self).__name__} needs teacher_scores (the training rows' 'teacher_scores' field)")
        candidates = torch.cat([positive.unsqueeze(1), negatives], dim=1)
        student = pairwise_similarity(query.unsqueeze(1), candidates, self.similarity)
        if teacher_scores.shape != student.shape:
            raise ValueError(
                f"teacher_scores must be [B={student.size(0)}, 1 + N={student.size(1)}] (positive, then each "
                f"negative), got {tuple(teacher_scores.shape)}"
            )
        return student, teacher_scores.to(student.dtype)

    def extra_repr(self) -> str:
        return f"similarity={self.similarity}"


class MarginMSELoss(DistillationLoss):
    """MSE between the student's and the teacher's margins ``score(q, p) - score(q, n)``, mean over the ``B * N``
    (row, negative) pairs. ``similarity``: the student's score, ``"cosine"`` or ``"dot"``; choose the one on the
    teacher's scale (the corpus-only recipe's teacher scores are cosines)."""

    def forward(
        self, query: Tensor, positive: Tensor, negatives: Tensor | None = None, *, teacher_scores: Tensor | None = None
    ) -> Tensor:
        student, teacher = self.candidate_scores(query, positive, negatives, teacher_scores)
        student_margin = student[:, :1] - student[:, 1:]
        teacher_margin = teacher[:, :1] - teacher[:, 1:]
        return F.mse_loss(student_margin, teacher_margin)


class ListwiseKLLoss(DistillationLoss):
    """``KL(teacher || student)`` of the softmax distributions over each row's candidates, mean over rows.

    Args:
        temperature: the student's scores are divided by it (as in InfoNCE).
        teacher_temperature: the teacher's scores are divided by it; ``None``: the same as ``temperature`` (right
            when both score with the same similarity, e.g. the corpus-only recipe's teacher cosines).
        similarity: the student's score, ``"cosine"`` or ``"dot"``.
    """

    def __init__(
        self, temperature: float = 0.05, teacher_temperature: float | None = None, similarity: Similarity = "cosine"
    ) -> None:
        super().__init__(similarity)
        for name, value in (("temperature", temperature), ("teacher_temperature", teacher_temperature)):
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")
        self.temperature = float(temperature)
        self.teacher_temperature = float(teacher_temperature if teacher_temperature is not None else temperature)

    def forward(
        self, query: Tensor, positive: Tensor, negatives: Tensor | None = None, *, teacher_scores: Tensor | None = None
    ) -> Tensor:
        student, teacher = self.candidate_scores(query, positive, negatives, teacher_scores)
        log_student = F.log_softmax(student / self.temperature, dim=-1)
        log_teacher = F.log_softmax(teacher / self.teacher_temperature, dim=-1)
        return F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True)

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, teacher_temperature={self.teacher_temperature}, "
            f"similarity={self.similarity}"
        )


def reads_teacher_scores(loss: nn.Module) -> bool:
    """Whether ``loss`` (or the loss a Matryoshka wrapper holds) must be called with ``teacher_scores``."""
    if isinstance(loss, MatryoshkaLoss):
        return reads_teacher_scores(loss.loss)
    return isinstance(loss, DistillationLoss)
