"""Retrieval, scored as MTEB's ``AbsTaskRetrieval`` scores it.

:class:`RetrievalTask` binds a loaded BEIR split (:mod:`lmembed.evaluation.retrieval_data`) to the
scoring settings of its MTEB task: cosine similarity, exact top-1000 search, pytrec_eval metrics, and
``ignore_identical_ids`` where MTEB sets it (ArguAna, FiQA2018, QuoraRetrieval, FEVER, MSMARCO). Metrics come
at the 20 cut-offs of :data:`~lmembed.evaluation.metrics.K_VALUES` (MTEB's seven among them) plus MTEB's nAUC keys
(:mod:`lmembed.evaluation.metrics`). Queries are embedded with ``encode_queries``
and the task's ``instruction``; documents with ``encode_corpus``, never with an instruction.
``ndcg_at_10`` is the main score; the result's items (for paired comparisons) are the scored queries,
each with its own ``ndcg_at_10``.

:func:`score_embeddings` is the same scoring for embeddings computed elsewhere, for callers that
produce many embedding variants in one pass (the strategy runner).

:func:`subsample_retrieval` makes a smaller, self-consistent copy of a split, for quick runs on a slow
machine; :meth:`RetrievalTask.subsample` gives a task on such a copy, named so that nobody mistakes
its scores for MTEB's (``SciFact[500 docs]``).

Data: a BEIR folder, ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import numpy as np

from lmembed.encoding.chunking import ChunkedEmbeddings, Chunking
from lmembed.errors import ConfigError
from lmembed.evaluation.base import ItemScores, ShrinkLimits, TaskResult, TextsToEmbed
from lmembed.evaluation.large_corpus import SearchMethod, corpus_matrix, is_large_corpus, search_corpus, storage_of
from lmembed.evaluation.metrics import K_VALUES, MAIN_METRIC, RetrievalScores, check_k_values, evaluate_run
from lmembed.evaluation.retrieval_data import RetrievalData, load_beir
from lmembed.evaluation.search import SearchResult, Similarity, exact_search, identical_id_positions
from lmembed.io import Qrels, is_whole_number
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

logger = logging.getLogger(__name__)

TOP_K = 1000

#: How :func:`subsample_retrieval` chooses what to keep (see there).
SubsamplePolicy = Literal["relevant-first", "all-judged"]


def fingerprint(paths: Sequence[Path]) -> str:
    """A short content hash of the given files, used as the dataset revision."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def _as_embeddings(x: Any, rows: int, what: str) -> np.ndarray:
    """Check an encoder's output: a 2-D float32 matrix with one row per text."""
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != rows:
        raise ValueError(f"{what}: expected a ({rows}, dim) matrix, got shape {arr.shape}")
    return arr


@dataclass
class ScoredRun:
    """Scores of one set of embeddings plus how long each stage took."""

    scores: RetrievalScores
    run: dict[str, dict[str, float]]
    timings: dict[str, float] = field(default_factory=dict)
    corpus_storage: dict[str, Any] | None = None  # set for memory-mapped / float16 corpora (large_corpus)


