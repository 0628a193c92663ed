"""``LexicalIndex``: BM25 over an index's documents, through ``bm25s``, row-aligned with the vectors.

Texts are lower-cased, split into words of two or more characters and stripped of English stop words (bm25s'
tokenizer; no stemming), and scored with Lucene's BM25 (``k1=1.5``, ``b=0.75``): the scores are bm25s' own.
A query word the corpus never holds is ignored; a document that shares no word with the query is not a hit.

Persisted in ``bm25/`` inside an index folder (:class:`lmembed.index.Index` keeps it beside the vectors, and
records the sha256 of each of its files in the index's manifest), with ``lexical.json`` recording which documents
it covers (their count and a digest of their ids and texts). :func:`open_lexical` reuses it while the index holds
exactly those documents, and rebuilds it (and saves it, when it can) after documents were added. ``bm25/`` must be
a folder inside the index folder, not a link leading elsewhere (:func:`lmembed.paths.inside`).

Its files are read by :func:`read_saved` alone, which trusts none of them: each JSON file must hold the types and
values lmembed writes, each array's ``.npy`` header is checked (dtype, 1-D, the file's size) before the array is
allocated, and the score matrix must agree with the vocabulary and the document count. A file that does not is a
:class:`LexicalIndexError` naming it and the field; bm25s is handed the checked values, never the files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_folder, atomic_write_text
from lmembed.errors import LmembedError
from lmembed.io import is_number, is_whole_number, read_json, read_npy_header
from lmembed.paths import inside

log = logging.getLogger(__name__)

LEXICAL_DIR = "bm25"
LEXICAL_FILE = "lexical.json"
FORMAT_VERSION = 2  # 2: the digest covers the texts as well as the ids


class LexicalIndexError(LmembedError, ValueError):
    """A saved BM25 index cannot be read, or BM25 is asked for without the bm25s package."""


@dataclass(frozen=True)
class LexicalParams:
    """BM25's parameters and the tokenizer's stop words (bm25s' names)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stopwords: str = "en"


def ids_digest(ids: Sequence[str], texts: Sequence[str] | None = None) -> str:
    """A digest of the documents' ids (and texts, when given) in row order: which documents a BM25 index covers."""
    digest = hashlib.blake2b(digest_size=16)
    for doc_id in ids:
        digest.update(doc_id.encode("utf-8", "surrogatepass") + b"\0")
    for text in texts or ():
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


INSTALL_HINT = "pip install 'lmembed[hybrid]'"


def _bm25s() -> tuple[Any, Any]:
    """bm25s and its tokenizer class (lazy: an optional extra, needed only for BM25); missing, a
    :class:`LexicalIndexError` that says which extra installs it."""
    try:
        import bm25s
        from bm25s.tokenization import Tokenizer
    except ImportError as exc:
        raise LexicalIndexError(
            f"BM25 (search or eval with bm25 or hybrid, adapt's hybrid teacher) needs the bm25s package "
            f"({exc.name} is missing): {INSTALL_HINT}"
        ) from None
    return bm25s, Tokenizer


class LexicalIndex:
    """BM25 over ``count`` documents; :meth:`search` returns rows into the index."""

    def __init__(self, retriever: Any, tokenizer: Any, params: LexicalParams, count: int, digest: str) -> None:
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.params = params
        self.count = count
        self.digest = digest

    @classmethod
    def build(cls, texts: Sequence[str], ids: Sequence[str], params: LexicalParams | None = None) -> LexicalIndex:
        bm25s, Tokenizer = _bm25s()
        params = params or LexicalParams()
        tokenizer = Tokenizer(stopwords=params.stopwords)
        tokens = tokenizer.tokenize(list(texts), return_as="tuple", show_progress=False)
        # bm25s's Tokenizer gives a document with no indexed word (all stop words) the empty word, which counted
        # as a word of length 1 (and lengthened the average): such a document has length 0, as bm25s.tokenize
        # and Lucene count it
        empty = tokens.vocab.get("")
        if empty is not None:
            tokens = type(tokens)(ids=[[] if doc == [empty] else doc for doc in tokens.ids], vocab=tokens.vocab)
        retriever = bm25s.BM25(k1=params.k1, b=params.b, method=params.method)
        retriever.index(tokens, show_progress=False)
        return cls(retriever, tokenizer, params, len(texts), ids_digest(ids, texts))

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)`` of shape ``(len(queries), k)``, best first; misses (no shared word, or fewer
        documents than ``k``) are row ``-1`` with score ``0``."""
        scores = np.zeros((len(queries), k), dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        if not queries or self.count == 0:
            return scores, rows
        depth = min(k, self.count)
        # an empty list is no way out for a query without a known word (in a batch, bm25s scores it as if it held
        # some word), so such a query is not searched at all
        tokens = self._known_ids(queries)
        asked = [i for i, query in enumerate(tokens) if query]
        if not asked:
            return scores, rows
        found, found_scores = self.retriever.retrieve([tokens[i] for i in asked], k=depth, show_progress=False)
        hit = found_scores > 0
        scores[asked, :depth] = np.where(hit, found_scores, 0)
        rows[asked, :depth] = np.where(hit, found, -1)
        return scores, rows

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document (in row order) for ``query``: zeros when it holds no indexed word."""
        known = self._known_ids([query])[0]
        if not known or self.count == 0:
            return np.zeros(self.count, dtype=np.float32)
        return np.asarray(self.retriever.get_scores(known), dtype=np.float32)

    def known_words(self, texts: Sequence[str]) -> list[int]:
        """How many distinct indexed words each text holds (stop words and words the corpus lacks do not count)."""
        return [len(set(ids)) for ids in self._known_ids(texts)]

    def _known_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's indexed word ids. bm25s maps every word the corpus lacks to the empty word, which it also
        gives each document with no indexed word (all stop words): left in, a text of unknown words would hit
        those documents, so the empty word is dropped here."""
        tokens = self.tokenizer.tokenize(list(texts), update_vocab=False, return_as="ids", show_progress=False)
        unknown = self.tokenizer.get_vocab_dict().get("")
        return [[int(t) for t in text if t != unknown] for text in tokens]

    # ------------------------------------------------------------------ persistence
    def save(self, folder: Path) -> Path:
        """Write ``folder/bm25`` (filled under a temporary name, then renamed into place)."""
        target = folder / LEXICAL_DIR
        with atomic_folder(target) as tmp:
            self.retriever.save(str(tmp), show_progress=False)
            self.tokenizer.save_vocab(str(tmp))
            self.tokenizer.save_stopwords(str(tmp))
            record = {"format": FORMAT_VERSION, "count": self.count, "ids": self.digest, "params": asdict(self.params)}
            atomic_write_text(tmp / LEXICAL_FILE, json.dumps(record, indent=2))
        return target

    @classmethod
    def load(cls, folder: Path) -> LexicalIndex | None:
        """The BM25 index saved in ``folder/bm25``, or None when there is none (or one of an older format). Every
        file is checked by :func:`read_saved` before bm25s sees any of it."""
        saved = read_saved(folder)
        if saved is None:
            return None
        bm25s, Tokenizer = _bm25s()
        scoring = saved.scoring
        retriever = bm25s.BM25(**{name: scoring[name] for name in BM25_ARGS})
        # what bm25s.BM25.load sets, from arrays already checked here
        retriever.vocab_dict = saved.vocab
        retriever._original_version = scoring["version"]
        retriever.unique_token_ids_set = set(saved.vocab.values())
        retriever.scores = {
            "data": saved.data,
            "indices": saved.indices,
            "indptr": saved.indptr,
            "num_docs": scoring["num_docs"],
        }
        retriever.nonoccurrence_array = None
        tokenizer = Tokenizer(stopwords=saved.params.stopwords)
        tokenizer.word_to_stem = saved.tokenizer_vocab["word_to_stem"]
        tokenizer.stem_to_sid = saved.tokenizer_vocab["stem_to_sid"]
        tokenizer.word_to_id = saved.tokenizer_vocab["word_to_id"]
        tokenizer.stopwords = saved.stopwords
        return cls(retriever, tokenizer, saved.params, saved.count, saved.digest)


# ---------------------------------------------------------------------------------------------- the saved files
PARAMS_FILE = "params.index.json"
VOCAB_FILE = "vocab.index.json"
TOKENIZER_VOCAB_FILE = "vocab.tokenizer.json"
STOPWORDS_FILE = "stopwords.tokenizer.json"
DATA_FILE = "data.csc.index.npy"
INDICES_FILE = "indices.csc.index.npy"
INDPTR_FILE = "indptr.csc.index.npy"
#: The bm25s scoring methods that need no extra array (bm25l and bm25+ do; lmembed never writes them).
METHODS = ("robertson", "lucene", "atire")
#: The arguments of ``bm25s.BM25`` that its ``params.index.json`` holds, besides ``num_docs`` and ``version``.
BM25_ARGS = ("k1", "b", "delta", "method", "idf_method", "dtype", "int_dtype", "backend")
#: The names of bm25s' stop word lists (its tokenizer refuses any other string).
STOPWORD_LISTS = tuple(
    name
    for pair in (
        ("en", "english"),
        ("en_plus", "english_plus"),
        ("de", "german"),
        ("nl", "dutch"),
        ("fr", "french"),
        ("es", "spanish"),
        ("pt", "portuguese"),
        ("it", "italian"),
        ("ru", "russian"),
        ("sv", "swedish"),
        ("no", "norwegian"),
        ("zh", "chinese"),
        ("tr", "turkish"),
        ("ko", "korean"),
        ("da", "danish"),
    )
    for name in pair
)
SCORE_DTYPES = ("float32", "float64")
INDEX_DTYPES = ("int32", "int64")
BACKENDS = ("numpy",)


@dataclass(frozen=True)
class SavedLexical:
    """The checked contents of a ``bm25/`` folder: lmembed's record, bm25s' parameters, vocabulary and the
    document-by-word score matrix in CSC form (column ``w`` spans ``indptr[w]:indptr[w + 1]``)."""

    params: LexicalParams
    count: int
    digest: str
    scoring: dict[str, Any]
    vocab: dict[str, int]
    tokenizer_vocab: dict[str, dict[str, Any]]
    stopwords: list[str]
    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray


def _refuse(path: Path, field: str, problem: str) -> LexicalIndexError:
    """The refusal of one field of one file of ``bm25/``, with what to do about it."""
    return LexicalIndexError(
        f"{path}: {field} {problem}; the BM25 index cannot be used: delete {path.parent} and it is rebuilt "
        "from the index's documents at the next BM25 search"
    )


def _json_file(path: Path, kind: type, what: str) -> Any:
    """A JSON file of ``bm25/`` (``what`` it holds) whose top must be ``kind``."""
    return read_json(path, error=LexicalIndexError, what=what, kind=kind)


def _checked_params(path: Path, data: Any, field: str) -> LexicalParams:
    """:class:`LexicalParams` from ``data`` (``field`` of ``path``), each value of the type and range BM25 needs."""
    if not isinstance(data, dict):
        raise _refuse(path, field, "must be an object")
    names = {f.name for f in fields(LexicalParams)}
    if unknown := sorted(set(data) - names):
        raise _refuse(path, f"{field}.{unknown[0]}", "is not a BM25 parameter")
    for name in ("k1", "b"):
        if name in data and not (is_number(data[name], finite=True) and data[name] >= 0):
            raise _refuse(path, f"{field}.{name}", f"must be a finite number >= 0, not {data[name]!r}")
    if "method" in data and data["method"] not in METHODS:
        raise _refuse(path, f"{field}.method", f"must be one of {', '.join(METHODS)}, not {data['method']!r}")
    if "stopwords" in data and data["stopwords"] not in STOPWORD_LISTS:
        raise _refuse(path, f"{field}.stopwords", f"must name one of bm25s' stop word lists, not {data['stopwords']!r}")
    return LexicalParams(**data)


def _check_scoring(path: Path, data: dict[str, Any], count: int) -> None:
    """bm25s' ``params.index.json``: exactly the fields lmembed writes, each of the type bm25s expects."""
    expected = {*BM25_ARGS, "num_docs", "version"}
    if unknown := sorted(set(data) - expected):
        raise _refuse(path, unknown[0], "is not a parameter lmembed writes")
    if missing := sorted(expected - set(data)):
        raise _refuse(path, missing[0], "is missing")
    for name in ("k1", "b", "delta"):
        if not (is_number(data[name], finite=True) and data[name] >= 0):
            raise _refuse(path, name, f"must be a finite number >= 0, not {data[name]!r}")
    for name, allowed in (
        ("method", METHODS),
        ("idf_method", METHODS),
        ("dtype", SCORE_DTYPES),
        ("int_dtype", INDEX_DTYPES),
        ("backend", BACKENDS),
    ):
        if data[name] not in allowed:
            raise _refuse(path, name, f"must be one of {', '.join(allowed)}, not {data[name]!r}")
    if not isinstance(data["version"], str):
        raise _refuse(path, "version", f"must be a string, not {data['version']!r}")
    if data["num_docs"] != count or not is_whole_number(data["num_docs"]):
        raise _refuse(path, "num_docs", f"is {data['num_docs']!r}, but {LEXICAL_FILE} records {count} documents")


