"""``lmembed adapt``: adapt an embedder to a corpus with nothing but the corpus.

The run, step by step (each step's knobs in :mod:`lmembed.training.adapt_recipe`, ``recipes/adapt/default.yaml``):

1. **Pseudo-queries** from the corpus alone, from any mix of sources: a document's title as a query for its body
   (GTE/E5's weak pairs; a title several documents share names none of them and is skipped); spans cropped from a
   document as queries for the rest of it (inverse cloze: the span is cut out of the positive, so the pair is not
   a string match), by default only from documents that gave no title query; queries an LLM writes through a
   ``synthesize`` corpus-only recipe when a generator is given.
2. **Filters**: a query that copies its passage's opening, or whose word trigrams are mostly found in the passage,
   teaches nothing and is dropped; so are near-duplicates (same words) of a query kept already.
3. **Held-back slice**: a seeded share of the queries is kept out of training; retrieving their own documents from
   the corpus (nDCG@10) picks the checkpoint to keep, and is reported before and after.
4. **Negatives** mined by the starting model, positive-aware (TopK-PercPos as in NV-Embed): candidates scoring
   close to the query's own document are dropped as likely false negatives, and the own document never is one.
5. **Labels**: with a teacher (an embedder, ``self`` for the starting model, or ``reranker:NAME``), its scores
   of the positive and negatives are kept as ``teacher_scores`` and the loss is MarginMSE; else InfoNCE with the
   mined negatives and the batch's other documents.
6. **Training** with the contrastive :class:`~lmembed.training.trainer.Trainer` (encoders fully, decoders with
   LoRA by default), texts cut to ``training.max_length`` tokens (128 by default, the length sentence-transformers
   models such as minilm were trained at; the saved model keeps its own window), checkpointed at every selection
   step, so ``resume`` continues an interrupted run.
7. **Merge**: the kept weights are ``start + merge × (adapted − start)`` (weight-space ensembling, WiSE-FT; with
   LoRA the adapter's update is scaled by ``merge``). The pseudo-queries are not the user's queries, and a model
   tuned to them alone drifts from what made it good; ``merge: 1`` keeps the adapted weights as they are.

Output folder::

    OUT/rows.jsonl          training rows, each with its provenance (source, document id, line, the miner's cosines)
    OUT/heldout.jsonl       the held-back pseudo-queries (query, document id)
    OUT/adapt_plan.json     the run's options and report, and the sha256 of rows.jsonl and heldout.jsonl (resume)
    OUT/adapt_summary.json  counts per source, rejects by reason, mining, selection history, time, memory
    OUT/adapt.log           the run's log
    OUT/checkpoints/ ...    the trainer's checkpoints (resume)
    OUT/best_state.safetensors, OUT/start_state.safetensors (their sha256 in OUT/selection.json)
                            the kept step's and the starting trainable weights (the merge's two ends)
    OUT/model/              the adapted Embedder (Embedder.from_pretrained(OUT/model))
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import resource
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_write_text
from lmembed.errors import LmembedError
from lmembed.io import CORPUS_FILE, DataFormatError, is_jsonl, iter_jsonl, iter_text_documents, read_jsonl, row_id
from lmembed.mining import MiningStats, mine_hard_negatives, write_rows
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.training.adapt_recipe import AdaptRecipe, QuerySource

log = logging.getLogger(__name__)

ROWS_FILE = "rows.jsonl"
HELDOUT_FILE = "heldout.jsonl"
SUMMARY_FILE = "adapt_summary.json"
LOG_FILE = "adapt.log"
SELECTION_FILE = "selection.json"
BEST_STATE_FILE = "best_state.safetensors"
START_STATE_FILE = "start_state.safetensors"
_WORD = re.compile(r"\w+", re.UNICODE)


class AdaptError(LmembedError, ValueError):
    """The corpus or the options of ``lmembed adapt`` cannot make a run; the message names the file and line."""


# ---------------------------------------------------------------------------------------------- the corpus
@dataclass(frozen=True)
class Document:
    """One corpus document: its id, title (may be empty), body, and the line it was read from."""

    id: str
    title: str
    text: str
    line: int

    @property
    def full(self) -> str:
        """The text the document is embedded as (title and body, as BEIR's corpus text)."""
        return (self.title + " " + self.text).strip()


def read_adapt_corpus(path: str | Path) -> list[Document]:
    """Documents of a BEIR ``corpus.jsonl`` (or a BEIR folder holding one), or of a text file with one document per
    line. A document with no text, a non-string field, a repeated id, an empty file: :class:`AdaptError` naming the
    file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / CORPUS_FILE
    if not path.is_file():
        raise AdaptError(f"{path}: no such corpus file (--corpus takes a BEIR corpus.jsonl or a text file)")
    docs: list[Document] = []
    try:
        if is_jsonl(path):
            seen: set[str] = set()
            for line_no, row in iter_jsonl(path):
                doc_id = row_id(row, path, line_no)
                if doc_id in seen:
                    raise AdaptError(f"{path}:{line_no}: document id {doc_id!r} is repeated")
                seen.add(doc_id)
                title = _string(row, "title", path, line_no)
                text = _string(row, "text", path, line_no)
                if not (title.strip() or text.strip()):
                    raise AdaptError(f"{path}:{line_no}: text: document {doc_id!r} has neither title nor text")
                docs.append(Document(doc_id, title.strip(), text.strip(), line_no))
        else:
            for line_no, doc_id, text in iter_text_documents(path):
                docs.append(Document(doc_id, "", text, line_no))
    except DataFormatError as exc:
        raise AdaptError(str(exc)) from exc
    if not docs:
        raise AdaptError(f"{path}: the corpus is empty (no documents to make queries from)")
    if len({d.full for d in docs}) < 2:
        raise AdaptError(
            f"{path}: the corpus has one distinct document; adapting needs at least two (a query must be told "
            "apart from other documents)"
        )
    return docs


def _string(row: dict[str, Any], key: str, path: Path, line_no: int) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AdaptError(f"{path}:{line_no}: {key}: must be a string, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------------------------- query sources
@dataclass
class PseudoQuery:
    """A query made from a document, with the positive to train on and where it came from."""

    query: str
    positive: str
    doc: int  # index of the source document
    source: QuerySource
    extra: dict[str, Any] = field(default_factory=dict)


def _words(text: str) -> list[str]:
    return text.split()


def title_queries(docs: Sequence[Document], min_words: int = 2, unique: bool = True) -> list[PseudoQuery]:
    """Each titled document's title as a query for its body (documents without a body or title give none). With
    ``unique``, a title that more than one document carries (same words, any case) is no query for any of them:
    it names a group (a section, a tag list), and its other documents would be false negatives."""
    counts = Counter(normalise(d.title) for d in docs if d.title)
    return [
        PseudoQuery(d.title, d.text, i, "title")
        for i, d in enumerate(docs)
        if d.title and d.text and len(_words(d.title)) >= min_words and not (unique and counts[normalise(d.title)] > 1)
    ]


def crop_queries(
    docs: Sequence[Document],
    *,
    per_document: int = 2,
    min_words: int = 6,
    max_words: int = 24,
    min_rest_words: int = 8,
    seed: int = 0,
    skip: Collection[int] = (),
) -> list[PseudoQuery]:
    """Random word spans of each document's body as queries; the positive is the document with the span cut out
    (inverse cloze). A document too short to keep ``min_rest_words`` words once a span is cut gives none, and so
    does every document whose index is in ``skip``."""
    rng = np.random.default_rng(seed)
    out: list[PseudoQuery] = []
    skipped = set(skip)
    for i, d in enumerate(docs):
        if i in skipped:
            continue
        words = _words(d.text)
        longest = min(max_words, len(words) - min_rest_words)
        if longest < min_words:
            continue
        for _ in range(per_document):
            length = int(rng.integers(min_words, longest + 1))
            start = int(rng.integers(0, len(words) - length + 1))
            span = " ".join(words[start : start + length])
            rest = " ".join(words[:start] + words[start + length :])
            positive = (d.title + " " + rest).strip()
            out.append(PseudoQuery(span, positive, i, "crop", {"start_word": start, "words": length}))
    return out


def generated_queries(
    docs: Sequence[Document],
    generator: Any,
    encode: Callable[[Sequence[str], str], np.ndarray],
    output: Path,
    *,
    recipe: str = "corpus-only-plain",
    limit: int | None = None,
    shard_size: int = 16,
    seed: int = 0,
) -> tuple[list[PseudoQuery], dict[str, Any]]:
    """Queries a generator writes for the documents, through ``synthesize``'s corpus-only recipe (its round-trip
    check and parser); its output (and resumable shards) go to ``output``. Returns the queries and its stats."""
    from lmembed.synthesis.synthesize import synthesize

    chosen = list(docs)[:limit] if limit else list(docs)
    ids, texts = [d.id for d in chosen], [d.full for d in chosen]
    stats = synthesize(recipe, generator, output, corpus=(ids, texts), encode=encode, seed=seed, shard_size=shard_size)
    index = {d.id: i for i, d in enumerate(docs)}
    out = []
    for row in read_jsonl(output):
        doc_id = (row.get("provenance") or {}).get("seed_passage")
        if doc_id in index and isinstance(row.get("query"), str):
            i = index[doc_id]
            out.append(PseudoQuery(row["query"], docs[i].full, i, "generator"))
    return out, stats


# ---------------------------------------------------------------------------------------------- filters
def normalise(text: str) -> str:
    """Lower case words only (punctuation and spacing ignored)."""
    return " ".join(_WORD.findall(text.lower()))


def copied_reason(query: str, passage: str, max_copied: float = 0.8) -> str | None:
    """Why a query copies its passage (``prefix``: it is the passage's opening; ``copy``: at least ``max_copied``
    of its word trigrams, or for a query under three words the whole query, are found in the passage), or None."""
    q, p = normalise(query), normalise(passage)
    if not q:
        return "empty"
    if p.startswith(q):
        return "prefix"
    words, passage_words = q.split(), p.split()
    if len(words) < 3:
        return None
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    seen = {tuple(passage_words[i : i + 3]) for i in range(len(passage_words) - 2)}
    share = sum(g in seen for g in grams) / len(grams)
    return "copy" if share >= max_copied else None


def filter_queries(
    queries: Sequence[PseudoQuery], *, max_copied: float = 0.8, min_words: int = 2
) -> tuple[list[PseudoQuery], Counter[str]]:
    """The queries worth training on, and the count of those dropped by reason (``prefix``, ``copy``,
    ``too_short``, ``duplicate``: same words, in any order and case, as a query kept already)."""
    kept: list[PseudoQuery] = []
    dropped: Counter[str] = Counter()
    seen: set[frozenset[str]] = set()
    for q in queries:
        words = normalise(q.query).split()
        if len(words) < min_words:
            dropped["too_short"] += 1
            continue
        reason = copied_reason(q.query, q.positive, max_copied)
        if reason:
            dropped[reason] += 1
            continue
        key = frozenset(words)
        if key in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(key)
        kept.append(q)
    return kept, dropped


def hold_back(
    queries: Sequence[PseudoQuery], fraction: float, max_queries: int, seed: int
) -> tuple[list[PseudoQuery], list[PseudoQuery]]:
    """A seeded split into (training, held back) by document: whole documents are held back, with all their
    queries, until about ``fraction`` of the queries are (at most ``max_queries``, at least one); no held-back
    query's document is a training positive, and training keeps at least one document. A split by query let a
    document's title train while its crop was held back: the held-back score measured what was trained on."""
    documents = sorted({q.doc for q in queries})
    if len(queries) < 2 or len(documents) < 2:
        raise AdaptError(
            f"only {len(queries)} pseudo-queries from {len(documents)} document(s) survived the filters: adapting "
            "needs queries from at least two documents (one to train on, one held back to pick the step with); "
            "give a larger corpus, or enable more query sources in the recipe"
        )
    order = np.random.default_rng(seed).permutation(documents)
    wanted = max(1, min(max_queries, round(fraction * len(queries)), len(queries) - 1))
    per_document = Counter(q.doc for q in queries)
    held_documents: set[int] = set()
    count = 0
    for doc in order.tolist():
        if count >= wanted or len(held_documents) == len(documents) - 1:
            break
        held_documents.add(doc)
        count += per_document[doc]
    held = [q for q in queries if q.doc in held_documents][:max_queries]
    return [q for q in queries if q.doc not in held_documents], held


