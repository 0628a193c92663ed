"""The metric@k curves of retrieval results over the cut-offs (the decoder-vs-encoder paper's view).

:func:`cutoff_curves` reads, from saved retrieval results, each model/strategy's nDCG@k (or another curve
metric) at every cut-off the result holds; :func:`plot_cutoff_curves` draws one panel per task with one line
per model/strategy against log k, labelled with the curve's normalised area (``cutoff_auc_<metric>``, see
:mod:`lmembed.evaluation.metrics`). ``lmembed report`` writes the figure as ``cutoffs.png`` when there is
at least one retrieval result with two or more cut-offs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from lmembed.atomic import atomic_savefig
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.metrics import cutoff_auc
from lmembed.evaluation.results import strategy_label

Curve = tuple[list[int], list[float]]  # cut-offs, metric values


def result_curve(result: TaskResult, metric: str = "ndcg") -> Curve | None:
    """``(k values, metric@k)`` of one result in increasing k, or ``None`` with fewer than two cut-offs."""
    pattern = re.compile(rf"^{re.escape(metric)}_at_(\d+)$")
    points = sorted((int(m.group(1)), float(v)) for key, v in result.scores.items() if (m := pattern.match(key)))
    if len(points) < 2:
        return None
    return [k for k, _ in points], [v for _, v in points]


def cutoff_curves(results: Iterable[TaskResult], metric: str = "ndcg") -> dict[str, dict[str, Curve]]:
    """Task name → ``"model / strategy"`` → curve, for every result that has one (first one seen wins)."""
    out: dict[str, dict[str, Curve]] = {}
    for result in results:
        curve = result_curve(result, metric)
        if curve is None:
            continue
        label = f"{result.model_name or 'unknown'} / {strategy_label(result)}"
        out.setdefault(result.task_name, {}).setdefault(label, curve)
    return out


def plot_cutoff_curves(results: Iterable[TaskResult], path: Path, *, metric: str = "ndcg") -> Path | None:
    """One panel per task, one line per model/strategy; ``None`` (nothing written) without any curve."""
    curves = cutoff_curves(results, metric)
    if not curves:
        return None
    # lazy: matplotlib loads only when a chart is drawn (keeps the CLI's start fast)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = sorted(curves)
    fig = Figure(figsize=(4.6 * len(tasks) + 1.0, 4.2))
    FigureCanvasAgg(fig)
    for i, task in enumerate(tasks, start=1):
        ax = fig.add_subplot(1, len(tasks), i)
        for label, (ks, values) in sorted(curves[task].items()):
            area = cutoff_auc(values, ks)
            ax.plot(ks, [100.0 * v for v in values], marker=".", label=f"{label} (area {100 * area:.1f})")
        ax.set_xscale("log")
        ax.set_xlabel("k (log scale)")
        ax.set_ylabel(f"{metric}@k × 100")
        ax.set_title(task, fontsize=10)
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return atomic_savefig(fig, path, dpi=120)
