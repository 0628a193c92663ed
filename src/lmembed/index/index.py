"""``Index``: an Embedder's vectors of a corpus, searchable, persisted as a folder.

    >>> emb = Embedder.from_pretrained("minilm")
    >>> index = Index.build(emb, "../shared/datasets/beir/scifact", "scifact.index", kind="hnsw")
    >>> index.search("what causes cancer?", k=5)          # [Hit(id, score, text, metadata, rank), ...]
    >>> Index.open("scifact.index").load_embedder()       # the model and strategy it was built with

The folder holds the vectors (one of :mod:`lmembed.index.kinds`), the documents
(:mod:`lmembed.index.store`) and ``manifest.json`` (:mod:`lmembed.index.manifest`). Documents are embedded
with ``Embedder.encode_corpus`` in chunks of ``chunk_size`` texts, each chunk one call of the encoding
engine, whose cache stores it: a build that was interrupted and is run again re-encodes only the chunks
that had not finished. Queries are embedded with ``encode_queries`` by an Embedder that matches the
manifest (weights and strategy), so they are never embedded differently from the documents.

One writer at a time: a save refuses to overwrite a folder another process has changed since this
Index read it.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmembed.atomic import TEMP_PREFIX, atomic_write_json, file_lock, sweep_leftovers, temp_path
from lmembed.encoding.cache import ENCODING_VERSION
from lmembed.encoding.chunking import Chunking
from lmembed.encoding.inputs import check_encodable, validate_texts
from lmembed.errors import ConfigError, InputError
from lmembed.index import integrity, kinds
from lmembed.index.chunk_map import ChunkMap
from lmembed.index.corpus import Document, load_corpus
from lmembed.index.errors import IndexExistsError, IndexFormatError, IndexIntegrityError, IndexWriteError
from lmembed.index.kinds import IndexParams, VectorIndex
from lmembed.index.manifest import MANIFEST_FILE, Manifest, check_embedder, describe_model
from lmembed.index.store import DocumentStore
from lmembed.io import read_json, whole_number
from lmembed.lexical.bm25 import LEXICAL_DIR, LexicalIndex, open_lexical, read_saved
from lmembed.lexical.fusion import fuse_rows
from lmembed.protocols import ENCODE_BATCH_SIZE

if TYPE_CHECKING:  # the Embedder pulls in torch
    from lmembed.embedder import Embedder

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 2048
LOCK_FILE = ".lock"
GENERATION_FILE = re.compile(r"^g\d{6}\.")
#: How documents are found: by the Embedder's vectors, by BM25 (:mod:`lmembed.lexical.bm25`), or both fused
#: (:mod:`lmembed.lexical.fusion`) from the ``candidates`` best of each.
SEARCH_MODES = ("dense", "bm25", "hybrid")
DEFAULT_CANDIDATES = 100
#: The chunk aggregations an index serves: each document at its best chunk (or its first); ``mean`` is refused.
INDEX_AGGREGATES = ("maxp", "first")

#: Receives (documents encoded so far, documents to encode) after each chunk.
Progress = Callable[[int, int], None]
CorpusLike = str | Path | Sequence[Document | tuple[str, str] | str]


@dataclass(frozen=True)
class Hit:
    """One search result: the document, its score and its rank (1-based). The score is the cosine similarity to
    the query (on a flat, hnsw or rescored binary index exactly; an ivf-pq index gives its product-quantisation
    estimate of it); with ``mode="bm25"`` or ``"hybrid"`` the BM25 or fused score."""

    id: str
    score: float
    text: str
    rank: int
    metadata: dict[str, Any] = field(default_factory=dict)


def _check_document(doc: Document, i: int) -> Document:
    """``doc`` (``corpus[i]``) if its id and text are strings that can be written as UTF-8 and its metadata a JSON
    object, else an :class:`InputError` naming its position and field (before anything is encoded or written)."""
    for name in ("id", "text"):
        value = getattr(doc, name)
        if not isinstance(value, str):
            raise InputError(f"corpus[{i}].{name} is {type(value).__name__} ({value!r:.40}); it must be a str")
        check_encodable(value, f"corpus[{i}].{name}")
    if not isinstance(doc.metadata, Mapping):
        raise InputError(f"corpus[{i}].metadata is {type(doc.metadata).__name__}; it must be a dict")
    if doc.metadata:
        try:
            json.dumps(dict(doc.metadata), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"corpus[{i}].metadata cannot be saved as JSON ({exc})") from None
    return doc


def as_documents(corpus: CorpusLike, first_row: int = 0) -> list[Document]:
    """Documents from a path (see :func:`load_corpus`), :class:`Document` objects, ``(id, text)`` pairs, or
    plain strings (whose ids are their row numbers in the index, counting from ``first_row``). Anything else (a
    dict, ``None``, an id or a text that is not a str) is an :class:`InputError` naming it."""
    if isinstance(corpus, str | Path):
        return load_corpus(corpus)
    if corpus is None:
        raise InputError("corpus is None; expected a path, or a list of Documents, (id, text) pairs or strings")
    if isinstance(corpus, Mapping):
        raise InputError(
            f"corpus is a {type(corpus).__name__}; pass a list of (id, text) pairs or Documents "
            "(e.g. list(corpus.items()) for {id: text})"
        )
    if hasattr(corpus, "columns"):  # a table iterates over its column names
        raise InputError(
            f"corpus is a {type(corpus).__name__}; pass a list of (id, text) pairs, e.g. "
            "list(zip(frame['id'], frame['text']))"
        )
    if isinstance(corpus, bytes | bytearray | set | frozenset | Document):  # a set's order is no row order
        raise InputError(
            f"corpus is a {type(corpus).__name__}; pass a path or a list of Documents, (id, text) pairs or strings"
        )
    try:
        items = list(corpus)
    except TypeError:
        raise InputError(
            f"corpus is {type(corpus).__name__}; expected a path, or a list of Documents, (id, text) pairs or strings"
        ) from None
    docs = []
    for i, item in enumerate(items):
        if isinstance(item, Document):
            docs.append(_check_document(item, i))
        elif isinstance(item, str):
            docs.append(_check_document(Document(str(first_row + i), item), i))
        elif isinstance(item, tuple | list) and len(item) == 2:
            docs.append(_check_document(Document(item[0], item[1]), i))
        else:
            raise InputError(
                f"corpus[{i}] is {type(item).__name__} ({item!r:.40}); expected a Document, an (id, text) pair or a str"
            )
    return docs


def _encoded_parts(
    embedder: Embedder, texts: Sequence[str], *, batch_size: int, chunk_size: int, progress: Progress | None
) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, vectors)`` of ``chunk_size`` texts at a time, as ``embedder.encode_corpus`` gives them."""
    chunk_size = whole_number(chunk_size, "chunk_size")
    for start in range(0, len(texts), chunk_size):
        stop = min(start + chunk_size, len(texts))
        yield start, embedder.encode_corpus(texts[start:stop], batch_size=batch_size)
        if progress is not None:
            progress(stop, len(texts))


