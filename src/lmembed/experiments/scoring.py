"""Evaluating one model on an experiment's suite, keeping the per-item scores the paired tests need.

:func:`build_suite` loads the tasks once (known names through the task registry, anything else from its
path) and shrinks them for a small machine the same way for every arm and seed, through the task's own
:meth:`~lmembed.evaluation.base.Task.shrink`: a retrieval corpus keeps the relevant documents of
``max_queries`` sampled queries, then random others up to ``max_docs``; other task types keep
``max_items`` randomly chosen pairs / texts / rows (clustering: per set; classification: the test rows).
Shrunk tasks are renamed (``SciFact[300 docs, 60 queries]``, ``STSBenchmark[300 items]``) so that nobody
reads their scores as MTEB's.

:func:`score_task` scores a model with the task's own :meth:`~lmembed.evaluation.base.Task.evaluate` and
keeps the per-item values its result carries (:class:`~lmembed.evaluation.base.ItemScores`; see
:mod:`lmembed.experiments.stats`): retrieval queries, STS and pair-classification pairs, summarization
texts, clustering sets. A task without items (classification, reranking) is compared on the mean over
seeds only. Nothing here depends on the task's type, so a new task type needs no change in this package.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmembed.evaluation.base import ShrinkLimits, Statistic, Task
from lmembed.evaluation.instructions import instruction_for
from lmembed.evaluation.suites import resolve_task
from lmembed.evaluation.tasks import load_task
from lmembed.experiments.spec import EvalSpec, TaskRef


@dataclass
class TaskScore:
    """One task's result for one run: the task's own scores plus (where defined) one value per item."""

    task: str
    task_type: str
    main_metric: str
    main_score: float
    scores: dict[str, float]
    statistic: Statistic | None = None
    item_ids: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    reference: list[float] | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """What ``run.json`` keeps (the items go to ``items.json``)."""
        return {
            "task_type": self.task_type,
            "main_metric": self.main_metric,
            "main_score": self.main_score,
            "statistic": self.statistic,
            "items": len(self.values),
            "seconds": self.seconds,
            "scores": self.scores,
        }

    def items(self) -> dict[str, Any]:
        return {"statistic": self.statistic, "ids": self.item_ids, "values": self.values, "reference": self.reference}


# ---------------------------------------------------------------------------------------------- the suite
def shrink(task: Task, evaluation: EvalSpec) -> Task:
    """``task`` reduced to the suite's limits (see the module docstring); unchanged when none applies."""
    limits = ShrinkLimits(
        max_items=evaluation.max_items,
        max_docs=evaluation.max_docs,
        max_queries=evaluation.max_queries,
        seed=evaluation.sample_seed,
    )
    return task.shrink(limits)


def load_task_ref(ref: TaskRef) -> Task:
    """The task a suite entry names: a known task by name, or the data at its path."""
    if ref.path:
        return load_task(Path(ref.path), task_type=ref.type, name=ref.name, split=ref.split)
    assert ref.name is not None  # the spec guarantees a name or a path
    return resolve_task(ref.name, task_type=ref.type, split=ref.split)


def build_suite(evaluation: EvalSpec) -> list[Task]:
    """Every task of the suite, loaded, shrunk and bound to its instruction (when a table is named)."""
    tasks = []
    for ref in evaluation.tasks:
        task = load_task_ref(ref)
        if evaluation.instructions:
            task = task.with_instruction(instruction_for(task.name, evaluation.instructions))
        tasks.append(shrink(task, evaluation))
    return tasks


# ---------------------------------------------------------------------------------------------- scoring
def score_task(task: Task, encoder: Any, *, batch_size: int = 16) -> TaskScore:
    """Score ``encoder`` on ``task``: the task's own scores and, where the task reports them, its items."""
    start = time.perf_counter()
    outcome = task.evaluate(encoder, batch_size=batch_size)
    score = TaskScore(
        task=outcome.task_name,
        task_type=outcome.task_type,
        main_metric=outcome.main_metric,
        main_score=outcome.main_score,
        scores={k: float(v) for k, v in outcome.scores.items() if isinstance(v, int | float)},
    )
    if outcome.items is not None:
        score.statistic = outcome.items.statistic
        score.item_ids, score.values = list(outcome.items.ids), list(outcome.items.values)
        score.reference = None if outcome.items.reference is None else list(outcome.items.reference)
    score.seconds = time.perf_counter() - start
    return score
