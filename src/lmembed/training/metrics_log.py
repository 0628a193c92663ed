"""What a training loop reports while it runs: ``metrics.jsonl``, the loss-curve PNG and the progress bar.

:class:`MetricsLog` appends one JSON object per logged step or evaluation to ``metrics.jsonl`` (main
process only) and keeps the records for :func:`plot_loss_curve`, which draws the training loss (raw
and smoothed) and any dev nDCG@10 to ``loss_curve.png``. :func:`progress_bar` is the rich bar the
contrastive trainer shows. Contrastive runs and pre-training stages write the same records.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lmembed import terminal
from lmembed.atomic import atomic_savefig, atomic_write_text
from lmembed.io import loads_json

__all__ = ["CURVE_FILE", "METRICS_FILE", "MetricsLog", "plot_loss_curve", "progress_bar"]

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss_curve.png"


class MetricsLog:
    """Appends JSON records to ``metrics.jsonl`` (main process only) and keeps them for the loss curve."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        self._plotted_at = -math.inf

    def resume_at(self, step: int) -> None:
        """Keep the records up to ``step``; later ones came from a run that was killed after its checkpoint."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = loads_json(line)
            except ValueError:
                continue  # a line cut short by the kill
            if isinstance(record, dict) and isinstance(record.get("step", 0), int) and record.get("step", 0) <= step:
                kept.append(record)
        self.records = kept
        if self.enabled:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()

    def plot(self, path: Path, *, every_s: float = 0.0) -> None:
        """Redraw the loss curve; with ``every_s`` only if the last drawing is older than that."""
        now = time.monotonic()
        if not self.enabled or (every_s and now - self._plotted_at < every_s):
            return
        plot_loss_curve(self.records, path)
        self._plotted_at = now


def plot_loss_curve(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Training loss per step (raw and smoothed) and, if any, dev nDCG@10 on a second axis."""
    import matplotlib  # lazy: matplotlib is heavy and only needed once a curve is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: see above; after use("Agg")

    steps = [r["step"] for r in records if "loss" in r]
    losses = [r["loss"] for r in records if "loss" in r]
    if not steps:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=1, label="loss")
    ax.plot(steps, _smooth(losses), color="tab:blue", linewidth=2, label="loss (smoothed)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    evals = [r for r in records if "eval" in r]
    if evals:
        right = ax.twinx()
        for name in evals[-1]["eval"]:
            points = [(r["step"], r["eval"][name]) for r in evals if name in r["eval"]]
            right.plot(*zip(*points, strict=True), marker="o", label=f"{name} nDCG@10")
        right.set_ylabel("dev nDCG@10")
        right.legend(loc="upper right", fontsize="small")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)


def _smooth(values: Sequence[float], weight: float = 0.9) -> list[float]:
    out, running = [], None
    for v in values:
        running = v if running is None else weight * running + (1 - weight) * v
        out.append(running)
    return out


@contextmanager
def progress_bar(enabled: bool, total: int, start: int) -> Iterator[Any]:
    """A rich progress bar showing loss, learning rate and rows/s; yields ``update(**fields)``."""
    if not enabled:
        yield lambda **_: None
        return
    columns = [
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]} lr {task.fields[lr]} {task.fields[rps]} rows/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with terminal.progress(*columns, label="training", unit="steps") as progress:
        task = progress.add_task("train", total=total, completed=start, loss="-", lr="-", rps="-")
        yield lambda **fields: progress.update(task, **fields)
