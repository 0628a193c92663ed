"""``lmembed doctor MODEL``: the resolved strategy, who decided each field, and the invariance checks."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from lmembed.cli.options import Exclude, load_embedder, options_command
from lmembed.options import ModelOptions

ModelArg = Annotated[str, typer.Argument(help="Bundled name, local directory or Hub id.")]
MARKS = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}


@options_command
def doctor(
    model: ModelArg,
    options: Annotated[ModelOptions, Exclude("backend", "precision", "calibration", "no_cache")] = ModelOptions(),
) -> None:
    """Print the strategy MODEL resolves to and what decided each field (option, lmembed.json, a published
    family's preset, the model, lmembed's default), then check it on the real model: attention mode, a text
    alone vs padded left/right in a batch, prompt tokens out of pooling, truncation keeping the final token,
    and the cosine to sentence-transformers where it loads the folder. Exit status 1 when a check fails."""
    # lazy: torch loads only when the command runs
    from lmembed.config import EmbeddingConfig
    from lmembed.evaluation.doctor import provenance, run_checks

    options = replace(options, no_cache=True)  # every vector computed: a cached one would hide what is checked
    given = {f.name: getattr(options, f.name) for f in fields(EmbeddingConfig) if hasattr(options, f.name)}
    emb = load_embedder(model, options)
    out = Console(soft_wrap=True)
    out.print(f"[bold]{escape(model)}[/]: resolved strategy (field = value  <- decided by)")
    width = max(len(f.name) for f in fields(EmbeddingConfig))
    for item in provenance(emb, given):
        out.print(f"  {item.name:<{width}} = {escape(repr(item.value))}  [dim]<-[/] {escape(item.source)}")
    if emb.published:
        preset = emb.published.preset
        out.print(f"published family: [bold]{escape(preset.family)}[/] (recognised by {escape(emb.published.reason)})")
        out.print(f"  reference: {escape(preset.source)}")
        out.print(f"  verified: {escape(preset.verified)}")
        out.print(f"  reference padding side: {preset.padding_side}; per-task instructions: {preset.instructions}")
        if preset.limits:
            out.print(f"  limits: {escape(preset.limits)}")
    checks = run_checks(emb)
    for check in checks:
        out.print(f"{MARKS[check.passed]}  {check.name}: {escape(check.detail)}", soft_wrap=True)
    failed = [c.name for c in checks if c.passed is False]
    if failed:
        Console(stderr=True).print(f"[red]{len(failed)} check(s) failed[/]: {', '.join(failed)}")
        raise typer.Exit(1)
