"""``lmembed eval``, ``lmembed sweep`` and ``lmembed report``: the evaluation commands.

``lmembed eval`` with no arguments is the main job: the bundled models on SciFact (see
:func:`main_job_plan`).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from lmembed.config import EmbeddingConfig

console = Console(stderr=True)
out_console = Console()

MAIN_JOB_SUBSET = 500
MAIN_JOB_DECODER_MAX_LENGTH = 256
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


def subsample_corpus(task: Any, size: int, seed: int = 0) -> Any:
    """A copy of a retrieval task whose corpus keeps every judged document plus random others, up to
    ``size`` documents. Its name says so (``SciFact[1000 docs]``): scores are not MTEB's."""
    from lmembed.evaluation.retrieval import RetrievalTask

    data = task.data
    judged = {doc for docs in data.qrels.values() for doc in docs}
    keep = [i for i, d in enumerate(data.corpus_ids) if d in judged]
    others = [i for i, d in enumerate(data.corpus_ids) if d not in judged]
    random.Random(seed).shuffle(others)
    keep = sorted(keep + others[: max(0, size - len(keep))])
    name = f"{task.name}[{len(keep)} docs]"
    sub = dataclasses.replace(
        data,
        name=name,
        corpus_ids=[data.corpus_ids[i] for i in keep],
        corpus_texts=[data.corpus_texts[i] for i in keep],
    )
    return RetrievalTask(sub, name=name, ignore_identical_ids=task.ignore_identical_ids)


def main_job_plan() -> list[tuple[str, list[EmbeddingConfig], str]]:
    """(model, strategies, corpus) triples of the default evaluation.

    minilm runs on the full SciFact (comparable with MTEB's published 64.51). The 135M-parameter
    decoder is ~30x slower per token on a laptop CPU, so it runs on a SciFact corpus reduced to every
    judged document plus random distractors (500 docs) and truncated at 256 tokens like minilm, with
    minilm repeated there for a fair comparison; four read-outs share one forward pass. Middle layers
    are read through the final norm: raw middle-layer states of this model carry a few "massive
    activation" dimensions (|x| ~ 4000) that make every mean-pooled vector nearly identical.
    """
    decoder = [
        EmbeddingConfig(pooling="mean", layer=-1),
        EmbeddingConfig(pooling="weighted_mean", layer=-1),
        EmbeddingConfig(pooling="mean", layer=15, final_norm=True),
        EmbeddingConfig(pooling="mean", layer=(15, 16), final_norm=True),
    ]
    return [
        ("minilm", [EmbeddingConfig(pooling="mean")], "full"),
        ("minilm", [EmbeddingConfig(pooling="mean")], "subset"),
        ("smollm2-135m", decoder, "subset"),
    ]


def run_main_job(output: Path, batch_size: int) -> None:
    from lmembed import Embedder
    from lmembed.evaluation.retrieval import RetrievalTask
    from lmembed.evaluation.runner import evaluate_strategies, results_table, write_all

    console.print("[bold]lmembed main job[/]: bundled models on SciFact (cached embeddings make re-runs fast)")
    full = RetrievalTask.from_name("scifact")
    subset = subsample_corpus(full, MAIN_JOB_SUBSET)
    results = []
    for model, configs, corpus in main_job_plan():
        task = full if corpus == "full" else subset
        console.print(f"• {model} on {task.name}: {', '.join(c.label() for c in configs)}")
        max_length = MAIN_JOB_DECODER_MAX_LENGTH if model != "minilm" else None
        embedder = Embedder.from_pretrained(model, config=configs[0], max_length=max_length)
        configs = [dataclasses.replace(c, max_length=embedder.config.max_length) for c in configs]
        results += evaluate_strategies(embedder, [task], configs, batch_size=batch_size)
    write_all(results, output)
    out_console.print(results_table(results, metrics=("ndcg_at_10", "map_at_10", "mrr_at_10", "recall_at_100")))
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
) -> tuple[list[Any], list[str]]:
    """Tasks named by --data and --suite (with per-task instructions bound), and the suite's absent ones."""
    from lmembed.evaluation.runner import load_task, unwrap

    tasks = [load_task(d, task_type=task_type) for d in data or []]
    missing: list[str] = []
    if suite:
        from lmembed.evaluation.suites import build_task, default_data_root, locate, suite_task_names

        root = default_data_root()
        for name in suite_task_names(suite):
            located = locate(name, root) if root else None
            if located is None or not located.available:
                missing.append(name)
                continue
            tasks.append(unwrap(build_task(located)))
    lookup = _instruction_lookup(instructions)
    if lookup:
        for task in tasks:
            if hasattr(task, "instruction"):  # symmetric task types carry their own instruction
                task.instruction = lookup(task)
    return tasks, missing


def _instruction_lookup(table: str | None):
    if not table:
        return None
    from lmembed.evaluation.instructions import instruction_for

    return lambda task: instruction_for(task.name, table)


def _print_suite_summary(results: list) -> None:
    from lmembed.evaluation.suites import aggregate

    by_key: dict[tuple[str, str], list] = {}
    for item in results:
        by_key.setdefault((item.result.model_name, item.config.label()), []).append(item.result)
    for (model, label), rows in by_key.items():
        per_type, overall, _ = aggregate(rows)
        cells = ", ".join(f"{k} {100 * v:.2f}" for k, v in per_type.items())
        out_console.print(f"{model} {label}: {cells}; overall {100 * (overall or 0):.2f}")
