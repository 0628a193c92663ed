"""Lexical retrieval and fusion: BM25 over a corpus (through ``bm25s``) and the fusion of ranked runs, used by
:class:`lmembed.index.Index`'s ``bm25``/``hybrid`` search modes and by two-stage evaluation.

=========== ===========================================================================================
module      holds
=========== ===========================================================================================
``bm25``    :class:`LexicalIndex`: BM25 scores equal to bm25s's own, saved in an index folder's ``bm25/``
``fusion``  reciprocal rank fusion and min-max score fusion of runs (:func:`fuse`, :func:`fuse_rows`)
=========== ===========================================================================================
"""

from lmembed.lexical.bm25 import LexicalIndex, LexicalIndexError, LexicalParams, open_lexical
from lmembed.lexical.fusion import FUSIONS, fuse, fuse_rows

__all__ = ["FUSIONS", "LexicalIndex", "LexicalIndexError", "LexicalParams", "fuse", "fuse_rows", "open_lexical"]
