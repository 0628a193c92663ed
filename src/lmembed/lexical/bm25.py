"""``LexicalIndex``: BM25 over an index's documents, through ``bm25s``, row-aligned with the vectors.

Texts are lower-cased, split into words of two or more characters and stripped of English stop words (bm25s'
tokenizer; no stemming), and scored with Lucene's BM25 (``k1=1.5``, ``b=0.75``): the scores are bm25s' own.
A query word the corpus never holds is ignored; a document that shares no word with the query is not a hit.

Persisted in ``bm25/`` inside an index folder (:class:`lmembed.index.Index` keeps it beside the vectors, and
records the sha256 of each of its files in the index's manifest), with ``lexical.json`` recording which documents
it covers (their count and a digest of their ids and texts). :func:`open_lexical` reuses it while the index holds
exactly those documents, and rebuilds it (and saves it, when it can) after documents were added. ``bm25/`` must be
a folder inside the index folder, not a link leading elsewhere (:func:`lmembed.paths.inside`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_folder, atomic_write_text
from lmembed.errors import LmembedError
from lmembed.io import loads_json
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
        """The BM25 index saved in ``folder/bm25``, or None when there is none."""
        source = folder / LEXICAL_DIR
        if not source.exists() and not source.is_symlink():
            return None
        inside(folder, LEXICAL_DIR, file=folder, field="the BM25 index", error=LexicalIndexError)
        record_file = inside(
            folder, f"{LEXICAL_DIR}/{LEXICAL_FILE}", file=folder, field="the BM25 index", error=LexicalIndexError
        )
        if not record_file.is_file():
            return None
        bm25s, Tokenizer = _bm25s()
        try:
            record = loads_json(record_file.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or record.get("format") != FORMAT_VERSION:  # older: ids-only digest
                return None
            params = LexicalParams(**record["params"])
            retriever = bm25s.BM25.load(str(source), show_progress=False)
            tokenizer = Tokenizer(stopwords=params.stopwords)
            tokenizer.load_vocab(str(source))
            tokenizer.load_stopwords(str(source))
            return cls(retriever, tokenizer, params, int(record["count"]), str(record["ids"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, EOFError, OSError) as exc:
            raise LexicalIndexError(
                f"{source}: cannot read the BM25 index ({exc}); delete the folder to rebuild it"
            ) from exc


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
