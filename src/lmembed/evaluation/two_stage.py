"""Retrieval in two stages, scored as MTEB scores retrieval: a first stage finds candidates, a reranker reorders
the best ``rerank_top_k`` of them.

First stages (:data:`FIRST_STAGES`):

* ``dense``: the Embedder's vectors, searched exactly (what :class:`RetrievalTask` does);
* ``bm25``: BM25 through bm25s (:mod:`lmembed.lexical.bm25`), no model;
* ``hybrid``: both, each to the task's ``top_k``, fused (:mod:`lmembed.lexical.fusion`: ``rrf`` or ``minmax``).

The second stage takes each query's first ``rerank_top_k`` candidates in the order the metrics read the run
(score descending, then id descending, as trec_eval), scores every query–candidate pair with the
:class:`~lmembed.rerank.Reranker` (all pairs in one call, batched by its token budget), and the reranked run
holds those candidates only, as MTEB's reranking of previous results does. Where the task ignores identical ids
(ArguAna), a candidate that is the query itself is dropped before the cut. :func:`stage_table` shows what each
stage adds.

Each stage's result records what produced it as its strategy (:func:`stage_strategy`): the dense strategy (the
Embedder's, as a plain evaluation records it), ``first_stage``, BM25's parameters and the ``fusion`` where BM25
takes part, and for the reranked stage the ``reranker`` and its ``rerank_top_k``; with its label (the dense
strategy's, e.g. ``mean@3+bidir``, or BM25's; ``rerank_top_k=5`` after it for the reranked stage) and the backend
and precision that ran the model. Its folder is named by them (:func:`~lmembed.evaluation.results.strategy_dir_name`),
so two staged runs that differ in any of them are written apart, and apart from a plain evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lmembed.errors import ConfigError
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.metrics import drop_identical_ids, evaluate_run, trec_order
from lmembed.evaluation.results import record_strategy, runtime_record
from lmembed.evaluation.search import exact_search
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.lexical.bm25 import LexicalIndex, LexicalParams
from lmembed.lexical.fusion import FUSIONS, fuse
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

if TYPE_CHECKING:  # the reranker pulls in torch; tasks load without it
    from lmembed.rerank.base import Reranker

FIRST_STAGES = ("dense", "bm25", "hybrid")
DEFAULT_RERANK_TOP_K = 100

Run = dict[str, dict[str, float]]


@dataclass
class StageResults:
    """One task's first stage and (with a reranker) its reranked second stage."""

    first: TaskResult
    reranked: TaskResult | None = None


def _check(first_stage: str, fusion: str, encoder: RetrievalEncoder | None) -> None:
    if first_stage not in FIRST_STAGES:
        raise ConfigError(f"first_stage={first_stage!r} is unknown; choose one of {', '.join(FIRST_STAGES)}")
    if fusion not in FUSIONS:
        raise ConfigError(f"fusion={fusion!r} is unknown; choose one of {', '.join(FUSIONS)}")
    if first_stage != "bm25" and encoder is None:
        raise ConfigError(f"first_stage={first_stage!r} needs a model (an encoder) for its dense part")


def dense_run(task: RetrievalTask, encoder: RetrievalEncoder, *, batch_size: int = ENCODE_BATCH_SIZE) -> Run:
    q, c, _ = task.encode(encoder, batch_size=batch_size)
    result = exact_search(q, c, top_k=task.top_k, similarity=task.similarity)
    return result.to_run(task.data.query_ids, task.data.corpus_ids)


#: BM25's parameters in a staged evaluation (bm25s' Lucene defaults), recorded in each result it takes part in.
BM25_PARAMS = LexicalParams()


def bm25_run(task: RetrievalTask) -> Run:
    data = task.data
    index = LexicalIndex.build(data.corpus_texts, data.corpus_ids, BM25_PARAMS)
    scores, rows = index.search(data.query_texts, task.top_k)
    return {
        qid: {data.corpus_ids[r]: float(s) for s, r in zip(scores[i], rows[i], strict=True) if r >= 0}
        for i, qid in enumerate(data.query_ids)
    }


