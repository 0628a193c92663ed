"""``lmembed doctor MODEL``: the resolved strategy, who decided each field, and the invariance checks.

A Hub id is resolved to its published family's preset without the network; when the Hugging Face cache does not
hold the model, the preset's conventions are printed and the command says that the weights are not here (exit
status 2) instead of trying to download them."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from lmembed import terminal
from lmembed.cli.options import Exclude, load_embedder, options_command
from lmembed.errors import ModelLoadError
from lmembed.models.bundled import BUNDLED
from lmembed.options import ModelOptions

ModelArg = Annotated[str, typer.Argument(help="Bundled name, local directory or Hub id.")]
MARKS = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}


NOT_LOADED = Exclude("backend", "precision", "calibration", "no_cache", "plan_window")  # flags doctor does not read


@options_command
def doctor(
    model: ModelArg,
    options: Annotated[ModelOptions, NOT_LOADED] = ModelOptions(),
) -> None:
    """Print the strategy MODEL resolves to and what decided each field (option, lmembed.json, a published
    family's preset, the model, lmembed's default), then check it on the real model: attention mode, a text
    alone vs padded left/right in a batch, prompt tokens out of pooling, truncation keeping the final token,
    and the cosine to sentence-transformers where it loads the folder; the last token ids each sample text ends
    with where the family's reference needs a final token. Exit status 1 when a check fails; 2 when MODEL is a Hub
    id whose weights are not on this machine (its published conventions are printed first, without the network)."""
    # lazy: torch loads only when the command runs
    from lmembed.config import EmbeddingConfig
    from lmembed.evaluation.doctor import preset_fields, provenance, run_checks, weights_here
    from lmembed.model_card import strategy_citations
    from lmembed.models import presets

    options = replace(options, no_cache=True)  # every vector computed: a cached one would hide what is checked
    given = {f.name: getattr(options, f.name) for f in fields(EmbeddingConfig) if hasattr(options, f.name)}
    out = terminal.console(soft_wrap=True)
    local = model in BUNDLED or Path(model).expanduser().exists()
    hub_id = None if local else presets.hub_id_of(model)  # a Hub id: resolved without the network
    if hub_id is not None and not weights_here(hub_id):
        resolution = presets.resolve(hub_id)
        known = "nothing is known of its conventions without its files"
        if resolution is not None:
            _print_fields(out, model, preset_fields(resolution, given))
            _print_preset(out, resolution)
            known = f"the conventions above are {resolution.preset.family}'s preset"
        elif prompts := presets.registry_prompts(hub_id):
            out.print(f"[bold]{escape(model)}[/]: mteb's model registry records its prompts {escape(repr(prompts))}")
            known = "its prompts above are mteb's record of them"
        raise ModelLoadError(
            f"{model}: the weights are not on this machine (the Hugging Face cache has no copy), so the checks did "
            f"not run; {known}. Download the model (for example `hf download {model}`) or pass its local folder "
            "to check it"
        )
    emb = load_embedder(model, options)
    _print_fields(out, model, provenance(emb, given))
    if emb.published:
        _print_preset(out, emb.published)
    family = emb.published.preset.cites if emb.published else ()
    if cites := (*family, *strategy_citations(emb.config, emb.backbone.is_decoder)):  # their BibTeX: a saved card's
        out.print(f"papers: {', '.join(dict.fromkeys(cites))} (lmembed.citations; a saved folder's README.md has them)")
    checks = run_checks(emb)
    for check in checks:
        out.print(f"{MARKS[check.passed]}  {check.name}: {escape(check.detail)}", soft_wrap=True)
    failed = [c.name for c in checks if c.passed is False]
    if failed:
        terminal.console(stderr=True).print(f"[red]{len(failed)} check(s) failed[/]: {', '.join(failed)}")
        raise typer.Exit(1)


def _print_fields(out: Console, model: str, items: list[Any]) -> None:
    out.print(f"[bold]{escape(model)}[/]: resolved strategy (field = value  <- decided by)")
    width = max(len(item.name) for item in items)
    for item in items:
        out.print(f"  {item.name:<{width}} = {escape(repr(item.value))}  [dim]<-[/] {escape(item.source)}")


def _print_preset(out: Console, resolution: Any) -> None:
    from lmembed.models.presets import required_final_token  # lazy, as above

    preset = resolution.preset
    out.print(f"published family: [bold]{escape(preset.family)}[/] (recognised by {escape(resolution.reason)})")
    out.print(f"  reference: {escape(preset.source)}")
    out.print(f"  verified: {escape(preset.verified)}")
    out.print(f"  reference padding side: {preset.padding_side}; per-task instructions: {preset.instructions}")
    final = required_final_token(preset)
    if final:
        token = "the tokenizer's EOS" if final == "eos" else repr(final)
        out.print(
            f"  every text ends with {escape(token)} (read by last-token pooling; appended where the tokenizer "
            "does not put it there)"
        )
    if preset.limits:
        out.print(f"  limits: {escape(preset.limits)}")
