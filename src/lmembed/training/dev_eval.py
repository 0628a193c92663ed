"""Dev evaluation during training: nDCG@10 on retrieval sets, optionally on a quick subsample.

:func:`load_eval_tasks` turns the configured ``eval_data`` paths (BEIR folders or dataset names) into
retrieval tasks, shrunk by the evaluation package's one subsampler
(:func:`~lmembed.evaluation.tasks.retrieval.subsample_retrieval`, relevant documents first) when
``eval_max_queries``/``eval_max_docs`` are set; :func:`evaluate_retrieval` scores a model on them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lmembed import task_registry
from lmembed.datasets import resolve_dataset
from lmembed.evaluation.tasks import build_task
from lmembed.evaluation.tasks.retrieval import RetrievalTask, subsample_retrieval
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

__all__ = ["evaluate_retrieval", "load_eval_tasks", "subsample_retrieval"]

log = logging.getLogger(__name__)


def load_eval_tasks(
    paths: Sequence[str],
    split: str = "test",
    *,
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
) -> list[RetrievalTask]:
    """Retrieval tasks for dev evaluation. A folder of a known MTEB retrieval task (e.g. ``scifact``) gets that
    task's MTEB name and settings (ArguAna's self-hits ...); any other BEIR folder keeps its own name."""
    tasks = []
    for path in paths:
        folder = resolve_dataset(path, download=False)
        spec = task_registry.find(folder.name)
        if spec is not None and spec.task_type == "Retrieval":
            task = build_task(spec, folder, split=split)
        else:
            task = RetrievalTask.from_path(folder, name=folder.name, split=split)
        if not isinstance(task, RetrievalTask):  # pragma: no cover - the registry says Retrieval
            raise TypeError(f"--eval-data {path}: not a retrieval task")
        if max_queries or max_docs:
            task.data = subsample_retrieval(task.data, max_queries, max_docs, seed)
        tasks.append(task)
    return tasks


def evaluate_retrieval(
    embedder: RetrievalEncoder, tasks: Sequence[RetrievalTask], batch_size: int = ENCODE_BATCH_SIZE
) -> dict[str, float]:
    """nDCG@10 of ``embedder`` on each task, keyed by task name."""
    scores = {}
    for task in tasks:
        result = task.evaluate(embedder, batch_size=batch_size)
        scores[task.name] = float(result.scores["ndcg_at_10"])
    return scores
