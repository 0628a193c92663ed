"""The contract every evaluation task follows, and the result record it produces.

A task is one small class (a :class:`TaskType`): it knows how to load its data and how to score an
encoder on it; a loaded task is a :class:`Task`. The result is a :class:`TaskResult`, which
serialises to MTEB's results layout (``results.py``).

What a caller needs beyond the score is part of the contract too, so that code above evaluation
(experiments, say) never looks inside a task: the texts a task embeds (:meth:`Task.embedded_texts`,
a list of :class:`TextsToEmbed`), a smaller copy of it for a quick run (:meth:`Task.shrink` with
:class:`ShrinkLimits`), and the score of every item its main score is built from
(:attr:`TaskResult.items`, an :class:`ItemScores`), for paired comparisons between models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

#: How the per-item values of a task become its statistic: their mean, their Spearman correlation with a
#: reference (STS: the gold scores), or their average precision against 0/1 references (pair classification).
Statistic = Literal["mean", "spearman", "ap"]
#: Which encoder call embeds texts: ``encode_queries`` (with the instruction), ``encode_corpus`` (never an
#: instruction), or a symmetric text (``encode_queries`` with the instruction when there is one, else as it is).
TextRole = Literal["query", "document", "text"]


@dataclass(frozen=True)
class TextsToEmbed:
    """One encoder call a task makes: the texts, in the order it passes them, and the instruction it passes."""

    texts: list[str]
    role: TextRole
    instruction: str | None = None


@dataclass(frozen=True)
class ShrinkLimits:
    """How far :meth:`Task.shrink` reduces a task: a retrieval corpus to ``max_docs`` documents and
    ``max_queries`` queries, other task types to ``max_items`` items; ``None`` keeps everything."""

    max_items: int | None = None
    max_docs: int | None = None
    max_queries: int | None = None
    seed: int = 0


@dataclass
class ItemScores:
    """The value of every item a task's main score is built from (a query, a pair, a text, a set).

    ``statistic`` says how the values combine: ``mean`` (retrieval: each query's main metric), ``spearman``
    against ``reference`` (STS: each pair's cosine against the gold scores), ``ap`` against 0/1
    ``reference`` (pair classification). Two models scored on the same items can be compared paired.
    """

    statistic: Statistic
    ids: list[str]
    values: list[float]
    reference: list[float] | None = None

    @classmethod
    def numbered(
        cls, statistic: Statistic, values: Sequence[float], reference: Sequence[float] | None = None
    ) -> ItemScores:
        """Items named by their position (``"0"``, ``"1"`` ...)."""
        return cls(
            statistic,
            [str(i) for i in range(len(values))],
            [float(v) for v in values],
            None if reference is None else [float(x) for x in reference],
        )


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
    items: ItemScores | None = None  # per-item values; not written to result files

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

    def evaluate(self, encoder: RetrievalEncoder, *, batch_size: int = ENCODE_BATCH_SIZE) -> TaskResult:
        """Score ``encoder``; the result's ``items`` holds the per-item values where the task has a natural unit."""
        ...

    def with_instruction(self, instruction: str | None) -> Task:
        """A copy of this task bound to ``instruction``."""
        ...

    def embedded_texts(self) -> list[TextsToEmbed]:
        """What :meth:`evaluate` will embed, one entry per encoder call, in order (for warming a cache)."""
        ...

    def shrink(self, limits: ShrinkLimits) -> Task:
        """A smaller copy for a quick run, renamed so that nobody reads its scores as the full task's
        (``SciFact[300 docs, 60 queries]``); this task itself when no limit applies."""
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
