"""Evaluating one model on an experiment's suite, keeping the per-item scores the paired tests need.

:func:`build_suite` loads the tasks once (known names through the task registry, anything else from its
path) and shrinks them for a small machine the same way for every arm and seed: a retrieval corpus keeps
the relevant documents of ``max_queries`` sampled queries, then random others up to ``max_docs``
(:meth:`~lmembed.evaluation.tasks.retrieval.RetrievalTask.subsample`); other task types keep ``max_items``
randomly chosen pairs / texts / rows (clustering: per set; classification: the test rows). Shrunk tasks
are renamed (``SciFact[300 docs, 60 queries]``, ``STSBenchmark[300 items]``) so that nobody reads their
scores as MTEB's.

:func:`score_task` scores a model with the task's own code and, where the task has a natural unit, the
value of every item (see :mod:`lmembed.experiments.stats`): retrieval queries (nDCG@10, from the same
search the scores come from), STS and pair-classification pairs (the cosine of the two embeddings the task
computed), summarization texts (their own Spearman), clustering sets (their V-measure). Classification and
reranking report no items: their arms are compared on the mean over seeds only.

The embeddings a task computes are recorded as they pass (:class:`RecordingEncoder`), so the per-item
values use exactly the vectors the task scored, and the embedding cache makes every repeat free.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from lmembed.evaluation.base import Task
from lmembed.evaluation.instructions import instruction_for
from lmembed.evaluation.suites import resolve_task
from lmembed.evaluation.tasks import (
    ClassificationTask,
    ClusteringTask,
    PairClassificationTask,
    RerankingTask,
    RetrievalTask,
    STSTask,
    SummarizationTask,
    load_task,
)
from lmembed.evaluation.tasks.clustering import ClusterSet
from lmembed.evaluation.tasks.retrieval import score_embeddings
from lmembed.experiments.spec import EvalSpec, TaskRef
from lmembed.experiments.stats import Statistic

#: The per-item metric of a retrieval query.
RETRIEVAL_ITEM_METRIC = "ndcg_at_10"


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
def _sample(n: int, keep: int | None, rng: np.random.Generator) -> list[int] | None:
    """Sorted indices of ``keep`` of ``n`` items, or ``None`` when all are kept."""
    if keep is None or keep >= n:
        return None
    return sorted(rng.choice(n, size=keep, replace=False).tolist())


def _pick(values: Sequence[Any], index: list[int]) -> list[Any]:
    return [values[i] for i in index]


#: Task types shrunk by sampling items: the fields that hold one value per item (the first one's length counts).
_ITEM_FIELDS: tuple[tuple[Any, tuple[str, ...]], ...] = (
    (STSTask, ("scores", "sentence1", "sentence2")),
    (PairClassificationTask, ("labels", "sentence1", "sentence2")),
    (SummarizationTask | RerankingTask, ("samples",)),
    (ClassificationTask, ("test_labels", "test_texts")),
)


def _shrink_items(task: Task, fields: tuple[str, ...], keep: int | None, rng: np.random.Generator) -> Task:
    """``task`` keeping the same ``keep`` sampled items of each of ``fields`` (unchanged when all are kept)."""
    index = _sample(len(getattr(task, fields[0])), keep, rng)
    if index is None:
        return task
    picked = {name: _pick(getattr(task, name), index) for name in fields}
    return dataclasses.replace(task, name=f"{task.name}[{len(index)} items]", **picked)


def shrink(task: Task, evaluation: EvalSpec) -> Task:
    """``task`` reduced as the module docstring says (unchanged when no limit applies)."""
    rng = np.random.default_rng(evaluation.sample_seed)
    if isinstance(task, RetrievalTask):
        if evaluation.max_docs is None and evaluation.max_queries is None:
            return task
        return task.subsample(
            max_docs=evaluation.max_docs,
            max_queries=evaluation.max_queries,
            seed=evaluation.sample_seed,
            policy="relevant-first",
        )
    keep = evaluation.max_items
    for kind, fields in _ITEM_FIELDS:
        if isinstance(task, kind):
            return _shrink_items(task, fields, keep, rng)
    if isinstance(task, ClusteringTask):
        if keep is None or all(len(s.sentences) <= keep for s in task.sets):
            return task
        sets = []
        for cluster_set in task.sets:
            index = _sample(len(cluster_set.sentences), keep, rng) or list(range(len(cluster_set.sentences)))
            sets.append(ClusterSet(_pick(cluster_set.sentences, index), _pick(cluster_set.labels, index)))
        return dataclasses.replace(task, name=f"{task.name}[{keep} per set]", sets=sets)
    return task


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
class RecordingEncoder:
    """Wraps an encoder and remembers every text's vector, so per-item values use the task's own vectors."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.vectors: dict[str, np.ndarray] = {}
        name = getattr(encoder, "model_name", None) or getattr(encoder, "name", "")
        self.model_name = name if isinstance(name, str) else ""

    def _keep(self, texts: Sequence[str], vectors: Any) -> np.ndarray:
        array = np.asarray(vectors, dtype=np.float32)
        for text, vector in zip(texts, array, strict=True):
            self.vectors[text] = vector
        return array

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, instruction: str | None = None) -> np.ndarray:
        if instruction is None:
            return self._keep(texts, self.encoder.encode(list(texts), batch_size=batch_size))
        return self._keep(texts, self.encoder.encode(list(texts), batch_size=batch_size, instruction=instruction))

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32
    ) -> np.ndarray:
        return self._keep(
            texts, self.encoder.encode_queries(list(texts), instruction=instruction, batch_size=batch_size)
        )

    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        return self._keep(texts, self.encoder.encode_corpus(list(texts), batch_size=batch_size))

    def matrix(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)


