"""Command line: a thin layer over the Python API.

``lmembed encode``, ``lmembed models`` and ``lmembed cache`` live here; evaluation, training and
mining register their commands from their own modules.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from lmembed.config import ATTENTION_HELP, POOLING_HELP

console = Console(stderr=True)
app = typer.Typer(
    help="lmembed: turn language models into text-embedding models; extract, train, evaluate.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
cache_app = typer.Typer(help="Inspect or clear the embedding cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

POOLING_DOC = "Pooling strategy. " + " ".join(f"'{k}': {v}" for k, v in POOLING_HELP.items())
ATTENTION_DOC = "Attention for decoders. " + " ".join(f"'{k}': {v}" for k, v in ATTENTION_HELP.items())
LAYER_DOC = (
    "Hidden layer(s) to read: an index (0 = embeddings, -1 = final output, -2 = penultimate ...) "
    "or a comma list averaged together, e.g. '15,16'."
)

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Bundled name, local directory or Hub id.")]
PoolingOpt = Annotated[str | None, typer.Option(help=POOLING_DOC)]
LayerOpt = Annotated[str | None, typer.Option(help=LAYER_DOC)]
AttentionOpt = Annotated[str | None, typer.Option(help=ATTENTION_DOC)]
EchoOpt = Annotated[
    bool | None, typer.Option("--echo/--no-echo", help="Echo embeddings: feed the text twice, pool the 2nd copy.")
]
DimOpt = Annotated[int | None, typer.Option(help="Matryoshka: keep the first DIM dimensions (then normalise).")]
MaxLenOpt = Annotated[int | None, typer.Option(help="Truncate texts to this many tokens (default: model's own).")]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16 or float16.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Do not read or write the embedding cache.")]


def parse_layer(value: str | None) -> int | tuple[int, ...] | None:
    """'-1' → -1; '15,16' → (15, 16); None stays None."""
    if value is None:
        return None
    try:
        parts = [int(p) for p in value.split(",") if p.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"--layer {value!r}: expected an int or a comma list of ints") from exc
    if not parts:
        raise typer.BadParameter("--layer is empty")
    return parts[0] if len(parts) == 1 else tuple(parts)


MODEL_OPTIONS = ("pooling", "layer", "attention", "echo", "dim", "max_length", "dtype", "device", "no_cache")


def model_options(values: dict) -> dict:
    """The model/strategy options of a command's arguments (pass ``locals()``), for :func:`load_embedder`."""
    return {name: values[name] for name in MODEL_OPTIONS}


def load_embedder(
    model: str,
    *,
    pooling: str | None = None,
    layer: str | None = None,
    attention: str | None = None,
    echo: bool | None = None,
    dim: int | None = None,
    max_length: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    no_cache: bool = False,
    **strategy,
):
    from lmembed import Embedder

    return Embedder.from_pretrained(
        model,
        pooling=pooling,
        layer=parse_layer(layer),
        attention=attention,
        echo=echo,
        dim=dim,
        max_length=max_length,
        dtype=dtype,
        device=device,
        cache=not no_cache,
        **strategy,
    )


def read_texts(path: Path, field: str) -> list[str]:
    """Lines of a .txt file, or the ``field`` of each row of a .jsonl file."""
    if not path.exists():
        raise typer.BadParameter(f"{path}: no such file")
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\n")
            if path.suffix != ".jsonl":
                texts.append(line)
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"{path}:{number}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise typer.BadParameter(f"{path}:{number}: expected an object with a string field {field!r}")
            texts.append(row[field])
    return texts


def write_vectors(vectors, texts: list[str], output: Path) -> None:
    import numpy as np

    from lmembed.atomic import atomic_write, atomic_write_text

    if output.suffix == ".npy":
        atomic_write(output, lambda handle: np.save(handle, vectors))
    elif output.suffix == ".jsonl":
        lines = (json.dumps({"text": t, "embedding": v.tolist()}) for t, v in zip(texts, vectors, strict=True))
        atomic_write_text(output, "\n".join(lines) + "\n")
    else:
        raise typer.BadParameter(f"--output {output}: use a .npy or .jsonl file name")


@app.command()
def encode(
    input: Annotated[Path, typer.Argument(help="A .txt file (one text per line) or .jsonl file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write: .npy or .jsonl.")],
    model: ModelOpt = "minilm",
    field: Annotated[str, typer.Option(help="Text field of .jsonl rows.")] = "text",
    pooling: PoolingOpt = None,
    layer: LayerOpt = None,
    attention: AttentionOpt = None,
    echo: EchoOpt = None,
    dim: DimOpt = None,
    max_length: MaxLenOpt = None,
    instruction: Annotated[str | None, typer.Option(help="Task instruction (kept out of pooling).")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per forward pass.")] = 32,
    dtype: DtypeOpt = "float32",
    device: DeviceOpt = "cpu",
    no_cache: NoCacheOpt = False,
) -> None:
    """Embed texts from a file and write the vectors (float32, one row per input, in order)."""
    texts = read_texts(input, field)
    emb = load_embedder(model, **model_options(locals()))
    vectors = emb.encode(texts, batch_size=batch_size, instruction=instruction)
    write_vectors(vectors, texts, output)
    console.print(f"wrote {vectors.shape[0]} × {vectors.shape[1]} vectors ({emb.config.label()}) to {output}")


@app.command()
def models() -> None:
    """List the bundled offline models and the converted-model cache."""
    from lmembed.models.bundled import list_bundled, lmembed_home

    table = Table(title="bundled models")
    for column in ("name", "hub_id", "installed", "converted", "description"):
        table.add_column(column)
    rows = list_bundled()
    for row in rows:
        table.add_row(*(row[c] for c in ("name", "hub_id", "installed", "converted", "description")))
    Console().print(table)
    for row in rows:
        if row["installed"] == "no":
            console.print(f"[yellow]{row['name']}[/]: install with `{row['install']}`")
    console.print(f"converted models live in {lmembed_home() / 'models'}")


@cache_app.command("clear")
def cache_clear(
    directory: Annotated[Path | None, typer.Option(help="Cache folder (default: $LMEMBED_CACHE).")] = None,
) -> None:
    """Delete every cached embedding."""
    from lmembed.encoding.cache import clear_cache, default_cache_dir

    removed = clear_cache(directory)
    console.print(f"removed {removed} cache shard(s) from {directory or default_cache_dir()}")


@cache_app.command("info")
def cache_info(
    directory: Annotated[Path | None, typer.Option(help="Cache folder (default: $LMEMBED_CACHE).")] = None,
) -> None:
    """Show where the cache is and how big it is."""
    from lmembed.encoding.cache import cache_size, default_cache_dir

    files, size = cache_size(directory)
    console.print(f"{directory or default_cache_dir()}: {files} shard(s), {size / 2**20:.1f} MiB")


# Commands that live beside their subsystem register themselves here.
for _module in ("lmembed.cli_eval", "lmembed.cli_train", "lmembed.cli_mine"):
    importlib.import_module(_module).register(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
