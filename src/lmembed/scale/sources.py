"""Where a sharded job's texts come from: a corpus read in independent *parts*, each a stream of row blocks.

A source is a list of parts that can be read on their own (on any worker), each knowing the global row
number of its first row, so every row of the corpus has one number whatever reads it. Parts yield
:class:`RowBlock` s of at most :data:`BLOCK_ROWS` rows, so nothing holds a whole corpus.

Formats (the readers of :mod:`lmembed.io` for text formats, so errors name ``<file>:<line>``):

* a BEIR folder or corpus file (``corpus.jsonl``, plain or ``.gz``): ``_id`` (or ``id``), ``title``,
  ``text``; the text embedded is ``(title + " " + text).strip()``, as :func:`lmembed.io.read_corpus` builds
  it; ids must be unique;
* a JSON-lines file read for one string ``field`` (what ``lmembed encode`` reads); ids are row numbers;
* a text file, one text per line, every line kept (blank ones too; ``lmembed encode``'s rule);
* Parquet: one file or a folder of ``*.parquet`` files (sorted by name) with a ``text`` column and
  optionally ``title`` and ``_id``/``id``; parts are row groups, so large corpora are read in parallel;
* texts in memory (optionally with ids), cut into parts of :data:`BLOCK_ROWS` rows.

A source's :meth:`CorpusSource.identity` names exactly what it reads (file, size and modification time,
or a hash of the texts), so a resumed job finds its earlier shards and a changed file starts a new job.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmembed.encoding.inputs import check_encodable
from lmembed.errors import InputError
from lmembed.io import (
    CORPUS_FILE,
    ID_FIELDS,
    DataFormatError,
    corpus_text,
    find_file,
    is_jsonl,
    iter_jsonl,
    iter_lines,
    row_id,
    sha256_file,
)
from lmembed.scale.errors import BadRowError

#: Rows per block read from a part (and per staging file written by the plan pass).
BLOCK_ROWS = 4096
PARQUET_SUFFIX = ".parquet"

#: Columns of a block in Arrow form. ``origin`` is a message template naming where a row came from.
BLOCK_SCHEMA = pa.schema(
    [
        ("row", pa.int64()),
        ("line", pa.int64()),
        ("id", pa.string()),
        ("text", pa.string()),
        ("origin", pa.string()),
    ]
)


def check_text(text: str, where: str, row: int, doc_id: str) -> None:
    """Refuse, naming the row, a text that cannot be encoded as UTF-8 (a lone surrogate): no tokenizer,
    and no Arrow column, can hold it."""
    try:
        check_encodable(text, "text")
    except InputError as exc:
        raise BadRowError(f"{where} (row {row}, id {doc_id!r}): {exc}") from None


def locate(origin: str, row: int, line: int) -> str:
    """Where a row came from, for messages: ``corpus.jsonl:12``, ``part-0.parquet row 7``, ``texts[3]``."""
    return origin.format(row=row, line=line)


@dataclass
class RowBlock:
    """Consecutive rows of one part: global row numbers, ids, texts, and where each came from."""

    rows: np.ndarray  # int64 global row numbers
    lines: np.ndarray  # int64 line (text formats) or row within the file (Parquet); -1 when none
    ids: list[str]
    texts: list[str]
    origin: str  # template for locate()

    def __len__(self) -> int:
        return len(self.texts)

    def to_arrow(self) -> pa.Table:
        n = len(self.texts)
        return pa.table(
            {
                "row": pa.array(self.rows, pa.int64()),
                "line": pa.array(self.lines, pa.int64()),
                "id": pa.array(self.ids, pa.string()),
                "text": pa.array(self.texts, pa.string()),
                "origin": pa.array([self.origin] * n, pa.string()),
            },
            schema=BLOCK_SCHEMA,
        )


class SourcePart(ABC):
    """A piece of a corpus that one worker can read on its own."""

    first_row: int

    @abstractmethod
    def read(self) -> Iterator[RowBlock]:
        """The part's rows, block by block, in order."""

    def read_arrow(self) -> Iterator[pa.Table]:
        """The same blocks as Arrow tables (what a Ray read task yields)."""
        for block in self.read():
            yield block.to_arrow()

    @property
    def row_count(self) -> int | None:
        """Rows in this part when known before reading (Parquet metadata, memory), else None."""
        return None

    @property
    def files(self) -> list[str]:
        return []