def score_embeddings(
    data: RetrievalData,
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    *,
    top_k: int = TOP_K,
    similarity: Similarity = "cosine",
    ignore_identical_ids: bool = False,
    k_values: Sequence[int] = K_VALUES,
    exclude_before_top_k: bool = False,
    chunk_size: int | None = None,
    search_method: SearchMethod = "exact",
) -> ScoredRun:
    """Search with precomputed embeddings (rows in ``data``'s query/corpus order) and score.

    ``ignore_identical_ids`` removes a hit whose id equals the query id. By default this
    happens after the top-``top_k`` search, which is what MTEB's code does (so such a query is
    scored on ``top_k - 1`` hits); ``exclude_before_top_k=True`` removes it during the search
    instead, as BEIR's original search did. Metrics at k < ``top_k`` are the same either way.

    Corpus embeddings that are memory-mapped or float16 (a large corpus, :mod:`~lmembed.evaluation.large_corpus`)
    are searched in chunks without being loaded, as is any corpus with ``search_method="faiss"``.
    """
    q = _as_embeddings(query_embeddings, len(data.query_ids), "query embeddings")
    large = is_large_corpus(corpus_embeddings)
    if large:
        c = corpus_matrix(corpus_embeddings, len(data.corpus_ids), "corpus embeddings")
    else:
        c = _as_embeddings(corpus_embeddings, len(data.corpus_ids), "corpus embeddings")
    exclude = None
    if ignore_identical_ids and exclude_before_top_k:
        exclude = identical_id_positions(data.query_ids, data.corpus_ids)
    start = time.perf_counter()
    if large or search_method != "exact":
        result = search_corpus(q, c, top_k=top_k, similarity=similarity, exclude=exclude, method=search_method)
    else:
        result = exact_search(q, c, top_k=top_k, similarity=similarity, exclude=exclude, chunk_size=chunk_size)
    run = result.to_run(data.query_ids, data.corpus_ids)
    searched = time.perf_counter()
    scores = evaluate_run(data.qrels, run, k_values, ignore_identical_ids=ignore_identical_ids)
    done = time.perf_counter()
    storage = storage_of(c) if large or search_method != "exact" else None
    return ScoredRun(scores, run, {"search_s": searched - start, "metrics_s": done - searched}, storage)


#: Queries scored against every chunk at once when documents are scored from their chunks (fewer where the chunks
#: are many: a block's scores stay within CHUNKED_BLOCK_ELEMENTS floats).
CHUNKED_QUERY_BLOCK = 256
CHUNKED_BLOCK_ELEMENTS = 1 << 24


