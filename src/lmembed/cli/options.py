"""Options shared by several commands, defined once: their help text, their validation, and the helpers
that turn them into library objects.

Every command that takes ``--batch-size``, ``--device``, ``--pooling`` ... uses the type defined here, so
the same value is accepted or refused with the same message everywhere (``min=1`` ranges are checked by
typer before any work starts).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lmembed.config import ATTENTION_HELP, POOLING_HELP

if TYPE_CHECKING:  # the Embedder pulls in torch; commands import it only when they run
    from lmembed.embedder import Embedder

POOLING_DOC = "Pooling strategy (default: the model's own). " + " ".join(
    f"'{name}': {text}" for name, text in POOLING_HELP.items()
)
ATTENTION_DOC = "Attention for decoders. " + " ".join(f"'{name}': {text}" for name, text in ATTENTION_HELP.items())
LAYER_DOC = (
    "Hidden layer(s) to read: an index (0 = embeddings, -1 = final output, -2 = penultimate ...) "
    "or a comma list averaged together, e.g. '15,16'."
)
DEVICE_DOC = "cpu, cuda, cuda:N or auto (a GPU when there is one)."
BACKEND_DOC = (
    "What runs the model: 'torch' (the reference; CPU or GPU; the default for float32) or 'onnx' (ONNX Runtime on "
    "the CPU: exported once, cached, run as a fused graph; vectors within cosine 0.9999 of torch's; the default for "
    "int8; needs pip install 'lmembed\\[onnx]')."
)
PRECISION_DOC = (
    "float32 (default), or int8: quantised (per-row activations, per-column weights on --backend onnx), "
    "calibrated on --calibration texts and checked against float32 by a quality gate that warns with the gap."
)
DTYPE_DOC = "float32, bfloat16 or float16."

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Bundled name, local directory or Hub id.")]
PoolingOpt = Annotated[str | None, typer.Option("--pooling", help=POOLING_DOC)]
LayerOpt = Annotated[str | None, typer.Option("--layer", help=LAYER_DOC)]
AttentionOpt = Annotated[str | None, typer.Option("--attention", help=ATTENTION_DOC)]
EchoOpt = Annotated[
    bool | None, typer.Option("--echo/--no-echo", help="Echo embeddings: feed the text twice, pool the 2nd copy.")
]
DimOpt = Annotated[
    int | None, typer.Option("--dim", min=1, help="Matryoshka: keep the first DIM dimensions (then normalise).")
]
MaxLenOpt = Annotated[
    int | None, typer.Option("--max-length", min=1, help="Truncate texts to this many tokens (default: model's own).")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=DTYPE_DOC)]
BackendOpt = Annotated[str | None, typer.Option("--backend", help=BACKEND_DOC)]
PrecisionOpt = Annotated[str, typer.Option("--precision", help=PRECISION_DOC)]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="--precision int8: a text file, one text per line, a few hundred of your own texts to calibrate on "
        "(default: a sample of the first texts encoded).",
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", help=DEVICE_DOC)]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Do not read or write the embedding cache.")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", min=1, help="Texts per forward pass.")]
InstructionOpt = Annotated[
    str | None, typer.Option("--instruction", help="Task instruction for queries (kept out of pooling).")
]
ENGINES = ("local", "ray")
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Where encoding runs: 'local' (this process) or 'ray' (resumable sharded jobs on Ray Data: one worker "
        "per GPU, or per CPU; vectors identical to 'local'; needs pip install 'lmembed\\[scale]').",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="--engine ray: join this running cluster ('auto', 'ray://head:10001'); default: start a local one.",
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option("--workers", min=1, help="--engine ray: number of workers (default: one per GPU, else per CPU)."),
]

#: Defaults every command shares, so ``--device`` means the same thing everywhere.
DEFAULT_DEVICE = "cpu"
DEFAULT_DTYPE = "float32"
DEFAULT_BATCH_SIZE = 32
DEFAULT_ENGINE = "local"
DEFAULT_PRECISION = "float32"
#: What --precision accepts: the torch backend's other float types are chosen with --dtype.
CLI_PRECISIONS = ("float32", "int8")

MODEL_OPTIONS = (
    "pooling",
    "layer",
    "attention",
    "echo",
    "dim",
    "max_length",
    "dtype",
    "device",
    "no_cache",
    "backend",
    "precision",
    "calibration",
)


def parse_layer(value: str | None) -> int | tuple[int, ...] | None:
    """'-1' → -1; '15,16' → (15, 16); None stays None."""
    if value is None:
        return None
    try:
        parts = [int(p) for p in value.split(",") if p.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r}: expected an int or a comma list of ints", param_hint="--layer") from exc
    if not parts:
        raise typer.BadParameter("empty value", param_hint="--layer")
    return parts[0] if len(parts) == 1 else tuple(parts)


def model_options(values: dict[str, Any]) -> dict[str, Any]:
    """The model/strategy options among a command's arguments (pass ``locals()``), for :func:`load_embedder`."""
    return {name: values[name] for name in MODEL_OPTIONS if name in values}


