"""Persistent vector indexes over an Embedder's vectors: build from a corpus (through the engine and its
cache), reopen safely, add documents, search.

=============== =====================================================================
module          holds
=============== =====================================================================
``index``       :class:`Index`: the persisted folder (vectors + documents + manifest)
``kinds``       the FAISS index kinds (``flat``, ``hnsw``, ``ivf-pq``, ``binary``) and their parameters
``store``       the documents of an index: ids, texts and metadata, row-aligned with the vectors
``manifest``    the manifest: strategy, weights fingerprint, build parameters; the mismatch check
``integrity``   each data file's sha256, verified on open; the previous generation kept for a restore
``corpus``      reading documents and queries (BEIR folder, JSON lines, text file)
``errors``      the index's error classes
=============== =====================================================================
"""

from lmembed.index.corpus import Document, load_corpus, load_queries
from lmembed.index.errors import (
    DuplicateIdError,
    IndexExistsError,
    IndexFormatError,
    IndexIntegrityError,
    IndexMismatchError,
)
from lmembed.index.index import Hit, Index
from lmembed.index.kinds import KINDS, IndexParams

__all__ = [
    "KINDS",
    "Document",
    "DuplicateIdError",
    "Hit",
    "Index",
    "IndexExistsError",
    "IndexFormatError",
    "IndexIntegrityError",
    "IndexMismatchError",
    "IndexParams",
    "load_corpus",
    "load_queries",
]