def first_stage_run(
    task: RetrievalTask,
    first_stage: str = "dense",
    *,
    encoder: RetrievalEncoder | None = None,
    fusion: str = "rrf",
    batch_size: int = ENCODE_BATCH_SIZE,
) -> Run:
    """Each judged query's ``task.top_k`` best documents ``{query id: {doc id: score}}`` by ``first_stage``."""
    _check(first_stage, fusion, encoder)
    if first_stage == "bm25":
        return bm25_run(task)
    dense = dense_run(task, encoder, batch_size=batch_size)
    if first_stage == "dense":
        return dense
    lexical = bm25_run(task)
    fused = {qid: fuse([dense[qid], lexical[qid]], fusion, tie_key=str) for qid in task.data.query_ids}
    return {qid: dict(ranked[: task.top_k]) for qid, ranked in fused.items()}  # cut where trec_eval would


def rerank_run(reranker: Reranker, task: RetrievalTask, run: Run, top_k: int = DEFAULT_RERANK_TOP_K) -> Run:
    """Each query's first ``top_k`` candidates of ``run`` (identical ids dropped first where the task ignores
    them) scored by ``reranker``: ``{query id: {doc id: reranker score}}``."""
    if top_k < 1:
        raise ConfigError(f"rerank_top_k={top_k} must be >= 1")
    data = task.data
    if task.ignore_identical_ids:
        run = drop_identical_ids(run)
    texts = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
    queries = dict(zip(data.query_ids, data.query_texts, strict=True))
    candidates = {qid: trec_order(run.get(qid, {}))[:top_k] for qid in data.query_ids}
    pairs = [(queries[qid], texts[doc]) for qid, docs in candidates.items() for doc in docs]
    scores = reranker.score_pairs(pairs).tolist() if pairs else []
    reranked: Run = {}
    start = 0
    for qid, docs in candidates.items():
        reranked[qid] = dict(zip(docs, scores[start : start + len(docs)], strict=True))
        start += len(docs)
    return reranked


@dataclass(frozen=True)
class StageStrategy:
    """What a stage's result records as its strategy, and the label it is shown under."""

    strategy: dict[str, Any]
    label: str


def stage_strategy(
    first_stage: str,
    encoder: RetrievalEncoder | None = None,
    *,
    fusion: str = "rrf",
    reranker: Reranker | None = None,
    rerank_top_k: int = DEFAULT_RERANK_TOP_K,
) -> StageStrategy:
    """The strategy of a first stage (``reranker`` None) or of its reranked stage: the encoder's dense strategy
    (``EmbeddingConfig.to_dict``, with dense and hybrid first stages), ``first_stage``, ``bm25`` (its parameters)
    and ``fusion`` (hybrid), then ``reranker``, ``reranker_max_length`` and ``rerank_top_k``. The label is the dense
    strategy's (``mean@-1+bidir``; BM25's parameters for a BM25 first stage), ``rerank_top_k=K`` after it for the
    reranked stage (the model name already says which first stage and reranker)."""
    strategy: dict[str, Any] = {}
    label = first_stage
    if first_stage != "bm25":
        config = getattr(encoder, "config", None)
        if config is not None and callable(getattr(config, "to_dict", None)):
            strategy.update(config.to_dict())
            label = str(config.label())
    strategy["first_stage"] = first_stage
    if first_stage != "dense":
        strategy["bm25"] = asdict(BM25_PARAMS)
        if first_stage == "bm25":
            label = f"{BM25_PARAMS.method} k1={BM25_PARAMS.k1} b={BM25_PARAMS.b}"
    if first_stage == "hybrid":
        strategy["fusion"] = fusion
    if reranker is not None:
        strategy["reranker"] = reranker.name
        max_length = getattr(reranker, "max_length", None)
        if isinstance(max_length, int):
            strategy["reranker_max_length"] = max_length
        strategy["rerank_top_k"] = rerank_top_k
        label = f"{label} rerank_top_k={rerank_top_k}"
    return StageStrategy(strategy, label)


