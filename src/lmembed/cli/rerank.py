"""Options shared by the commands that search in stages (``lmembed search``, ``lmembed eval``, ``lmembed serve``):
the first stage (dense, BM25 or hybrid, and how runs are fused) and the reranker of the second stage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # torch loads only when a command runs
    from lmembed.rerank import Reranker

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


def check_stage_options(mode: str, fusion: str) -> None:
    if mode not in MODES:
        raise typer.BadParameter(f"{mode!r} is not one of {', '.join(MODES)}", param_hint="--mode")
    if fusion not in FUSIONS:
        raise typer.BadParameter(f"{fusion!r} is not one of {', '.join(FUSIONS)}", param_hint="--fusion")


def open_reranker(name: str, *, device: str, max_batch_tokens: int | None = None) -> Reranker:
    from lmembed.rerank import load_reranker  # lazy: torch and transformers

    options = {"max_batch_tokens": max_batch_tokens} if max_batch_tokens else {}
    return load_reranker(name, device=device, **options)
