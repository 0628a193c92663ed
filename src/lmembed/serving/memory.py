"""Handing freed memory back to the operating system after large requests, refused ones included.

A large request (a million-character query, thousands of rerank pairs) makes the allocator grow its heaps; when
the request is over, glibc keeps most of the freed pages for later, so the server's resident memory stays at its
peak. The batchers trim after their forward passes (:func:`~lmembed.serving.batcher.release_memory`); a request
refused after heavy work (its pairs tokenised, its first stage searched) runs no pass, so the server also keeps a
:class:`MemoryTrimmer`: it counts the work requests did (tokens, or characters / 4) and, when no request is in
flight after at least ``threshold`` of it, collects garbage and trims on a worker thread, at most once per
``min_interval_s`` (a trim due sooner is scheduled for when the interval is over). On a C library without
``malloc_trim`` it does nothing.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

from lmembed.serving.batcher import _libc, release_memory

log = logging.getLogger(__name__)

#: Work (tokens, or characters / 4) after which an idle server trims its heaps.
TRIM_THRESHOLD = 32768


class MemoryTrimmer:
    """Trims the C heap when the server is idle after enough work (see the module doc)."""

    def __init__(self, threshold: int = TRIM_THRESHOLD, min_interval_s: float = 1.0) -> None:
        self.threshold = threshold
        self.min_interval_s = min_interval_s
        self.work = 0
        self.trims = 0  # done so far (for tests and logs)
        self.last = 0.0
        self.pending = False  # a trim is scheduled for when the interval is over
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return _libc() is not None

    def note(self, work: int) -> None:
        """Count ``work`` (tokens, or characters / 4) done since the last trim."""
        self.work += work

    def idle(self) -> None:
        """The server has nothing in flight: trim (on a thread) if enough work was done since the last trim."""
        if self.work < self.threshold or not self.available:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: trim here
            self.work, self.last = 0, time.monotonic()
            self.trim()
            return
        wait = self.last + self.min_interval_s - time.monotonic()
        if wait > 0:  # trimmed a moment ago: trim again once the interval is over (not never)
            if not self.pending:
                self.pending = True
                loop.call_later(wait, self._retry)
            return
        self.work, self.last = 0, time.monotonic()
        loop.run_in_executor(None, self.trim)

    def _retry(self) -> None:
        self.pending = False
        self.idle()

    def trim(self) -> None:
        with self._lock:
            # first the cycles a refused request can leave (an exception's traceback holding its frames' features),
            # which the collector would otherwise free only when allocations resume
            gc.collect()
            if release_memory():
                self.trims += 1
        log.debug("malloc_trim after large requests")