def _word_ids(path: Path, data: Any, field: str, words: int, *, every: bool) -> dict[str, int]:
    """A ``{word: id}`` map whose ids lie in ``[0, words)``; with ``every``, each id once."""
    if not isinstance(data, dict):
        raise _refuse(path, field, "must be an object mapping each word to its id")
    for word, word_id in data.items():
        if not is_whole_number(word_id) or not 0 <= word_id < words:
            raise _refuse(path, f"{field}[{word!r}]", f"is {word_id!r}, not a word id below {words}")
    if every and sorted(data.values()) != list(range(words)):
        raise _refuse(path, field, f"must give each of the {words} word ids of the score matrix to one word")
    return data


def _npy_header(path: Path, dtypes: Sequence[str]) -> int:
    """The length of the 1-D array in the ``.npy`` file ``path``, from its header alone: refused unless its dtype
    is one of ``dtypes``, it is 1-D in C order, and the file holds exactly the bytes the header claims."""
    try:
        with path.open("rb") as handle:
            header = read_npy_header(handle, path.stat().st_size)
    except (OSError, ValueError, EOFError) as exc:
        raise _refuse(path, "the header", f"cannot be read ({exc})") from None
    shape, dtype = header.shape, header.dtype
    if dtype.name not in dtypes:
        raise _refuse(path, "dtype", f"is {dtype}, not one of {', '.join(dtypes)}")
    if len(shape) != 1 or header.fortran:
        raise _refuse(path, "shape", f"is {list(shape)}{' in Fortran order' if header.fortran else ''}, not 1-D")
    if header.claimed_bytes != header.data_bytes:
        raise _refuse(
            path, "shape", f"claims {shape[0]} values of {dtype}, but the file holds {header.data_bytes} bytes"
        )
    return shape[0]