def chunked_search(
    queries: np.ndarray, chunked: ChunkedEmbeddings, *, top_k: int, similarity: Similarity
) -> SearchResult:
    """Exact top-``top_k`` documents per query, each document scored from its chunks (``chunked.aggregate``),
    in blocks of :data:`CHUNKED_QUERY_BLOCK` queries; ties go to the lower document row."""
    k = min(top_k, chunked.num_docs)
    indices = np.full((len(queries), top_k), -1, dtype=np.int64)
    scores = np.full((len(queries), top_k), -np.inf, dtype=np.float32)
    if similarity == "cosine":  # the chunks normalised once, not again for every block of queries
        chunked = dataclasses.replace(chunked, vectors=unit_rows(chunked.vectors))
        queries, similarity = unit_rows(np.asarray(queries, dtype=np.float32)), "dot"
    rows = max(len(chunked.vectors), chunked.num_docs, 1)
    step = max(1, min(CHUNKED_QUERY_BLOCK, CHUNKED_BLOCK_ELEMENTS // rows))
    for start in range(0, len(queries), step):
        block = chunked.document_scores(queries[start : start + step], similarity=similarity)
        order = np.argsort(-block, axis=1, kind="stable")[:, :k]
        indices[start : start + len(block), :k] = order
        scores[start : start + len(block), :k] = np.take_along_axis(block, order, axis=1)
    return SearchResult(indices, scores)


def score_chunked_embeddings(
    data: RetrievalData,
    query_embeddings: np.ndarray,
    chunked: ChunkedEmbeddings,
    *,
    top_k: int = TOP_K,
    similarity: Similarity = "cosine",
    ignore_identical_ids: bool = False,
    k_values: Sequence[int] = K_VALUES,
) -> ScoredRun:
    """:func:`score_embeddings` for a chunked corpus: documents scored from their chunks' scores."""
    q = _as_embeddings(query_embeddings, len(data.query_ids), "query embeddings")
    if chunked.num_docs != len(data.corpus_ids):
        raise ValueError(f"chunked corpus: {chunked.num_docs} documents for {len(data.corpus_ids)} corpus ids")
    start = time.perf_counter()
    run = chunked_search(q, chunked, top_k=top_k, similarity=similarity).to_run(data.query_ids, data.corpus_ids)
    searched = time.perf_counter()
    scores = evaluate_run(data.qrels, run, k_values, ignore_identical_ids=ignore_identical_ids)
    timings = {"search_s": searched - start, "metrics_s": time.perf_counter() - searched}
    return ScoredRun(scores, run, timings)


# ---------------------------------------------------------------------------------------------- subsampling
def _relevant_first(qrels: Qrels, query_ids: Sequence[str], known: set[str]) -> list[str]:
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


def _keep_all_judged(data: RetrievalData, max_docs: int | None, seed: int) -> RetrievalData:
    """Every query and judgment; every judged document plus others drawn by ``random.Random(seed)``."""
    if max_docs is None:
        return data
    judged = {doc for docs in data.qrels.values() for doc in docs}
    keep = [i for i, d in enumerate(data.corpus_ids) if d in judged]
    others = [i for i, d in enumerate(data.corpus_ids) if d not in judged]
    random.Random(seed).shuffle(others)
    keep = sorted(keep + others[: max(0, max_docs - len(keep))])
    return dataclasses.replace(
        data, corpus_ids=[data.corpus_ids[i] for i in keep], corpus_texts=[data.corpus_texts[i] for i in keep]
    )


def _keep_relevant_first(
    data: RetrievalData, max_queries: int | None, max_docs: int | None, seed: int
) -> RetrievalData:
    """Answerable queries (sampled), their relevant documents first, then others; judgments pruned to match."""
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
    return dataclasses.replace(
        data,
        query_ids=[query_ids[i] for i in answerable],
        query_texts=[query_texts[i] for i in answerable],
        qrels={query_ids[i]: qrels[query_ids[i]] for i in answerable},
        corpus_ids=corpus_ids,
        corpus_texts=corpus_texts,
        missing_docs=[],
        missing_queries=[],
    )


def subsample_retrieval(
    data: RetrievalData,
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
    *,
    policy: SubsamplePolicy = "relevant-first",
) -> RetrievalData:
    """A smaller, self-consistent copy of a retrieval split (same name), for quick evaluation.

    Scores on a subsample compare models evaluated on the same subsample; they are not MTEB's.

    ``policy="relevant-first"`` (training's dev evaluation): keeps up to ``max_queries`` answerable
    queries (chosen at random) and a corpus of at most ``max_docs`` documents: first documents judged
    relevant to the kept queries (best judgments first, spread over the queries), then random others
    (NumPy ``default_rng(seed)``). Judgments of documents left out are dropped, and so are queries
    left without a relevant document.

    ``policy="all-judged"`` (the main job's and ``lmembed sweep --corpus-sample``'s reduced corpus):
    queries and judgments stay as they are; the corpus keeps every judged document, plus documents
    drawn at random (Python ``random.Random(seed)``) until it holds ``max_docs`` (more when more are
    judged). ``max_queries`` is not supported there.
    """
    if policy == "all-judged":
        if max_queries is not None:
            raise ConfigError("subsample policy 'all-judged' keeps every query; max_queries is not supported")
        return _keep_all_judged(data, max_docs, seed)
    if policy == "relevant-first":
        return _keep_relevant_first(data, max_queries, max_docs, seed)
    raise ConfigError(f"unknown subsample policy {policy!r}; use 'relevant-first' or 'all-judged'")


# ---------------------------------------------------------------------------------------------- the task
@dataclass
class RetrievalTask:
    """A retrieval task bound to its data (implements :class:`lmembed.evaluation.base.Task`).

    ``instruction`` (optional) goes on the queries only. ``name`` defaults to the data's name and
    ``dataset_revision`` to a content hash of the data files.
    """

    data: RetrievalData
    name: str = ""
    instruction: str | None = None
    ignore_identical_ids: bool = False
    top_k: int = TOP_K
    similarity: Similarity = "cosine"
    k_values: Sequence[int] = K_VALUES
    languages: Sequence[str] = ("eng-Latn",)
    dataset_revision: str = ""
    mteb_dataset_revision: str | None = None
    search_method: SearchMethod = "exact"  # "faiss": FAISS's kernel, chunk by chunk (large_corpus)
    chunking: Chunking | None = None  # long documents: chunked and scored from their chunks (encoding.chunking)
    task_type: ClassVar[str] = "Retrieval"
    main_metric: ClassVar[str] = MAIN_METRIC

    def __post_init__(self) -> None:
        self.name = self.name or self.data.name
        self.k_values = check_k_values(self.k_values, "k_values")
        if not is_whole_number(self.top_k) or self.top_k < 1:
            raise ConfigError(f"top_k={self.top_k!r:.40} must be a whole number >= 1")
        self.languages = list(self.languages)
        if not self.dataset_revision:
            self.dataset_revision = fingerprint(self.data.files) if self.data.files else "unknown"

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        name: str | None = None,
        split: str = "test",
        instruction: str | None = None,
        **settings: Any,
    ) -> Self:
        """Load ``split`` of the BEIR folder ``path``; ``settings`` are the other fields
        (``ignore_identical_ids``, ``mteb_dataset_revision``, ``top_k`` ...)."""
        data = load_beir(path, split, name=name)
        return cls(data, name=data.name, instruction=instruction, **settings)

    @property
    def split(self) -> str:
        return self.data.split

    def with_instruction(self, instruction: str | None) -> Self:
        """This task, bound to another instruction."""
        return dataclasses.replace(self, instruction=instruction)

    def with_chunking(self, chunking: Chunking | None) -> Self:
        """This task with documents chunked by ``chunking`` (``None``: truncated at the model's window)."""
        return dataclasses.replace(self, chunking=chunking)

    def subsample(
        self,
        *,
        max_docs: int | None = None,
        max_queries: int | None = None,
        seed: int = 0,
        policy: SubsamplePolicy = "all-judged",
    ) -> Self:
        """This task on a :func:`subsample_retrieval` of its data, named for it: ``SciFact[500 docs]``
        (``SciFact[500 docs, 50 queries]`` when queries were dropped too). The copy claims no MTEB
        dataset revision, since its scores are not MTEB's."""
        data = subsample_retrieval(self.data, max_queries, max_docs, seed, policy=policy)
        label = f"{len(data.corpus_ids)} docs"
        if len(data.query_ids) != len(self.data.query_ids):
            label += f", {len(data.query_ids)} queries"
        name = f"{self.name}[{label}]"
        return dataclasses.replace(
            self, data=dataclasses.replace(data, name=name), name=name, mteb_dataset_revision=None
        )

    def shrink(self, limits: ShrinkLimits) -> Self:
        """:meth:`subsample` with the ``relevant-first`` policy (``max_items`` does not apply); itself
        when neither ``max_docs`` nor ``max_queries`` is set."""
        if limits.max_docs is None and limits.max_queries is None:
            return self
        return self.subsample(
            max_docs=limits.max_docs, max_queries=limits.max_queries, seed=limits.seed, policy="relevant-first"
        )

    def embedded_texts(self) -> list[TextsToEmbed]:
        """The judged queries (with the instruction), then the whole corpus."""
        return [
            TextsToEmbed(list(self.data.query_texts), "query", self.instruction),
            TextsToEmbed(list(self.data.corpus_texts), "document"),
        ]

    def encode(
        self, encoder: RetrievalEncoder, *, batch_size: int = ENCODE_BATCH_SIZE
    ) -> tuple[np.ndarray, np.ndarray | ChunkedEmbeddings, dict[str, float]]:
        """Encode the judged queries (with the task's instruction) and the whole corpus (with ``chunking``: its
        chunks, through ``encode_corpus(..., chunking=...)``)."""
        start = time.perf_counter()
        q = encoder.encode_queries(self.data.query_texts, instruction=self.instruction, batch_size=batch_size)
        mid = time.perf_counter()
        if self.chunking is not None:
            chunked = encoder.encode_corpus(self.data.corpus_texts, batch_size=batch_size, chunking=self.chunking)
            q = _as_embeddings(q, len(self.data.query_ids), "encode_queries output")
            return q, chunked, {"encode_queries_s": mid - start, "encode_corpus_s": time.perf_counter() - mid}
        c = encoder.encode_corpus(self.data.corpus_texts, batch_size=batch_size)
        end = time.perf_counter()
        q = _as_embeddings(q, len(self.data.query_ids), "encode_queries output")
        if is_large_corpus(c):  # memory-mapped / float16: searched in chunks, never loaded whole
            c = corpus_matrix(c, len(self.data.corpus_ids), "encode_corpus output")
        else:
            c = _as_embeddings(c, len(self.data.corpus_ids), "encode_corpus output")
        return q, c, {"encode_queries_s": mid - start, "encode_corpus_s": end - mid}

    def _score(self, query_embeddings: np.ndarray, corpus_embeddings: np.ndarray | ChunkedEmbeddings) -> ScoredRun:
        if isinstance(corpus_embeddings, ChunkedEmbeddings):
            return score_chunked_embeddings(
                self.data,
                query_embeddings,
                corpus_embeddings,
                top_k=self.top_k,
                similarity=self.similarity,
                ignore_identical_ids=self.ignore_identical_ids,
                k_values=self.k_values,
            )
        return score_embeddings(
            self.data,
            query_embeddings,
            corpus_embeddings,
            top_k=self.top_k,
            similarity=self.similarity,
            ignore_identical_ids=self.ignore_identical_ids,
            k_values=self.k_values,
            search_method=self.search_method,
        )

    def score_embeddings(
        self,
        query_embeddings: np.ndarray,
        corpus_embeddings: np.ndarray | ChunkedEmbeddings,
        *,
        model_name: str = "",
    ) -> TaskResult:
        """Score precomputed embeddings with this task's settings (a chunked corpus: documents from chunks)."""
        start = time.perf_counter()
        scored = self._score(query_embeddings, corpus_embeddings)
        return self._result(scored, scored.timings, time.perf_counter() - start, model_name)

    def evaluate(self, encoder: RetrievalEncoder, *, batch_size: int = ENCODE_BATCH_SIZE) -> TaskResult:
        """Encode, search and score; the result carries per-stage timings in ``extra``."""
        start = time.perf_counter()
        q, c, timings = self.encode(encoder, batch_size=batch_size)
        scored = self._score(q, c)
        timings = {**timings, "encode_s": timings["encode_queries_s"] + timings["encode_corpus_s"], **scored.timings}
        model_name = getattr(encoder, "model_name", "")
        result = self._result(
            scored, timings, time.perf_counter() - start, model_name if isinstance(model_name, str) else ""
        )
        result.extra["instruction"] = self.instruction
        return result

    def _result(self, scored: ScoredRun, timings: dict[str, float], elapsed: float, model_name: str) -> TaskResult:
        for message in self.data.warnings:
            logger.info("%s", message)
        extra: dict[str, Any] = {
            "timings": timings,
            "languages": self.languages,
            "dataset_revision": self.dataset_revision,
            "mteb_dataset_revision": self.mteb_dataset_revision,
            "settings": {
                "similarity": self.similarity,
                "top_k": self.top_k,
                "ignore_identical_ids": self.ignore_identical_ids,
            },
            "data": self.data.summary(),
            "num_scored_queries": scored.scores.num_queries,
        }
        if self.chunking is not None:
            extra["settings"]["chunking"] = self.chunking.to_dict()
        if scored.corpus_storage is not None:  # a large corpus: how its embeddings were stored and searched
            extra["corpus_embeddings"] = {**scored.corpus_storage, "search": self.search_method}
        per_query = scored.scores.per_query
        ids = sorted(per_query)
        return TaskResult(
            task_name=self.name,
            task_type=self.task_type,
            split=self.data.split,
            scores=scored.scores.scores,
            main_metric=self.main_metric,
            evaluation_time=elapsed,
            model_name=model_name,
            extra=extra,
            items=ItemScores("mean", ids, [float(per_query[q][self.main_metric]) for q in ids]),
        )
