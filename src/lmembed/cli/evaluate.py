"""``lmembed eval`` (with no arguments: the main job), ``lmembed sweep`` and ``lmembed report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lmembed import terminal
from lmembed.cli.index import check_chunk_options
from lmembed.cli.options import (
    DEFAULT_PRECISION,
    BatchSizeOpt,
    ChunkingOpt,
    ChunkOverlapOpt,
    ChunkTokensOpt,
    LateChunkingOpt,
    MaxLenOpt,
    check_backend,
    check_engine,
    check_writable,
    load_embedder,
    make_chunking,
    options_command,
    refuse_unused,
    scale_out,
)
from lmembed.cli.rerank import (
    FirstStageOpt,
    FusionOpt,
    RerankBatchTokensOpt,
    RerankOpt,
    RerankTopKOpt,
    evaluate_in_stages,
)
from lmembed.config import ATTENTIONS
from lmembed.encoding.chunking import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS
from lmembed.evaluation.instructions import INSTRUCTION_SETS
from lmembed.options import EngineOptions, ModelOptions, flags_of
from lmembed.protocols import ENCODE_BATCH_SIZE

console = terminal.console(stderr=True)
out_console = terminal.console()

DataOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        "-d",
        help="Dataset name (scifact, nfcorpus, stsbenchmark ...) or directory; repeatable. Long documents: "
        "concat:scifact:4 (a retrieval split's documents joined 4 at a time, judgments carried over), "
        "passkey:24x600 or needle:24x600 (24 generated documents of about 600 words).",
    ),
]
GridOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--grid",
        help="KEY=V1,V2 over pooling, layer (int, mid, penultimate, a+b fused), attention, echo, final_norm, dim, "
        "max_length (a length grid, e.g. with --data concat:scifact:4 or passkey:24x600); "
        "every combination is evaluated, sharing forward passes. A grid over layers also measures each point's "
        "texts/s on retrieval tasks (the forward pass stops at the layer read: layer=k costs about k/L).",
    ),
]
OutputDirOpt = Annotated[Path, typer.Option("--output", "-o", help="Results directory.")]


@options_command
def eval_command(
    ctx: typer.Context,
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Model(s); repeatable.")] = None,
    data: DataOpt = None,
    suite: Annotated[str | None, typer.Option(help="A named suite, e.g. mteb-lite, sts, retrieval.")] = None,
    grid: GridOpt = None,
    task_type: Annotated[str | None, typer.Option(help="Force the task type of --data directories.")] = None,
    instructions: Annotated[
        str | None,
        typer.Option(
            help=f"Per-task instructions from a named table: {', '.join(map(repr, INSTRUCTION_SETS))} "
            "(default: a published model's own, as on the MTEB leaderboard; none for other models)."
        ),
    ] = None,
    output: OutputDirOpt = Path("results"),
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    options: ModelOptions = ModelOptions(),
    engine: EngineOptions = EngineOptions(),
    first_stage: FirstStageOpt = "dense",
    fusion: FusionOpt = "rrf",
    rerank: RerankOpt = None,
    rerank_top_k: RerankTopKOpt = 100,
    rerank_batch_tokens: RerankBatchTokensOpt = 16384,
    chunking: ChunkingOpt = None,
    chunk_tokens: ChunkTokensOpt = DEFAULT_CHUNK_TOKENS,
    chunk_overlap: ChunkOverlapOpt = DEFAULT_CHUNK_OVERLAP,
    late_chunking: LateChunkingOpt = False,
) -> None:
    """Evaluate models (× strategies) on tasks, MTEB-style. With no arguments: the main job.

    With --rerank MODEL (and/or --first-stage bm25|hybrid) retrieval is scored in stages: the first stage's
    --rerank-top-k candidates per query are reranked, and a table shows each stage's gain.

    With --engine ray every encoding runs as a sharded job on Ray (workers load the model themselves) and
    retrieval corpora are searched memory-mapped from the embedding cache; scores equal --engine local's."""
    # lazy (here and below): the evaluation stack imports scikit-learn and SciPy, seconds that --help must not pay
    from lmembed.evaluation.instructions import instruction_set, published_instructions
    from lmembed.evaluation.main_job import instruction_lookup, resolve_eval_tasks, suite_summary_lines
    from lmembed.evaluation.runner import evaluate_strategies, expand_grid, parse_grid, results_table, write_all

    check_writable(output, "--output", folder=True)
    check_engine(engine, options)
    check_chunk_options(ctx, chunking, late_chunking)
    if not model and not data and not suite:
        if engine.engine != "local":
            raise typer.BadParameter(
                "the main job runs locally; give --model/--data to evaluate on Ray", param_hint="--engine"
            )
        if options.calibration is not None:
            raise typer.BadParameter(
                "the main job calibrates int8 on the texts it scores; --calibration is for --model/--data",
                param_hint="--calibration",
            )
        used = {"output", "batch_size", "backend", "precision", "engine", "calibration"}
        refuse_unused(
            ctx,
            [param.name for param in ctx.command.params if param.name and param.name not in used],
            "not used by the main job (lmembed eval with no --model, --data or --suite runs its bundled defaults)",
        )
        _main_job(output, batch_size, options.backend, options.precision)
        return
    if rerank or first_stage != "dense":
        staged_unused = ("grid", "engine", "ray_address", "workers")
        refuse_unused(ctx, staged_unused, "not used by a staged evaluation (one strategy, run here)")
        if first_stage == "bm25":
            model_side = [name for name in flags_of(ModelOptions) if not (rerank and name == "device")]
            refuse_unused(ctx, model_side, "not used with --first-stage bm25 (no embedding model runs)")
    tasks, missing = resolve_eval_tasks(data, suite, task_type, instructions)  # tasks carry their instructions
    if not tasks:  # nothing would be scored: say what is missing rather than write an empty table
        if missing:
            raise typer.BadParameter(
                f"no task of the suite has its data on this machine (absent: {', '.join(missing)})",
                param_hint="--suite",
            )
        raise typer.BadParameter("nothing to evaluate: name the tasks (a known name or a folder)", param_hint="--data")
    if chunking is not None or late_chunking:
        if rerank or first_stage != "dense":
            raise typer.BadParameter("chunked documents are scored by the dense stage only", param_hint="--chunking")
        tasks = _chunked(tasks, chunking, chunk_tokens, chunk_overlap, late_chunking)
    if rerank or first_stage != "dense":
        staged = {"first_stage": first_stage, "fusion": fusion, "rerank": rerank, "rerank_top_k": rerank_top_k}
        evaluate_in_stages(
            model or ["minilm"],
            tasks,
            options,
            **staged,
            rerank_batch_tokens=rerank_batch_tokens,
            batch_size=batch_size,
            output=output,
            instructions=instructions,
        )
        return
    results = []
    for name in model or ["minilm"]:
        emb = load_embedder(name, options)
        emb = scale_out(emb, engine, on_progress=_progress, memory_map=True)
        parsed = parse_grid(grid or [], emb.backbone.num_layers)
        configs = expand_grid(emb.config, parsed)
        timed = len(parsed.get("layer", [])) > 1 and engine.engine == "local"  # a layer x dim grid: quality vs cost
        console.print(f"• {name}: {len(configs)} strateg{'y' if len(configs) == 1 else 'ies'} × {len(tasks)} task(s)")
        default = published_instructions(getattr(emb, "published", None))
        published = None if instructions else instruction_lookup(default)  # a published model's own instructions
        scored = evaluate_strategies(
            emb, tasks, configs, batch_size=batch_size, instruction_for=published, measure_speed=timed
        )
        if instructions and instruction_set(instructions) is not default:  # not what a plain run reads: kept apart
            for item in scored:
                item.result.extra["instructions"] = instructions.strip().lower()
        results += scored
    write_all(results, output)
    out_console.print(results_table(results))
    if suite:
        for line in suite_summary_lines(results):
            out_console.print(line)
    if missing:
        console.print(f"[yellow]not scored (data absent)[/]: {', '.join(missing)}")
    console.print(f"results written under {output}/")