def _npy(path: Path) -> np.ndarray:
    """The array of an ``.npy`` file whose header :func:`_npy_header` has checked (never a pickle)."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise _refuse(path, "the array", f"cannot be read ({exc})") from None


def read_saved(folder: Path) -> SavedLexical | None:
    """The one reader of ``folder/bm25``: None where there is none (or one of an older format), else every file
    checked for types, shapes and ranges before an array is allocated, and the score matrix checked against the
    vocabulary and the document count (word ids in range, ``indptr`` from 0 to the number of scores without going
    back, document rows below the count, finite scores). Needs numpy only, not bm25s."""
    source = folder / LEXICAL_DIR
    if not source.exists() and not source.is_symlink():
        return None
    inside(folder, LEXICAL_DIR, file=folder, field="the BM25 index", error=LexicalIndexError)
    record_file = inside(
        folder, f"{LEXICAL_DIR}/{LEXICAL_FILE}", file=folder, field="the BM25 index", error=LexicalIndexError
    )
    if not record_file.is_file():
        return None
    record = _json_file(record_file, dict, "BM25 index's record")
    if record.get("format") != FORMAT_VERSION:  # older: an ids-only digest
        return None
    count, digest = record.get("count"), record.get("ids")
    if not is_whole_number(count) or count < 0:
        raise _refuse(record_file, "count", f"must be a whole number >= 0, not {count!r}")
    if not isinstance(digest, str):
        raise _refuse(record_file, "ids", f"must be a string, not {digest!r}")
    params = _checked_params(record_file, record.get("params"), "params")

    def file(name: str) -> Path:
        return inside(folder, f"{LEXICAL_DIR}/{name}", file=folder, field="the BM25 index", error=LexicalIndexError)

    scoring_file = file(PARAMS_FILE)
    scoring = _json_file(scoring_file, dict, "BM25 parameters")
    _check_scoring(scoring_file, scoring, count)
    lengths = {
        name: _npy_header(file(name), dtypes)
        for name, dtypes in (
            (DATA_FILE, SCORE_DTYPES),
            (INDICES_FILE, INDEX_DTYPES),
            (INDPTR_FILE, INDEX_DTYPES),
        )
    }
    words = lengths[INDPTR_FILE] - 1
    if words < 0:
        raise _refuse(file(INDPTR_FILE), "shape", "is [0]; it must hold one offset more than there are words")
    if lengths[DATA_FILE] != lengths[INDICES_FILE]:
        raise _refuse(
            file(INDICES_FILE), "shape", f"is [{lengths[INDICES_FILE]}], but {DATA_FILE} holds {lengths[DATA_FILE]}"
        )
    vocab_file = file(VOCAB_FILE)
    vocab = _word_ids(vocab_file, _json_file(vocab_file, dict, "BM25 vocabulary"), "the vocabulary", words, every=True)
    tokenizer_file = file(TOKENIZER_VOCAB_FILE)
    tokenizer_vocab = _json_file(tokenizer_file, dict, "BM25 tokenizer's vocabulary")
    for key in ("word_to_stem", "stem_to_sid", "word_to_id"):
        if not isinstance(tokenizer_vocab.get(key), dict):
            raise _refuse(tokenizer_file, key, "must be an object")
    _word_ids(tokenizer_file, tokenizer_vocab["word_to_id"], "word_to_id", words, every=False)
    _word_ids(tokenizer_file, tokenizer_vocab["stem_to_sid"], "stem_to_sid", words, every=False)
    stopwords_file = file(STOPWORDS_FILE)
    stopwords = _json_file(stopwords_file, list, "BM25 stop words")
    if not all(isinstance(word, str) for word in stopwords):
        raise _refuse(stopwords_file, "the stop words", "must all be strings")

    data, indices, indptr = _npy(file(DATA_FILE)), _npy(file(INDICES_FILE)), _npy(file(INDPTR_FILE))
    if indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr) < 0).any():
        raise _refuse(
            file(INDPTR_FILE),
            "the column offsets",
            f"must go from 0 to {len(indices)} (the number of scores) without going back",
        )
    if len(indices) and (indices.min() < 0 or indices.max() >= count):
        raise _refuse(file(INDICES_FILE), "the document rows", f"must lie in [0, {count})")
    if not np.isfinite(data).all():
        raise _refuse(file(DATA_FILE), "the scores", "hold NaN or infinite values")
    return SavedLexical(
        params=params,
        count=count,
        digest=digest,
        scoring=scoring,
        vocab=vocab,
        tokenizer_vocab=tokenizer_vocab,
        stopwords=stopwords,
        data=data,
        indices=indices,
        indptr=indptr,
    )


def open_lexical(
    folder: Path | None,
    texts: Sequence[str],
    ids: Sequence[str],
    *,
    save: Callable[[LexicalIndex], object] | None = None,
) -> LexicalIndex:
    """The BM25 index of these documents: the one saved in ``folder`` if it covers exactly them, else a new one,
    saved by ``save`` (default: into ``folder`` when there is one)."""
    digest = ids_digest(ids, texts)
    saved = LexicalIndex.load(folder) if folder is not None else None
    if saved is not None and saved.count == len(ids) and saved.digest == digest:
        return saved
    log.info("building the BM25 index of %d documents", len(ids))
    built = LexicalIndex.build(texts, ids, saved.params if saved is not None else None)
    if save is not None:
        save(built)
    elif folder is not None:
        built.save(folder)
    return built