def encode_in_chunks(
    embedder: Embedder, texts: Sequence[str], *, batch_size: int, chunk_size: int, progress: Progress | None = None
) -> np.ndarray:
    """``embedder.encode_corpus`` over ``chunk_size`` texts at a time (each chunk reaches the cache as soon
    as it is done, so an interrupted run loses at most one chunk)."""
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    for start, part in _encoded_parts(embedder, texts, batch_size=batch_size, chunk_size=chunk_size, progress=progress):
        out[start : start + len(part)] = part
    return out


def encode_into(
    vectors: VectorIndex,
    embedder: Embedder,
    texts: Sequence[str],
    *,
    batch_size: int,
    chunk_size: int,
    progress: Progress | None = None,
) -> None:
    """:func:`encode_in_chunks` added to ``vectors``: a kind that :attr:`~lmembed.index.kinds.VectorIndex.streams`
    (flat, binary without rescoring) takes each chunk as it is encoded, so a build holds the index and one chunk,
    never the corpus's vectors twice (three times, before); another takes them all at once, normalised in place."""
    if not vectors.streams:
        vectors.add(
            encode_in_chunks(embedder, texts, batch_size=batch_size, chunk_size=chunk_size, progress=progress), own=True
        )
        return
    for _, part in _encoded_parts(embedder, texts, batch_size=batch_size, chunk_size=chunk_size, progress=progress):
        vectors.add(part, own=True)


