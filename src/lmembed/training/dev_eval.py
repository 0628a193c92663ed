"""Dev evaluation during training: nDCG@10 on retrieval sets, optionally on a quick subsample.

:func:`load_eval_tasks` turns the configured ``eval_data`` paths (BEIR folders or dataset names) into
retrieval tasks, shrunk by :func:`subsample_retrieval` when ``eval_max_queries``/``eval_max_docs``
are set; :func:`evaluate_retrieval` scores a model on them. Without the evaluation extras (pytrec_eval)
dev evaluation is switched off with a warning and training goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lmembed.datasets import resolve_dataset
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.protocols import RetrievalEncoder

try:
    from lmembed.evaluation.retrieval import RetrievalTask
except ImportError as _missing:  # pytrec_eval absent: training still runs, without dev evaluation
    RetrievalTask = None  # type: ignore[assignment,misc]
    _MISSING_REASON = str(_missing)
else:
    _MISSING_REASON = ""

__all__ = ["evaluate_retrieval", "load_eval_tasks", "subsample_retrieval"]

log = logging.getLogger(__name__)


def _relevant_first(qrels: dict[str, dict[str, int]], query_ids: Sequence[str], known: set[str]) -> list[str]:
    """Relevant documents of the queries, best-judged first, taken round-robin so every query gets some."""
    ranked = [
        [d for d, score in sorted(qrels.get(q, {}).items(), key=lambda kv: -kv[1]) if score > 0 and d in known]
        for q in query_ids
    ]
    order: dict[str, None] = {}
    for depth in range(max((len(r) for r in ranked), default=0)):
        for docs in ranked:
            if depth < len(docs):
                order.setdefault(docs[depth], None)
    return list(order)


def subsample_retrieval(
    data: RetrievalData, max_queries: int | None = None, max_docs: int | None = None, seed: int = 0
) -> RetrievalData:
    """A smaller, self-consistent copy of a retrieval split, for quick evaluation on a slow machine.

    Keeps up to ``max_queries`` answerable queries (chosen at random) and a corpus of at most ``max_docs``
    documents: first documents judged relevant to the kept queries (best judgments first, spread over
    the queries), then random others. Judgments of documents left out are dropped, and so are queries
    left without a relevant document. Scores compare models evaluated on the same subsample; they are
    not the full-corpus numbers.
    """
    rng = np.random.default_rng(seed)
    corpus_ids, corpus_texts = list(data.corpus_ids), list(data.corpus_texts)
    known = set(corpus_ids)
    usable = [
        i
        for i, q in enumerate(data.query_ids)
        if any(score > 0 and d in known for d, score in data.qrels.get(q, {}).items())
    ]
    if max_queries and max_queries < len(usable):
        usable = sorted(rng.choice(usable, size=max_queries, replace=False).tolist())
    query_ids, query_texts = [data.query_ids[i] for i in usable], [data.query_texts[i] for i in usable]
    if max_docs and max_docs < len(corpus_ids):
        wanted = _relevant_first(data.qrels, query_ids, known)[:max_docs]
        position = {d: i for i, d in enumerate(corpus_ids)}
        chosen = {position[d] for d in wanted}
        others = np.array([i for i in range(len(corpus_ids)) if i not in chosen], dtype=np.int64)
        extra = min(max_docs - len(chosen), len(others))
        chosen |= set(rng.choice(others, size=extra, replace=False).tolist()) if extra > 0 else set()
        order = sorted(chosen)
        corpus_ids, corpus_texts = [corpus_ids[i] for i in order], [corpus_texts[i] for i in order]
    kept_docs = set(corpus_ids)
    qrels = {q: {d: s for d, s in data.qrels.get(q, {}).items() if d in kept_docs} for q in query_ids}
    answerable = [i for i, q in enumerate(query_ids) if any(s > 0 for s in qrels[q].values())]
    return replace(
        data,
        query_ids=[query_ids[i] for i in answerable],
        query_texts=[query_texts[i] for i in answerable],
        qrels={query_ids[i]: qrels[query_ids[i]] for i in answerable},
        corpus_ids=corpus_ids,
        corpus_texts=corpus_texts,
        missing_docs=[],
        missing_queries=[],
    )


def load_eval_tasks(
    paths: Sequence[str],
    split: str = "test",
    *,
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
) -> list[Any]:
    """Retrieval tasks for dev evaluation; empty (with a warning) when the evaluation module is missing."""
    if not paths:
        return []
    if RetrievalTask is None:
        log.warning("dev evaluation is off: lmembed.evaluation.retrieval is not available (%s)", _MISSING_REASON)
        return []
    tasks = []
    for path in paths:
        folder = resolve_dataset(path, download=False)
        try:
            task = RetrievalTask.from_name(folder.name, path=folder, split=split)
        except KeyError:
            task = RetrievalTask.from_folder(folder, name=folder.name, split=split)
        if max_queries or max_docs:
            task.data = subsample_retrieval(task.data, max_queries, max_docs, seed)
        tasks.append(task)
    return tasks


def evaluate_retrieval(embedder: RetrievalEncoder, tasks: Sequence[Any], batch_size: int = 32) -> dict[str, float]:
    """nDCG@10 of ``embedder`` on each task, keyed by task name."""
    scores = {}
    for task in tasks:
        result = task.evaluate(embedder, batch_size=batch_size)
        scores[task.name] = float(result.scores["ndcg_at_10"])
    return scores
