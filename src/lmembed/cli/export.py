"""``lmembed export``: write a deployable ONNX graph of a model and strategy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from lmembed import terminal
from lmembed.cli.options import (
    Exclude,
    ModelOpt,
    check_backend,
    check_writable,
    load_embedder,
    options_command,
)
from lmembed.config import PORTABLE_PRECISIONS
from lmembed.options import ModelOptions

#: Export offers the strategy options; the runtime ones are its own (--precision, --calibration) or fixed.
EXPORTED = Exclude("dim", "dtype", "device", "backend", "precision", "calibration", "no_cache", "plan_window")

console = terminal.console(stderr=True)
FORMATS = ("onnx",)
PRECISIONS = PORTABLE_PRECISIONS  # float32 or int8: the graph ONNX Runtime runs


@options_command
def export(
    directory: Annotated[
        Path | None,
        typer.Argument(help="Folder to write: new, empty, or an earlier export (replaced atomically); or -o DIR."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Folder to write, as every command's -o (or DIRECTORY).")
    ] = None,
    model: ModelOpt = "minilm",
    format: Annotated[str, typer.Option("--format", help="Graph format: onnx.")] = "onnx",
    precision: Annotated[
        str, typer.Option("--precision", help="float32, or int8 (needs --calibration; quality-gated).")
    ] = "float32",
    calibration: Annotated[
        Path | None,
        typer.Option("--calibration", help="Text file, one text per line: int8 calibration texts (a few hundred)."),
    ] = None,
    options: Annotated[ModelOptions, EXPORTED] = ModelOptions(backend="onnx"),
) -> None:
    """Export MODEL with its strategy: model.onnx returns exactly the hidden states the strategy pools (pooling stays
    in lmembed), beside manifest.json, the tokenizer and lmembed.json. Exports are cached by weights, strategy and
    runtime versions; `backend="onnx"` in Python runs the same graph."""
    if directory is not None and output is not None and directory != output:
        raise typer.BadParameter(f"two folders to write: {directory} and {output}; give one", param_hint="--output")
    directory = directory or output
    if directory is None:
        raise typer.BadParameter("the folder to write: -o DIR (or as the argument)", param_hint="--output")
    if format not in FORMATS:
        raise typer.BadParameter(f"{format!r}: the only format is {', '.join(FORMATS)}", param_hint="--format")
    if precision not in PRECISIONS:
        raise typer.BadParameter(f"{precision!r}: choose {' or '.join(PRECISIONS)}", param_hint="--precision")
    if precision == "int8" and calibration is None:
        raise typer.BadParameter("int8 needs calibration texts: --calibration FILE", param_hint="--calibration")
    texts = check_backend("onnx", precision, calibration)  # read as every command reads calibration texts
    check_writable(directory, "DIRECTORY", folder=True)
    emb = load_embedder(model, replace(options, precision=precision))  # calibrated by export() itself
    out = emb.export(directory, format, calibration=texts)
    console.print(f"exported {emb.name} ({emb.config.label()}, {precision}) to {out}")
