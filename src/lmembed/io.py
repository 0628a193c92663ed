"""Reading lmembed's input formats: JSON lines, plain text lines, BEIR folders and qrels files.

Every reader here shares the same rules:

* files are UTF-8; a byte-order mark at the start is ignored; a file whose name ends in ``.gz`` (any case) is
  decompressed on the fly;
* lines end in LF, CRLF or a lone CR (Python's universal newlines), and the line ending is never part of the text;
* a file is JSON lines when its name ends in ``.jsonl`` or ``.ndjson``, optionally followed by ``.gz``, in any
  case (:func:`is_jsonl`);
* a problem in a file (bytes that are not UTF-8, a line that is not JSON, a row that is not a JSON
  object, a JSON string holding a lone surrogate, a malformed qrels row, damaged gzip data) raises
  :class:`DataFormatError`, whose message starts with ``<file>:<line>:``.

Readers that may drop bad lines instead of failing (training data's ``skip_invalid``) take an
``on_error`` callback: it receives each :class:`DataFormatError` and either raises or returns, in
which case the line is skipped.

BEIR folders hold ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``,
``text``) and ``qrels/<split>.tsv``; any of them may be gzip-compressed. A document's text is
``(title + " " + text).strip()``, as MTEB builds it. Qrels files follow one rule, see
:func:`iter_qrels`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from numbers import Integral
from pathlib import Path
from typing import IO, Any, NamedTuple

from lmembed.errors import ConfigError, LmembedError

logger = logging.getLogger(__name__)

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_DIR = "qrels"
QRELS_HEADER_IDS = frozenset({"query-id", "query_id", "qid"})
_BOM = b"\xef\xbb\xbf"
JSONL_SUFFIXES = (".jsonl", ".ndjson")
#: a JSON ``\\uXXXX`` escape of a UTF-16 surrogate, which alone (unpaired) is no character
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

Qrels = dict[str, dict[str, int]]


class DataFormatError(LmembedError, ValueError):
    """A data file is malformed; the message names the file and, where there is one, the line."""

    def __init__(self, path: str | Path, line_no: int | None, reason: str) -> None:
        self.path = Path(path)
        self.line_no = line_no
        self.reason = reason
        super().__init__(f"{self.where}: {reason}")

    @property
    def where(self) -> str:
        """``<file>:<line>``, or the file alone when the problem has no line."""
        return str(self.path) if self.line_no is None else f"{self.path}:{self.line_no}"


#: Receives a problem found in one line; raises it (or another error), or returns to skip the line.
OnError = Callable[[DataFormatError], None]


def _report(error: DataFormatError, on_error: OnError | None) -> None:
    if on_error is None:
        raise error
    on_error(error)


# ---------------------------------------------------------------------------------------------- JSON
class DuplicateKeyError(ValueError):
    """A JSON object gives one key twice (Python's ``json`` would keep the last value without a word)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"key {key!r} is given twice in one object")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


#: digits of the longest integer a JSON document may hold (Python's own limit on converting a string to an int)
MAX_INT_DIGITS = 4300


class _LongInteger(Exception):
    pass


def _int(digits: str) -> int:
    if len(digits) > MAX_INT_DIGITS:  # int() would raise a bare ValueError, which no reader takes for bad JSON
        raise _LongInteger
    return int(digits)


def loads_json(text: str | bytes) -> Any:
    """The one JSON parser of lmembed's readers: :func:`json.loads`, except that an object giving one key twice is
    a :class:`DuplicateKeyError` (two readers of one file, ours and another tool's, could otherwise see different
    values), and an integer of more than :data:`MAX_INT_DIGITS` digits is a :class:`json.JSONDecodeError` at it."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_int)
    except _LongInteger:
        doc = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        found = re.search(rf"\d{{{MAX_INT_DIGITS + 1},}}", doc)
        raise json.JSONDecodeError(
            f"an integer of more than {MAX_INT_DIGITS} digits", doc, found.start() if found else 0
        ) from None


#: what a refusal of a newer layout advises (:func:`check_format`)
READ_WITH_WRITER = "read it with the lmembed that wrote it"


def check_format(
    record: str | Path, field: str, value: Any, current: int, what: str, error: Callable[[str], Exception], advice: str
) -> None:
    """Refuse a file lmembed wrote whose layout number (its ``field``, ``value`` as read) is not the one this lmembed
    reads, ``current``: a newer lmembed's file is not read as this one's. The refusal names the file and the field,
    says what this lmembed reads (``what``: "checkpoints", "result records" ...) and what to do (``advice``)."""
    if value != current or isinstance(value, bool):
        raise error(
            f"{record}: {field}: {value!r}; this lmembed reads {what} of format {current} (a newer lmembed wrote it?): "
            f"{advice}"
        )


def read_json(
    path: str | Path, *, error: Callable[[str], Exception] = ValueError, what: str = "file", kind: type | None = dict
) -> Any:
    """The JSON document of one file (a config, a record, a manifest: every whole-file JSON lmembed reads). A file
    that cannot be read, is not UTF-8, is not JSON, gives a key twice, nests past the parser's limit, or (with
    ``kind``) holds another type at its top, is ``error("<file>: ...")`` naming ``what`` the file should be."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a pipe would be waited on forever, a device read without end
            raise error(f"{path}: the {what} is not a plain file (a pipe, socket, device or folder)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: the {what} cannot be read ({exc.strerror or exc})") from None
    try:
        data = loads_json(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: line {exc.lineno}: invalid JSON in the {what} ({exc.msg})") from None
    except DuplicateKeyError as exc:
        raise error(f"{path}: the {what} gives key {exc.key!r} twice in one object") from None
    except RecursionError:
        raise error(f"{path}: the {what} nests arrays or objects too deeply to read") from None
    if kind is not None and not isinstance(data, kind):
        raise error(f"{path}: the {what} must hold {_json_type(kind())} at its top, not {_json_type(data)}")
    return data


# ---------------------------------------------------------------------------------------------- lines
def is_gzip(path: str | Path) -> bool:
    """True when ``path``'s name ends in ``.gz`` (any case): the readers here decompress it."""
    return Path(path).suffix.lower() == ".gz"


def is_jsonl(path: str | Path) -> bool:
    """True when ``path`` names a JSON-lines file: ``.jsonl`` or ``.ndjson``, optionally ``.gz``-compressed,
    in any case (``corpus.JSONL``, ``queries.jsonl.gz``)."""
    name = Path(path).name.lower()
    return name.removesuffix(".gz").endswith(JSONL_SUFFIXES)


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if is_gzip(path) else path.open("rb")


def _split_cr(raw: bytes) -> list[bytes]:
    """The lines in one chunk read up to an LF, its line ending dropped: a lone CR ends a line too (universal
    newlines), so ``b"a\\rb\\r\\n"`` holds the lines ``a`` and ``b``."""
    for ending in (b"\r\n", b"\n", b"\r"):
        if raw.endswith(ending):
            raw = raw[: -len(ending)]
            break
    return raw.split(b"\r")


def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of every line (LF, CRLF and lone CR all end one); damaged gzip data is reported as
    a format error."""
    line_no = 0
    try:
        with _open_binary(path) as handle:
            for raw in handle:
                for piece in _split_cr(raw) if b"\r" in raw else (raw,):  # most files: no CR, or CRLF
                    line_no += 1
                    yield line_no, piece
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataFormatError(path, line_no + 1, f"damaged gzip data ({exc})") from exc


def iter_lines(path: str | Path, *, on_error: OnError | None = None) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, text)`` for every line of a UTF-8 text file, the line ending (LF, CRLF or a
    lone CR) removed; blank lines included. A line that is not UTF-8 is an error naming file and line."""
    path = Path(path)
    for line_no, raw in _raw_lines(path):
        if line_no == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM) :]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); is this a text file?"
            _report(DataFormatError(path, line_no, reason), on_error)
            continue
        yield line_no, text.rstrip("\r\n")


