"""Output that reads both on a terminal and in a log file: consoles and progress.

On a terminal, :func:`progress` is a rich progress bar and :func:`console` rich's own console. When the stream
is not a terminal (``lmembed eval > run.log 2>&1``, a batch job, CI), a bar would show nothing until the end
and rich would wrap tables and Markdown at 80 columns; instead:

* :func:`progress` returns a :class:`LogProgress` that prints a plain line as work advances, at most one
  every ``LOG_EVERY_S`` seconds (and one at the end): ``label: done/total (pct), rate/s, elapsed, ETA``, with
  any extra fields (where items differ in cost, texts of different lengths, the count is of items while the
  percentage and the ETA are of the work: an encode that runs its longest texts first does not promise too late
  an end); and, while a step takes longer than ``HEARTBEAT_S`` (one slow batch, a long forward pass), a line
  every ``HEARTBEAT_S`` seconds saying for how long nothing has finished, so a log never goes silent for long;
* :func:`console` is as wide as the content (``LOG_WIDTH`` columns, no soft wrapping), unless ``COLUMNS`` is
  set, which rich honours as ever.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import Progress

#: Seconds between two progress lines in a log.
LOG_EVERY_S = 5.0
#: Seconds without a finished step after which a log is told that the work goes on (and again each as long).
HEARTBEAT_S = 60.0
#: Task fields that count what a task's work is made of when items differ in cost (texts of different lengths):
#: lines and bars show ``items``/``items_total`` while the percentage and the time left follow the work.
ITEMS, ITEMS_TOTAL = "items", "items_total"
#: Width of a console that writes to a file or pipe: a table is never wrapped at 80 columns in a log.
LOG_WIDTH = 400


def is_terminal(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default: stderr) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(*, stderr: bool = False, **options: Any) -> Console:
    """A rich console for stdout (or stderr); full width, without wrapping, when it writes to a log."""
    stream = sys.stderr if stderr else sys.stdout
    if not is_terminal(stream) and "COLUMNS" not in os.environ:
        options.setdefault("width", LOG_WIDTH)
        options.setdefault("soft_wrap", True)
    return Console(stderr=stderr, **options)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class LogProgress:
    """The part of :class:`rich.progress.Progress` lmembed uses, as plain lines in a log (see the module doc)."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        every_s: float | None = None,
        unit: str = "",
        clock: Any = time.monotonic,
        heartbeat_s: float | None = None,
    ) -> None:
        self.label = label
        self.stream = stream
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s  # 0: none
        self.unit = f" {unit}" if unit else ""
        self.clock = clock
        self.tasks: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the heartbeat thread reads what the work's thread updates
        self._stopped = threading.Event()
        self._heart: threading.Thread | None = None

    def __enter__(self) -> LogProgress:
        if self.heartbeat_s > 0:
            self._stopped.clear()
            self._heart = threading.Thread(target=self._beat, name="lmembed-progress-heartbeat", daemon=True)
            self._heart.start()
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self._stopped.set()
        if self._heart is not None:
            self._heart.join()
            self._heart = None
        if kind is None:
            with self._lock:
                for task_id in self.tasks:
                    self._emit(task_id, final=True)

    def _beat(self) -> None:
        """Every quarter of ``heartbeat_s``, a line for each unfinished task whose last step finished (and whose
        last line was printed) at least ``heartbeat_s`` ago."""
        while not self._stopped.wait(self.heartbeat_s / 4):
            with self._lock:
                now = self.clock()
                for task_id, task in self.tasks.items():
                    done = task["total"] is not None and task["completed"] >= task["total"]
                    if not done and now - task["last"] >= self.heartbeat_s:
                        quiet = _duration(now - task["changed"])
                        self._emit(task_id, note=f"still working: nothing finished for {quiet}")

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields: Any) -> int:
        task_id = len(self.tasks)
        now = self.clock()
        self.tasks[task_id] = {
            "total": total,
            "completed": completed,
            "start_done": completed,
            "start": now,
            "last": now,
            "changed": now,
            "printed": None,
            "start_items": fields.get(ITEMS, 0),
            "fields": fields,
        }
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(
        self,
        task_id: int,
        *,
        completed: float | None = None,
        advance: float | None = None,
        total: float | None = None,
        **fields: Any,
    ) -> None:
        with self._lock:
            task = self.tasks[task_id]
            before = task["completed"]
            if total is not None:
                task["total"] = total
            if completed is not None:
                task["completed"] = completed
            if advance is not None:
                task["completed"] += advance
            if task["completed"] != before:
                task["changed"] = self.clock()
            task["fields"].update(fields)
            if self.clock() - task["last"] >= self.every_s:
                self._emit(task_id)

    def line(self, task_id: int) -> str:
        """``label: done/total (pct), rate/s, elapsed, ETA`` and the task's extra fields.

        A task whose fields hold ``items`` and ``items_total`` (see the module doc: work that is not the same for
        every item) counts and rates items, while its percentage and ETA follow ``completed``/``total``."""
        task = self.tasks[task_id]
        fields = dict(task["fields"])
        done, total = task["completed"], task["total"]
        elapsed = max(self.clock() - task["start"], 1e-9)
        work_rate = (done - task["start_done"]) / elapsed
        shown, shown_total, rate = done, total, work_rate
        if ITEMS in fields and ITEMS_TOTAL in fields:
            shown, shown_total = fields.pop(ITEMS), fields.pop(ITEMS_TOTAL)
            rate = (shown - task["start_items"]) / elapsed
        parts = [f"{shown:,.0f}/{shown_total:,.0f}{self.unit}" if shown_total else f"{shown:,.0f}{self.unit}"]
        if total:
            parts[0] += f" ({100 * done / total:.0f}%)"
        parts.append(f"{rate:,.1f}{self.unit}/s")
        parts.append(f"elapsed {_duration(elapsed)}")
        if total and work_rate > 0 and done < total:
            parts.append(f"ETA {_duration((total - done) / work_rate)}")
        parts += [f"{key} {value}" for key, value in fields.items()]
        return f"{self.label}: " + ", ".join(parts)

    def _emit(self, task_id: int, *, final: bool = False, note: str = "") -> None:
        task = self.tasks[task_id]
        task["last"] = self.clock()
        if final and (task["printed"] == task["completed"] or task["last"] - task["start"] < self.every_s):
            return  # nothing new, or a task too short to need a line in a log
        task["printed"] = task["completed"]
        line = self.line(task_id) + (f" ({note})" if note else "")
        print(line, file=self.stream or sys.stderr, flush=True)


def progress(*columns: Any, label: str, unit: str = "", **options: Any) -> Progress | LogProgress:
    """A rich progress bar with ``columns`` on a terminal; a :class:`LogProgress` printing ``label`` lines
    every few seconds otherwise (``options`` go to rich's ``Progress``)."""
    stream = options["console"].file if "console" in options else sys.stderr
    if is_terminal(stream):
        return Progress(*columns, **options)
    return LogProgress(label, stream=stream, unit=unit)
