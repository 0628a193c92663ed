"""``lmembed experiment``: run an experiment file (arms × seeds, trained and evaluated) and judge the differences.

    lmembed experiment experiments/echo-vs-classic.yaml -o bench/results/experiments/echo-vs-classic
    lmembed experiment FILE.yaml --resume                 # continue at the first unfinished run
    lmembed experiment FILE.yaml --only echo --only classic
    lmembed experiment FILE.yaml --budget-minutes 30      # says which runs will not fit, and skips them
    lmembed experiment FILE.yaml --workers 2              # two runs at once (the cores split, or one GPU each)
    lmembed experiment FILE.yaml --set device=cuda --set evaluate.max_docs=5000

The file's layout is described in :mod:`lmembed.experiments.spec`; ``lmembed report FOLDER`` renders the
finished folder again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lmembed import terminal
from lmembed.cli.options import check_writable

console = terminal.console(stderr=True, highlight=False)
out_console = terminal.console(highlight=False)


def experiment(
    file: Annotated[Path, typer.Argument(help="An experiment YAML file (arms, seeds, evaluation suite).")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Results folder (default: runs/experiments/<experiment name>)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted experiment; finished runs are kept.")
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only this arm (repeatable); arms it reads models from run too."),
    ] = None,
    budget_minutes: Annotated[
        float | None,
        typer.Option(
            "--budget-minutes",
            min=0.0,
            help="Time budget: after the first run, estimate the rest and skip the runs that would not fit.",
        ),
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a value of the file: KEY=VALUE, KEY a dotted path (train.steps=20)."),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Runs at once, each in its own process: the CPU's cores split between them, or one GPU each.",
        ),
    ] = 1,
) -> None:
    """Train and evaluate every (arm, seed) of an experiment file, then report each arm's mean ± std over
    seeds and, for each pair of arms, the paired difference with a bootstrap interval, a randomization-test
    p-value and a verdict (holds / reversed / not distinguishable). Writes summary.json/.md/.png."""
    from lmembed.experiments.runner import run_experiment  # lazy: the evaluation stack is seconds to import
    from lmembed.experiments.spec import load_spec

    if workers > 1 and budget_minutes is not None:
        raise typer.BadParameter(
            "a time budget estimates runs one after another: use it with one worker", param_hint="--workers"
        )
    spec = load_spec(file, settings or [])
    folder = check_writable(output or Path("runs") / "experiments" / spec.name, "--output", folder=True)
    outcome = run_experiment(
        spec,
        folder,
        resume=resume,
        only=only,
        budget_minutes=budget_minutes,
        progress=lambda line: console.print(escape(line)),
        workers=workers,
    )
    markdown = outcome.files.get("markdown")
    if markdown is not None:
        out_console.print(escape(markdown.read_text()))
    done = f"{len(outcome.finished)} run(s) now, {len(outcome.reused)} earlier"
    if outcome.skipped:
        done += f", {len(outcome.skipped)} not started (budget; continue with --resume)"
    console.print(f"experiment {spec.name}: {done}; wrote {', '.join(str(p) for p in outcome.files.values())}")
