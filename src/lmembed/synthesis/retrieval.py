"""Dense retrieval over a recipe's seed corpus, for Gecko's candidates and corpus-only's round trip and negatives.

The corpus is embedded once per run, while the run is planned, and kept as ``corpus-embeddings.npy`` in the run's
parts folder, so a resumed run (and every worker of a run on Ray) reads it instead of embedding it again.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmembed.synthesis.runner import Context, Encode, ShardError, read_stage, write_stage

CACHE = "corpus-embeddings.npy"


def corpus_embeddings(context: Context) -> np.ndarray:
    """The corpus's document vectors, encoded once per run and kept as a checked stage (``corpus-embeddings.npy``);
    kept vectors that are not one float32 row per corpus text are refused, naming the file."""
    kept = read_stage(context.parts, CACHE)
    if kept is not None:
        matrix = np.load(io.BytesIO(kept), allow_pickle=False)
        rows = len(context.corpus_texts)
        if matrix.ndim != 2 or matrix.shape[0] != rows or matrix.dtype != np.float32:
            raise ShardError(
                f"{context.parts / CACHE}: holds {matrix.dtype} vectors of shape {matrix.shape}, not one float32 row "
                f"for each of the corpus's {rows} texts; delete it to encode the corpus again"
            )
        return matrix
    assert context.encode is not None
    matrix = np.asarray(context.encode(context.corpus_texts, "document"), dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, matrix)
    write_stage(context.parts, CACHE, buffer.getvalue())
    return matrix


def top_k(context: Context, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and scores of each query's ``k`` best corpus passages, best first."""
    assert context.encode is not None
    if not queries:
        return np.zeros((0, 0), dtype=int), np.zeros((0, 0), dtype=np.float32)
    docs = corpus_embeddings(context)
    scores = np.asarray(context.encode(list(queries), "query"), dtype=np.float32) @ docs.T
    k = min(k, docs.shape[0])
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def embedder_encode(embedder: Any) -> Encode:
    """The :data:`~lmembed.synthesis.runner.Encode` of an embedder (anything with ``encode_queries`` and
    ``encode_corpus``, such as :class:`lmembed.Embedder`): queries with its query side, passages as documents."""

    def encode(texts: Sequence[str], side: str) -> np.ndarray:
        if side == "query":
            return embedder.encode_queries(list(texts))
        return embedder.encode_corpus(list(texts))

    return encode


@dataclass
class EmbedderEncode:
    """An ``encode(texts, side)`` for the relabelling recipes from an embedder's name or folder (and
    ``Embedder.from_pretrained`` options), loaded on first use. It pickles as its name, so a run on Ray sends
    each worker the name, and the worker loads the embedder itself (once)."""

    name_or_path: str
    options: Mapping[str, Any] = field(default_factory=dict)
    _encode: Encode | None = field(default=None, init=False, repr=False, compare=False)

    def __call__(self, texts: Sequence[str], side: str) -> np.ndarray:
        if self._encode is None:
            from lmembed.embedder import Embedder  # lazy: torch loads only in a run that retrieves

            self._encode = embedder_encode(Embedder.from_pretrained(self.name_or_path, **self.options))
        return self._encode(texts, side)

    def __getstate__(self) -> dict[str, Any]:
        return {"name_or_path": self.name_or_path, "options": dict(self.options), "_encode": None}