class _Blocks:
    """Accumulates rows into blocks of :data:`BLOCK_ROWS`."""

    def __init__(self, origin: str, first_row: int) -> None:
        self.origin = origin
        self.next_row = first_row
        self.lines: list[int] = []
        self.ids: list[str] = []
        self.texts: list[str] = []

    def add(self, line: int, doc_id: str | None, text: str) -> RowBlock | None:
        row = self.next_row + len(self.texts)
        doc_id = str(row) if doc_id is None else doc_id
        check_text(text, locate(self.origin, row, line), row, doc_id)
        self.lines.append(line)
        self.ids.append(doc_id)
        self.texts.append(text)
        return self.flush() if len(self.texts) >= BLOCK_ROWS else None

    def flush(self) -> RowBlock | None:
        if not self.texts:
            return None
        n = len(self.texts)
        block = RowBlock(
            rows=np.arange(self.next_row, self.next_row + n, dtype=np.int64),
            lines=np.asarray(self.lines, dtype=np.int64),
            ids=self.ids,
            texts=self.texts,
            origin=self.origin,
        )
        self.next_row += n
        self.lines, self.ids, self.texts = [], [], []
        return block


@dataclass
class _FilePart(SourcePart):
    """A part that reads one whole file."""

    path: str

    @property
    def files(self) -> list[str]:
        return [self.path]


class _TextFilePart(_FilePart):
    """A text-format file read row by row into blocks; a subclass says what each row of the file gives."""

    @abstractmethod
    def _rows(self, path: Path) -> Iterator[tuple[int, str | None, str]]:
        """``(line, id or None for the row number, text)`` for every row of the file, in order."""

    def read(self) -> Iterator[RowBlock]:
        path = Path(self.path)
        blocks = _Blocks(f"{path}:{{line}}", self.first_row)
        for line_no, doc_id, text in self._rows(path):
            if (block := blocks.add(line_no, doc_id, text)) is not None:
                yield block
        if (block := blocks.flush()) is not None:
            yield block


@dataclass
class BeirPart(_TextFilePart):
    """A BEIR corpus file: ``(title + " " + text).strip()`` per row, ids from ``_id``."""

    first_row: int = 0

    def _rows(self, path: Path) -> Iterator[tuple[int, str | None, str]]:
        for line_no, row in iter_jsonl(path):
            yield line_no, row_id(row, path, line_no), corpus_text(row, path, line_no)


@dataclass
class JsonlFieldPart(_TextFilePart):
    """One string field of every row of a JSON-lines file (ids are row numbers)."""

    field: str = "text"
    first_row: int = 0

    def _rows(self, path: Path) -> Iterator[tuple[int, str | None, str]]:
        for line_no, row in iter_jsonl(path):
            value = row.get(self.field)
            if not isinstance(value, str):
                raise DataFormatError(path, line_no, f"expected an object with a string field {self.field!r}")
            yield line_no, None, value


@dataclass
class TextLinesPart(_TextFilePart):
    """Every line of a text file, blank lines included (ids are row numbers)."""

    first_row: int = 0

    def _rows(self, path: Path) -> Iterator[tuple[int, str | None, str]]:
        for line_no, line in iter_lines(path):
            yield line_no, None, line


