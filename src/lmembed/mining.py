"""Hard-negative mining with a teacher embedder, including NV-Retriever's positive-aware filters.

Contrastive training learns more from negatives that the current model finds hard, but the hardest
candidates a retriever returns are often unlabelled relevant documents (false negatives): training
against them teaches the model to push away correct answers. NV-Retriever (Moreira et al., 2024; used
for NV-Embed's training data) filters candidates by comparing each one's teacher score with the
teacher score of the labelled positive. The filters offered here:

========== ==================================================================== ====================
method     a candidate is kept when its score is ...                            default ``margin``
========== ==================================================================== ====================
naive      (always kept: plain top-k)                                           ignored
abs        below an absolute ceiling: ``score < margin`` (TopK-Abs)             0.7
margin_pos below the positive score minus a gap: ``score < pos - margin``       0.05
perc_pos   a share below the positive: ``score < pos - |pos|·(1 - margin)``     0.95 (NV-Embed's)
========== ==================================================================== ====================

``pos`` is the *lowest* teacher score among a query's positives, the cautious choice when a query has
several. ``skip_top=s`` additionally ignores the ``s`` best-ranked non-positive candidates before the
filter is applied (NV-Retriever's "TopK-shifted" variants).

How it runs: queries (grouped by instruction) and the de-duplicated corpus are embedded once with the
teacher's ``encode_queries`` / ``encode_corpus`` (an lmembed ``Embedder`` serves repeated runs from its
embedding cache), the ``candidates`` best documents per query are found with the evaluation package's
exact chunked search, positives and the query's own text are removed, the filter is applied, and the
``k`` best survivors become the row's ``negatives``, best first.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from lmembed.atomic import atomic_write
from lmembed.errors import LmembedError
from lmembed.evaluation.search import exact_search
from lmembed.io import (
    CORPUS_FILE,
    NEGATIVE_KEYS,
    POSITIVE_KEYS,
    QUERY_KEYS,
    DataFormatError,
    find_file,
    is_jsonl,
    iter_jsonl,
    read_corpus,
    read_jsonl,
    read_text_lines,
    row_key,
)
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

log = logging.getLogger(__name__)

METHODS = ("naive", "abs", "margin_pos", "perc_pos")
DEFAULT_MARGINS = {"naive": 0.0, "abs": 0.7, "margin_pos": 0.05, "perc_pos": 0.95}
_METHOD_ALIASES = {
    "topk": "naive",
    "top_k": "naive",
    "topk_abs": "abs",
    "absolute": "abs",
    "topk_marginpos": "margin_pos",
    "marginpos": "margin_pos",
    "topk_percpos": "perc_pos",
    "percpos": "perc_pos",
}


class MiningError(LmembedError, ValueError):
    """Mining options or inputs are not usable."""


@dataclass
class MiningStats:
    """What happened to the candidates, summed over all queries."""

    queries: int = 0
    candidates: int = 0
    removed_positives: int = 0
    skipped_top: int = 0
    removed_by_threshold: int = 0
    negatives: int = 0
    short_rows: int = 0  # rows that got fewer than k negatives
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- options
def canonical_method(method: str) -> str:
    """Normalise a method name (``perc_pos``, ``TopK-PercPos``, ``naive`` ...) or raise."""
    key = method.strip().lower().replace("-", "_")
    key = _METHOD_ALIASES.get(key, key)
    if key not in METHODS:
        raise MiningError(f"mining method {method!r} is unknown; choose one of {', '.join(METHODS)}")
    return key


def resolve_margin(method: str, margin: float | None) -> float:
    """The filter parameter for ``method``: the given value or the method's default."""
    if method == "naive" and margin is not None:
        raise MiningError(f"margin={margin}: method 'naive' keeps the top k as they are and takes no margin")
    value = DEFAULT_MARGINS[method] if margin is None else float(margin)
    if not math.isfinite(value):
        raise MiningError(f"margin={value} is not a finite number")
    if method == "perc_pos" and not 0 < value <= 1:
        raise MiningError(f"perc_pos needs 0 < margin <= 1 (a fraction of the positive score), got {value}")
    if method == "margin_pos" and value < 0:
        raise MiningError(f"margin_pos needs margin >= 0, got {value}")
    return value


