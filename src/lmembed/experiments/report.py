"""Rendering an experiment's summary: a Markdown report and one PNG (arms × tasks with intervals).

An experiment folder (written by ``lmembed experiment``) holds ``summary.json``; this module turns it into
``summary.md`` and ``summary.png``. It only reads the JSON, so ``lmembed report FOLDER`` can render an
experiment folder as well as a folder of MTEB-layout results: :func:`render_folder` renders the first kind
here and hands the second to :func:`lmembed.evaluation.report.render_report`. What the numbers mean is
computed in :mod:`lmembed.experiments.summary`; the Markdown says it in a line above each table.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, StrictInt

from lmembed.atomic import atomic_savefig, atomic_write_text
from lmembed.errors import LmembedError
from lmembed.evaluation.report import Report, ScoreTable, render_report, type_rank
from lmembed.io import READ_WITH_WRITER, check_format, read_json
from lmembed.schema import RecordModel, check_json

SUMMARY_FILE = "summary.json"
#: the layout of ``summary.json`` this lmembed writes and reads (its ``format``; a summary without one is of 1)
SUMMARY_FORMAT = 1
MARKDOWN_FILE = "summary.md"
PNG_FILE = "summary.png"
MISSING = "–"


class SummaryFileError(LmembedError, ValueError):
    """A ``summary.json`` that is not an experiment summary as lmembed writes it."""


class _Head(RecordModel):
    name: str
    seeds: list[int] = Field(default_factory=list)
    paper: str | None = None
    claim: str | None = None
    paper_result: str | None = None
    scale: str | None = None
    model: str | None = None
    device: str | None = None


class _Task(RecordModel):
    name: str
    task_type: str
    main_metric: str
    scale: float


class _Arm(RecordModel):
    name: str
    kind: str
    runs: int
    steps: int | None = None
    train_seconds: float | None = None


class _Cell(RecordModel):
    mean: float | None
    std: float | None
    n: int
    interval: list[float | None] | None = Field(default=None, min_length=2, max_length=2)
    curve: list[float] | None = None


class _Comparison(RecordModel):
    a: str
    b: str
    task: str
    claim: str
    difference: float | None
    verdict: str
    low: float | None = None
    high: float | None = None
    p_value: float | None = None
    p_holm: float | None = None  # summaries written before 2026-11-29 (stop 58) have none
    items: int = 0
    method: str | None = None  # "items" or "seeds and items"; older summaries have none (they were over items)
    df: float | None = None
    minus: list[str] | None = Field(default=None, min_length=2, max_length=2)


class _Runs(RecordModel):
    finished: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)


class ExperimentSummary(RecordModel):
    """The fields of ``summary.json`` that the report reads (:mod:`lmembed.experiments.summary` writes them)."""

    format: StrictInt = SUMMARY_FORMAT  # checked by load_summary before the rest
    experiment: _Head
    tasks: list[_Task]
    arms: list[_Arm]
    scores: dict[str, dict[str, _Cell]]
    comparisons: list[_Comparison] = Field(default_factory=list)
    runs: _Runs = Field(default_factory=_Runs)


def is_experiment_folder(folder: str | Path) -> bool:
    """True when ``folder`` holds an experiment summary (``summary.json``, a JSON object with an ``experiment``
    entry); :func:`load_summary` then checks the rest."""
    path = Path(folder) / SUMMARY_FILE
    if not path.is_file():
        return False
    try:
        return "experiment" in read_json(path)  # an object: read_json refuses any other JSON as ValueError
    except ValueError:
        return False


def load_summary(folder: str | Path) -> dict[str, Any]:
    """``summary.json`` of ``folder``, checked for every field the report reads; :class:`SummaryFileError` names the
    file and the field otherwise."""
    path = Path(folder) / SUMMARY_FILE
    data = read_json(path, error=SummaryFileError, what="an experiment summary")
    form = data.get("format", SUMMARY_FORMAT)
    check_format(path, "format", form, SUMMARY_FORMAT, "experiment summaries", SummaryFileError, READ_WITH_WRITER)
    return check_json(data, path, ExperimentSummary, SummaryFileError, "an experiment summary")


def _number(value: float | None, scale: float = 100.0, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return MISSING
    return f"{value * scale:.{digits}f}"


def _cell(cell: Mapping[str, Any] | None, scale: float) -> str:
    if not cell:
        return MISSING
    digits = 2 if scale == 100.0 else 3
    text = f"{_number(cell['mean'], scale, digits)} ± {_number(cell['std'], scale, digits)} (n={cell['n']})"
    interval = cell.get("interval")
    if interval and None not in interval:
        text += f" [{_number(interval[0], scale, digits)}, {_number(interval[1], scale, digits)}]"
    return text


def _p(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:.4f}" if value >= 0.0001 else f"{value:.1e}"


def _over(comparison: Mapping[str, Any]) -> str:
    """What a comparison's interval and p cover: items, or seeds and items (with the t's degrees of freedom)."""
    if comparison.get("p_value") is None:
        return MISSING
    if comparison.get("method") == "seeds and items":
        df = comparison.get("df")
        return f"seeds + items (df {df:.1f})" if isinstance(df, int | float) and math.isfinite(df) else "seeds + items"
    return "items"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return lines


def experiment_markdown(summary: Mapping[str, Any]) -> str:
    """The report: what was run, the scores per arm, the paired comparisons, training and run status."""
    head = summary["experiment"]
    lines = [f"# Experiment: {head['name']}", ""]
    for label, key in (
        ("Paper", "paper"),
        ("Claim", "claim"),
        ("Paper's result", "paper_result"),
        ("Scale here", "scale"),
        ("Model", "model"),
        ("Device", "device"),
    ):
        if head.get(key):
            lines.append(f"- **{label}:** {head[key]}")
    lines.append(f"- **Seeds:** {', '.join(str(s) for s in head.get('seeds', []))} (arms without training run once)")
    lines.append("")
    tasks = summary["tasks"]
    lines += [
        "## Scores",
        "",
        "Main score (× 100 for task metrics): mean ± sample std over the arm's runs (n), then the 95 % interval of "
        "the arm's score. One run: over items (queries, pairs, texts or sets; bootstrap-t for means, expanded "
        "percentile bootstrap for Spearman and AP). Several runs (seeds): over seeds and items (the arm's score is "
        "the mean of its runs'; a t interval whose variance adds the seed-to-seed spread to the items'). The train "
        "loss has an interval over its seeds only (one falling curve is one block of correlated steps).",
        "",
    ]
    header = ["arm", "kind", *(t["name"] for t in tasks)]
    rows = []
    for arm in summary["arms"]:
        cells = summary["scores"].get(arm["name"], {})
        rows.append([arm["name"], arm["kind"], *(_cell(cells.get(t["name"]), t["scale"]) for t in tasks)])
    lines += [*_table(header, rows), ""]
    metrics = ", ".join(f"{t['name']}: {t['main_metric']}" for t in tasks)
    lines += [f"Metrics: {metrics}.", ""]
    comparisons = summary.get("comparisons") or []
    if comparisons:
        lines += [
            "## Comparisons",
            "",
            "Paired over the items both arms were scored on: difference a − b of the task statistic, its 95 % "
            "interval, a two-sided p, and that p adjusted by Holm's method over this experiment's comparisons. "
            "*over* says what the interval and p cover: *items* (one run per arm: item bootstrap interval and paired "
            "randomization test) or *seeds + items* (an arm of several runs: t interval and t test whose variance "
            "adds each arm's seed-to-seed spread to the items', with its degrees of freedom; two or three seeds give "
            "few, and a weak test). *holds* / *reversed*: the interval excludes 0 and the Holm p < 0.05 (the plain p "
            "where a summary has no Holm column: written before 2026-11-29), in / against the claimed direction; "
            "otherwise *not distinguishable*. The train loss is compared on means of blocks of steps laid out by the "
            "correlation of the two arms' per-step difference; *too few blocks*: that correlation leaves fewer than "
            "two blocks of a single run each, and nothing to judge.",
            "",
        ]
        if any(c.get("minus") for c in comparisons):
            lines += [
                "A row whose a and b are gaps (arm − arm) compares the two gaps: (a1 − a2) − (b1 − b2) over the "
                "items all four arms were scored on; the randomization test (one run per arm) swaps each item's two "
                "gaps, the test over seeds counts each arm's seeds once.",
                "",
            ]
        scale_of = {t["name"]: t["scale"] for t in tasks}
        rows = []
        for c in comparisons:
            scale = scale_of.get(c["task"], 100.0)
            digits = 2 if scale == 100.0 else 3
            interval = (
                f"[{_number(c['low'], scale, digits)}, {_number(c['high'], scale, digits)}]"
                if c.get("low") is not None
                else MISSING
            )
            minus = c.get("minus")
            rows.append(
                [
                    f"({c['a']} − {c['b']})" if minus else c["a"],
                    f"({minus[0]} − {minus[1]})" if minus else c["b"],
                    c["task"],
                    c["claim"],
                    _number(c["difference"], scale, digits),
                    interval,
                    _p(c.get("p_value")),
                    _p(c.get("p_holm")),
                    str(c.get("items", 0)),
                    _over(c),
                    f"**{c['verdict']}**",
                ]
            )
        lines += [
            *_table(
                [
                    "a",
                    "b",
                    "task",
                    "claim (a vs b)",
                    "a − b",
                    "95 % interval",
                    "p",
                    "p (Holm)",
                    "items",
                    "over",
                    "verdict",
                ],
                rows,
            )
        ]
        lines.append("")
    trained = [a for a in summary["arms"] if a["kind"] in ("train", "recipe") and a.get("train_seconds") is not None]
    if trained:
        lines += ["## Training", ""]
        rows = [
            [a["name"], a["kind"], str(a["runs"]), str(a.get("steps") or MISSING), f"{a['train_seconds']:.0f}"]
            for a in trained
        ]
        lines += [*_table(["arm", "kind", "runs", "steps (all stages)", "train s (mean)"], rows), ""]
    runs = summary.get("runs", {})
    lines += ["## Runs", "", f"Finished: {len(runs.get('finished', []))}; missing: {len(runs.get('missing', []))}."]
    for run_id, reason in (runs.get("skipped") or {}).items():
        lines.append(f"- not started: {run_id} ({reason})")
    if runs.get("missing"):
        lines.append(f"- missing: {', '.join(runs['missing'])} (finish them with `lmembed experiment FILE --resume`)")
    return "\n".join(lines) + "\n"


def plot_experiment(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Bars per task (one per arm) with the 95 % item intervals as error bars; the loss curves beside them."""
    # lazy: matplotlib loads only when a chart is drawn (keeps the CLI's start fast)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = [t for t in summary["tasks"] if t["scale"] == 100.0]
    arms = [a["name"] for a in summary["arms"]]
    curves = {
        arm: cell["curve"]
        for arm, row in summary["scores"].items()
        for name, cell in row.items()
        if name == "train loss" and cell.get("curve")
    }
    panels = 2 if curves else 1
    fig = Figure(
        figsize=(max(6.0, 1.2 + 1.1 * max(1, len(tasks)) * (0.5 + 0.18 * len(arms))) + 4.0 * (panels - 1), 4.6)
    )
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, panels, 1)
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        xs, heights, low_err, high_err = [], [], [], []
        for j, task in enumerate(tasks):
            cell = summary["scores"].get(arm, {}).get(task["name"])
            if not cell:
                continue
            mean = 100 * cell["mean"]
            interval = cell.get("interval")
            if not interval or None in interval:  # no items: the spread over seeds instead
                interval = (cell["mean"] - (cell["std"] or 0.0), cell["mean"] + (cell["std"] or 0.0))
            low, high = interval
            xs.append(j - 0.4 + width * (i + 0.5))
            heights.append(mean)
            low_err.append(max(0.0, mean - 100 * low))
            high_err.append(max(0.0, 100 * high - mean))
        if xs:
            ax.bar(xs, heights, width=width, yerr=[low_err, high_err], capsize=2, label=arm)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([t["name"] for t in tasks], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("main score × 100 (95 % interval over items)")
    ax.set_title(summary["experiment"]["name"])
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    if curves:
        loss_ax = fig.add_subplot(1, panels, 2)
        for arm, curve in curves.items():
            loss_ax.plot(range(1, len(curve) + 1), curve, label=arm)
        loss_ax.set_xlabel("step (last training stage)")
        loss_ax.set_ylabel("training loss (mean over seeds)")
        loss_ax.grid(alpha=0.3)
        loss_ax.legend(fontsize=7)
    fig.tight_layout()
    return atomic_savefig(fig, path, dpi=110)


def write_experiment_report(summary: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``summary.md`` and ``summary.png`` for ``summary`` into ``out_dir``."""
    out = Path(out_dir)
    markdown = atomic_write_text(out / MARKDOWN_FILE, experiment_markdown(summary))
    png = plot_experiment(summary, out / PNG_FILE)
    return {"markdown": markdown, "png": png}


def render_experiment(folder: str | Path, out_dir: str | Path) -> tuple[str, dict[str, Path], dict[str, Any]]:
    """Render the experiment in ``folder`` into ``out_dir``: (Markdown text, files written, the summary)."""
    summary = load_summary(folder)
    files = write_experiment_report(summary, out_dir)
    if Path(out_dir).resolve() != Path(folder).resolve():
        files["json"] = atomic_write_text(Path(out_dir) / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    return experiment_markdown(summary), files, summary


def experiment_report(folder: str | Path, out_dir: str | Path, *, echo: bool = False) -> Report:
    """An experiment folder rendered into ``out_dir`` as a :class:`~lmembed.evaluation.report.Report`: its
    Markdown, the files written, and the arms × tasks mean scores as the score table."""
    markdown, files, summary = render_experiment(folder, out_dir)
    types: dict[str, list[str]] = defaultdict(list)
    for task in summary["tasks"]:
        if task["scale"] == 100.0:
            types[task["task_type"]].append(task["name"])
    scores = {
        (arm["name"], f"{arm['runs']} run(s)"): {
            name: cell["mean"] for name, cell in summary["scores"].get(arm["name"], {}).items() if name != "train loss"
        }
        for arm in summary["arms"]
    }
    ordered = {t: types[t] for t in sorted(types, key=type_rank)}
    if echo:
        print(markdown)
    return Report(
        markdown=markdown, table=ScoreTable(rows=list(scores), task_types=ordered, scores=scores), files=files
    )


def render_folder(
    results_dir: str | Path,
    out_dir: str | Path,
    *,
    title: str = "lmembed results",
    echo: bool = False,
    empty_ok: bool = True,
) -> Report:
    """What ``lmembed report`` renders: an experiment folder as an experiment (:func:`experiment_report`),
    any other folder as a table of its results (:func:`~lmembed.evaluation.report.render_report`; ``empty_ok``
    as there)."""
    if is_experiment_folder(results_dir):
        return experiment_report(results_dir, out_dir, echo=echo)
    return render_report(results_dir, out_dir, title=title, echo=echo, empty_ok=empty_ok)
