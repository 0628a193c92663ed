"""Compare saved results: Markdown tables and a bar chart.

:func:`render_report` reads every task result under a folder (any task type; only each task's
``main_score`` is used), builds one row per model/strategy and one column per task, grouped by
task type, with per-type means and overall means, and writes ``report.md``, ``report.png`` and
``report.json`` into an output folder, plus ``cutoffs.png`` (nDCG@k over the cut-offs, with each curve's
normalised area, :mod:`lmembed.evaluation.cutoff_curves`) where retrieval results hold several cut-offs.
(A folder written by ``lmembed experiment`` is rendered by :mod:`lmembed.experiments.report`, which builds
the same :class:`Report` with the arms as rows.)
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lmembed.atomic import atomic_savefig, atomic_write_text
from lmembed.errors import LmembedError
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.cutoff_curves import plot_cutoff_curves
from lmembed.evaluation.results import (
    markdown_cell,
    scan_results,
    strategy_digest,
    strategy_label,
    strategy_slug,
    variant_tag,
)

logger = logging.getLogger(__name__)

TYPE_ORDER = ["Retrieval", "STS", "Classification", "Clustering", "PairClassification", "Reranking"]
MISSING = "–"

Row = tuple[str, str]  # (model name, strategy slug)
#: what a sample's task type is marked with: a task run on a subset of its data is named ``Task[500 docs]``
#: (``RetrievalTask.subsample``); it is a type of its own, kept out of the overall means
SAMPLES = " (samples)"


def task_type_of(result: TaskResult) -> str:
    """The type ``result`` is grouped under: its task's, marked as samples when the task ran on a subset."""
    name = result.task_name
    return result.task_type + SAMPLES if name.endswith("]") and "[" in name else result.task_type


@dataclass
class ScoreTable:
    """Main scores arranged as rows (model, strategy) × tasks, tasks grouped by type."""

    rows: list[Row]
    task_types: dict[str, list[str]]  # type → task names, in display order
    scores: dict[Row, dict[str, float]]  # row → task → main score

    def type_mean(self, row: Row, task_type: str) -> tuple[float | None, bool]:
        """Mean over the type's tasks the row has, and whether it has all of them."""
        return _mean([self.scores[row].get(t) for t in self.task_types[task_type]])

    @property
    def whole_types(self) -> list[str]:
        """The task types of whole tasks: the overall means are over these (a sample's scores are not comparable
        with its task's, :data:`SAMPLES`)."""
        return [t for t in self.task_types if not t.endswith(SAMPLES)]

    def task_mean(self, row: Row) -> tuple[float | None, bool]:
        return _mean([self.scores[row].get(t) for kind in self.whole_types for t in self.task_types[kind]])

    def mean_of_type_means(self, row: Row) -> tuple[float | None, bool]:
        means = [self.type_mean(row, t) for t in self.whole_types]
        value, complete = _mean([m for m, _ in means])
        return value, complete and all(c for _, c in means)


@dataclass
class Report:
    """What :func:`render_report` produced."""

    markdown: str
    table: ScoreTable
    files: dict[str, Path] = field(default_factory=dict)


def _mean(values: list[float | None]) -> tuple[float | None, bool]:
    present = [v for v in values if v is not None]
    if not present:
        return None, False
    return sum(present) / len(present), len(present) == len(values)


def type_rank(task_type: str) -> tuple[int, int, str]:
    """Sort key of a task type: MTEB's usual order (``TYPE_ORDER``), then any other type by name; each type's
    samples after all whole types."""
    whole = task_type.removesuffix(SAMPLES)
    return (whole != task_type, TYPE_ORDER.index(whole) if whole in TYPE_ORDER else len(TYPE_ORDER), whole)


def _newest_first(results: Iterable[TaskResult]) -> list[TaskResult]:
    def mtime(r: TaskResult) -> float:
        source = r.extra.get("source_path")
        try:
            return Path(source).stat().st_mtime if source else 0.0
        except OSError:
            return 0.0

    return sorted(results, key=mtime, reverse=True)