def keep_mask(scores: np.ndarray, positive_score: float, method: str, margin: float) -> np.ndarray:
    """Which candidate scores pass ``method``'s filter (``scores`` is one query's candidate row)."""
    if method == "naive":
        return np.ones(scores.shape, dtype=bool)
    if method == "abs":
        return scores < margin
    if method == "margin_pos":
        return scores < positive_score - margin
    # pos·margin for a positive pos; for a negative one (a cosine below 0) that would be *above* pos, keeping
    # candidates closer to the query than its own document: the same gap is taken below pos instead
    return scores < positive_score - abs(positive_score) * (1 - margin)


# ---------------------------------------------------------------------------------------------- inputs
def _row_query(row: Mapping[str, Any]) -> str:
    key = _key(row, QUERY_KEYS, "query")
    if key is None or not isinstance(row[key], str) or not row[key]:
        raise MiningError(f"row has no query text (one of {', '.join(QUERY_KEYS)}): {dict(row)!r:.120}")
    return row[key]


def _key(row: Mapping[str, Any], keys: tuple[str, ...], what: str) -> str | None:
    try:
        return row_key(row, keys, what)
    except ValueError as exc:
        raise MiningError(str(exc)) from None


def _row_negatives(row: Mapping[str, Any]) -> list[str]:
    """The negatives a row has already, under any of their names (a string or a list of texts)."""
    key = _key(row, NEGATIVE_KEYS, "negatives")
    value = row[key] if key is not None else []
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(t, str) and t for t in items):
        raise MiningError(f"row's {key!r} must be a text or a list of texts")
    return items


def _row_positives(row: Mapping[str, Any]) -> list[str]:
    key = _key(row, POSITIVE_KEYS, "positive")
    if key is None:
        raise MiningError(f"row has no positive (one of {', '.join(POSITIVE_KEYS)}): {dict(row)!r:.120}")
    value = row[key]
    items = [value] if isinstance(value, str) else list(value)
    if not items or not all(isinstance(t, str) and t for t in items):
        raise MiningError(f"row's {key!r} must be a non-empty text or list of texts")
    return items


def _as_row(row: Any) -> dict[str, Any]:
    """A plain dict for a mapping row or a ``TrainExample``-like object."""
    if isinstance(row, Mapping):
        return dict(row)
    if hasattr(row, "query") and hasattr(row, "positives"):
        out = {"query": row.query, "positive": list(row.positives)}
        for name in ("instruction", "task"):
            if getattr(row, name, None):
                out[name] = getattr(row, name)
        return out
    raise MiningError(f"a row must be a mapping or a TrainExample, got {type(row).__name__}")


def corpus_texts(corpus: Mapping[str, str] | Sequence[str] | None) -> list[str]:
    """The corpus as a list of texts (ids of a mapping are dropped: mining works on texts)."""
    if corpus is None:
        return []
    if isinstance(corpus, Mapping):
        return [str(t) for t in corpus.values()]
    if isinstance(corpus, str):
        raise MiningError("corpus must be a list of texts or a {id: text} mapping, not one string")
    return [str(t) for t in corpus]


