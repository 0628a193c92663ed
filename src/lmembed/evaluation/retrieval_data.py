"""One split of a retrieval dataset, loaded for evaluation: :class:`RetrievalData` and :func:`load_beir`.

The files are read by :mod:`lmembed.io` (BEIR folder layout: ``corpus.jsonl``, ``queries.jsonl``,
``qrels/<split>.tsv``, any of them gzip-compressed). On top of that, this module follows MTEB's
conventions so that scores are comparable:

* a document's text is ``(title + " " + text).strip()``;
* only queries that have judgments in the requested split are evaluated;
* judgments are kept exactly as given, even when they name a document or query that does not
  exist; such ids are reported in :attr:`RetrievalData.missing_docs` /
  :attr:`RetrievalData.missing_queries` and logged, never silently dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from lmembed.errors import LmembedError
from lmembed.io import CORPUS_FILE, QUERIES_FILE, Qrels, find_file, qrels_file, read_corpus, read_qrels, read_queries

logger = logging.getLogger(__name__)


@dataclass
class RetrievalData:
    """One split of a retrieval dataset, ready to encode and score.

    ``query_ids``/``query_texts`` hold only the queries judged in ``split``, in the order of
    ``queries.jsonl``. ``qrels`` is the split's judgments, unmodified.
    """

    name: str
    split: str
    corpus_ids: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: Qrels
    missing_docs: list[tuple[str, str]] = field(default_factory=list)
    missing_queries: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source: Path | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def num_judgments(self) -> int:
        return sum(len(docs) for docs in self.qrels.values())

    def summary(self) -> dict[str, int]:
        """Counts worth recording next to a result."""
        return {
            "num_documents": len(self.corpus_ids),
            "num_queries": len(self.query_ids),
            "num_judgments": self.num_judgments,
            "num_missing_docs": len(self.missing_docs),
            "num_missing_queries": len(self.missing_queries),
        }


class NothingToScoreError(LmembedError, ValueError):
    """A retrieval split on which no score could mean anything (empty corpus, no judged query, ...)."""


def _check_scorable(files: list[Path], corpus_ids: list[str], judged: list[str], qrels: Qrels) -> None:
    """Refuse a split whose every score would be 0.00 for lack of data, saying what is missing."""
    corpus_file, queries_file, qrels_file_ = files
    if not corpus_ids:
        raise NothingToScoreError(f"{corpus_file}: the corpus holds no documents; nothing can be retrieved")
    if not qrels:
        raise NothingToScoreError(f"{qrels_file_}: no judgments; nothing can be scored")
    if not judged:
        sample = ", ".join(list(qrels)[:3])
        raise NothingToScoreError(
            f"{qrels_file_}: none of its {len(qrels)} judged query id(s) (e.g. {sample}) appears in {queries_file}; "
            "nothing can be scored"
        )
    known = set(corpus_ids)
    if not any(d in known and score > 0 for q in judged for d, score in qrels[q].items()):
        raise NothingToScoreError(
            f"{qrels_file_}: no document judged relevant to a query in {queries_file} appears in {corpus_file}; "
            "every score would be 0"
        )


def _report_missing(
    name: str, files: list[Path], qrels: Qrels, doc_ids: set[str], queries: dict[str, str]
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """Find judged ids absent from the corpus or queries, log them and describe them: the qrels file, how many of
    its judgments, which ids (a few) and what becomes of them."""
    corpus_file, queries_file, judgments = files
    missing_docs = [(q, d) for q, docs in qrels.items() for d in docs if d not in doc_ids]
    missing_queries = [q for q in qrels if q not in queries]
    warnings: list[str] = []
    if missing_docs:
        sample = ", ".join(d for _, d in missing_docs[:5])
        warnings.append(
            f"{name}: {judgments}: {len(missing_docs)} judgment(s) name documents missing from {corpus_file} "
            f"(kept, as MTEB does; they can never be retrieved): {sample}"
        )
    if missing_queries:
        sample = ", ".join(missing_queries[:5])
        dropped = sum(len(qrels[q]) for q in missing_queries)
        warnings.append(
            f"{name}: {judgments}: {dropped} judgment(s) of {len(missing_queries)} query id(s) missing from "
            f"{queries_file} are not scored (as MTEB, which scores the queries it has): {sample}"
        )
    for message in warnings:
        logger.warning(message)
    return missing_docs, missing_queries, warnings


def load_beir(folder: str | Path, split: str = "test", *, name: str | None = None) -> RetrievalData:
    """Load ``split`` of the BEIR dataset in ``folder``."""
    folder = Path(folder)
    files = [find_file(folder, CORPUS_FILE), find_file(folder, QUERIES_FILE), qrels_file(folder, split)]
    corpus_ids, corpus_texts = read_corpus(files[0])
    queries = read_queries(files[1])
    qrels = read_qrels(files[2])
    label = name or folder.name
    missing_docs, missing_queries, warnings = _report_missing(label, files, qrels, set(corpus_ids), queries)
    judged = [q for q in queries if q in qrels]
    _check_scorable(files, corpus_ids, judged, qrels)
    return RetrievalData(
        name=label,
        split=split,
        corpus_ids=corpus_ids,
        corpus_texts=corpus_texts,
        query_ids=judged,
        query_texts=[queries[q] for q in judged],
        qrels=qrels,
        missing_docs=missing_docs,
        missing_queries=missing_queries,
        warnings=warnings,
        source=folder,
        files=files,
    )
