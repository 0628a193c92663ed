"""Options shared by the commands that search in stages (``lmembed search``, ``lmembed eval``, ``lmembed serve``):
the first stage (dense, BM25 or hybrid, and how runs are fused) and the reranker of the second stage."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lmembed import terminal

if TYPE_CHECKING:  # torch loads only when a command runs
    from lmembed.rerank import Reranker

console = terminal.console(stderr=True)
MODES = ("dense", "bm25", "hybrid")
FUSIONS = ("rrf", "minmax")

ModeOpt = Annotated[
    str,
    typer.Option(
        "--mode",
        help="First stage: dense (the model's vectors), bm25, or hybrid (both, fused; see --fusion).",
    ),
]
FusionOpt = Annotated[
    str, typer.Option("--fusion", help="hybrid: rrf (reciprocal rank fusion) or minmax (normalised scores summed).")
]
CandidatesOpt = Annotated[
    int, typer.Option("--candidates", min=1, help="hybrid: candidates taken from each of dense and BM25 before fusing.")
]
RerankOpt = Annotated[
    str | None,
    typer.Option(
        "--rerank",
        help="Second stage: a reranker (a CrossEncoder folder, any sequence-classification or causal-LM checkpoint).",
    ),
]
RerankTopKOpt = Annotated[
    int, typer.Option("--rerank-top-k", min=1, help="First-stage candidates the reranker reads per query.")
]
RerankBatchTokensOpt = Annotated[
    int, typer.Option("--rerank-batch-tokens", min=1, help="Reranker: padded tokens per forward pass.")
]


def check_stage_options(mode: str, fusion: str, mode_option: str = "--mode") -> None:
    if mode not in MODES:
        raise typer.BadParameter(f"{mode!r} is not one of {', '.join(MODES)}", param_hint=mode_option)
    if fusion not in FUSIONS:
        raise typer.BadParameter(f"{fusion!r} is not one of {', '.join(FUSIONS)}", param_hint="--fusion")


def open_reranker(name: str, *, device: str, max_batch_tokens: int | None = None) -> Reranker:
    """The reranker ``--rerank`` names; a name that is no model is refused naming the option."""
    from lmembed.errors import ModelLoadError
    from lmembed.models.loading import check_model_name
    from lmembed.rerank import load_reranker  # lazy: torch and transformers

    try:
        check_model_name(name)
    except ModelLoadError as exc:
        raise typer.BadParameter(f"the reranker: {exc}", param_hint="--rerank") from None
    options = {"max_batch_tokens": max_batch_tokens} if max_batch_tokens else {}
    return load_reranker(name, device=device, **options)


FirstStageOpt = Annotated[
    str,
    typer.Option(
        "--first-stage",
        help="Retrieval's first stage: dense (the model), bm25, or hybrid (both fused, see --fusion). "
        "Anything but dense, or --rerank, scores retrieval in stages (a table shows each stage's gain).",
    ),
]


def evaluate_in_stages(
    models: list[str],
    tasks: list[Any],
    options: Any,
    *,
    first_stage: str,
    fusion: str,
    rerank: str | None,
    rerank_top_k: int,
    rerank_batch_tokens: int,
    batch_size: int,
    output: Path,
    instructions: str | None = None,
) -> None:
    """``lmembed eval --first-stage/--rerank``: retrieval tasks in two stages, reranking tasks by the reranker. The
    tasks carry the instructions ``--instructions`` named, which each retrieval result records (kept apart from a run
    without them)."""
    # lazy: torch, transformers, the evaluation stack
    from lmembed.cli.options import load_embedder
    from lmembed.evaluation.results import write_result
    from lmembed.evaluation.tasks.reranking import RerankingTask
    from lmembed.evaluation.tasks.retrieval import RetrievalTask
    from lmembed.evaluation.two_stage import evaluate_two_stage, stage_table

    check_stage_options(first_stage, fusion, "--first-stage")
    unsupported = [t.name for t in tasks if not isinstance(t, RetrievalTask | RerankingTask)]
    if unsupported:
        raise typer.BadParameter(
            f"only retrieval and reranking tasks are scored in stages; not {', '.join(unsupported)}",
            param_hint="--data/--suite",
        )
    if any(isinstance(t, RerankingTask) for t in tasks) and not rerank:
        raise typer.BadParameter("reranking tasks in stages need --rerank MODEL", param_hint="--rerank")
    reranker = open_reranker(rerank, device=options.device, max_batch_tokens=rerank_batch_tokens) if rerank else None
    encoders = [None] if first_stage == "bm25" else [load_embedder(name, options) for name in models]
    staged, written = [], []
    for task in tasks:
        if isinstance(task, RerankingTask):
            result = task.evaluate_reranker(reranker)
            written.append(write_result(result, output))
            console.print(f"{task.name}: {reranker.name} map {100 * result.main_score:.2f}")
            continue
        for encoder in encoders:
            item = evaluate_two_stage(
                task,
                first_stage=first_stage,
                encoder=encoder,
                reranker=reranker,
                rerank_top_k=rerank_top_k,
                fusion=fusion,
                batch_size=batch_size,
            )
            staged.append(item)
            for stage in (r for r in (item.first, item.reranked) if r is not None):
                if instructions:  # a staged run reads no published instructions: any table given is not its own
                    stage.extra["instructions"] = instructions.strip().lower()
                written.append(write_result(stage, output))
    if staged:
        terminal.console().print(stage_table(staged))
    console.print(f"results written under {output}/ ({len(written)} files)")
