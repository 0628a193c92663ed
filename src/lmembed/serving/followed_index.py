"""The index a server searches, followed on disk: ``lmembed index add`` (or a rebuild, or a rollback) while the server
runs is searched without a restart.

An index keeps its documents and vectors in memory once opened, so a server that opened generation N goes on
answering from N whatever is written to the folder after. :class:`FollowedIndex` looks at the folder's manifest at
most every ``every_s`` seconds, from the search that asks for the index (a ``stat``, no read), and when the manifest
changed opens the folder again on a worker thread with every check a start makes (each data file's sha256, the
model it was built with against the served one, the BM25 files). Searches go on with the generation they have until
the new one is whole; then the next search gets it. A folder that changed into something the server cannot search
(a damaged file, an index of another model, a generation removed by a later write while it was read) is said in the
log, naming the folder and the reason, and the loaded generation stays; the next change is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from lmembed.errors import LmembedError
from lmembed.index import Index
from lmembed.index.manifest import MANIFEST_FILE

log = logging.getLogger(__name__)

#: seconds between two looks at a followed index's manifest (``lmembed serve --index-poll``)
DEFAULT_POLL_S = 2.0


def _stamp(folder: Path) -> tuple[int, int, int] | None:
    """What tells one write of the manifest from another: its inode, size and modification time (None: absent)."""
    try:
        st = (folder / MANIFEST_FILE).stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class FollowedIndex:
    """The index a server searches now (:meth:`current`), opened again when its folder's manifest changes.

    ``open`` opens the folder with every check (by default :meth:`Index.open` against the served model, then
    :meth:`Index.check_lexical`); ``every_s`` 0 never looks again (the index as it was at start). An index with no
    folder (built in memory) is never looked for."""

    def __init__(self, index: Index, open: Callable[[Path], Index], *, every_s: float = DEFAULT_POLL_S) -> None:
        if isinstance(every_s, bool) or not every_s >= 0:
            raise ValueError(f"every_s={every_s!r} must be a number of seconds >= 0")
        self.index = index
        self.every_s = every_s
        self.failure: str | None = None  # why the folder's newest write is not searched (None: it is)
        self._open = open
        self._seen = _stamp(index.path) if index.path is not None else None
        self._looked = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def current(self) -> Index:
        """The index to search: the newest generation opened whole. When ``every_s`` has passed since the last
        look and the manifest changed, opening it begins in the background (call from the event loop)."""
        folder = self.index.path
        if folder is None or not self.every_s or self._task is not None:
            return self.index
        now = time.monotonic()
        if now - self._looked < self.every_s:
            return self.index
        self._looked = now
        stamp = _stamp(folder)
        if stamp is not None and stamp != self._seen:
            self._seen = stamp
            self._task = asyncio.get_running_loop().create_task(self._reopen(folder))
        return self.index

    @property
    def opening(self) -> bool:
        """Whether a newer write of the folder is being opened now."""
        return self._task is not None

    async def _reopen(self, folder: Path) -> None:
        try:
            index = await asyncio.to_thread(self._open, folder)
        except (LmembedError, OSError, ValueError) as exc:
            self.failure = f"{folder}: {exc}"
            log.warning(
                "%s changed, and the change cannot be searched (%s); still searching generation %d",
                folder,
                exc,
                self.index.manifest.generation,
            )
        else:
            old = self.index
            self.index, self.failure = index, None
            log.info(
                "%s: searching generation %d (%d documents; was generation %d, %d documents)",
                folder,
                index.manifest.generation,
                index.count,
                old.manifest.generation,
                old.count,
            )
        finally:
            self._task = None