class _TextPool:
    """De-duplicated candidate texts with a text → index map."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.index: dict[str, int] = {}
        for text in texts:
            if text and text not in self.index:
                self.index[text] = len(self.index)

    def add(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))

    @property
    def texts(self) -> list[str]:
        return list(self.index)


# ---------------------------------------------------------------------------------------------- embedding
def _embed_queries(
    teacher: RetrievalEncoder,
    queries: Sequence[str],
    instructions: Sequence[str | None],
    batch_size: int,
) -> np.ndarray:
    """Query embeddings in input order; one teacher call per distinct instruction."""
    out: np.ndarray | None = None
    groups: dict[str | None, list[int]] = {}
    for i, instruction in enumerate(instructions):
        groups.setdefault(instruction, []).append(i)
    for instruction, rows in groups.items():
        texts = [queries[i] for i in rows]
        vectors = np.asarray(teacher.encode_queries(texts, instruction=instruction, batch_size=batch_size))
        if out is None:
            out = np.empty((len(queries), vectors.shape[1]), dtype=np.float32)
        out[rows] = vectors
    assert out is not None
    return out


# ---------------------------------------------------------------------------------------------- selection
def _select(
    cand_index: np.ndarray,
    cand_scores: np.ndarray,
    banned: set[int],
    positive_score: float,
    *,
    k: int,
    method: str,
    margin: float,
    skip_top: int,
    stats: MiningStats,
) -> tuple[list[int], list[float]]:
    """Pick one query's negatives from its ranked candidates."""
    valid = cand_index >= 0
    idx, sc = cand_index[valid], cand_scores[valid]
    stats.candidates += len(idx)
    not_positive = np.array([int(j) not in banned for j in idx], dtype=bool)
    stats.removed_positives += int((~not_positive).sum())
    idx, sc = idx[not_positive], sc[not_positive]
    skipped = min(skip_top, len(idx))
    stats.skipped_top += skipped
    idx, sc = idx[skipped:], sc[skipped:]
    keep = keep_mask(sc, positive_score, method, margin)
    stats.removed_by_threshold += int((~keep).sum())
    idx, sc = idx[keep][:k], sc[keep][:k]
    stats.negatives += len(idx)
    stats.short_rows += int(len(idx) < k)
    return [int(j) for j in idx], [float(s) for s in sc]


def default_candidates(k: int, skip_top: int, max_positives: int) -> int:
    """How many documents to retrieve per query: room for the positives, the skipped ranks and a
    tenfold surplus over ``k`` for the filter to discard."""
    return skip_top + 10 * k + max_positives


# ---------------------------------------------------------------------------------------------- public API
def mine_hard_negatives(
    teacher: RetrievalEncoder,
    rows: Iterable[Mapping[str, Any] | Any],
    corpus: Mapping[str, str] | Sequence[str] | None = None,
    *,
    k: int = 7,
    method: str = "perc_pos",
    margin: float | None = None,
    skip_top: int = 0,
    candidates: int | None = None,
    batch_size: int = ENCODE_BATCH_SIZE,
    query_instruction: str | None = None,
    keep_existing: bool = False,
    with_scores: bool = False,
    stats: MiningStats | None = None,
) -> list[dict[str, Any]]:
    """Return the rows with ``negatives`` mined from ``corpus`` by ``teacher``.

    Args:
        teacher: anything with ``encode_queries(texts, instruction=..., batch_size=...)`` and
            ``encode_corpus(texts, batch_size=...)`` (an lmembed ``Embedder``, a test double ...).
        rows: training rows ``{"query", "positive" (text or list), "instruction"?, ...}`` or
            ``TrainExample`` objects; other fields are copied to the output unchanged.
        corpus: candidate documents, a list of texts or ``{id: text}``; the rows' positives are
            always added. ``None`` mines from the positives of the other rows.
        k: negatives per row (fewer when too few candidates survive; see ``stats.short_rows``).
        method, margin: the filter (see the module table); ``margin=None`` takes the method's default.
        skip_top: ignore this many best-ranked non-positive candidates first.
        candidates: documents retrieved per query (default :func:`default_candidates`).
        query_instruction: used for rows without their own ``instruction``.
        keep_existing: put a row's existing ``negatives`` first and mine only the rest.
        with_scores: add ``teacher_scores`` (the teacher's cosine of each positive and each negative, existing ones
            included) in the form the distillation losses read: ``{"positive": [...], "negatives": [...]}``.
        stats: filled in with counts, when given.

    Similarity is cosine (the teacher's vectors are L2-normalised here).
    """
    method = canonical_method(method)
    margin = resolve_margin(method, margin)
    if k < 1:
        raise MiningError(f"k={k} must be >= 1")
    if skip_top < 0:
        raise MiningError(f"skip_top={skip_top} must be >= 0")
    stats = stats if stats is not None else MiningStats()
    items = [_as_row(r) for r in rows]
    if not items:
        return []
    queries = [_row_query(r) for r in items]
    positives = [_row_positives(r) for r in items]
    instructions = [r.get("instruction") or query_instruction for r in items]
    if query_instruction is not None and (own := sum(1 for r in items if r.get("instruction"))):
        log.warning(
            "%d of %d rows give their own instruction, which they are mined with instead of the one given",
            own,
            len(items),
        )
    pool = _TextPool(corpus_texts(corpus))
    positive_ids = [[pool.add(p) for p in pos] for pos in positives]
    docs = pool.texts
    n_retrieve = candidates or default_candidates(k, skip_top, max(len(p) for p in positive_ids))
    log.info("mining %d queries against %d documents (%s, margin=%s)", len(items), len(docs), method, margin)

    doc_vecs = unit_rows(teacher.encode_corpus(docs, batch_size=batch_size))
    query_vecs = unit_rows(_embed_queries(teacher, queries, instructions, batch_size))
    kept = _TextPool([])  # a row's existing negatives, when they are kept and scored
    for text in (t for r in items for t in _row_negatives(r)) if keep_existing and with_scores else ():
        kept.add(text)
    kept_vecs = unit_rows(teacher.encode_corpus(kept.texts, batch_size=batch_size)) if kept.texts else None
    found = exact_search(query_vecs, doc_vecs, top_k=min(n_retrieve, len(docs)), similarity="dot")
    stats.queries += len(items)
    out = []
    for i, row in enumerate(items):
        pos_scores = doc_vecs[positive_ids[i]] @ query_vecs[i]
        positive_score = float(pos_scores.min())
        banned = set(positive_ids[i])
        if queries[i] in pool.index:
            banned.add(pool.index[queries[i]])  # a query is never its own negative (symmetric data)
        existing = _row_negatives(row) if keep_existing else []
        banned.update(pool.index[t] for t in existing if t in pool.index)
        need = max(0, k - len(existing))
        chosen, scores = _select(
            found.indices[i],
            found.scores[i],
            banned,
            positive_score,
            k=need,
            method=method,
            margin=margin,
            skip_top=skip_top,
            stats=stats,
        )
        new_row = {key: value for key, value in row.items() if key not in NEGATIVE_KEYS}  # one name for them
        new_row["negatives"] = existing + [docs[j] for j in chosen]
        new_row.pop("teacher_scores", None)  # they scored the row's old negatives
        if with_scores:
            before = [float(kept_vecs[kept.index[t]] @ query_vecs[i]) for t in existing] if existing else []
            new_row["teacher_scores"] = {"positive": [float(x) for x in pos_scores], "negatives": before + scores}
        out.append(new_row)
    if stats.short_rows:
        log.warning("%d of %d rows got fewer than %d negatives", stats.short_rows, len(items), k)
    return out


