"""Progress of a sharded job across its workers: shards done, texts done, texts per second, time left."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """One snapshot, taken each time a shard finishes (``stage`` ``"encode"``) or the plan pass ends (``"plan"``)."""

    stage: str
    shards_done: int
    shards_total: int
    rows_done: int
    rows_total: int
    elapsed_s: float
    rows_per_s: float
    eta_s: float | None
    workers: int

    def line(self) -> str:
        """A one-line summary, e.g. ``encode: 5/12 shards, 20,480/49,152 texts, 812 texts/s, ETA 35 s, 2 workers``."""
        eta = "-" if self.eta_s is None else f"{self.eta_s:,.0f} s"
        return (
            f"{self.stage}: {self.shards_done}/{self.shards_total} shards, "
            f"{self.rows_done:,}/{self.rows_total:,} texts, "
            f"{self.rows_per_s:,.0f} texts/s, ETA {eta}, {self.workers} worker{'s' if self.workers != 1 else ''}"
        )


ProgressCallback = Callable[[Progress], None]


def log_progress(progress: Progress) -> None:
    """The default callback: one INFO log line per snapshot."""
    log.info("%s", progress.line())


@dataclass
class ProgressTracker:
    """Counts finished shards; the rate counts only texts encoded by this run (resumed shards are free)."""

    shards_total: int
    rows_total: int
    shards_done: int
    rows_done: int
    workers: int
    callback: ProgressCallback | None = None
    start: float = field(default_factory=time.perf_counter)
    rows_this_run: int = 0
    worker_ids: set[int] = field(default_factory=set)

    def shard_finished(self, rows: int, worker: int | None = None) -> Progress:
        self.shards_done += 1
        self.rows_done += rows
        self.rows_this_run += rows
        if worker is not None:
            self.worker_ids.add(worker)
        snapshot = self.snapshot("encode")
        if self.callback is not None:
            self.callback(snapshot)
        return snapshot

    def snapshot(self, stage: str) -> Progress:
        elapsed = time.perf_counter() - self.start
        rate = self.rows_this_run / elapsed if elapsed > 0 else 0.0
        left = self.rows_total - self.rows_done
        eta = left / rate if rate > 0 else None
        return Progress(
            stage=stage,
            shards_done=self.shards_done,
            shards_total=self.shards_total,
            rows_done=self.rows_done,
            rows_total=self.rows_total,
            elapsed_s=elapsed,
            rows_per_s=rate,
            eta_s=eta,
            workers=self.workers,
        )