#: What tells one row from another: the model, the strategy's slug, and how it was read and run where a plain run
#: differs (:func:`~lmembed.evaluation.results.variant_tag`: chunking, instruction table, backend and precision; ""
#: for a plain run on the reference, torch at float32).
RowKey = tuple[str, str, str]


def _row_key(result: TaskResult) -> RowKey:
    return result.model_name or "unknown", strategy_slug(result.strategy), variant_tag(result)


def _row_names(results: list[TaskResult]) -> dict[RowKey, Row]:
    """Each (model, strategy, variant)'s row: the model and the strategy's label (with the chunking, instruction
    table, backend and precision where a plain run differs: ``mean@-1+bidir (maxp 64/32)``,
    ``mean@-1+bidir (onnx int8)``); where strategies of one model share a label, the fields in which they differ
    follow it (``mean@-1 max_length=128``: a field a strategy lacks, as a plain run
    lacks a staged run's ``first_stage``, is left out of its name), else their digest."""
    keys = {_row_key(r): r for r in results}
    groups: dict[tuple[str, str], list[tuple[RowKey, TaskResult]]] = defaultdict(list)
    for key, r in keys.items():
        groups[key[0], strategy_label(r)].append((key, r))
    names: dict[RowKey, Row] = {}
    for (model, label), members in groups.items():
        strategies = [r.strategy if isinstance(r.strategy, dict) else {} for _, r in members]
        differing = sorted(
            {k for st in strategies for k in st if len({json.dumps(s.get(k), default=str) for s in strategies}) > 1}
        )
        named = [" ".join([label, *(f"{k}={st[k]}" for k in differing if k in st)]) for st in strategies]
        unique = len(set(named)) == len(named)
        for (key, r), name in zip(members, named, strict=True):
            if len(members) == 1:
                names[key] = (model, label)
            elif differing and unique:
                names[key] = (model, name)
            else:
                names[key] = (model, f"{label} [{strategy_digest(r.strategy)}]")
    return names


def build_table(results: Iterable[TaskResult]) -> ScoreTable:
    """Arrange results into a :class:`ScoreTable` (rows named by model and strategy label); for duplicates the
    newest file wins."""
    scores: dict[Row, dict[str, float]] = defaultdict(dict)
    types: dict[str, set[str]] = defaultdict(set)
    ordered = _newest_first(results)
    names = _row_names(ordered)
    for r in ordered:
        row = names[_row_key(r)]
        if r.task_name in scores[row]:
            logger.warning("several results for %s / %s; using the newest", row, r.task_name)
            continue
        scores[row][r.task_name] = r.main_score
        types[task_type_of(r)].add(r.task_name)
    ordered_types = {t: sorted(types[t]) for t in sorted(types, key=type_rank)}
    return ScoreTable(rows=sorted(scores), task_types=ordered_types, scores=dict(scores))


def _fmt(value: float | None, complete: bool = True, *, scale: float = 100.0) -> str:
    if value is None:
        return MISSING
    return f"{value * scale:.2f}" + ("" if complete else "*")


def _markdown_table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(map(markdown_cell, header)) + " |"]
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + "|")
    lines += ["| " + " | ".join(map(markdown_cell, cells)) + " |" for cells in body]
    return lines


def table_markdown(table: ScoreTable, *, title: str = "Results") -> str:
    """Markdown: a summary table (per-type means), then one table per task type."""
    lines = [f"# {title}", "", "Main scores × 100. `*` = mean over the tasks present only.", ""]
    if len(table.whole_types) < len(table.task_types):
        lines += [
            f"A task run on a subset of its data (`Task[500 docs]`) is listed under its type{SAMPLES} and left out "
            "of the overall means: its scores are not comparable with the whole task's.",
            "",
        ]
    types = list(table.task_types)
    header = ["model", "strategy", *(f"{t} mean" for t in types), "mean (task)", "mean (type)"]
    body = []
    for row in table.rows:
        cells = [_fmt(*table.type_mean(row, t)) for t in types]
        cells += [_fmt(*table.task_mean(row)), _fmt(*table.mean_of_type_means(row))]
        body.append([row[0], row[1], *cells])
    lines += ["## Summary", "", *_markdown_table(header, body), ""]
    for task_type, tasks in table.task_types.items():
        header = ["model", "strategy", *tasks, "mean"]
        body = [
            [row[0], row[1], *(_fmt(table.scores[row].get(t)) for t in tasks), _fmt(*table.type_mean(row, task_type))]
            for row in table.rows
        ]
        lines += [f"## {task_type}", "", *_markdown_table(header, body), ""]
    return "\n".join(lines)