# ---------------------------------------------------------------------------------------------- files
def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file of training rows (blank lines skipped); a malformed line raises
    :class:`MiningError` naming the file and line."""
    try:
        return read_jsonl(path)
    except DataFormatError as exc:
        raise MiningError(str(exc)) from exc


def read_training_rows(path: str | Path) -> list[dict[str, Any]]:
    """:func:`read_rows` for mining: every row must have a query and a positive, else :class:`MiningError` names
    the file and line (found before any model loads, not when the rows are mined)."""
    rows = []
    try:
        for line_no, row in iter_jsonl(path):
            try:
                _row_query(row)
                _row_positives(row)
            except MiningError as exc:
                raise MiningError(f"{path}:{line_no}: {exc}") from None
            rows.append(row)
    except DataFormatError as exc:
        raise MiningError(str(exc)) from exc
    return rows


def write_rows(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines (UTF-8, one object per line), creating parent folders."""

    def write(handle: IO[bytes]) -> None:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))

    return atomic_write(path, write)


def load_corpus(path: str | Path) -> list[str]:
    """Candidate documents from a BEIR folder (``corpus.jsonl``), a corpus JSON-lines file
    (``title``/``text`` fields) or a plain text file (one document per line, blank lines skipped)."""
    path = Path(path)
    if path.is_dir():
        try:
            corpus = find_file(path, CORPUS_FILE)
        except FileNotFoundError:
            raise MiningError(f"{path}: no corpus.jsonl in this folder") from None
        return read_corpus(corpus)[1]
    if is_jsonl(path):
        return read_corpus(path)[1]
    return read_text_lines(path, strip=True)