def read_text(path: str | Path) -> str:
    """The whole of a UTF-8 text file (a byte-order mark dropped), for readers of YAML and JSON documents.

    Bytes that are not UTF-8 (a binary file, another encoding) are a :class:`DataFormatError` naming the file,
    the line and the column, never a bare ``UnicodeDecodeError``."""
    path = Path(path)
    raw = path.read_bytes()
    if raw.startswith(_BOM):
        raw = raw[len(_BOM) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line_no = raw.count(b"\n", 0, exc.start) + 1
        reason = (
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start - line_start + 1}); "
            "is this a text file?"
        )
        raise DataFormatError(path, line_no, reason) from None


def read_text_lines(path: str | Path, *, strip: bool = False) -> list[str]:
    """The lines of a text file (one text per line). With ``strip``, each line is stripped of
    surrounding whitespace and blank lines are left out; without it every line is kept as it is."""
    if not strip:
        return [line for _, line in iter_lines(path)]
    return [line.strip() for _, line in iter_lines(path) if line.strip()]


def iter_text_documents(path: str | Path) -> Iterator[tuple[int, str, str]]:
    """``(line number, id, text)`` of every document of a plain-text corpus: one document per line, blank lines
    skipped, the text stripped, and the id the line number (``"3"`` for line 3), the same for every command that
    reads such a file (``index``, ``synthesize``, ``adapt``)."""
    for line_no, line in iter_lines(path):
        if line.strip():
            yield line_no, str(line_no), line.strip()