def encode_chunks_in_chunks(
    embedder: Embedder,
    texts: Sequence[str],
    chunking: Chunking,
    *,
    batch_size: int,
    chunk_size: int,
    first_row: int = 0,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`encode_in_chunks` for long documents: the chunk vectors of ``texts`` (``chunk_size`` documents per
    call) and each chunk's document row, counted from ``first_row``."""
    chunk_size = whole_number(chunk_size, "chunk_size")
    vectors, rows = [np.empty((0, embedder.dim), dtype=np.float32)], [np.empty(0, dtype=np.int64)]
    for start in range(0, len(texts), chunk_size):
        stop = min(start + chunk_size, len(texts))
        chunked = embedder.encode_corpus(texts[start:stop], batch_size=batch_size, chunking=chunking)
        vectors.append(chunked.vectors)
        rows.append(chunked.doc_index + first_row + start)
        if progress is not None:
            progress(stop, len(texts))
    return np.concatenate(vectors), np.concatenate(rows)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with file_lock(folder / LOCK_FILE):
        yield


#: The errors of a place that cannot be written (read-only, no permission, full): the user's to fix, not a bug.
UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


@contextmanager
def _writing(folder: Path) -> Iterator[None]:
    """Turn a write refused by the file system into an :class:`IndexWriteError` naming the path; the manifest is
    the commit point, so the index stays at the generation it had."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, IndexWriteError) or exc.errno not in UNWRITABLE:
            raise
        raise IndexWriteError(
            f"{exc.filename or folder}: cannot write the index {folder} ({exc.strerror or exc}); it is left as it "
            "was. Work on a copy of the index in a place you can write to"
        ) from exc


def _check_embedder_given(embedder: Any) -> None:
    """Refuse, before anything is read, an ``embedder`` that is not one (``None``, a model name)."""
    if embedder is None:
        raise ConfigError("embedder is None; pass an Embedder (Embedder.from_pretrained(...)) to build an index")
    if not callable(getattr(embedder, "encode_corpus", None)) or not hasattr(embedder, "dim"):
        raise ConfigError(
            f"embedder is a {type(embedder).__name__}, not an Embedder; load one with Embedder.from_pretrained(...)"
        )


def _check_target(path: Path, overwrite: bool) -> None:
    """Refuse, before any encoding, a folder that cannot receive a new index."""
    if path.exists() and not path.is_dir():
        raise IndexExistsError(f"{path} exists and is not a folder")
    if not path.is_dir():
        return
    if (path / MANIFEST_FILE).exists():
        if not overwrite:
            raise IndexExistsError(f"{path} already holds an index; add documents to it, or overwrite it on purpose")
    elif not all(_left_by_a_build(p) for p in path.iterdir()):
        raise IndexExistsError(f"{path} is a folder with other files in it; choose an empty or new folder")


def _left_by_a_build(path: Path) -> bool:
    """Whether ``path``, in a folder without a manifest, is what an interrupted build of an index left there (its
    lock, data files of a generation, temporary files): such a folder is built again, the files replaced."""
    name = path.name
    if name == LOCK_FILE or name.startswith(TEMP_PREFIX):
        return True
    return bool(GENERATION_FILE.match(name)) and path.is_file() and not path.is_symlink()


class Index:
    """Vectors + documents + manifest; see the module doc."""

    def __init__(
        self,
        manifest: Manifest,
        vectors: VectorIndex,
        store: DocumentStore,
        *,
        path: Path | None = None,
        embedder: Embedder | None = None,
        chunks: ChunkMap | None = None,
    ) -> None:
        if chunks is not None:
            chunks.check(vectors.ntotal, len(store), str(path or "index"))
        elif vectors.ntotal != len(store):
            raise IndexFormatError(f"{vectors.ntotal} vectors for {len(store)} documents")
        self.chunks = chunks  # long documents: vector rows are chunks of these document rows
        self.manifest = manifest
        self.vectors = vectors
        self.store = store
        self.path = path
        self.embedder = embedder
        self._lexical: LexicalIndex | None = None
        self._lexical_lock = threading.Lock()  # a server's search threads build it once

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        embedder: Embedder,
        corpus: CorpusLike,
        path: str | Path | None = None,
        *,
        kind: str = "flat",
        dim: int | None = None,
        params: IndexParams | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        overwrite: bool = False,
        progress: Progress | None = None,
        chunking: Chunking | None = None,
        **kind_params: Any,
    ) -> Index:
        """Embed ``corpus`` and index it; with ``path``, save the folder there.

        With ``chunking`` long documents are cut into token windows and every chunk is indexed; searches still
        return documents, each scored by its best chunk (:mod:`lmembed.index.chunk_map`).

        ``kind`` and ``kind_params`` (``hnsw_m=``, ``ef_search=``, ``nlist=``, ``rescore=`` ... see
        :class:`IndexParams`) or a ready ``params``. ``dim`` keeps the first ``dim`` dimensions
        (Matryoshka): the strategy recorded, and used for queries, has that ``dim``.
        """
        _check_embedder_given(embedder)
        chunk_size = whole_number(chunk_size, "chunk_size")
        if params is None:
            params = IndexParams.of(kind, **kind_params)
        elif kind_params or kind != "flat":
            raise TypeError("give either params= or kind=/index parameters, not both")
        if dim is not None:
            dim = whole_number(dim, "dim")
            width = embedder.engine.output_dim(embedder.config)
            if dim > width:
                raise ConfigError(f"dim={dim} is more than the model's {width} dimensions")
            embedder = embedder.with_config(embedder.config.with_options(dim=dim))
        target = Path(path) if path is not None else None
        if target is not None:
            _check_target(target, overwrite)
        params.check_dim(embedder.dim)  # refuse impossible parameters before the encoding starts
        if chunking is not None and chunking.aggregate not in INDEX_AGGREGATES:
            raise ConfigError(
                f"chunking aggregate={chunking.aggregate!r}: an index scores a document by its best chunk; use "
                f"{' or '.join(INDEX_AGGREGATES)}"
            )
        store = DocumentStore(as_documents(corpus))
        vectors = kinds.create(params, embedder.dim)
        chunks = None
        if chunking is not None:
            chunk_vectors, doc_rows = encode_chunks_in_chunks(
                embedder, store.texts, chunking, batch_size=batch_size, chunk_size=chunk_size, progress=progress
            )
            chunks = ChunkMap(doc_rows)
            if len(chunks):
                vectors.add(chunk_vectors, own=True)
        elif len(store):
            encode_into(vectors, embedder, store.texts, batch_size=batch_size, chunk_size=chunk_size, progress=progress)
        manifest = Manifest(
            params=vectors.params,
            dim=embedder.dim,
            count=len(store),
            model=describe_model(embedder),
            chunking=chunking.to_dict() if chunking is not None else None,
        )
        index = cls(manifest, vectors, store, embedder=embedder, chunks=chunks)
        if target is not None:
            index._write(target, replace_existing=overwrite)
        return index

    @classmethod
    def open(
        cls,
        path: str | Path,
        embedder: Embedder | None = None,
        *,
        ef_search: int | None = None,
        nprobe: int | None = None,
        rescore_multiplier: int | None = None,
        verify: bool = True,
    ) -> Index:
        """Reopen a saved index. An ``embedder`` is checked against the manifest (a mismatch is an
        :class:`IndexMismatchError`); without one, :meth:`load_embedder` loads the index's own. The
        query-time parameters may be changed here. ``verify`` checks each data file's sha256 against the
        manifest first (an :class:`~lmembed.index.errors.IndexIntegrityError` names a damaged one)."""
        path = Path(path)
        manifest = Manifest.read(path)
        if manifest.encoding != ENCODING_VERSION:
            logger.warning(
                "%s: its vectors were made by lmembed's input building of version %d, this lmembed's is %d: a query "
                "or an added document may be read slightly otherwise than its documents were (rebuild it with "
                "`lmembed index build ... --overwrite` to match)",
                path / MANIFEST_FILE,
                manifest.encoding,
                ENCODING_VERSION,
            )
        manifest.params = manifest.params.with_search(
            ef_search=ef_search, nprobe=nprobe, rescore_multiplier=rescore_multiplier
        )
        integrity.check_paths(path, manifest)  # every file it names lies inside the folder, verified or not
        if verify:
            integrity.verify(path, manifest)
        try:
            vectors = kinds.load(path, manifest.files, manifest.params, manifest.dim)
        except IndexFormatError as exc:
            raise IndexFormatError(f"{exc}; {integrity.remedy(path)}") from exc
        except (RuntimeError, ValueError, OSError) as exc:
            raise IndexFormatError(f"{path}: cannot read the vectors ({exc}); {integrity.remedy(path)}") from exc
        store = DocumentStore.load(path / manifest.files["documents"])
        chunks = ChunkMap.load(path / manifest.files["chunks"]) if manifest.chunking is not None else None
        vector_count = len(chunks) if chunks is not None else manifest.count
        if len(store) != manifest.count or vectors.ntotal != vector_count:
            raise IndexFormatError(
                f"{path}: the manifest says {manifest.count} documents, the files hold {len(store)} documents "
                f"and {vectors.ntotal} vectors"
            )
        if embedder is not None:
            check_embedder(manifest, embedder, path)
        return cls(manifest, vectors, store, path=path, embedder=embedder, chunks=chunks)

    def load_embedder(
        self, *, device: str = "cpu", cache: bool = False, source: str | None = None, **options: Any
    ) -> Embedder:
        """Load the model the index was built with (from ``source`` when given, else the recorded one), read out
        with the index's strategy, backend, precision and int8 calibration, and bind it.

        ``cache=False`` by default: queries are not worth caching. Raises :class:`IndexMismatchError`
        if the model at that source differs from the one the index was built with."""
        from lmembed.embedder import Embedder  # lazy: torch loads only when a model is needed

        spec = self.manifest.model.load
        if (source or spec.source) is None:
            raise IndexFormatError(
                f"index {self.path} was built with an in-memory model ({self.manifest.model.name}); "
                "pass that Embedder to Index.open"
            )
        if options:  # options given by the caller replace the recorded ones (a check below refuses a mismatch)
            spec = replace(spec, **{k: v for k, v in options.items() if k in spec.loading()})
            options = {k: v for k, v in options.items() if k not in spec.loading()}
        embedder = Embedder.from_spec(spec, source=source, device=device, cache=cache, **options)
        check_embedder(self.manifest, embedder, self.path or "(in memory)")
        self.embedder = embedder
        return embedder

    # ------------------------------------------------------------------ properties
    @property
    def count(self) -> int:
        return len(self.store)

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def kind(self) -> str:
        return self.manifest.params.kind

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"Index({self.kind}, {self.count} documents, dim {self.dim}{where})"

    def info(self) -> dict[str, Any]:
        """The manifest plus sizes: what ``lmembed index info`` shows."""
        data = self.manifest.to_dict()
        data["path"] = str(self.path) if self.path else None
        data["memory_bytes"] = self.vectors.memory_bytes()
        if self.path:
            data["disk_bytes"] = sum((self.path / name).stat().st_size for name in self.manifest.files.values())
        return data

    # ------------------------------------------------------------------ changes
    def add(
        self,
        corpus: CorpusLike,
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        progress: Progress | None = None,
    ) -> int:
        """Embed and append documents (saved at once when the index has a folder); returns how many.

        An id the index already holds, or one given twice, is a :class:`DuplicateIdError` and nothing is
        added."""
        embedder = self._require_embedder()
        chunk_size = whole_number(chunk_size, "chunk_size")
        docs = as_documents(corpus, first_row=self.count)
        self.store.check_new(docs)
        if not docs:
            return 0
        texts = [d.text for d in docs]
        if self.chunks is not None:
            chunking = Chunking(**self.manifest.chunking)  # type: ignore[arg-type]
            vectors, doc_rows = encode_chunks_in_chunks(
                embedder,
                texts,
                chunking,
                batch_size=batch_size,
                chunk_size=chunk_size,
                first_row=self.count,
                progress=progress,
            )
            self.chunks.extend(doc_rows)
        else:  # all encoded before the index changes: a failure half-way leaves it as it was
            vectors = encode_in_chunks(embedder, texts, batch_size=batch_size, chunk_size=chunk_size, progress=progress)
        self.vectors.add(vectors, own=True)
        self.store.extend(docs)
        self._lexical = None  # rebuilt over every document at the next BM25 search
        self.manifest.params = self.vectors.params
        self.manifest.count = self.count
        if self.path is not None:
            self._write(self.path, replace_existing=True)
        return len(docs)

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the index to a folder (a new one, or its own: saving in place is what ``add`` does)."""
        target = Path(path)
        if self.path is None or target.resolve() != self.path.resolve():
            _check_target(target, overwrite)
        self._write(target, replace_existing=True)
        return target

    def _write(self, folder: Path, *, replace_existing: bool) -> None:
        with _writing(folder):
            self._write_locked(folder, replace_existing=replace_existing)

    def _write_locked(self, folder: Path, *, replace_existing: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder):
            on_disk = Manifest.read(folder) if (folder / MANIFEST_FILE).exists() else None
            if on_disk is not None:
                if not replace_existing:
                    raise IndexExistsError(f"{folder} already holds an index")
                ours = self.path is not None and folder.resolve() == self.path.resolve()
                if ours and on_disk.generation != self.manifest.generation:
                    raise IndexFormatError(
                        f"{folder} was changed by another writer since it was opened (generation "
                        f"{on_disk.generation}, this copy has {self.manifest.generation}); reopen it and retry"
                    )
            generation = (on_disk.generation if on_disk else 0) + 1
            stem = f"g{generation:06d}"
            files = {**self.vectors.save(folder, stem), **self.store.save(folder, stem)}
            if self.chunks is not None:
                files.update(self.chunks.save(folder, stem))
            sums = integrity.checksums(folder, list(files.values()))
            # bm25/ keeps the sha256 recorded when it was saved (never one taken now of files nobody checked); a
            # bm25/ they do not cover is derived data no manifest vouches for: removed, rebuilt at the next search
            recorded = (on_disk.checksums if on_disk is not None else None) or {}
            lexical = {n: s for n, s in recorded.items() if integrity.is_lexical(n)}
            if set(integrity.lexical_files(folder)) - set(lexical):
                integrity.drop_lexical(folder)
                lexical = {}
            sums.update(lexical)
            manifest = Manifest(
                **{**self.manifest.__dict__, "generation": generation, "files": files, "checksums": sums}
            )
            if on_disk is not None:
                integrity.keep_previous(folder, folder / MANIFEST_FILE)
            manifest.write(folder)
            kept = set(files.values()) | (set(on_disk.files.values()) if on_disk is not None else set())
            for stale in folder.iterdir():
                old = GENERATION_FILE.match(stale.name) and stale.name not in kept
                if (old or stale.name.startswith(TEMP_PREFIX)) and (stale.is_symlink() or not stale.is_dir()):
                    stale.unlink(missing_ok=True)
        self.manifest = manifest
        self.path = folder

    # ------------------------------------------------------------------ integrity
    @staticmethod
    def verify(path: str | Path) -> Manifest:
        """Check every data file of the index at ``path`` against its manifest's sha256, then read them all
        back; returns the manifest, or raises an :class:`IndexFormatError` naming the file and what to do."""
        path = Path(path)
        manifest = Manifest.read(path)
        integrity.verify(path, manifest)
        Index.open(path, verify=False)  # the files hash right; they must also read back whole
        Index.check_lexical(path)
        return manifest

    @staticmethod
    def check_lexical(path: str | Path) -> None:
        """Read back the BM25 files saved in the index at ``path``, if any, through the one reader that checks them
        (:func:`~lmembed.lexical.bm25.read_saved`, which a BM25 search's load also goes through; it needs numpy, not
        bm25s, and builds no retriever to throw away): a server checks them before it answers, so a damaged file
        stops it at start, not at its first BM25 search."""
        path = Path(path)
        if integrity.lexical_files(path):
            read_saved(path)

    @staticmethod
    def restore_previous(path: str | Path) -> Manifest:
        """Make the previous generation (kept by the last save) current again; the newer one's additions are
        dropped. Its files are verified first; returns its manifest."""
        path = Path(path)
        previous_file = path / integrity.PREVIOUS_MANIFEST
        if not previous_file.is_file():
            raise IndexFormatError(f"{path}: no previous generation is kept ({previous_file} is missing)")
        with _writing(path), _locked(path):
            raw = read_json(previous_file, error=IndexFormatError, what="previous manifest")
            previous = Manifest.from_dict(raw, str(previous_file))
            # bm25/ was saved for the newer generation: removed, and rebuilt (with its checksums) when next searched
            integrity.drop_lexical(path)
            if previous.checksums is not None:
                previous.checksums = {n: s for n, s in previous.checksums.items() if not integrity.is_lexical(n)}
                raw["checksums"] = dict(previous.checksums)
            damaged = integrity.check_files(path, previous, integrity.PREVIOUS_MANIFEST)
            if damaged:
                raise IndexIntegrityError(
                    f"{', '.join(str(path / n) for n in damaged)}: the previous generation is damaged too; rebuild "
                    f"the index (`lmembed index build ... -o {path} --overwrite`)"
                )
            atomic_write_json(path / MANIFEST_FILE, raw)
            previous_file.unlink()
        return previous

    # ------------------------------------------------------------------ search
    def _require_embedder(self) -> Embedder:
        if self.embedder is None:
            raise ConfigError("this Index has no Embedder: pass one to Index.open, or call load_embedder() first")
        return self.embedder

    def embed_queries(
        self, queries: Sequence[str], *, instruction: str | None = None, batch_size: int = ENCODE_BATCH_SIZE
    ):
        """Query vectors, embedded as the index's strategy embeds queries (``encode_queries``)."""
        return self._require_embedder().encode_queries(list(queries), instruction=instruction, batch_size=batch_size)

    def search(
        self,
        query: str,
        k: int = 10,
        *,
        instruction: str | None = None,
        mode: str = "dense",
        fusion: str = "rrf",
        candidates: int = DEFAULT_CANDIDATES,
    ) -> list[Hit]:
        """The ``k`` documents most similar to one query (``mode``, ``fusion``, ``candidates``: see
        :meth:`search_rows`)."""
        if not isinstance(query, str):
            raise InputError(f"query must be a str, got {type(query).__name__}; use search_batch for several")
        hits = self.search_batch([query], k, instruction=instruction, mode=mode, fusion=fusion, candidates=candidates)
        return hits[0]

    def search_batch(
        self,
        queries: Sequence[str],
        k: int = 10,
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
        mode: str = "dense",
        fusion: str = "rrf",
        candidates: int = DEFAULT_CANDIDATES,
        vectors: np.ndarray | None = None,
    ) -> list[list[Hit]]:
        """The ``k`` best documents of each query, in query order (``mode``, ``fusion``, ``candidates``,
        ``vectors``: see :meth:`search_rows`)."""
        how = {"mode": mode, "fusion": fusion, "candidates": candidates, "vectors": vectors}
        return self.hits(*self.search_rows(queries, k, instruction=instruction, batch_size=batch_size, **how))

    @property
    def lexical(self) -> LexicalIndex:
        """The BM25 index of the same documents: the one saved in the folder once its files hash as the manifest
        records, or one built on first use and saved with its checksums (:meth:`_save_lexical`)."""
        with self._lexical_lock:
            if self._lexical is None or self._lexical.count != self.count:
                self._lexical = self._open_lexical()
            return self._lexical

    def _open_lexical(self) -> LexicalIndex:
        folder = self.path
        if folder is None:
            return open_lexical(None, self.store.texts, self.store.ids)
        on_disk = Manifest.read(folder)  # bm25/ may have been saved, and its sha256 recorded, by another process
        if on_disk.generation != self.manifest.generation:  # a newer generation's bm25/ is not this copy's
            return LexicalIndex.build(self.store.texts, self.store.ids)
        integrity.verify_lexical(folder, on_disk)
        return open_lexical(folder, self.store.texts, self.store.ids, save=self._save_lexical)

    def _save_lexical(self, lexical: LexicalIndex) -> None:
        """Save a BM25 index just built into ``bm25/`` and record each of its files' sha256 in the manifest (the
        same generation). Skipped when another writer changed the folder since it was opened; where the folder
        cannot be written, the BM25 index serves from memory only.

        The files are written aside first and their sha256 recorded before they are renamed into ``bm25/``, the old
        one removed before that record: a save killed at any point leaves either no ``bm25/`` (built again at the
        next BM25 search) or one the manifest vouches for, never one it does not know."""
        folder = self.path
        if folder is None:
            return
        try:
            with _locked(folder):
                on_disk = Manifest.read(folder)
                if on_disk.generation != self.manifest.generation:
                    return
                if on_disk.checksums is None:  # an index written before checksums: its next save adds them all
                    lexical.save(folder)
                    return
                target = folder / LEXICAL_DIR
                sweep_leftovers(target)  # a save killed before on this machine
                staging = temp_path(target)
                try:
                    lexical.save(staging)
                    sums = {n: s for n, s in on_disk.checksums.items() if not integrity.is_lexical(n)}
                    on_disk.checksums = {**sums, **integrity.lexical_checksums(staging)}
                    integrity.drop_lexical(folder)
                    on_disk.write(folder)
                    (staging / LEXICAL_DIR).rename(target)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                self.manifest.checksums = on_disk.checksums
        except OSError as exc:
            logger.warning("%s: the BM25 index is kept in memory only (%s)", folder, exc)

    def search_rows(
        self,
        queries: Sequence[str],
        k: int = 10,
        *,
        mode: str = "dense",
        fusion: str = "rrf",
        candidates: int = DEFAULT_CANDIDATES,
        vectors: np.ndarray | None = None,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)`` of each query's ``k`` best documents. ``mode``: ``dense`` (cosine of the Embedder's
        vectors), ``bm25``, or ``hybrid``: the ``max(k, candidates)`` best of each, fused by ``fusion`` (``rrf`` or
        ``minmax``; the score is then the fused one). ``vectors``: the queries' vectors, if already embedded.

        ``k`` and ``candidates`` beyond the number of documents are searched as that number (the hits are the same),
        so the arrays have ``min(k, documents)`` columns (at least 1), misses being row ``-1``."""
        if mode not in SEARCH_MODES:
            raise ConfigError(f"mode={mode!r} is unknown; choose one of {', '.join(SEARCH_MODES)}")
        k = self._depth(whole_number(k, "k"))
        candidates = self._depth(whole_number(candidates, "candidates"))
        queries = validate_texts(queries, "queries")
        if mode == "bm25":
            return self.lexical.search(queries, k)
        if vectors is None:
            vectors = self.embed_queries(queries, instruction=instruction, batch_size=batch_size)
        depth = k if mode == "dense" else max(k, candidates)
        dense = self.search_vectors(vectors, depth)
        if mode == "dense":
            return dense
        ids = self.store.ids  # equal fused scores in trec_eval's order (id descending): served as evaluated
        return fuse_rows([dense, self.lexical.search(queries, depth)], k, fusion, tie_key=ids.__getitem__)

    def search_vectors(self, vectors: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, rows)`` for query vectors embedded elsewhere (they must be this index's kind of vector): an
        ``(n, dim)`` array of finite numbers. ``k`` beyond the number of documents is searched as that number."""
        k = self._depth(whole_number(k, "k"))
        try:
            vectors = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"vectors must be an (n, {self.dim}) array of numbers, got {type(vectors).__name__} ({exc})"
            ) from None
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InputError(
                f"vectors must have shape (n, {self.dim}) (this index holds {self.dim}-dimensional vectors), "
                f"got shape {vectors.shape}"
            )
        if not np.isfinite(vectors).all():
            bad = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
            raise InputError(f"vectors[{bad}] holds NaN or infinite values; every query vector must be finite")
        if self.chunks is not None:  # chunks of long documents: each document at its best chunk
            return self.chunks.search(self.vectors.search, vectors, k)
        return self.vectors.search(vectors, k)

    def _depth(self, k: int) -> int:
        """``k`` capped at the number of documents (at least 1): no search allocates room for hits that cannot be."""
        return min(k, max(self.count, 1))

    def hits(self, scores: np.ndarray, rows: np.ndarray) -> list[list[Hit]]:
        """Search results as :class:`Hit` lists (misses dropped)."""
        results = []
        for score_row, index_row in zip(scores, rows, strict=True):
            hits = []
            for rank, (score, row) in enumerate(zip(score_row.tolist(), index_row.tolist(), strict=True), start=1):
                if row < 0:
                    break
                doc = self.store.document(row)
                hits.append(Hit(doc.id, score, doc.text, rank, doc.metadata))
            results.append(hits)
        return results
