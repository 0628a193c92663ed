"""The Python API of sharded encoding: an Embedder whose encode calls run as jobs, and one-call corpus encoding.

    >>> from lmembed import Embedder
    >>> from lmembed.scale import encode_corpus, scaled
    >>> emb = Embedder.from_pretrained("minilm")
    >>> done = encode_corpus(emb, "../shared/datasets/beir/scifact", engine="ray")   # a local Ray cluster
    >>> done.ids[:2], done.vectors.shape
    >>> fast = scaled(emb, engine="ray", ray_address="auto")    # any code that takes an Embedder
    >>> fast.encode_corpus(texts)                               # ... now encodes on the cluster

A scaled Embedder *is* an :class:`~lmembed.embedder.Embedder` (the same backbone, engine, strategy, name and
dimension, shared, not copied) whose executor is a :class:`ShardedExecutor`, so evaluation, index building
and mining take it unchanged; its ``encode``, ``encode_queries``, ``encode_corpus`` and ``encode_strategies``
each run sharded jobs (:class:`~lmembed.scale.job.EncodeJob`) on the executor's engine and return the same
vectors as the plain Embedder, bit for bit; ``with_config`` keeps the executor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_write
from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder
from lmembed.encoding.inputs import validate_texts
from lmembed.errors import ConfigError
from lmembed.options import EngineOptions
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.scale.engines import JobEngine, make_engine
from lmembed.scale.job import DEFAULT_SHARD_ROWS, STORAGE_DTYPES, EncodeJob, JobReport
from lmembed.scale.progress import ProgressCallback
from lmembed.scale.sources import CorpusSource, memory_source, open_source
from lmembed.scale.work import EmbedderSpec

CorpusLike = str | Path | Sequence[str] | CorpusSource


class ShardedExecutor:
    """Runs an Embedder's encoding as sharded jobs on ``engine`` (see the module doc); its ``reports`` list what
    each job did.

    ``spec`` makes every worker load the model itself (large models; the path must be readable on every
    node) instead of receiving a copy of the Embedder. ``memory_map`` returns read-only memory maps of
    ``.npy`` files in the cache instead of arrays in memory; ``corpus_dtype="float16"`` stores corpus
    vectors (``encode_corpus``) at half the size. Progress snapshots go to ``on_progress``.
    """

    def __init__(
        self,
        engine: JobEngine,
        *,
        spec: EmbedderSpec | None = None,
        shard_rows: int = DEFAULT_SHARD_ROWS,
        memory_map: bool = False,
        corpus_dtype: str = "float32",
        on_progress: ProgressCallback | None = None,
    ) -> None:
        if corpus_dtype not in STORAGE_DTYPES:
            raise ConfigError(f"corpus_dtype={corpus_dtype!r}: use one of {', '.join(STORAGE_DTYPES)}")
        if corpus_dtype != "float32" and not memory_map:
            raise ConfigError("corpus_dtype='float16' is a storage format: use it with memory_map=True")
        self.engine = engine
        self.spec = spec
        self.shard_rows = shard_rows
        self.memory_map = memory_map
        self.corpus_dtype = corpus_dtype
        self.on_progress = on_progress
        self.reports: list[JobReport] = []

    def run(
        self,
        embedder: Embedder,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None,
        batch_size: int,
        corpus: bool = False,
    ) -> list[np.ndarray]:
        """One job per group of strategies that share their forward passes."""
        texts = validate_texts(texts)
        dtype = self.corpus_dtype if corpus else "float32"
        groups: dict[str, list[int]] = {}
        for i, cfg in enumerate(configs):
            groups.setdefault(json.dumps(cfg.forward_key(), sort_keys=True), []).append(i)
        results: list[np.ndarray | None] = [None] * len(configs)
        for members in groups.values():
            arrays = self._job(embedder, texts, [configs[i] for i in members], instruction, batch_size, dtype)
            for i, array in zip(members, arrays, strict=True):
                results[i] = array
        return [r for r in results if r is not None]

    def _job(
        self,
        embedder: Embedder,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        instruction: str | None,
        batch_size: int,
        dtype: str,
    ) -> list[np.ndarray]:
        job = EncodeJob(
            embedder,
            memory_source(texts),
            configs,
            instruction=instruction,
            batch_size=batch_size,
            shard_rows=self.shard_rows,
        )
        self.reports.append(job.run(self.engine, spec=self.spec, on_progress=self.on_progress))
        cached = embedder.engine.use_cache
        out = [job.vectors(i, dtype=dtype, memory_map=self.memory_map and cached) for i in range(len(configs))]
        if not cached:
            job.remove()  # an uncached Embedder leaves nothing behind
        return out


def scaled(
    embedder: Embedder,
    engine: str | JobEngine | EngineOptions = "ray",
    *,
    spec: EmbedderSpec | None = None,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    memory_map: bool = False,
    corpus_dtype: str = "float32",
    on_progress: ProgressCallback | None = None,
    **engine_options: Any,
) -> Embedder:
    """``embedder`` on ``engine``: ``"local"`` returns it unchanged (the ordinary single-process path);
    ``"ray"`` (or an engine object) returns the same Embedder encoding through a :class:`ShardedExecutor`.
    ``engine_options``: the fields of :class:`~lmembed.options.EngineOptions` (``ray_address=``, ``workers=``
    ...); the other options: see :class:`ShardedExecutor`."""
    chosen = make_engine(engine, **engine_options)  # refuses Ray options given to the local engine
    if isinstance(engine, str | EngineOptions) and chosen.name == "local":
        return embedder
    return embedder.with_executor(
        ShardedExecutor(
            chosen,
            spec=spec,
            shard_rows=shard_rows,
            memory_map=memory_map,
            corpus_dtype=corpus_dtype,
            on_progress=on_progress,
        )
    )


@dataclass
class EncodedCorpus:
    """A finished corpus job: ids and vectors in input order, and what the run did."""

    ids: list[str]
    vectors: np.ndarray
    report: JobReport
    job: EncodeJob

    def write_jsonl(self, path: str | Path) -> Path:
        """One ``{"text", "embedding"}`` row per input row, in order (``lmembed encode -o x.jsonl``), atomically."""

        def write(handle: Any) -> None:
            row = 0
            for block in self.job.source.iter_blocks():
                for text in block.texts:
                    line = json.dumps({"text": text, "embedding": np.asarray(self.vectors[row]).tolist()})
                    handle.write((line + "\n").encode())
                    row += 1

        return atomic_write(path, write)


def as_source(corpus: CorpusLike, *, field: str | None = None) -> CorpusSource:
    """A :class:`CorpusSource` from a path (see :func:`~lmembed.scale.sources.open_source`), a list of texts,
    or a source."""
    if isinstance(corpus, CorpusSource):
        return corpus
    if isinstance(corpus, str | Path):
        return open_source(corpus, field=field)
    return memory_source(list(corpus))


def encode_corpus(
    embedder: Embedder,
    corpus: CorpusLike,
    *,
    engine: str | JobEngine | EngineOptions = "local",
    instruction: str | None = None,
    batch_size: int = ENCODE_BATCH_SIZE,
    shard_rows: int = DEFAULT_SHARD_ROWS,
    output: str | Path | None = None,
    memory_map: bool = False,
    dtype: str = "float32",
    field: str | None = None,
    spec: EmbedderSpec | None = None,
    on_progress: ProgressCallback | None = None,
    **engine_options: Any,
) -> EncodedCorpus:
    """Encode a whole corpus as a sharded job on ``engine`` (``"local"`` or ``"ray"``, an engine, or
    :class:`~lmembed.options.EngineOptions`; ``engine_options``: its fields as keywords) and return its ids
    and vectors in input order. The corpus streams from disk (JSON lines, BEIR, text lines, Parquet) or
    comes as a list of texts; ``output`` (``.npy``) receives the matrix, written atomically, and the
    result is its memory map; ``memory_map`` keeps a ``.npy`` in the cache instead. Killed or failed,
    the same call resumes where it stopped."""
    chosen = make_engine(engine, **engine_options)
    job = EncodeJob(
        embedder,
        as_source(corpus, field=field),
        instruction=instruction,
        batch_size=batch_size,
        shard_rows=shard_rows,
    )
    report = job.run(chosen, spec=spec, on_progress=on_progress)
    vectors = job.vectors(dtype=dtype, memory_map=memory_map, output=output)
    return EncodedCorpus(job.ids(), vectors, report, job)