def _chart_positions(table: ScoreTable) -> tuple[list[float], list[str], list[tuple[float, float, str]]]:
    """x positions and labels per task, leaving a gap between task types."""
    xs, labels, spans = [], [], []
    x = 0.0
    for task_type, tasks in table.task_types.items():
        first = x
        for task in tasks:
            xs.append(x)
            labels.append(task)
            x += 1.0
        spans.append((first, x - 1.0, task_type))
        x += 0.6
    return xs, labels, spans


def plot_table(table: ScoreTable, path: Path, *, title: str = "Results") -> Path:
    """Grouped bar chart of main scores (one group per task, one bar per row) saved as PNG."""
    # lazy: matplotlib loads only when a chart is drawn (keeps the CLI's start fast)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs, labels, spans = _chart_positions(table)
    n_rows = max(1, len(table.rows))
    width = 0.8 / n_rows
    fig = Figure(figsize=(min(44.0, max(6.0, 0.5 + len(xs) * (0.35 + 0.12 * n_rows)) + 3.5), 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    tasks = [t for ts in table.task_types.values() for t in ts]
    for i, row in enumerate(table.rows):
        heights = [100.0 * table.scores[row].get(t, float("nan")) for t in tasks]
        offsets = [x - 0.4 + width * (i + 0.5) for x in xs]
        ax.bar(offsets, heights, width=width, label=f"{row[0]} / {row[1]}")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    for first, last, task_type in spans:
        ax.annotate(
            task_type,
            xy=((first + last) / 2, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("main score × 100")
    ax.set_title(title, pad=18)
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    if table.rows:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return atomic_savefig(fig, path, dpi=120)


def _table_json(table: ScoreTable) -> dict:
    return {
        "task_types": table.task_types,
        "rows": [
            {"model": m, "strategy": s, "scores": table.scores[(m, s)], "mean_task": table.task_mean((m, s))[0]}
            for m, s in table.rows
        ],
    }


class NoResultsError(LmembedError, ValueError):
    """A folder with no task results to report."""


def render_report(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    title: str = "lmembed results",
    echo: bool = False,
    empty_ok: bool = True,
) -> Report:
    """Collect the results under ``results_dir`` and write report.md/.png/.json to ``out_dir``; with
    ``empty_ok=False`` a folder without results is :class:`NoResultsError`, before anything is written."""
    scan = scan_results(results_dir)
    results = scan.results
    if not results and not empty_ok and scan.skipped:
        raise NoResultsError(
            f"{results_dir}: no readable results in it; skipped {len(scan.skipped)} result file(s):\n"
            + "\n".join(scan.skipped)
        )
    if not results and not empty_ok:
        raise NoResultsError(f"{results_dir}: no results in it (neither an experiment's summary.json nor result files)")
    if not results:
        logger.warning("no result files found under %s", results_dir)
    table = build_table(results)
    markdown = table_markdown(table, title=title)
    out = Path(out_dir)
    files = {"markdown": out / "report.md", "png": out / "report.png", "json": out / "report.json"}
    atomic_write_text(files["markdown"], markdown)
    atomic_write_text(files["json"], json.dumps(_table_json(table), indent=2) + "\n")
    plot_table(table, files["png"], title=title)
    if plot_cutoff_curves(results, out / "cutoffs.png") is not None:
        files["cutoffs"] = out / "cutoffs.png"
    if echo:
        print(markdown)
    return Report(markdown=markdown, table=table, files=files)
