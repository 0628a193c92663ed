"""The errors an index raises for a user-facing problem (all :class:`~lmembed.errors.LmembedError`)."""

from __future__ import annotations

from lmembed.errors import LmembedError, UnsafeFileError


class IndexFormatError(LmembedError, ValueError):
    """A folder is not a readable lmembed index (no manifest, a damaged one, a missing data file)."""


class IndexMismatchError(LmembedError, ValueError):
    """An Embedder whose weights or strategy differ from those the index's vectors were built with."""


class DuplicateIdError(LmembedError, ValueError):
    """A document id given twice, or one that the index already holds."""


class IndexIntegrityError(IndexFormatError):
    """An index data file whose sha256 differs from the one its manifest recorded (damaged or changed)."""


class IndexPathError(IndexFormatError, UnsafeFileError):
    """A manifest that names a file outside its index folder (an absolute path, a ``..``, a link to elsewhere)."""


class IndexWriteError(LmembedError, OSError):
    """An index folder that cannot be written (read-only, no permission, disk full); the index is left as it was."""


class IndexExistsError(LmembedError, FileExistsError):
    """A folder an index would be written to that already holds one, or other files: nothing is overwritten."""