def split_check(held: Sequence[PseudoQuery], seed: int) -> tuple[list[PseudoQuery], list[PseudoQuery]]:
    """The held-back queries split by document into (selection, check): the selection half picks the step to keep;
    the check half never does, so its score before and after is an unbiased measure of the kept model (the best
    of several steps on the set that chose it is optimistic by construction). Fewer than two held-back documents:
    no check half (empty)."""
    documents = sorted({q.doc for q in held})
    if len(documents) < 2:
        return list(held), []
    order = np.random.default_rng([seed, 1]).permutation(documents).tolist()
    checked = set(order[: len(documents) // 2])
    return [q for q in held if q.doc not in checked], [q for q in held if q.doc in checked]


# ---------------------------------------------------------------------------------------------- mining, labels
def _row(q: PseudoQuery, docs: Sequence[Document], negatives: list[str]) -> dict[str, Any]:
    d = docs[q.doc]
    provenance = {"source": q.source, "doc_id": d.id, "line": d.line, **q.extra}
    return {"query": q.query, "positive": q.positive, "negatives": negatives, "provenance": provenance}


def unmined_rows(queries: Sequence[PseudoQuery], docs: Sequence[Document]) -> list[dict[str, Any]]:
    """Training rows without mined negatives (in-batch negatives only)."""
    return [_row(q, docs, []) for q in queries]


def mine_rows(
    embedder: Any,
    queries: Sequence[PseudoQuery],
    docs: Sequence[Document],
    *,
    k: int = 3,
    method: str = "perc_pos",
    margin: float | None = 0.95,
    skip_top: int = 0,
    batch_size: int = ENCODE_BATCH_SIZE,
    sources: Collection[QuerySource] | None = None,
) -> tuple[list[dict[str, Any]], MiningStats]:
    """Training rows with negatives mined from the corpus by ``embedder``: candidates are scored against the
    query's own (whole) document, which is never a negative; the row's positive is then the query's own positive
    (a body, or a document with its span cut out). Only queries whose ``source`` is in ``sources`` (None: all) are
    mined; the others' rows have no negatives (the trainer tops them up with random documents). The rows keep
    the queries' order."""
    stats = MiningStats()
    chosen = [q for q in queries if sources is None or q.source in sources]
    mined = (
        mine_hard_negatives(
            embedder,
            [{"query": q.query, "positive": docs[q.doc].full} for q in chosen],
            [d.full for d in docs],
            k=k,
            method=method,
            margin=margin,
            skip_top=skip_top,
            batch_size=batch_size,
            with_scores=True,
            stats=stats,
        )
        if chosen
        else []
    )
    found = {}
    for q, m in zip(chosen, mined, strict=True):
        own = {docs[q.doc].full, q.positive}
        scored = m["teacher_scores"]
        kept = [(n, s) for n, s in zip(m["negatives"], scored["negatives"], strict=True) if n not in own]
        row = _row(q, docs, [n for n, _ in kept])
        # the miner's cosines of the whole own document and of each negative: how they were chosen, and what a
        # teacher built on the same model need not compute again
        row["provenance"]["mined_scores"] = {"positive": min(scored["positive"]), "negatives": [s for _, s in kept]}
        found[id(q)] = row
    return [found.get(id(q)) or _row(q, docs, []) for q in queries], stats


def label_rows(
    rows: list[dict[str, Any]], teacher: Any, num_negatives: int, *, reranker_scale: float | str = "auto"
) -> list[dict[str, Any]]:
    """Add ``teacher_scores`` (positive, then the first ``num_negatives`` negatives) from ``teacher``: a reranker
    (``score(query, documents)``) or an embedder (cosine of its vectors). Rows with fewer negatives are dropped
    (a distillation loss needs the same number of scores in every row).

    A reranker's scores are logits, on another scale than the cosine student's (a cross-encoder's margins run to
    10 and more, a cosine's never past 2: MarginMSE would then ask for margins the student cannot reach). With
    ``reranker_scale="auto"`` they are multiplied by :func:`reranker_scale_to_student`'s factor; a number multiplies
    them by it instead (1: as the reranker gives them). Each row's provenance keeps the factor (``teacher_scale``)."""
    usable = [r for r in rows if len(r["negatives"]) >= num_negatives]
    for row in usable:
        row["negatives"] = row["negatives"][:num_negatives]
    if not usable:
        return []
    if isinstance(teacher, HybridTeacher):
        teacher.label(usable, num_negatives)
        return usable
    if hasattr(teacher, "score") and not hasattr(teacher, "encode_queries"):
        raw = np.asarray(
            [teacher.score(row["query"], [row["positive"], *row["negatives"]]) for row in usable], dtype=float
        )
        factor = reranker_scale_to_student(usable, raw) if reranker_scale == "auto" else float(reranker_scale)
        for row, scores in zip(usable, raw, strict=True):
            set_teacher_scores(row, scores * factor)
            row.setdefault("provenance", {})["teacher_scale"] = factor
        return usable
    q = unit_rows(teacher.encode_queries([r["query"] for r in usable]))
    docs = [d for r in usable for d in (r["positive"], *r["negatives"])]
    d = unit_rows(teacher.encode_corpus(docs)).reshape(len(usable), 1 + num_negatives, -1)
    scores = np.einsum("rd,rkd->rk", q, d)
    for row, s in zip(usable, scores, strict=True):
        set_teacher_scores(row, s)
    return usable


def reranker_scale_to_student(rows: Sequence[dict[str, Any]], scores: np.ndarray) -> float:
    """The factor that puts a reranker's ``scores`` (one row per row: positive, then negatives) on the starting
    model's cosine scale: the spread (standard deviation) of the starting model's margins ``cos(q, p) - cos(q, n)``
    over the rows' (row, negative) pairs, over that of the reranker's margins. One positive factor keeps the
    reranker's order and its relative margins; only their unit changes. The starting model's cosines are those the
    miner kept (``provenance.mined_scores``); 1.0 when a row has none or the reranker's margins do not vary."""
    mined = [r.get("provenance", {}).get("mined_scores") for r in rows]
    if not mined or any(m is None for m in mined):
        return 1.0
    negatives = scores.shape[1] - 1
    start = np.asarray([[m["positive"] - n for n in m["negatives"][:negatives]] for m in mined], dtype=float)
    teacher = scores[:, :1] - scores[:, 1:]
    if start.shape != teacher.shape or float(np.std(teacher)) == 0.0:
        return 1.0
    return float(np.std(start) / np.std(teacher))


def set_teacher_scores(row: dict[str, Any], scores: Any) -> None:
    """``row["teacher_scores"]`` from scores (any sequence of numbers) of its positive, then of each negative."""
    values = np.asarray(scores, dtype=float)
    row["teacher_scores"] = {"positive": float(values[0]), "negatives": [float(x) for x in values[1:]]}


class HybridTeacher:
    """A teacher made from the corpus alone: the starting model's cosine fused with BM25 over the corpus,
    ``cos(q, d) + weight × bm25(q, d) / max_d' bm25(q, d')`` (the lexical part scaled to [0, 1] per query).
    Dense and lexical retrieval fail on different queries, and their fusion retrieves better than either (on BEIR
    sets as on most collections), so its scores hold what the starting model alone does not know about the
    corpus: its rare terms. With ``weight`` 0 it is the embedder alone (no BM25 index is built).

    Rows are scored by the corpus documents they came from: a positive by its whole document (a body without its
    title, a document without its cropped span), a negative as itself. :meth:`label` scores rows mined already;
    :meth:`candidate_rows` makes rows whose negatives are the teacher's own best documents for the query."""

    def __init__(
        self,
        embedder: Any,
        docs: Sequence[Document],
        weight: float = 0.25,
        batch_size: int = ENCODE_BATCH_SIZE,
        *,
        mined_by_embedder: bool = False,
    ) -> None:
        """``mined_by_embedder``: the rows given to :meth:`label` were mined by ``embedder`` itself, so the cosines
        :func:`mine_rows` kept in their provenance (``mined_scores``) are its dense part and are not computed again."""
        self.embedder, self.docs, self.weight, self.batch_size = embedder, docs, weight, batch_size
        self.mined_by_embedder = mined_by_embedder
        self.lexical: Any = None
        if weight > 0:
            from lmembed.lexical.bm25 import LexicalIndex

            self.lexical = LexicalIndex.build([d.full for d in docs], [d.id for d in docs])
        self.row = {d.full: i for i, d in enumerate(docs)}
        self.by_id = {d.id: i for i, d in enumerate(docs)}

    def _fused(self, query: str, dense: np.ndarray, columns: Any) -> np.ndarray:
        """The teacher's scores of the documents ``columns`` (``dense``: their cosines with the query)."""
        if self.lexical is None:
            return dense
        lexical = self.lexical.scores(query)
        top = float(lexical.max()) if lexical.size else 0.0
        return dense + (self.weight * lexical[columns] / top if top > 0 else 0.0)

    def _encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return unit_rows(self.embedder.encode_queries(list(queries), batch_size=self.batch_size))

    def label(self, rows: list[dict[str, Any]], num_negatives: int) -> None:
        """Set each row's ``teacher_scores`` (its positive, then its first ``num_negatives`` negatives)."""
        columns = [[self.by_id[r["provenance"]["doc_id"]], *(self.row[n] for n in r["negatives"])] for r in rows]
        for row, cols, dense in zip(rows, columns, self._cosines(rows, columns, num_negatives), strict=True):
            set_teacher_scores(row, self._fused(row["query"], dense, cols))

    def _cosines(self, rows: list[dict[str, Any]], columns: list[list[int]], num_negatives: int) -> list[np.ndarray]:
        """Each row's query cosine with its documents ``columns``: the miner's own (``mined_scores``) when it was
        this embedder, else encoded here."""
        mined = [r["provenance"].get("mined_scores") for r in rows] if self.mined_by_embedder else []
        if mined and all(mined):
            return [np.array([m["positive"], *m["negatives"][:num_negatives]], dtype=np.float32) for m in mined]
        used = sorted({j for cols in columns for j in cols})
        where = {j: k for k, j in enumerate(used)}
        doc_vectors = unit_rows(
            self.embedder.encode_corpus([self.docs[j].full for j in used], batch_size=self.batch_size)
        )
        query_vectors = self._encode_queries([r["query"] for r in rows])
        return [doc_vectors[[where[j] for j in cols]] @ q for cols, q in zip(columns, query_vectors, strict=True)]

    def score_matrix(self, queries: Sequence[str], columns: Sequence[int]) -> np.ndarray:
        """The teacher's scores of the corpus documents ``columns`` for each query (queries x columns)."""
        docs = unit_rows(self.embedder.encode_corpus([self.docs[j].full for j in columns], batch_size=self.batch_size))
        dense = self._encode_queries(queries) @ docs.T
        return np.stack([self._fused(text, dense[i], list(columns)) for i, text in enumerate(queries)])

    def candidate_rows(self, queries: Sequence[PseudoQuery], k: int) -> list[dict[str, Any]]:
        """One row per query whose negatives are the teacher's ``k`` best documents of the whole corpus other than
        the query's own (no false-negative filter: a near-positive gets a near-positive score, which a listwise
        loss learns as such), with ``teacher_scores``. Dynamic listwise distillation's candidate lists (RocketQAv2),
        drawn by the teacher, so documents only BM25 finds are among them."""
        if k >= len(self.docs):
            raise AdaptError(f"mining.k is {k}: the corpus has only {len(self.docs)} documents to draw candidates from")
        doc_vectors = unit_rows(self.embedder.encode_corpus([d.full for d in self.docs], batch_size=self.batch_size))
        query_vectors = self._encode_queries([q.query for q in queries])
        rows = []
        every = slice(None)
        for q, vector in zip(queries, query_vectors, strict=True):
            fused = self._fused(q.query, doc_vectors @ vector, every)
            own = float(fused[q.doc])
            fused[q.doc] = -np.inf
            best = np.argpartition(-fused, k)[:k]
            best = best[np.argsort(-fused[best], kind="stable")]
            row = _row(q, self.docs, [self.docs[j].full for j in best])
            set_teacher_scores(row, [own, *fused[best]])
            rows.append(row)
        return rows


# ---------------------------------------------------------------------------------------------- selection
@dataclass
class HeldOut:
    """Held-back pseudo-queries and the corpus slice they are retrieved from; with :meth:`follow`, also a
    teacher's scores of that slice, which :meth:`score` measures the student's agreement with.

    Each query's own document is the text it would have trained on (a body without its title, a document with
    the query's span cut out), not the whole document, which holds a title or crop word for word; the slice's
    other variants of the same document are left out of that query's ranking."""

    queries: list[str]
    targets: list[int]  # index into ``documents`` of each query's own document
    documents: list[str]
    columns: list[int] = field(default_factory=list)  # the corpus index of each of ``documents``
    teacher: np.ndarray | None = None  # queries x documents: the teacher's scores (see :meth:`follow`)
    temperature: float = 0.05

    @classmethod
    def build(cls, held: Sequence[PseudoQuery], docs: Sequence[Document], max_documents: int, seed: int) -> HeldOut:
        own = sorted({q.doc for q in held})
        others = [i for i in range(len(docs)) if i not in set(own)]
        room = max(0, max_documents - len(own))
        if len(others) > room:
            others = sorted(np.random.default_rng(seed).choice(others, room, replace=False).tolist())
        texts = [q.positive for q in held] + [docs[i].full for i in others]
        columns = [q.doc for q in held] + others
        return cls([q.query for q in held], list(range(len(held))), texts, columns)

    def follow(self, teacher: HybridTeacher, temperature: float) -> None:
        """Score the slice with ``teacher`` once; :meth:`score` then also gives ``teacher_ndcg_at_10``."""
        self.teacher = teacher.score_matrix(self.queries, self.columns)
        self.temperature = temperature

    def _variants(self) -> np.ndarray:
        """``queries x documents``: True where a column is another variant of the query's own document."""
        columns = np.asarray(self.columns if self.columns else range(len(self.documents)))
        own = columns[np.asarray(self.targets)]
        mask = columns[None, :] == own[:, None]
        mask[np.arange(len(self.targets)), self.targets] = False
        return mask

    def score(self, embedder: Any, batch_size: int = ENCODE_BATCH_SIZE) -> dict[str, float]:
        """nDCG@10 and MRR@10 of retrieving each query's own document (one relevant document each)."""
        q = unit_rows(embedder.encode_queries(self.queries, batch_size=batch_size))
        d = unit_rows(embedder.encode_corpus(self.documents, batch_size=batch_size))
        sims = q @ d.T
        variants = self._variants()
        sims[variants] = -np.inf
        own = sims[np.arange(len(self.targets)), self.targets]
        ranks = (sims > own[:, None]).sum(axis=1) + 1  # ties count in the query's favour
        top = ranks <= 10
        ndcg = float(np.mean(np.where(top, 1.0 / np.log2(ranks + 1), 0.0)))
        mrr = float(np.mean(np.where(top, 1.0 / ranks, 0.0)))
        scores = {"ndcg_at_10": ndcg, "mrr_at_10": mrr}
        if self.teacher is not None:
            teacher = self.teacher.copy()
            teacher[variants] = -np.inf
            scores["teacher_ndcg_at_10"] = agreement(sims, teacher, self.temperature)
        return scores


def agreement(student: np.ndarray, teacher: np.ndarray, temperature: float, depth: int = 10) -> float:
    """Mean nDCG@``depth`` of the student's ranking (``student``: queries x documents) judged by the teacher's:
    the teacher's ``depth`` best documents of each query are the relevant ones, each graded by its softmax weight
    ``exp((t - t_best) / temperature)``; 1 when the student's top ``depth`` is the teacher's, in its order."""
    rows = np.arange(teacher.shape[0])[:, None]
    depth = min(depth, teacher.shape[1])
    best = np.argsort(-teacher, axis=1, kind="stable")[:, :depth]
    gains = np.exp((teacher[rows, best] - teacher[rows, best[:, :1]]) / temperature)
    relevance = np.zeros_like(teacher, dtype=np.float64)
    relevance[rows, best] = gains
    discount = 1.0 / np.log2(np.arange(2, depth + 2))
    ranked = np.argsort(-student, axis=1, kind="stable")[:, :depth]
    dcg = (relevance[rows, ranked] * discount).sum(axis=1)
    ideal = (gains * discount).sum(axis=1)
    return float(np.mean(dcg / ideal))


def peak_memory_mb() -> float:
    """This process's peak resident memory (MB), and the GPU's peak allocation when one was used."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        import torch

        if torch.cuda.is_available():
            peak += torch.cuda.max_memory_allocated() / 2**20
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return round(peak, 1)


def corpus_digest(docs: Sequence[Document]) -> str:
    digest = hashlib.sha256()
    for d in docs:
        digest.update(f"{d.id}\t{d.full}\n".encode())
    return digest.hexdigest()[:16]


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


__all__ = [
    "AdaptError",
    "AdaptRecipe",
    "Document",
    "HeldOut",
    "PseudoQuery",
    "copied_reason",
    "crop_queries",
    "filter_queries",
    "generated_queries",
    "hold_back",
    "label_rows",
    "mine_rows",
    "read_adapt_corpus",
    "reranker_scale_to_student",
    "split_check",
    "title_queries",
    "write_rows",
]