# ---------------------------------------------------------------------------------------------- JSON lines
def _json_type(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    names = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def iter_jsonl(path: str | Path, *, on_error: OnError | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for each non-blank line of a JSON-lines file.

    Every row must be a JSON object; a line that is not JSON, or holds another JSON value, is a
    :class:`DataFormatError` naming the file and line (passed to ``on_error`` when given).
    """
    path = Path(path)
    for line_no, line in iter_lines(path, on_error=on_error):
        if not line.strip():
            continue
        try:
            row = loads_json(line)
        except json.JSONDecodeError as exc:
            _report(DataFormatError(path, line_no, f"invalid JSON ({exc.msg} at column {exc.colno})"), on_error)
            continue
        except DuplicateKeyError as exc:
            _report(DataFormatError(path, line_no, str(exc)), on_error)
            continue
        except RecursionError:
            _report(DataFormatError(path, line_no, "arrays or objects nest too deeply to read"), on_error)
            continue
        if not isinstance(row, dict):
            _report(DataFormatError(path, line_no, f"expected a JSON object, got {_json_type(row)}"), on_error)
            continue
        if _SURROGATE_ESCAPE.search(line) and (problem := lone_surrogate(row)):
            _report(DataFormatError(path, line_no, problem), on_error)
            continue
        yield line_no, row


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """What holds a lone surrogate (``\\ud800`` escaped alone: no character, it cannot be encoded as UTF-8) in a
    decoded JSON value, or ``None``; ``where`` is the value's place (``field 'text'``, ``field 'neg'[2]``)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where or 'a string'} holds a lone surrogate ({value[exc.start]!r} at character {exc.start + 1})"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and (problem := lone_surrogate(key, f"{where or 'a key'} {key!r}")):
            return problem
        place = f"{where}[{key!r}]" if where else f"field {key!r}"
        if problem := lone_surrogate(item, place):
            return problem
    return None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSON-lines file, in order (blank lines skipped)."""
    return [row for _, row in iter_jsonl(path)]


def read_texts_field(path: str | Path, field: str) -> list[str]:
    """The string ``field`` of every row of a JSON-lines file; a row without it names file and line."""
    texts = []
    for line_no, row in iter_jsonl(path):
        value = row.get(field)
        if not isinstance(value, str):
            raise DataFormatError(path, line_no, f"expected an object with a string field {field!r}")
        texts.append(value)
    return texts


# ---------------------------------------------------------------------------------------------- BEIR
def find_file(folder: str | Path, name: str) -> Path:
    """``folder/name``, or its gzip-compressed twin ``folder/name.gz``, whichever exists."""
    folder = Path(folder)
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"neither {folder / name} nor {folder / name}.gz exists")


def qrels_file(folder: str | Path, split: str) -> Path:
    """A BEIR folder's ``qrels/<split>.tsv`` (or ``.tsv.gz``)."""
    return find_file(Path(folder) / QRELS_DIR, f"{split}.tsv")


def qrels_splits(folder: str | Path) -> list[str]:
    """The splits a BEIR folder has judgments for (``qrels/*.tsv`` and ``*.tsv.gz``), sorted."""
    qrels = Path(folder) / QRELS_DIR
    if not qrels.is_dir():
        return []
    names = (p.name.removesuffix(".gz") for p in qrels.iterdir() if p.is_file())
    return sorted({name.removesuffix(".tsv") for name in names if name.endswith(".tsv")})


def is_beir_folder(folder: str | Path) -> bool:
    """True when ``folder`` holds a corpus and a queries file (plain or gzip-compressed)."""
    try:
        find_file(folder, CORPUS_FILE)
        find_file(folder, QUERIES_FILE)
    except FileNotFoundError:
        return False
    return True


def is_whole_number(value: Any) -> bool:
    """Whether a value read from JSON is an integer (``true`` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def whole_number(value: Any, argument: str, *, minimum: int = 1) -> int:
    """An argument given in Python as an int if it is a whole number (any integral type, numpy's too; not a bool) of
    at least ``minimum``, else a :class:`~lmembed.errors.ConfigError` naming ``argument``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(f"{argument}={value!r:.40} must be a whole number >= {minimum}, got {type(value).__name__}")
    if value < minimum:
        raise ConfigError(f"{argument}={value} must be >= {minimum}")
    return int(value)


def is_number(value: Any, *, finite: bool = False) -> bool:
    """Whether a value read from JSON is a number (``true`` is not 1); with ``finite``, neither NaN nor infinite."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return not finite or math.isfinite(value)


def is_plain_file_name(name: Any) -> bool:
    """Whether a name read from a record is that of a file in the record's own folder: not empty, not ``.`` or
    ``..``, no separator, NUL or leading ``~`` (a path, or one to expand, could name a file anywhere)."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
        and not name.startswith("~")
    )


def string_field(row: dict[str, Any], key: str, path: Path, line_no: int, *, required: bool = True) -> str:
    """``row[key]``, a string (a text: a number there is a mistake, not a text to embed)."""
    value = row.get(key)
    if value is None:
        if required:
            raise DataFormatError(path, line_no, f"missing field {key!r}")
        return ""
    if not isinstance(value, str):
        raise DataFormatError(path, line_no, f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def id_field(row: dict[str, Any], key: str, path: Path, line_no: int) -> str:
    """``row[key]``, an id: a string or a JSON integer (BEIR files give both), as a string."""
    value = row.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return string_field(row, key, path, line_no)


#: The fields a corpus or queries row may give its id in, in order: BEIR's ``_id``, then ``id`` (as many corpora
#: spell it). Every reader of such rows (evaluation, index, mining, synthesis, adaptation, Ray) takes these.
ID_FIELDS = ("_id", "id")


def row_id(row: dict[str, Any], path: Path, line_no: int) -> str:
    """A corpus or queries row's id: the first of :data:`ID_FIELDS` it gives (see :func:`id_field`). No id
    field, or an empty id, is a :class:`DataFormatError` naming the file, the line and the field."""
    key = next((k for k in ID_FIELDS if row.get(k) is not None), None)
    if key is None:
        raise DataFormatError(path, line_no, "missing id field (" + " or ".join(map(repr, ID_FIELDS)) + ")")
    value = id_field(row, key, path, line_no)
    if not value:
        raise DataFormatError(path, line_no, f"field {key!r} is empty")
    return value


#: The names a training row (``lmembed train``'s data, ``lmembed mine``'s input and output) may give each field.
QUERY_KEYS = ("query", "anchor", "question")
POSITIVE_KEYS = ("positive", "positives", "pos")
NEGATIVE_KEYS = ("negatives", "negative", "neg", "hard_negatives")


def row_key(row: Mapping[str, Any], keys: Sequence[str], what: str) -> str | None:
    """The one of ``keys`` (the names of one field, e.g. :data:`QUERY_KEYS`) that ``row`` gives a value, or ``None``;
    two of them is a ``ValueError`` naming both (which one was meant cannot be told: ``query`` and ``anchor``)."""
    given = [k for k in keys if row.get(k) is not None]
    if len(given) > 1:
        raise ValueError(f"fields {given[0]!r} and {given[1]!r} both give the {what}; keep one")
    return given[0] if given else None


def corpus_text(row: dict[str, Any], path: Path, line_no: int) -> str:
    """The text a BEIR corpus row is embedded as: ``(title + " " + text).strip()``, both optional."""
    title = string_field(row, "title", path, line_no, required=False)
    text = string_field(row, "text", path, line_no, required=False)
    return (title + " " + text).strip()


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """A BEIR corpus file as parallel lists of ids and texts (``(title + " " + text).strip()``)."""
    path = Path(path)
    ids: list[str] = []
    texts: list[str] = []
    seen: set[str] = set()
    for line_no, row in iter_jsonl(path):
        doc_id = row_id(row, path, line_no)
        if doc_id in seen:
            raise DataFormatError(path, line_no, f"duplicate document id {doc_id!r}")
        seen.add(doc_id)
        ids.append(doc_id)
        texts.append(corpus_text(row, path, line_no))
    return ids, texts


def read_queries(path: str | Path) -> dict[str, str]:
    """A BEIR queries file as ``{query id: text}`` (file order, text as given)."""
    path = Path(path)
    queries: dict[str, str] = {}
    for line_no, row in iter_jsonl(path):
        query_id = row_id(row, path, line_no)
        if query_id in queries:
            raise DataFormatError(path, line_no, f"duplicate query id {query_id!r}")
        queries[query_id] = string_field(row, "text", path, line_no)
    return queries


class Judgment(NamedTuple):
    """One qrels row: a query, a document and the relevance score, with its line number."""

    line_no: int
    query_id: str
    doc_id: str
    score: int


def _qrels_score(text: str) -> int:
    """An integer relevance score; ``"1.0"`` is read as 1, but ``"0.5"`` is refused, not truncated."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise ValueError(f"relevance score {text!r} is not an integer")
    return int(value)


def _parse_judgment(line: str, path: Path, line_no: int) -> Judgment:
    columns = line.split("\t") if "\t" in line else line.split()
    if len(columns) == 3:
        query_id, doc_id, score = columns
    elif len(columns) == 4:  # TREC: qid, iteration, docid, relevance
        query_id, _, doc_id, score = columns
    else:
        raise DataFormatError(
            path, line_no, f"expected 3 tab-separated columns (or TREC's 4), got {len(columns)}: {line[:80]!r}"
        )
    query_id, doc_id = query_id.strip(), doc_id.strip()
    if not query_id or not doc_id:
        raise DataFormatError(path, line_no, "empty query or document id")
    try:
        return Judgment(line_no, query_id, doc_id, _qrels_score(score))
    except ValueError as exc:
        raise DataFormatError(path, line_no, str(exc)) from None


def iter_qrels(path: str | Path, *, on_error: OnError | None = None) -> Iterator[Judgment]:
    """Yield the judgments of a qrels file, in file order.

    The rule: columns are split on tabs (on runs of whitespace when a line has no tab); a row has
    BEIR's 3 columns (``query-id corpus-id score``) or TREC's 4 (``qid iteration docid relevance``);
    ids are stripped and must not be empty; the score is an integer (``1.0`` is accepted as 1); a
    first line whose first column is ``query-id``, ``query_id`` or ``qid`` is a header and skipped;
    blank lines are skipped. Anything else is a :class:`DataFormatError` naming file and line.
    """
    path = Path(path)
    for line_no, line in iter_lines(path, on_error=on_error):
        if not line.strip():
            continue
        if line_no == 1:
            first = line.split("\t") if "\t" in line else line.split()
            if len(first) >= 2 and first[0].strip().lower() in QRELS_HEADER_IDS:
                continue
        try:
            judgment = _parse_judgment(line, path, line_no)
        except DataFormatError as error:
            _report(error, on_error)
            continue
        yield judgment


def read_qrels(path: str | Path) -> Qrels:
    """A qrels file as ``{query id: {doc id: relevance}}``; a repeated judgment keeps the last score
    (and is logged when the scores differ)."""
    qrels: Qrels = {}
    for line_no, query_id, doc_id, score in iter_qrels(path):
        docs = qrels.setdefault(query_id, {})
        if doc_id in docs and docs[doc_id] != score:
            logger.warning("%s:%d: repeated judgment for (%s, %s); keeping the last", path, line_no, query_id, doc_id)
        docs[doc_id] = score
    return qrels


#: files hashed at once when a record's files are checked (a model's weight shards, an index's arrays)
HASH_THREADS = min(8, os.cpu_count() or 1)


class NpyHeader(NamedTuple):
    """What an ``.npy`` header says of its array, and how many bytes follow the header."""

    shape: tuple[int, ...]
    dtype: Any  # numpy.dtype
    fortran: bool
    data_bytes: int

    @property
    def claimed_bytes(self) -> int:
        """The bytes the array the header describes takes (numbers from elsewhere: Python integers, no overflow)."""
        count = 1
        for dim in self.shape:
            count *= int(dim)
        return count * int(self.dtype.itemsize)


def read_npy_header(handle: IO[bytes], size: int) -> NpyHeader:
    """The header of the ``.npy`` data ``handle`` reads from its start, ``size`` bytes in all (a file, an ``.npz``
    member), read without the array: the one header reader of every ``.npy`` file lmembed reads from elsewhere, each
    caller then holding the header to its own format (an object dtype, which only a pickle can fill, among the first
    things). A version numpy's writers do not produce, or a header that cannot be parsed, is a ``ValueError``."""
    from numpy.lib import format as npy  # lazy: io is read by commands that never touch an array

    version = npy.read_magic(handle)
    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"npy format {version}, which lmembed does not write")
    shape, fortran, dtype = readers[version](handle)
    return NpyHeader(tuple(int(d) for d in shape), dtype, bool(fortran), size - handle.tell())


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks (what indexes and checkpoints record of their files)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_recorded_files(
    folder: Path, record: Path, files: Any, names: Sequence[str], *, key: str, error: type[LmembedError]
) -> None:
    """Each of ``names`` lies in ``folder`` (links followed) and hashes to the sha256 that ``record`` (a JSON file of
    the folder: a checkpoint's ``state.json``, a run's plan) holds for it in ``files``, its ``key`` field (one digest,
    or a list of those its content may have: a file being replaced); else ``error``, naming the file and
    ``key.NAME`` (a recorded file that is missing too). Called before anything in those files is read."""
    from lmembed.paths import inside  # lazy: paths and io are siblings of one layer

    def digests(value: Any) -> list[Any]:
        return value if isinstance(value, list) else [value]

    if not isinstance(files, dict) or not all(isinstance(d, str) for v in files.values() for d in digests(v)):
        raise error(f"{record}: {key} must map each file's name to its sha256")
    paths = []
    for name in names:
        if name not in files:
            raise error(f"{record}: {key} has no sha256 for {name}, a file of {folder}")
        path = inside(folder, name, file=record, field=f"{key}.{name}", error=error)
        if not path.is_file():
            raise error(f"{path}: {record} records it ({key}.{name}), but it is not there")
        paths.append(path)
    with ThreadPoolExecutor(max_workers=max(1, min(HASH_THREADS, len(paths)))) as pool:  # hashlib frees the GIL
        found = list(pool.map(sha256_file, paths))
    for name, path, digest in zip(names, paths, found, strict=True):
        if digest not in digests(files[name]):
            raise error(
                f"{path}: its sha256 is not the one {record} records ({key}.{name}): the file was changed or "
                "damaged after it was written"
            )