class _TextCollector:
    """An encoder that returns random unit vectors and notes which texts (with which instruction) it was
    asked for: running a task on it lists what the task will embed, cheaply."""

    model_name = "text-collector"

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str | None]] = []
        self._rng = np.random.default_rng(0)

    def _vectors(self, texts: Sequence[str], instruction: str | None) -> np.ndarray:
        self.calls.append((list(texts), instruction))
        return _unit(self._rng.normal(size=(len(texts), 8)).astype(np.float32))

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, instruction: str | None = None) -> np.ndarray:
        return self._vectors(texts, instruction)

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32
    ) -> np.ndarray:
        return self._vectors(texts, instruction)

    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        return self._vectors(texts, None)


def suite_texts(task: Task) -> list[tuple[list[str], str | None]]:
    """What scoring ``task`` embeds: (texts, instruction) per encoder call."""
    if isinstance(task, RetrievalTask):
        return [(list(task.data.query_texts), task.instruction), (list(task.data.corpus_texts), None)]
    collector = _TextCollector()
    # scoring random vectors may fail (a constant prediction); the calls made are what matter
    with contextlib.suppress(Exception):
        task.evaluate(collector, batch_size=1024)
    return collector.calls


def _unit(matrix: np.ndarray) -> np.ndarray:
    return matrix / np.clip(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12, None)


def _cosine(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two matrices (pair i: row i of each)."""
    return np.einsum("ij,ij->i", _unit(first), _unit(second)).astype(np.float64)


def _retrieval(task: RetrievalTask, encoder: Any, batch_size: int) -> TaskScore:
    queries, corpus, _ = task.encode(encoder, batch_size=batch_size)
    scored = score_embeddings(
        task.data,
        queries,
        corpus,
        top_k=task.top_k,
        similarity=task.similarity,
        ignore_identical_ids=task.ignore_identical_ids,
        k_values=task.k_values,
    )
    ids = sorted(scored.scores.per_query)
    scores = scored.scores.scores
    return TaskScore(
        task=task.name,
        task_type=task.task_type,
        main_metric=task.main_metric,
        main_score=float(scores["main_score"]),
        scores=scores,
        statistic="mean",
        item_ids=ids,
        values=[float(scored.scores.per_query[q][RETRIEVAL_ITEM_METRIC]) for q in ids],
    )


def _summarization_items(task: SummarizationTask, recorder: RecordingEncoder) -> tuple[list[str], list[float]]:
    """Per source text: Spearman of the best cosine to a human summary against the relevance scores."""
    ids, values = [], []
    for number, sample in enumerate(task.samples):
        human, machine = recorder.matrix(sample.human_summaries), recorder.matrix(sample.machine_summaries)
        predicted = _cosine_matrix(machine, human).max(axis=1)
        if len(set(sample.relevance)) <= 1 or len(set(predicted.tolist())) <= 1:
            continue  # a correlation is undefined there (the task skips these texts too)
        ids.append(str(number))
        values.append(float(spearmanr(sample.relevance, predicted)[0]))
    return ids, values


def _cosine_matrix(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Cosine of every row of ``first`` with every row of ``second``."""
    return _unit(first) @ _unit(second).T


def score_task(task: Task, encoder: Any, *, batch_size: int = 16) -> TaskScore:
    """Score ``encoder`` on ``task``: the task's own scores and, where defined, the per-item values."""
    start = time.perf_counter()
    if isinstance(task, RetrievalTask):
        result = _retrieval(task, encoder, batch_size)
        result.seconds = time.perf_counter() - start
        return result
    recorder = RecordingEncoder(encoder)
    outcome = task.evaluate(recorder, batch_size=batch_size)
    score = TaskScore(
        task=outcome.task_name,
        task_type=outcome.task_type,
        main_metric=outcome.main_metric,
        main_score=outcome.main_score,
        scores={k: float(v) for k, v in outcome.scores.items() if isinstance(v, int | float)},
    )
    if isinstance(task, STSTask):
        score.statistic = "spearman"
        score.values = _cosine(recorder.matrix(task.sentence1), recorder.matrix(task.sentence2)).tolist()
        score.reference = [float(x) for x in task.scores]
    elif isinstance(task, PairClassificationTask):
        score.statistic = "ap"
        score.values = _cosine(recorder.matrix(task.sentence1), recorder.matrix(task.sentence2)).tolist()
        score.reference = [float(x) for x in task.labels]
    elif isinstance(task, SummarizationTask):
        score.statistic = "mean"
        score.item_ids, score.values = _summarization_items(task, recorder)
    elif isinstance(task, ClusteringTask) and isinstance(outcome.extra.get("v_measures"), list):
        score.statistic = "mean"
        score.values = [float(v) for v in outcome.extra["v_measures"]]
    if score.statistic is not None and not score.item_ids:
        score.item_ids = [str(i) for i in range(len(score.values))]
    score.seconds = time.perf_counter() - start
    return score
