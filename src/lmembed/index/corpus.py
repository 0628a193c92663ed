"""Reading the documents an index is built from, and the queries a batch search runs.

Accepted inputs (the file readers of :mod:`lmembed.io`, so errors name ``<file>:<line>``):

* a BEIR folder: its ``corpus.jsonl`` (``queries.jsonl`` for queries), plain or ``.gz``;
* a JSON-lines file (``.jsonl``, ``.ndjson``, plain or ``.gz``, any case: :func:`lmembed.io.is_jsonl`): one
  object per line with an id (``_id`` or ``id``, a string or a number), a
  ``text`` and optionally a ``title``. A document's text is ``(title + " " + text).strip()``, as
  BEIR and ``lmembed eval`` build it, so an index and an evaluation embed the same strings; every
  other field (the title included) is kept as the document's metadata;
* any other file: plain text, one document (or query) per non-blank line, whose id is its line number.

Ids are unique: a repeated id is a :class:`~lmembed.index.errors.DuplicateIdError` naming both lines. A query is
never empty: a query row without text, or a queries file without a query, is a :class:`DataFormatError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmembed.index.errors import DuplicateIdError
from lmembed.io import (
    CORPUS_FILE,
    ID_FIELDS,
    QUERIES_FILE,
    DataFormatError,
    find_file,
    is_jsonl,
    iter_jsonl,
    iter_text_documents,
    row_id,
)


@dataclass(frozen=True)
class Document:
    """One document: its id, the text that is embedded, and whatever else its row carried."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _row_string(row: dict[str, Any], key: str, path: Path, line_no: int) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataFormatError(path, line_no, f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _records(path: Path, *, documents: bool) -> Iterator[tuple[int, str, str, dict[str, Any]]]:
    """``(line, id, text, metadata)`` of every record of a JSON-lines or plain-text file; a document's
    text joins its title, a query's text is kept as it is (both as ``lmembed eval`` reads them)."""
    if not is_jsonl(path):
        for line_no, doc_id, text in iter_text_documents(path):
            yield line_no, doc_id, text, {}
        return
    for line_no, row in iter_jsonl(path):
        doc_id = row_id(row, path, line_no)
        if "text" not in row and not (documents and "title" in row):
            raise DataFormatError(path, line_no, "missing field 'text'")
        text = _row_string(row, "text", path, line_no)
        if documents:
            text = (_row_string(row, "title", path, line_no) + " " + text).strip()
        elif not text.strip():
            raise DataFormatError(path, line_no, "empty query: field 'text' holds no text")
        metadata = {k: v for k, v in row.items() if k not in ID_FIELDS and k != "text"}
        yield line_no, doc_id, text, metadata


def _unique(path: Path, records: Iterator[tuple[int, str, str, dict[str, Any]]]) -> Iterator[Document]:
    first_line: dict[str, int] = {}
    for line_no, doc_id, text, metadata in records:
        if doc_id in first_line:
            raise DuplicateIdError(f"{path}:{line_no}: duplicate id {doc_id!r} (first at line {first_line[doc_id]})")
        first_line[doc_id] = line_no
        yield Document(doc_id, text, metadata)


def _resolve(path: str | Path, beir_file: str) -> Path:
    path = Path(path)
    if path.is_dir():
        return find_file(path, beir_file)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    return path


def load_corpus(path: str | Path) -> list[Document]:
    """The documents of a BEIR folder, a JSON-lines file or a text file (see the module doc)."""
    source = _resolve(path, CORPUS_FILE)
    return list(_unique(source, _records(source, documents=True)))


def load_queries(path: str | Path) -> list[tuple[str, str]]:
    """``(query id, text)`` pairs of a BEIR folder's queries, a JSON-lines file or a text file."""
    source = _resolve(path, QUERIES_FILE)
    queries = [(doc.id, doc.text) for doc in _unique(source, _records(source, documents=False))]
    if not queries:
        raise DataFormatError(source, None, "holds no query (the file is empty, or every line is blank)")
    return queries
