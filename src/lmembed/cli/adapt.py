"""``lmembed adapt``: adapt an embedder to a corpus with nothing but the corpus.

Examples::

    lmembed adapt --model minilm --corpus ../shared/datasets/beir/scifact/corpus.jsonl -o runs/adapt-scifact
    lmembed adapt --model smollm2-135m --corpus docs.txt -o runs/adapt-docs --recipe lora
    lmembed adapt --model minilm --corpus corpus.jsonl -o runs/a --generator local:smollm2-135m --teacher self
    lmembed adapt --model minilm --corpus corpus.jsonl -o runs/a --resume     # continue an interrupted run
    lmembed adapt --model my-model --corpus corpus.jsonl -o runs/t --terms-only   # only the corpus's term channel

What it does (titles and cropped spans as queries, copied-span and duplicate filters, mined negatives, a held-back
slice of pseudo-queries to pick the step) is described in :mod:`lmembed.training.adapt`; the steps' knobs are in
``recipes/adapt/default.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lmembed import terminal
from lmembed.cli.options import check_writable


def adapt(
    model: Annotated[str, typer.Option("--model", "-m", help="Starting embedder: bundled name, folder or Hub id.")],
    corpus: Annotated[
        Path, typer.Option("--corpus", help="BEIR corpus.jsonl (or its folder), or a text file: one document a line.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder (the model goes to OUT/model).")],
    recipe: Annotated[
        Path | None,
        typer.Option("--recipe", help="Adapt recipe YAML (default: the values of recipes/adapt/default.yaml)."),
    ] = None,
    generator: Annotated[
        str | None,
        typer.Option("--generator", "-g", help="Also LLM-written queries: tiny[:SEED], local:MODEL or an endpoint."),
    ] = None,
    generator_model: Annotated[
        str | None, typer.Option("--generator-model", help="Model name sent to an endpoint generator.")
    ] = None,
    teacher: Annotated[
        str | None,
        typer.Option(
            "--teacher",
            help="Label with a teacher (MarginMSE): an embedder, 'self', reranker:NAME_OR_FOLDER, or 'hybrid' "
            "(the starting model fused with BM25 over the corpus: no other model).",
        ),
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Training steps (recipe's by default).")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", min=1, help="Batch size (recipe's).")] = None,
    lora: Annotated[
        bool | None, typer.Option("--lora/--no-lora", help="LoRA or full fine-tuning (default: LoRA for decoders).")
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N.")
    ] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --output.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    terms_only: Annotated[
        bool,
        typer.Option(
            "--terms-only",
            help="Only fit the recipe's term channel on the corpus to the model as it is (no queries, no training).",
        ),
    ] = False,
) -> None:
    """Adapt an embedder to a corpus with nothing but the corpus: pseudo-queries from titles, cropped spans (and a
    generator's, when given), negatives mined by the starting model, the step chosen on held-back pseudo-queries."""
    check_writable(output, "--output", folder=True)
    from lmembed.training.adapt_recipe import load_adapt_recipe  # lazy: keeps `lmembed --help` light

    plan = load_adapt_recipe(recipe)
    if generator_model is not None and not (generator or "").startswith(("http://", "https://")):
        raise typer.BadParameter(
            "names the model an endpoint generator (--generator http(s)://...) is asked for; "
            f"{'no generator is given' if generator is None else f'--generator {generator} is not one'}",
            param_hint="--generator-model",
        )
    if terms_only:
        _terms_only(model, corpus, output, plan, device, generator, teacher, steps, batch_size, lora, resume)
        return
    check_models(generator, teacher)
    gen = None
    if generator is not None:
        from lmembed.synthesis.generators import build_generator

        gen = build_generator(generator, model=generator_model)
    from lmembed.training.adapt_run import run_adapt  # lazy: torch loads only when a run starts

    result = run_adapt(
        model,
        corpus,
        output,
        recipe=plan,
        generator=gen,
        teacher=teacher,
        resume=resume,
        steps=steps,
        batch_size=batch_size,
        device=device,
        lora=lora,
        progress=progress,
    )
    selection = result.summary["selection"]
    terms = result.summary["terms"]
    channel = ""
    if terms:
        channel = f", with the term channel {terms['saved_scores']['ndcg_at_10']:.4f} ({terms['dims']} dims appended)"
    console = terminal.console(stderr=True)
    check = selection.get("check")
    measured = "no check half: too few held-back documents, or a run resumed from one begun without it"
    if check:
        measured = (
            f"check pseudo-queries, which picked nothing: nDCG@10 {check['before']['ndcg_at_10']:.4f} → "
            f"{check['saved']['ndcg_at_10']:.4f} on {check['queries']}"
        )
    console.print(
        f"adapted model: {result.model_dir}  ({measured}; step {selection['best_step']} picked by "
        f"{selection['queries']} selection pseudo-queries, nDCG@10 {selection['before']['ndcg_at_10']:.4f} → "
        f"{selection['after']['ndcg_at_10']:.4f}"
        f"{channel}; {result.summary['seconds']:.0f} s, peak memory {result.summary['peak_memory_mb']:.0f} MB)"
    )


def check_models(generator: str | None, teacher: str | None) -> None:
    """Refuse a --generator or --teacher that names no usable model, before any work starts (the teacher is
    loaded only once the queries are made and mined)."""
    from lmembed.errors import LmembedError
    from lmembed.models.loading import check_model_name
    from lmembed.synthesis.generators import GeneratorError, check_generator

    if generator is not None:
        try:
            check_generator(generator)
        except GeneratorError as exc:
            raise typer.BadParameter(str(exc), param_hint="--generator") from None
    if teacher is None or teacher in ("self", "hybrid"):
        return
    try:
        check_model_name(teacher.removeprefix("reranker:"))
    except LmembedError as exc:
        raise typer.BadParameter(str(exc), param_hint="--teacher") from None


def _terms_only(model: str, corpus: Path, output: Path, plan: Any, device: str, *training_options: Any) -> None:
    if any(option not in (None, False) for option in training_options):
        raise typer.BadParameter(
            "fits the term channel alone; --generator, --teacher, --steps, --batch-size, --lora and --resume are "
            "training options",
            param_hint="--terms-only",
        )
    from lmembed.training.adapt_run import run_terms_only

    result = run_terms_only(model, corpus, output, recipe=plan, device=device)
    terms = result.summary["terms"]
    terminal.console(stderr=True).print(
        f"model with a term channel: {result.model_dir}  ({result.summary['documents']} documents, {terms['dims']} "
        f"dims appended at weight {terms['weight']}; {result.summary['seconds']:.0f} s)"
    )
