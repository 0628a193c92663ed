"""Long documents: token windows with overlap, and document scores from chunk scores.

A document longer than the model's window is cut into windows of ``tokens`` text tokens (special tokens are
added later, per chunk, by the encoding), each starting ``tokens - overlap`` tokens after the previous one; the
last window ends at the document's last token. A chunk's text is the document's own characters from its first
token's start to its last token's end (the tokenizer's offsets), so nothing is decoded or normalised.

A document is scored from its chunks' scores (:data:`AGGREGATES`): ``first`` (the first window only: what
truncation at ``tokens`` gives), ``maxp`` (the best chunk, as in Dai & Callan's MaxP) or ``mean``. With
``late=True`` the chunks are pooled from one forward pass over the whole document (up to the strategy's
``max_length``) instead of being encoded apart (late chunking, :meth:`EncodingEngine.encode_late_chunks`).

Chunks of one document are consecutive rows and every document has at least one (an empty document has one
empty chunk), so ``doc_index`` is non-decreasing and covers every document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmembed.encoding.inputs import tokenizer_lock
from lmembed.errors import ConfigError
from lmembed.io import is_whole_number
from lmembed.pooling.normalize import unit_rows

Aggregate = Literal["first", "maxp", "mean"]
AGGREGATES: tuple[str, ...] = ("first", "maxp", "mean")

__all__ = [
    "AGGREGATES",
    "ChunkedEmbeddings",
    "Chunking",
    "Chunks",
    "aggregate_chunk_scores",
    "split_documents",
    "token_windows",
]


#: text tokens per window by default: with its special tokens a window fits a model that reads 256 tokens (minilm,
#: many sentence-transformers encoders); a larger one is refused where it would be cut at the strategy's max_length
DEFAULT_CHUNK_TOKENS = 192
DEFAULT_CHUNK_OVERLAP = 32


@dataclass(frozen=True)
class Chunking:
    """How long documents are chunked and scored: ``tokens`` per window, ``overlap`` shared with the previous
    window, ``aggregate`` (first, maxp, mean) and ``late`` (pool chunks from one long forward pass)."""

    aggregate: Aggregate = "maxp"
    tokens: int = DEFAULT_CHUNK_TOKENS
    overlap: int = DEFAULT_CHUNK_OVERLAP
    late: bool = False

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ConfigError(f"chunking aggregate={self.aggregate!r}: expected one of {', '.join(AGGREGATES)}")
        for name in ("tokens", "overlap"):
            value = getattr(self, name)
            if not is_whole_number(value):
                raise ConfigError(f"chunk {name}={value!r} must be a whole number of tokens")
        if not isinstance(self.late, bool):
            raise ConfigError(f"chunk late={self.late!r} must be true or false")
        if self.tokens < 1:
            raise ConfigError(f"chunk tokens={self.tokens} must be >= 1")
        if not 0 <= self.overlap < self.tokens:
            raise ConfigError(f"chunk overlap={self.overlap} must be >= 0 and below chunk tokens={self.tokens}")

    def label(self) -> str:
        late = ",late" if self.late else ""
        return f"{self.aggregate}[{self.tokens}/{self.overlap}{late}]"

    def to_dict(self) -> dict[str, Any]:
        return {"aggregate": self.aggregate, "tokens": self.tokens, "overlap": self.overlap, "late": self.late}


def token_windows(length: int, tokens: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` token windows over a sequence of ``length`` tokens: at most ``tokens`` each, each starting
    ``tokens - overlap`` after the previous one, the last one ending at ``length``; ``[(0, 0)]`` when empty."""
    if length <= 0:
        return [(0, 0)]
    stride = tokens - overlap
    windows = []
    start = 0
    while True:
        end = min(start + tokens, length)
        windows.append((start, end))
        if end >= length:
            return windows
        start += stride


@dataclass
class Chunks:
    """Chunk texts of some documents, with each chunk's document row and token window."""

    texts: list[str]
    doc_index: np.ndarray  # (n_chunks,) int64, non-decreasing
    windows: list[tuple[int, int]]
    num_docs: int


def split_documents(tokenizer: Any, documents: Sequence[str], chunking: Chunking) -> Chunks:
    """Cut ``documents`` into chunk texts by ``chunking``'s token windows (``first``: the first window only)."""
    texts: list[str] = []
    rows: list[int] = []
    windows: list[tuple[int, int]] = []
    if documents:
        with tokenizer_lock(tokenizer):  # the call resets the backend's truncation, which a builder may be using
            encoded = tokenizer(list(documents), add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for row, (doc, offsets) in enumerate(zip(documents, encoded["offset_mapping"], strict=True)):
            spans = token_windows(len(offsets), chunking.tokens, chunking.overlap)
            if chunking.aggregate == "first":
                spans = spans[:1]
            for start, end in spans:
                texts.append(doc[offsets[start][0] : offsets[end - 1][1]] if end > start else doc)
                rows.append(row)
                windows.append((start, end))
    return Chunks(texts, np.asarray(rows, dtype=np.int64), windows, len(documents))


def _first_rows(doc_index: np.ndarray, num_docs: int) -> np.ndarray:
    """The first chunk row of each document; every document must have one, in order."""
    starts = np.searchsorted(doc_index, np.arange(num_docs), side="left")
    if doc_index.size and (np.any(np.diff(doc_index) < 0) or doc_index[0] != 0 or doc_index[-1] != num_docs - 1):
        raise ValueError("chunk document rows must be non-decreasing and cover every document")
    if np.any(doc_index[np.minimum(starts, len(doc_index) - 1)] != np.arange(num_docs)):
        raise ValueError("every document needs at least one chunk")
    return starts


def aggregate_chunk_scores(scores: np.ndarray, doc_index: np.ndarray, num_docs: int, aggregate: str) -> np.ndarray:
    """Document scores ``(n_queries, num_docs)`` from chunk scores ``(n_queries, n_chunks)``: the first chunk's,
    the best chunk's (``maxp``) or the mean over the document's chunks."""
    if aggregate not in AGGREGATES:
        raise ConfigError(f"chunking aggregate={aggregate!r}: expected one of {', '.join(AGGREGATES)}")
    scores = np.asarray(scores, dtype=np.float32)
    if num_docs == 0:
        return np.zeros((scores.shape[0], 0), dtype=np.float32)
    starts = _first_rows(np.asarray(doc_index, dtype=np.int64), num_docs)
    if aggregate == "first":
        return scores[:, starts]
    if aggregate == "maxp":
        return np.maximum.reduceat(scores, starts, axis=1)
    counts = np.diff(np.append(starts, scores.shape[1])).astype(np.float32)
    return np.add.reduceat(scores, starts, axis=1) / counts


@dataclass
class ChunkedEmbeddings:
    """Chunk vectors of a corpus (rows of ``vectors``), each chunk's document row, and how documents are
    scored from them (``aggregate``)."""

    vectors: np.ndarray
    doc_index: np.ndarray
    num_docs: int
    aggregate: str

    def document_scores(self, queries: np.ndarray, *, similarity: str = "cosine") -> np.ndarray:
        """``(n_queries, num_docs)`` scores: each chunk scored by ``similarity`` (cosine or dot), then aggregated."""
        q = np.asarray(queries, dtype=np.float32)
        c = self.vectors
        if similarity == "cosine":
            q, c = unit_rows(q), unit_rows(c)
        elif similarity != "dot":
            raise ConfigError(f"similarity={similarity!r}: expected 'cosine' or 'dot'")
        return aggregate_chunk_scores(q @ c.T, self.doc_index, self.num_docs, self.aggregate)