def _result(
    task: RetrievalTask,
    run: Run,
    name: str,
    elapsed: float,
    extra: dict[str, Any],
    stage: StageStrategy,
    runtime: dict[str, str] | None,
) -> TaskResult:
    scores = evaluate_run(task.data.qrels, run, task.k_values, ignore_identical_ids=task.ignore_identical_ids)
    result = TaskResult(
        task_name=task.name,
        task_type=task.task_type,
        split=task.data.split,
        scores=scores.scores,
        main_metric=task.main_metric,
        evaluation_time=elapsed,
        model_name=name,
        extra={**extra, "data": task.data.summary(), "instruction": task.instruction},
    )
    record_strategy(result, stage.strategy, stage.label, runtime)
    return result


def first_stage_name(first_stage: str, model_name: str, fusion: str) -> str:
    return {"dense": model_name, "bm25": "bm25", "hybrid": f"{model_name}+bm25 ({fusion})"}[first_stage]


def evaluate_two_stage(
    task: RetrievalTask,
    *,
    first_stage: str = "dense",
    encoder: RetrievalEncoder | None = None,
    reranker: Reranker | None = None,
    rerank_top_k: int = DEFAULT_RERANK_TOP_K,
    fusion: str = "rrf",
    batch_size: int = ENCODE_BATCH_SIZE,
) -> StageResults:
    """The first stage's scores and, with a ``reranker``, the reranked stage's (see the module doc)."""
    start = time.perf_counter()
    run = first_stage_run(task, first_stage, encoder=encoder, fusion=fusion, batch_size=batch_size)
    model_name = getattr(encoder, "model_name", None) or getattr(encoder, "name", "") if encoder is not None else ""
    name = first_stage_name(first_stage, str(model_name), fusion)
    settings = {"first_stage": first_stage, "fusion": fusion if first_stage == "hybrid" else None}
    runtime = runtime_record(encoder) if first_stage != "bm25" else None
    first_strategy = stage_strategy(first_stage, encoder, fusion=fusion)
    first = _result(task, run, name, time.perf_counter() - start, {"two_stage": settings}, first_strategy, runtime)
    if reranker is None:
        return StageResults(first)
    start = time.perf_counter()
    reranked_run = rerank_run(reranker, task, run, rerank_top_k)
    elapsed = time.perf_counter() - start
    pairs = sum(len(docs) for docs in reranked_run.values())
    extra = {
        "two_stage": {**settings, "reranker": reranker.name, "rerank_top_k": rerank_top_k},
        "pairs": pairs,
        "pairs_per_s": pairs / elapsed if elapsed > 0 else None,
    }
    second = stage_strategy(first_stage, encoder, fusion=fusion, reranker=reranker, rerank_top_k=rerank_top_k)
    reranked = _result(task, reranked_run, f"{name} » {reranker.name}", elapsed, extra, second, runtime)
    return StageResults(first, reranked)


def stage_table(results: Sequence[StageResults], metric: str = "ndcg_at_10") -> str:
    """Markdown: per task and first stage, the first stage's ``metric``, the reranked one's, and the gain."""
    header = ["task", "first stage", metric, "reranked by", f"{metric} reranked", "gain", "pairs/s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for item in results:
        first = item.first.scores[metric]
        cells = [item.first.task_name, item.first.model_name, f"{100 * first:.2f}"]
        if item.reranked is None:
            cells += ["-", "-", "-", "-"]
        else:
            second = item.reranked.scores[metric]
            rate = item.reranked.extra.get("pairs_per_s")
            cells += [
                str(item.reranked.extra["two_stage"]["reranker"]),
                f"{100 * second:.2f}",
                f"{100 * (second - first):+.2f}",
                f"{rate:.0f}" if rate else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