def load_embedder(
    model: str,
    *,
    pooling: str | None = None,
    layer: str | None = None,
    attention: str | None = None,
    echo: bool | None = None,
    dim: int | None = None,
    max_length: int | None = None,
    dtype: str = DEFAULT_DTYPE,
    device: str = DEFAULT_DEVICE,
    no_cache: bool = False,
    backend: str | None = None,
    precision: str = DEFAULT_PRECISION,
    calibration: Path | None = None,
    **strategy: Any,
) -> Embedder:
    """An :class:`~lmembed.embedder.Embedder` from command-line option values (``backend``, ``precision`` and
    ``calibration`` checked first by :func:`check_backend`)."""
    from lmembed.embedder import Embedder  # lazy: torch loads only when a command runs, not for --help

    texts = check_backend(backend, precision, calibration)
    emb = Embedder.from_pretrained(
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
        backend=backend,
        precision=None if precision == DEFAULT_PRECISION else precision,
        **strategy,
    )
    return emb.calibrate(texts) if texts is not None else emb


def check_backend(backend: str | None, precision: str, calibration: Path | None) -> list[str] | None:
    """Refuse an unknown backend or precision, or --calibration without int8, before any model loads; return
    the calibration texts (read and checked here, so a bad file fails before the model loads)."""
    from lmembed.io import read_text_lines  # lazy: keeps --help fast

    if backend not in (None, "torch", "onnx"):
        raise typer.BadParameter(f"{backend!r}: choose torch or onnx", param_hint="--backend")
    if precision not in CLI_PRECISIONS:
        raise typer.BadParameter(
            f"{precision!r}: choose {' or '.join(CLI_PRECISIONS)} (bfloat16/float16: use --dtype)",
            param_hint="--precision",
        )
    if calibration is None:
        return None
    if precision != "int8" or backend == "torch":  # torch's own int8 is dynamic: it has nothing to calibrate
        raise typer.BadParameter(
            "calibration texts are for --precision int8 on ONNX Runtime", param_hint="--calibration"
        )
    texts = read_text_lines(check_input_file(calibration, "--calibration"), strip=True)
    if len(set(texts)) < 8:
        raise typer.BadParameter(
            f"{calibration}: int8 calibration needs at least 8 distinct texts, got {len(set(texts))}",
            param_hint="--calibration",
        )
    return texts


def check_engine(
    engine: str, ray_address: str | None, workers: int | None = None, precision: str = DEFAULT_PRECISION
) -> str:
    """Refuse an unknown engine, Ray options given to the local engine, or int8 on Ray, before any work starts."""
    if engine not in ENGINES:
        raise typer.BadParameter(f"{engine!r}: choose one of {', '.join(ENGINES)}", param_hint="--engine")
    if engine == "ray" and precision == "int8":  # each worker would calibrate on its own shard: vectors would disagree
        raise typer.BadParameter(
            "int8 runs with --engine local (calibrated once, in one process)", param_hint="--precision"
        )
    if engine == "local" and (ray_address is not None or workers is not None):
        option = "--ray-address" if ray_address is not None else "--workers"
        raise typer.BadParameter(f"{option} needs --engine ray", param_hint=option)
    return engine


def scale_out(
    embedder: Embedder,
    engine: str,
    model: str,
    options: dict[str, Any],
    *,
    ray_address: str | None = None,
    workers: int | None = None,
    on_progress: Any = None,
    memory_map: bool = False,
) -> Embedder:
    """``embedder`` for ``--engine local``; for ``--engine ray`` the same Embedder encoding through sharded jobs,
    whose workers load ``model`` themselves with the command's model options (device chosen per worker);
    ``memory_map``: results are read-only memory maps of ``.npy`` files in the embedding cache."""
    if engine == "local":
        return embedder
    from lmembed.scale import scaled  # lazy: Ray Data is optional and slow to import

    return scaled(
        embedder,
        "ray",
        ray_address=ray_address,
        workers=workers,
        spec=worker_spec(model, options),
        on_progress=on_progress,
        memory_map=memory_map,
    )


def worker_spec(model: str, options: dict[str, Any]) -> Any:
    """How Ray workers load ``model`` with a command's model options (an ``lmembed.scale.EmbedderSpec``); each
    worker picks its own device (its GPU, or the CPU)."""
    from lmembed.scale import EmbedderSpec  # lazy: Ray Data is optional and slow to import

    skip = ("device", "no_cache", "calibration")
    loading = {
        k: v for k, v in options.items() if k not in skip and v is not None and (k, v) != ("precision", "float32")
    }
    if "layer" in loading:
        loading["layer"] = parse_layer(loading["layer"])
    return EmbedderSpec(model, loading)


def check_input_file(path: Path, option: str) -> Path:
    """Refuse a missing or unreadable input before any model is loaded."""
    if not path.exists():
        raise typer.BadParameter(f"{path}: no such file", param_hint=option)
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a folder; expected a file", param_hint=option)
    if not os.access(path, os.R_OK):
        raise typer.BadParameter(f"{path}: not readable", param_hint=option)
    return path


def check_writable(path: Path, option: str, *, folder: bool = False) -> Path:
    """Refuse an output path that cannot be written, before the work starts (not after an hour of it).

    ``folder=True``: ``path`` is a directory to create or fill; otherwise a file whose parent must be
    creatable and writable.
    """
    if folder and path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{path} exists and is not a folder", param_hint=option)
    if not folder and path.is_dir():
        raise typer.BadParameter(f"{path} is a folder; expected a file name", param_hint=option)
    target = path if folder else path.parent
    probe = target
    while not probe.exists():  # the nearest existing ancestor must let us create the rest
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise typer.BadParameter(f"cannot create {target}: {probe} is not a folder", param_hint=option)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise typer.BadParameter(f"cannot write to {target} (no write permission on {probe})", param_hint=option)
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise typer.BadParameter(f"{path} exists and is not writable", param_hint=option)
    return path