def _chunked(tasks: list[Any], aggregate: str | None, tokens: int, overlap: int, late: bool) -> list[Any]:
    """The retrieval tasks among ``tasks`` set to chunk their documents (the others as they are)."""
    from lmembed.evaluation.tasks.retrieval import RetrievalTask

    chunking = make_chunking(aggregate, tokens, overlap, late)
    return [t.with_chunking(chunking) if isinstance(t, RetrievalTask) else t for t in tasks]


def _progress(progress: Any) -> None:
    """--engine ray: one line per finished shard (shards done, texts/s, ETA)."""
    console.print(progress.line(), markup=False, soft_wrap=True)


def _main_job(output: Path, batch_size: int, backend: str | None, precision: str) -> None:
    from lmembed.evaluation.main_job import MAIN_JOB_METRICS, run_main_job
    from lmembed.evaluation.runner import results_table

    check_backend(backend, precision, None)
    console.print("[bold]lmembed main job[/]: bundled models on SciFact (cached embeddings make re-runs fast)")
    results = run_main_job(
        output,
        batch_size,
        progress=console.print,
        backend=backend,
        precision=None if precision == DEFAULT_PRECISION else precision,
    )
    out_console.print(results_table(results, metrics=MAIN_JOB_METRICS))
    console.print(f"results written under {output}/ (render with `lmembed report {output}`)")
    console.print("evaluate your own BEIR folder: lmembed eval --model minilm --data path/to/folder")


def sweep(
    data: Annotated[list[str], typer.Argument(help="Retrieval dataset name(s) or directories.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Bundled name, local directory or Hub id.")] = (
        "smollm2-135m"
    ),
    pooling: Annotated[str, typer.Option(help="Pooling used at every layer.")] = "mean",
    attention: Annotated[
        str | None, typer.Option(help=f"{' or '.join(ATTENTIONS)} (default: the model's own; encoders: bidirectional).")
    ] = None,
    max_length: MaxLenOpt = None,
    corpus_sample: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=(
                "Keep every judged doc, plus random others up to N docs in all (more when the judged ones exceed "
                "N; faster; not MTEB-comparable)."
            ),
        ),
    ] = None,
    output: OutputDirOpt = Path("results/sweep"),
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
) -> None:
    """Layer-wise probe: every layer's pooled embedding plus fused sets, from one forward pass per batch."""
    from lmembed.evaluation.sweep import run_sweep

    check_writable(output, "--output", folder=True)
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


def report(
    results_dir: Annotated[Path, typer.Argument(help="A results directory written by lmembed eval.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write report.*")] = None,
) -> None:
    """Render everything in a results directory: Markdown table per category + PNG bar chart."""
    # lazy: the evaluation stack is seconds to import
    from lmembed.evaluation.report import NoResultsError
    from lmembed.experiments.report import render_folder

    if not results_dir.is_dir():
        raise typer.BadParameter(f"{results_dir}: no such folder", param_hint="RESULTS_DIR")
    out = check_writable(output or results_dir, "--output", folder=True)
    try:
        rendered = render_folder(results_dir, out, echo=False, empty_ok=False)
    except NoResultsError as exc:
        raise typer.BadParameter(str(exc), param_hint="RESULTS_DIR") from None
    out_console.print(rendered.markdown)
    console.print(f"wrote {', '.join(str(p) for p in rendered.files.values())}")
