"""The contract every evaluation task follows, and the result record it produces.

A task is one small class: it knows how to load its data and how to score an encoder on it. The
result is a :class:`TaskResult`, which serialises to MTEB's results layout (``results.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from lmembed.protocols import RetrievalEncoder


@dataclass
class TaskResult:
    """Scores of one encoder on one task split.

    ``scores`` uses MTEB's metric keys (``ndcg_at_10``, ``cosine_spearman``, ``accuracy`` ...) and
    always contains ``main_score``.
    """

    task_name: str
    task_type: str  # "Retrieval", "STS", "Classification", "Clustering", ...
    split: str
    scores: dict[str, float]
    main_metric: str
    subset: str = "default"
    evaluation_time: float = 0.0
    model_name: str = ""
    strategy: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def main_score(self) -> float:
        return float(self.scores["main_score"])


class Task(Protocol):
    """One evaluation task bound to its data."""

    name: str
    task_type: ClassVar[str]
    main_metric: ClassVar[str]

    def evaluate(self, encoder: RetrievalEncoder, *, batch_size: int = 32) -> TaskResult: ...