@dataclass
class ParquetPart(_FilePart):
    """Row groups of one Parquet file."""

    row_groups: list[int]
    first_row: int
    rows_before: int  # rows of this file before the first of these row groups
    num_rows: int
    text_column: str = "text"
    title_column: str | None = None
    id_column: str | None = None

    def read(self) -> Iterator[RowBlock]:
        columns = [c for c in (self.id_column, self.title_column, self.text_column) if c]
        handle = pq.ParquetFile(self.path)
        row, in_file = self.first_row, self.rows_before
        for batch in handle.iter_batches(batch_size=BLOCK_ROWS, row_groups=self.row_groups, columns=columns):
            n = batch.num_rows
            texts = batch.column(self.text_column).to_pylist()
            titles = batch.column(self.title_column).to_pylist() if self.title_column else None
            for i, text in enumerate(texts):
                if not isinstance(text, str):
                    raise DataFormatError(
                        self.path,
                        None,
                        f"row {in_file + i}: column {self.text_column!r} is not a string ({text!r:.40})",
                    )
            if titles is not None:
                texts = [((t or "") + " " + x).strip() for t, x in zip(titles, texts, strict=True)]
            if self.id_column:
                ids = [str(v) for v in batch.column(self.id_column).to_pylist()]
            else:
                ids = [str(r) for r in range(row, row + n)]
            yield RowBlock(
                rows=np.arange(row, row + n, dtype=np.int64),
                lines=np.arange(in_file, in_file + n, dtype=np.int64),
                ids=ids,
                texts=texts,
                origin=f"{self.path} row {{line}}",
            )
            row += n
            in_file += n

    @property
    def row_count(self) -> int:
        return self.num_rows


@dataclass
class MemoryPart(SourcePart):
    """Texts already in memory (a slice of a list)."""

    first_row: int
    texts: list[str]
    ids: list[str] | None = None

    def read(self) -> Iterator[RowBlock]:
        for start in range(0, len(self.texts), BLOCK_ROWS):
            texts = self.texts[start : start + BLOCK_ROWS]
            first = self.first_row + start
            ids = (
                self.ids[start : start + BLOCK_ROWS]
                if self.ids is not None
                else [str(first + i) for i in range(len(texts))]
            )
            yield RowBlock(
                rows=np.arange(first, first + len(texts), dtype=np.int64),
                lines=np.full(len(texts), -1, dtype=np.int64),
                ids=list(ids),
                texts=list(texts),
                origin="texts[{row}]",
            )

    @property
    def row_count(self) -> int:
        return len(self.texts)


