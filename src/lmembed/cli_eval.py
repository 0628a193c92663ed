"""``lmembed eval``, ``lmembed sweep`` and ``lmembed report``: the evaluation commands.

``lmembed eval`` with no arguments is the main job: the bundled models on SciFact (see
:func:`lmembed.evaluation.main_job.main_job_plan`). The work is done by :mod:`lmembed.evaluation`;
this module parses options and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from lmembed.evaluation.base import Task
from lmembed.evaluation.main_job import (
    MAIN_JOB_METRICS,
    instruction_lookup,
    resolve_eval_tasks,
    suite_summary_lines,
)
from lmembed.evaluation.main_job import run_main_job as run_main_job_library
from lmembed.evaluation.runner import StrategyResult, results_table

console = Console(stderr=True)
out_console = Console()

DataOpt = Annotated[
    list[str] | None,
    typer.Option("--data", "-d", help="Dataset name (scifact, nfcorpus, stsbenchmark ...) or directory; repeatable."),
]
GridOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--grid",
        help="KEY=V1,V2 over pooling, layer (int, mid, penultimate, a+b fused), attention, echo, final_norm, dim; "
        "every combination is evaluated, sharing forward passes.",
    ),
]


def run_main_job(output: Path, batch_size: int) -> None:
    """The main job, with its progress and results table printed."""
    console.print("[bold]lmembed main job[/]: bundled models on SciFact (cached embeddings make re-runs fast)")
    results = run_main_job_library(output, batch_size, progress=console.print)
    out_console.print(results_table(results, metrics=MAIN_JOB_METRICS))
    console.print(f"results written under {output}/ (render with `lmembed report {output}`)")
    console.print("evaluate your own BEIR folder: lmembed eval --model minilm --data path/to/folder")


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Model(s); repeatable.")] = None,
        data: DataOpt = None,
        suite: Annotated[str | None, typer.Option(help="A named suite, e.g. mteb-lite, sts, retrieval.")] = None,
        grid: GridOpt = None,
        pooling: Annotated[str | None, typer.Option(help="Pooling (see `lmembed encode --help`).")] = None,
        layer: Annotated[str | None, typer.Option(help="Layer index or comma list to fuse.")] = None,
        attention: Annotated[str | None, typer.Option(help="causal or bidirectional (decoders).")] = None,
        echo: Annotated[bool | None, typer.Option("--echo/--no-echo", help="Echo embeddings.")] = None,
        dim: Annotated[int | None, typer.Option(help="Matryoshka dimension.")] = None,
        max_length: Annotated[int | None, typer.Option(help="Max tokens per text.")] = None,
        task_type: Annotated[str | None, typer.Option(help="Force the task type of --data directories.")] = None,
        instructions: Annotated[
            str | None, typer.Option(help="Per-task query instructions: 'nv-embed' or 'e5' (default: none).")
        ] = None,
        output: Annotated[Path, typer.Option("--output", "-o", help="Results directory.")] = Path("results"),
        batch_size: Annotated[int, typer.Option(help="Texts per forward pass.")] = 32,
        dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16.")] = "float32",
        device: Annotated[str, typer.Option(help="cpu, cuda, auto.")] = "cpu",
        no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the embedding cache.")] = False,
    ) -> None:
        """Evaluate models (× strategies) on tasks, MTEB-style. With no arguments: the main job."""
        if not model and not data and not suite:
            run_main_job(output, batch_size)
            return
        from lmembed.cli import load_embedder, model_options
        from lmembed.evaluation.runner import evaluate_strategies, expand_grid, parse_grid, results_table, write_all

        options = model_options(locals())
        tasks, missing = _tasks(data, suite, task_type, instructions)
        instruction_for = _instruction_lookup(instructions)
        results = []
        for name in model or ["minilm"]:
            emb = load_embedder(name, **options)
            configs = expand_grid(emb.config, parse_grid(grid or [], emb.backbone.num_layers))
            console.print(
                f"• {name}: {len(configs)} strateg{'y' if len(configs) == 1 else 'ies'} × {len(tasks)} task(s)"
            )
            results += evaluate_strategies(emb, tasks, configs, batch_size=batch_size, instruction_for=instruction_for)
        write_all(results, output)
        out_console.print(results_table(results))
        if suite:
            _print_suite_summary(results)
        if missing:
            console.print(f"[yellow]not scored (data absent)[/]: {', '.join(missing)}")
        console.print(f"results written under {output}/")

    @app.command("sweep")
    def sweep_command(
        data: Annotated[list[str], typer.Argument(help="Retrieval dataset name(s) or directories.")],
        model: Annotated[str, typer.Option("--model", "-m")] = "smollm2-135m",
        pooling: Annotated[str, typer.Option(help="Pooling used at every layer.")] = "mean",
        attention: Annotated[str, typer.Option(help="causal or bidirectional.")] = "causal",
        max_length: Annotated[int | None, typer.Option(help="Max tokens per text.")] = None,
        corpus_sample: Annotated[
            int | None, typer.Option(help="Keep judged docs + random others up to N (faster; not MTEB-comparable).")
        ] = None,
        output: Annotated[Path, typer.Option("--output", "-o")] = Path("results/sweep"),
        batch_size: Annotated[int, typer.Option()] = 32,
    ) -> None:
        """Layer-wise probe: every layer's pooled embedding plus fused sets, from one forward pass per batch."""
        from lmembed.evaluation.sweep import run_sweep

        run_sweep(
            model,
            data,
            pooling=pooling,
            attention=attention,
            max_length=max_length,
            corpus_sample=corpus_sample,
            output=output,
            batch_size=batch_size,
        )

    @app.command("report")
    def report_command(
        results_dir: Annotated[Path, typer.Argument(help="A results directory written by lmembed eval.")],
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write report.*")] = None,
    ) -> None:
        """Render everything in a results directory: Markdown table per category + PNG bar chart."""
        from lmembed.evaluation.report import render_report

        report = render_report(results_dir, output or results_dir, echo=False)
        out_console.print(report.markdown)
        console.print(f"wrote {', '.join(str(p) for p in report.files.values())}")


def _tasks(
    data: list[str] | None, suite: str | None, task_type: str | None, instructions: str | None
) -> tuple[list[Task], list[str]]:
    """Tasks named by --data and --suite (with per-task instructions bound), and the suite's absent ones."""
    return resolve_eval_tasks(data, suite, task_type, instructions)


_instruction_lookup = instruction_lookup


def _print_suite_summary(results: list[StrategyResult]) -> None:
    for line in suite_summary_lines(results):
        out_console.print(line)
