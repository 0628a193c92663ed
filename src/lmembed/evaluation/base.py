"""The contract every evaluation task follows, and the result record it produces.

A task is one small class (a :class:`TaskType`): it knows how to load its data and how to score an
encoder on it; a loaded task is a :class:`Task`. The result is a :class:`TaskResult`, which
serialises to MTEB's results layout (``results.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
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
    """One evaluation task bound to its data and to its instruction (``None``: texts as they are).

    Every task type implements it: retrieval, reranking, STS, classification, clustering, pair
    classification and summarization (:mod:`lmembed.evaluation.tasks`).
    """

    name: str
    instruction: str | None
    task_type: ClassVar[str]
    main_metric: ClassVar[str]

    @property
    def split(self) -> str: ...

    def evaluate(self, encoder: RetrievalEncoder, *, batch_size: int = 32) -> TaskResult: ...

    def with_instruction(self, instruction: str | None) -> Task:
        """A copy of this task bound to ``instruction``."""
        ...


class TaskType(Protocol):
    """A task class: builds a :class:`Task` from the data at a path (a file or a folder)."""

    task_type: str
    main_metric: str

    def from_path(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        split: str = "test",
        instruction: str | None = None,
        **settings: Any,
    ) -> Task: ...
