"""Read retrieval datasets in the BEIR folder layout.

A BEIR dataset folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``, ``score``, with a
header line and often CRLF line endings). Any of these may also be gzip-compressed (``.gz``).

The loader follows MTEB's conventions so that scores are comparable:

* a document's text is ``(title + " " + text).strip()``;
* only queries that have judgments in the requested split are evaluated;
* judgments are kept exactly as given, even when they name a document or query that does not
  exist; such ids are reported in :attr:`RetrievalData.missing_docs` /
  :attr:`RetrievalData.missing_queries` and logged, never silently dropped.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]


class DataFormatError(ValueError):
    """A data file has a malformed row; the message names the file and line."""

    def __init__(self, path: Path, line_no: int, message: str) -> None:
        super().__init__(f"{path}:{line_no}: {message}")
        self.path = path
        self.line_no = line_no


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


def _find_file(folder: Path, stem: str) -> Path:
    """``folder/stem`` or its ``.gz`` twin, whichever exists."""
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"neither {folder / stem} nor {folder / stem}.gz exists")


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` with the line ending (LF or CRLF) removed."""
    with _open_text(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            yield line_no, line.rstrip("\r\n")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, object)`` for each non-blank line of a JSON-lines file."""
    for line_no, line in _iter_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, line_no, f"invalid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise DataFormatError(path, line_no, "expected a JSON object")
        yield line_no, row


def _string_field(row: dict, key: str, path: Path, line_no: int, *, required: bool = True) -> str:
    """Read ``row[key]`` as a string; ids may be given as JSON numbers."""
    value = row.get(key)
    if value is None:
        if required:
            raise DataFormatError(path, line_no, f"missing field {key!r}")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataFormatError(path, line_no, f"field {key!r} must be a string, got {type(value).__name__}")
    return str(value)


def read_corpus(path: Path) -> tuple[list[str], list[str]]:
    """Read a BEIR corpus file into parallel lists of ids and texts (title + " " + text)."""
    ids: list[str] = []
    texts: list[str] = []
    seen: set[str] = set()
    for line_no, row in _iter_jsonl(path):
        doc_id = _string_field(row, "_id", path, line_no)
        if doc_id in seen:
            raise DataFormatError(path, line_no, f"duplicate document id {doc_id!r}")
        seen.add(doc_id)
        title = _string_field(row, "title", path, line_no, required=False)
        text = _string_field(row, "text", path, line_no, required=False)
        ids.append(doc_id)
        texts.append((title + " " + text).strip())
    return ids, texts


def read_queries(path: Path) -> dict[str, str]:
    """Read a BEIR queries file into ``{query id: text}`` (file order, text as given)."""
    queries: dict[str, str] = {}
    for line_no, row in _iter_jsonl(path):
        query_id = _string_field(row, "_id", path, line_no)
        if query_id in queries:
            raise DataFormatError(path, line_no, f"duplicate query id {query_id!r}")
        queries[query_id] = _string_field(row, "text", path, line_no)
    return queries


def _is_header(fields: list[str]) -> bool:
    return len(fields) >= 2 and fields[0].strip().lower() in {"query-id", "query_id", "qid"}


def _parse_qrels_row(fields: list[str], path: Path, line_no: int) -> tuple[str, str, int]:
    """Split one qrels row: BEIR's 3 columns, or TREC's 4 (``qid iter docid rel``)."""
    if len(fields) == 3:
        query_id, doc_id, score = fields
    elif len(fields) == 4:
        query_id, _, doc_id, score = fields
    else:
        raise DataFormatError(path, line_no, f"expected 3 tab-separated columns, got {len(fields)}")
    query_id, doc_id = query_id.strip(), doc_id.strip()
    if not query_id or not doc_id:
        raise DataFormatError(path, line_no, "empty query or document id")
    try:
        value = int(score.strip())
    except ValueError:
        raise DataFormatError(path, line_no, f"relevance score {score!r} is not an integer") from None
    return query_id, doc_id, value


def read_qrels(path: Path) -> Qrels:
    """Read a qrels file into ``{query id: {doc id: relevance}}``."""
    qrels: Qrels = {}
    for line_no, line in _iter_lines(path):
        if not line.strip():
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if line_no == 1 and _is_header(fields):
            continue
        query_id, doc_id, score = _parse_qrels_row(fields, path, line_no)
        docs = qrels.setdefault(query_id, {})
        if doc_id in docs and docs[doc_id] != score:
            logger.warning("%s:%d: repeated judgment for (%s, %s); keeping the last", path, line_no, query_id, doc_id)
        docs[doc_id] = score
    return qrels


def _report_missing(
    name: str, qrels: Qrels, doc_ids: set[str], queries: dict[str, str]
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """Find judged ids absent from the corpus or queries, log them and describe them."""
    missing_docs = [(q, d) for q, docs in qrels.items() for d in docs if d not in doc_ids]
    missing_queries = [q for q in qrels if q not in queries]
    warnings: list[str] = []
    if missing_docs:
        sample = ", ".join(d for _, d in missing_docs[:5])
        warnings.append(
            f"{name}: {len(missing_docs)} judgment(s) name documents missing from the corpus "
            f"(kept, as MTEB does; they can never be retrieved): {sample}"
        )
    if missing_queries:
        sample = ", ".join(missing_queries[:5])
        warnings.append(
            f"{name}: {len(missing_queries)} judged query id(s) missing from the queries file "
            f"(kept in qrels, but they cannot be encoded or scored): {sample}"
        )
    for message in warnings:
        logger.warning(message)
    return missing_docs, missing_queries, warnings


def load_beir(folder: str | Path, split: str = "test", *, name: str | None = None) -> RetrievalData:
    """Load ``split`` of the BEIR dataset in ``folder``."""
    folder = Path(folder)
    files = [
        _find_file(folder, "corpus.jsonl"),
        _find_file(folder, "queries.jsonl"),
        _find_file(folder / "qrels", f"{split}.tsv"),
    ]
    corpus_ids, corpus_texts = read_corpus(files[0])
    queries = read_queries(files[1])
    qrels = read_qrels(files[2])
    label = name or folder.name
    missing_docs, missing_queries, warnings = _report_missing(label, qrels, set(corpus_ids), queries)
    judged = [q for q in queries if q in qrels]
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
