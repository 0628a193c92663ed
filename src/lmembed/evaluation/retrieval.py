"""Retrieval tasks: encode queries and corpus, search, score as MTEB does.

:class:`RetrievalTask` binds a loaded BEIR split (:mod:`lmembed.evaluation.data`) to MTEB's
settings for it (cosine similarity, exact top-1000 search, pytrec_eval metrics, ArguAna's
``ignore_identical_ids``). :func:`score_embeddings` is the same scoring for embeddings computed
elsewhere, for callers that produce many embedding variants in one pass.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lmembed.datasets import resolve_dataset
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.data import RetrievalData, load_beir
from lmembed.evaluation.metrics import K_VALUES, MAIN_METRIC, RetrievalScores, evaluate_run
from lmembed.evaluation.search import Similarity, exact_search, identical_id_positions
from lmembed.protocols import RetrievalEncoder

logger = logging.getLogger(__name__)

TOP_K = 1000


@dataclass(frozen=True)
class RetrievalTaskSpec:
    """MTEB's settings for one retrieval task.

    ``mteb_dataset_revision`` is the Hugging Face revision of MTEB's copy of the data, recorded
    for reference; the local BEIR files hold the same documents, queries and judgments.
    """

    name: str
    dataset: str
    split: str = "test"
    ignore_identical_ids: bool = False
    languages: tuple[str, ...] = ("eng-Latn",)
    mteb_dataset_revision: str | None = None


MTEB_RETRIEVAL_TASKS: dict[str, RetrievalTaskSpec] = {
    spec.name: spec
    for spec in (
        RetrievalTaskSpec("SciFact", "scifact", mteb_dataset_revision="0228b52cf27578f30900b9e5271d331663a030d7"),
        RetrievalTaskSpec("NFCorpus", "nfcorpus", mteb_dataset_revision="ec0fa4fe99da2ff19ca1214b7966684033a58814"),
        RetrievalTaskSpec(
            "ArguAna",
            "arguana",
            ignore_identical_ids=True,
            mteb_dataset_revision="c22ab2a51041ffd869aaddef7af8d8215647e41a",
        ),
    )
}


def task_spec(name: str) -> RetrievalTaskSpec:
    """Look up a task by MTEB name or dataset name, case-insensitively."""
    key = name.strip().lower()
    for spec in MTEB_RETRIEVAL_TASKS.values():
        if key in (spec.name.lower(), spec.dataset):
            return spec
    known = ", ".join(MTEB_RETRIEVAL_TASKS)
    raise KeyError(f"unknown retrieval task {name!r}; known: {known}")


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
) -> ScoredRun:
    """Search with precomputed embeddings (rows in ``data``'s query/corpus order) and score.

    ``ignore_identical_ids`` removes a hit whose id equals the query id. By default this
    happens after the top-``top_k`` search, which is what MTEB's code does (so such a query is
    scored on ``top_k - 1`` hits); ``exclude_before_top_k=True`` removes it during the search
    instead, as BEIR's original search did. Metrics at k < ``top_k`` are the same either way.
    """
    q = _as_embeddings(query_embeddings, len(data.query_ids), "query embeddings")
    c = _as_embeddings(corpus_embeddings, len(data.corpus_ids), "corpus embeddings")
    exclude = None
    if ignore_identical_ids and exclude_before_top_k:
        exclude = identical_id_positions(data.query_ids, data.corpus_ids)
    start = time.perf_counter()
    result = exact_search(q, c, top_k=top_k, similarity=similarity, exclude=exclude, chunk_size=chunk_size)
    run = result.to_run(data.query_ids, data.corpus_ids)
    searched = time.perf_counter()
    scores = evaluate_run(data.qrels, run, k_values, ignore_identical_ids=ignore_identical_ids)
    done = time.perf_counter()
    return ScoredRun(scores, run, {"search_s": searched - start, "metrics_s": done - searched})


class RetrievalTask:
    """A retrieval task bound to its data (implements :class:`lmembed.evaluation.base.Task`)."""

    task_type: ClassVar[str] = "Retrieval"
    main_metric: ClassVar[str] = MAIN_METRIC

    def __init__(
        self,
        data: RetrievalData,
        *,
        name: str | None = None,
        ignore_identical_ids: bool = False,
        top_k: int = TOP_K,
        similarity: Similarity = "cosine",
        k_values: Sequence[int] = K_VALUES,
        languages: Sequence[str] = ("eng-Latn",),
        dataset_revision: str | None = None,
        mteb_dataset_revision: str | None = None,
    ) -> None:
        self.data = data
        self.name = name or data.name
        self.ignore_identical_ids = ignore_identical_ids
        self.top_k = top_k
        self.similarity: Similarity = similarity
        self.k_values = tuple(k_values)
        self.languages = list(languages)
        self.dataset_revision = dataset_revision or (fingerprint(data.files) if data.files else "unknown")
        self.mteb_dataset_revision = mteb_dataset_revision

    @classmethod
    def from_name(cls, name: str, *, path: str | Path | None = None, split: str | None = None) -> RetrievalTask:
        """Build an MTEB task (``"SciFact"``, ``"nfcorpus"`` ...) with MTEB's settings.

        The data is found with :func:`lmembed.datasets.resolve_dataset` unless ``path`` is given.
        """
        spec = task_spec(name)
        folder = Path(path) if path is not None else resolve_dataset(spec.dataset)
        data = load_beir(folder, split or spec.split, name=spec.name)
        return cls(
            data,
            name=spec.name,
            ignore_identical_ids=spec.ignore_identical_ids,
            languages=spec.languages,
            mteb_dataset_revision=spec.mteb_dataset_revision,
        )

    @classmethod
    def from_folder(
        cls, path: str | Path, *, name: str | None = None, split: str = "test", **kwargs: Any
    ) -> RetrievalTask:
        """Build a task from any BEIR-layout folder; keyword arguments go to the constructor."""
        return cls(load_beir(path, split, name=name), name=name, **kwargs)

    @property
    def split(self) -> str:
        return self.data.split

    def encode(
        self, encoder: RetrievalEncoder, *, batch_size: int = 32, instruction: str | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """Encode the judged queries (with ``instruction``) and the whole corpus."""
        start = time.perf_counter()
        q = encoder.encode_queries(self.data.query_texts, instruction=instruction, batch_size=batch_size)
        mid = time.perf_counter()
        c = encoder.encode_corpus(self.data.corpus_texts, batch_size=batch_size)
        end = time.perf_counter()
        q = _as_embeddings(q, len(self.data.query_ids), "encode_queries output")
        c = _as_embeddings(c, len(self.data.corpus_ids), "encode_corpus output")
        return q, c, {"encode_queries_s": mid - start, "encode_corpus_s": end - mid}

    def score_embeddings(
        self, query_embeddings: np.ndarray, corpus_embeddings: np.ndarray, *, model_name: str = ""
    ) -> TaskResult:
        """Score precomputed embeddings with this task's settings."""
        start = time.perf_counter()
        scored = score_embeddings(
            self.data,
            query_embeddings,
            corpus_embeddings,
            top_k=self.top_k,
            similarity=self.similarity,
            ignore_identical_ids=self.ignore_identical_ids,
            k_values=self.k_values,
        )
        return self._result(scored, scored.timings, time.perf_counter() - start, model_name)

    def evaluate(
        self, encoder: RetrievalEncoder, *, batch_size: int = 32, instruction: str | None = None
    ) -> TaskResult:
        """Encode, search and score; the result carries per-stage timings in ``extra``."""
        start = time.perf_counter()
        q, c, timings = self.encode(encoder, batch_size=batch_size, instruction=instruction)
        scored = score_embeddings(
            self.data,
            q,
            c,
            top_k=self.top_k,
            similarity=self.similarity,
            ignore_identical_ids=self.ignore_identical_ids,
            k_values=self.k_values,
        )
        timings = {**timings, "encode_s": timings["encode_queries_s"] + timings["encode_corpus_s"], **scored.timings}
        model_name = getattr(encoder, "model_name", "")
        result = self._result(
            scored, timings, time.perf_counter() - start, model_name if isinstance(model_name, str) else ""
        )
        result.extra["instruction"] = instruction
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
        return TaskResult(
            task_name=self.name,
            task_type=self.task_type,
            split=self.data.split,
            scores=scored.scores.scores,
            main_metric=self.main_metric,
            evaluation_time=elapsed,
            model_name=model_name,
            extra=extra,
        )
