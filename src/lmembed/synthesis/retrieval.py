"""Dense retrieval over a recipe's seed corpus, for Gecko's candidates and corpus-only's round trip and negatives.

The corpus is embedded once per run and kept as ``corpus-embeddings.npy`` in the run's parts folder, so a resumed
run does not embed it again.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmembed.atomic import atomic_write
from lmembed.synthesis.runner import Context, Encode

CACHE = "corpus-embeddings.npy"


def corpus_embeddings(context: Context) -> np.ndarray:
    path = context.parts / CACHE
    if path.exists():
        return np.load(path)
    assert context.encode is not None
    matrix = np.asarray(context.encode(context.corpus_texts, "document"), dtype=np.float32)
    buffer = io.BytesIO()
    np.save(buffer, matrix)
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))
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