@dataclass
class CorpusSource:
    """A corpus as independently readable parts (see the module doc)."""

    parts: list[SourcePart]
    identity: str
    description: str
    unique_ids: bool = False  # True when ids come from the data and must not repeat
    meta: dict[str, Any] = field(default_factory=dict)

    def iter_blocks(self) -> Iterator[RowBlock]:
        """Every row, block by block, in row order."""
        for part in self.parts:
            yield from part.read()

    @property
    def row_count(self) -> int | None:
        counts = [p.row_count for p in self.parts]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _file_identity(paths: Sequence[Path], kind: str, **options: Any) -> str:
    """What names a job over these files: how they are read and each file's place and content (hashed whole: a file
    rewritten with its size and time kept, as ``cp -p`` or ``rsync -t`` do, is other rows; sha256 reads 1.7-1.8 GB/s
    here, bench/results/saved-folder-load). The content's digest decides the size, so the size is not added."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps({"kind": kind, **options}, sort_keys=True).encode())
    for path in paths:
        digest.update(f"{path.resolve()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def memory_source(texts: Sequence[str], ids: Sequence[str] | None = None) -> CorpusSource:
    """Texts (and optional ids) held in memory; the identity is a hash of them."""
    texts = list(texts)
    if ids is not None:
        ids = [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    digest = hashlib.blake2b(digest_size=16)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRowError(f"texts[{i}] is {type(text).__name__} ({text!r:.40}); every item must be a str")
        check_text(text, f"texts[{i}]", i, str(i) if ids is None else ids[i])
        digest.update(text.encode())
        digest.update(b"\x00")
    if ids is not None:
        digest.update("\x00".join(ids).encode("utf-8", "surrogatepass"))
    parts: list[SourcePart] = [
        MemoryPart(start, texts[start : start + BLOCK_ROWS], None if ids is None else ids[start : start + BLOCK_ROWS])
        for start in range(0, len(texts), BLOCK_ROWS)
    ]
    return CorpusSource(parts, "memory-" + digest.hexdigest(), f"{len(texts)} texts in memory", unique_ids=False)


def _parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(PARQUET_SUFFIX) and p.is_file())
        if not files:
            raise FileNotFoundError(f"{path} holds no *{PARQUET_SUFFIX} files")
        return files
    return [path]


def parquet_source(
    path: str | Path, *, text_column: str = "text", title_column: str | None = "title", id_column: str | None = None
) -> CorpusSource:
    """Parquet file(s); ``title_column`` is used when present (BEIR's rule), ``id_column`` defaults to
    ``_id`` or ``id`` when present, else row numbers. Parts are groups of row groups of about
    :data:`BLOCK_ROWS` × 4 rows, with their first rows known from the files' metadata."""
    path = Path(path)
    files = _parquet_files(path)
    parts: list[SourcePart] = []
    first = 0
    chosen_id, chosen_title = id_column, title_column
    for file in files:
        meta = pq.ParquetFile(file).metadata
        names = set(meta.schema.names)
        if text_column not in names:
            raise DataFormatError(file, None, f"no column {text_column!r} (columns: {sorted(names)})")
        title = chosen_title if chosen_title in names else None
        ident = id_column or next((c for c in ID_FIELDS if c in names), None)
        if id_column and id_column not in names:
            raise DataFormatError(file, None, f"no id column {id_column!r} (columns: {sorted(names)})")
        chosen_id = ident
        groups: list[int] = []
        rows_in_groups = 0
        rows_before = 0
        for group in range(meta.num_row_groups):
            groups.append(group)
            rows_in_groups += meta.row_group(group).num_rows
            if rows_in_groups >= 4 * BLOCK_ROWS:
                parts.append(
                    ParquetPart(str(file), groups, first, rows_before, rows_in_groups, text_column, title, ident)
                )
                first += rows_in_groups
                rows_before += rows_in_groups
                groups, rows_in_groups = [], 0
        if groups:
            parts.append(ParquetPart(str(file), groups, first, rows_before, rows_in_groups, text_column, title, ident))
            first += rows_in_groups
    identity = _file_identity(files, "parquet", text=text_column, title=title_column, id=id_column)
    return CorpusSource(parts, identity, f"{path} ({first} rows)", unique_ids=chosen_id is not None)


def open_texts(path: str | Path, *, field: str = "text") -> CorpusSource:
    """``lmembed encode``'s rule: a ``.jsonl`` file gives the string ``field`` of each row, a ``.parquet`` file
    its column ``field``, any other file its lines (every line, blank ones too). Ids are row numbers."""
    path = Path(path)
    if is_jsonl(path):
        return CorpusSource(
            [JsonlFieldPart(str(path), field)], _file_identity([path], "jsonl-field", field=field), str(path)
        )
    if path.suffix == PARQUET_SUFFIX:
        source = parquet_source(path, text_column=field, title_column=None, id_column=None)
        return replace(source, unique_ids=False)
    return CorpusSource([TextLinesPart(str(path))], _file_identity([path], "lines"), str(path))


def open_source(path: str | Path, *, field: str | None = None) -> CorpusSource:
    """A corpus file or folder (see the module doc). ``field`` reads one string field of a JSON-lines
    file (``lmembed encode``'s rule, ids = row numbers); without it a JSON-lines file is a BEIR corpus."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_dir():
        if any(p.name.endswith(PARQUET_SUFFIX) for p in path.iterdir()):
            return parquet_source(path)
        corpus = find_file(path, CORPUS_FILE)
        return CorpusSource([BeirPart(str(corpus))], _file_identity([corpus], "beir"), str(corpus), unique_ids=True)
    name = path.name
    if name.endswith(PARQUET_SUFFIX):
        return parquet_source(path)
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        if field is not None:
            identity = _file_identity([path], "jsonl-field", field=field)
            return CorpusSource([JsonlFieldPart(str(path), field)], identity, str(path))
        return CorpusSource([BeirPart(str(path))], _file_identity([path], "beir"), str(path), unique_ids=True)
    return CorpusSource([TextLinesPart(str(path))], _file_identity([path], "lines"), str(path))
