"""Options shared by several commands, defined once: their help text, their validation, and the helpers
that turn them into library objects.

Model and engine options are the fields of :class:`~lmembed.options.ModelOptions` and
:class:`~lmembed.options.EngineOptions` (each field carries its flag and help). A command takes a whole group
as one parameter, ``options: ModelOptions = ModelOptions()``, and :func:`options_command` shows typer that
parameter as the group's flags, building the frozen object from them before the command runs; so a new field
is a new flag of every command that takes the group, and a command's signature holds only what is its own.

Why a decorator: typer 0.29 has no option groups built from a dataclass (each parameter of the command's
signature is one option), and a shared callback belongs to a command *group*, so its options would go before
the command name (``lmembed --pooling mean encode``) and change every command line. Rewriting the signature
typer reads (``__signature__``) keeps each flag, its help, its default and its place after the command name
exactly as they were, and needs nothing from typer beyond ``inspect.signature``. ``Exclude`` in the
annotation leaves out the fields a command does not offer (they keep the default's values).

Every command that takes ``--batch-size``, ``--device``, ``--pooling`` ... uses the type defined here, so
the same value is accepted or refused with the same message everywhere (``min=1`` ranges are checked by
typer before any work starts).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin, get_type_hints

import typer

from lmembed import config
from lmembed.config import PORTABLE_PRECISIONS
from lmembed.errors import LmembedError
from lmembed.options import (
    ATTENTION_DOC,
    BACKEND_DOC,
    DEFAULT_DEVICE,
    DEFAULT_DTYPE,
    DEFAULT_ENGINE,
    DEFAULT_PRECISION,
    DEVICE_DOC,
    DTYPE_DOC,
    ENGINES,
    LAYER_DOC,
    POOLING_DOC,
    PRECISION_DOC,
    EngineOptions,
    Flag,
    ModelOptions,
    flags_of,
)

if TYPE_CHECKING:  # the Embedder pulls in torch; commands import it only when they run
    from lmembed.embedder import Embedder

__all__ = [  # the help texts and defaults, re-exported for the commands that take one option alone
    "ATTENTION_DOC",
    "BACKEND_DOC",
    "DEFAULT_DEVICE",
    "DEFAULT_DTYPE",
    "DEFAULT_ENGINE",
    "DEFAULT_PRECISION",
    "DEVICE_DOC",
    "DTYPE_DOC",
    "LAYER_DOC",
    "POOLING_DOC",
    "PRECISION_DOC",
]

#: The attribute of a command made by :func:`options_command`: its option groups, by parameter name.
GROUPS_ATTR = "__option_groups__"


class Exclude:
    """In ``Annotated[ModelOptions, Exclude("dim", ...)]``: fields of the group the command does not offer."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)


def option_type(group: type, name: str) -> Any:
    """The ``Annotated`` type typer reads for field ``name`` of an options dataclass (its flag and help)."""
    spec = flags_of(group)[name]
    kind = spec.cli_type if spec.cli_type is not None else get_type_hints(group)[name]
    extra = {} if spec.min is None else {"min": spec.min}
    return Annotated[kind, typer.Option(*spec.decls, help=spec.help, **extra)]


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Bundled name, local directory or Hub id.")]
PoolingOpt = option_type(ModelOptions, "pooling")
LayerOpt = option_type(ModelOptions, "layer")
AttentionOpt = option_type(ModelOptions, "attention")
EchoOpt = option_type(ModelOptions, "echo")
DimOpt = option_type(ModelOptions, "dim")
MaxLenOpt = option_type(ModelOptions, "max_length")
DtypeOpt = option_type(ModelOptions, "dtype")
BackendOpt = option_type(ModelOptions, "backend")
PrecisionOpt = option_type(ModelOptions, "precision")
CalibrationOpt = option_type(ModelOptions, "calibration")
DeviceOpt = option_type(ModelOptions, "device")
NoCacheOpt = option_type(ModelOptions, "no_cache")
EngineOpt = option_type(EngineOptions, "engine")
RayAddressOpt = option_type(EngineOptions, "ray_address")
WorkersOpt = option_type(EngineOptions, "workers")
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", min=1, help="Texts per forward pass.")]
InstructionOpt = Annotated[
    str | None, typer.Option("--instruction", help="Task instruction for queries (kept out of pooling).")
]
#: What --precision accepts: the torch backend's other float types are chosen with --dtype.
CLI_PRECISIONS = PORTABLE_PRECISIONS


@dataclasses.dataclass(frozen=True)
class _Group:
    """One options-group parameter of a command: its dataclass, the fields offered as flags, the base value."""

    kind: type
    offered: dict[str, Flag]
    base: Any

    def build(self, values: dict[str, Any]) -> Any:
        for name, spec in self.offered.items():
            if spec.parse is not None:
                try:
                    values[name] = spec.parse(values[name])
                except (LmembedError, ValueError) as exc:
                    raise typer.BadParameter(str(exc), param_hint=spec.name) from None
        return dataclasses.replace(self.base, **values)


def _group_of(param: inspect.Parameter) -> _Group | None:
    """The options group a parameter stands for (annotated with an options dataclass), or None."""
    annotation, excluded = param.annotation, frozenset()
    if get_origin(annotation) is Annotated:
        annotation, *extras = get_args(annotation)
        excluded = frozenset().union(*(e.names for e in extras if isinstance(e, Exclude)))
    if not (isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and flags_of(annotation)):
        return None
    offered = {name: spec for name, spec in flags_of(annotation).items() if name not in excluded}
    base = annotation() if param.default is inspect.Parameter.empty else param.default
    return _Group(annotation, offered, base)


def options_command(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` as typer sees it: each parameter annotated with an options dataclass (``ModelOptions``,
    ``EngineOptions``, optionally ``Annotated[..., Exclude(...)]``) becomes that group's flags, in field order
    at its place; the command receives the frozen object built from them (see the module doc)."""
    signature = inspect.signature(command, eval_str=True)
    groups: dict[str, _Group] = {}
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        group = _group_of(param)
        if group is None:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        groups[param.name] = group
        for name in group.offered:
            default = getattr(group.base, name)
            annotation = option_type(group.kind, name)
            params.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            )
    names = [p.name for p in params]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise TypeError(f"{command.__name__}: options offered twice: {', '.join(clashes)}")

    @functools.wraps(command)
    def run(**values: Any) -> Any:
        for name, group in groups.items():
            values[name] = group.build({field: values.pop(field) for field in group.offered})
        return command(**values)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    setattr(run, GROUPS_ATTR, groups)
    return run


def load_embedder(model: str, options: ModelOptions, **strategy: Any) -> Embedder:
    """An :class:`~lmembed.embedder.Embedder` from command-line option values (``backend``, ``precision`` and
    ``calibration`` checked first by :func:`check_backend`)."""
    from lmembed import Embedder  # lazy: torch loads only when a command runs, not for --help
    from lmembed.models.context import PositionInterpolationError  # lazy, as above

    texts = check_backend(options.backend, options.precision, options.calibration)
    try:
        emb = Embedder.from_pretrained(model, **options.loading(), **strategy)
    except PositionInterpolationError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rope-scale") from exc
    return emb.calibrate(texts) if texts is not None else emb


def check_backend(backend: str | None, precision: str, calibration: Path | None) -> list[str] | None:
    """Refuse an unknown backend or precision, or --calibration without int8, before any model loads; return
    the calibration texts (read and checked here, so a bad file fails before the model loads)."""
    from lmembed.io import read_text_lines  # lazy: keeps --help fast

    names = config.BACKENDS  # read when called: the registry as it stands (a backend registered at run time too)
    if backend is not None and backend not in names:
        raise typer.BadParameter(f"{backend!r}: choose {' or '.join(names)}", param_hint="--backend")
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


def check_engine(engine: EngineOptions, model: ModelOptions | None = None) -> str:
    """Refuse an unknown engine, Ray options given to the local engine, or int8 or a plan window on Ray, before any
    work starts."""
    if engine.engine not in ENGINES:
        raise typer.BadParameter(f"{engine.engine!r}: choose one of {', '.join(ENGINES)}", param_hint="--engine")
    if engine.engine == "ray" and model is not None and model.precision == "int8":
        # each worker would calibrate on its own shard: vectors would disagree
        raise typer.BadParameter(
            "int8 runs with --engine local (calibrated once, in one process)", param_hint="--precision"
        )
    if engine.engine == "ray" and model is not None and model.plan_window is not None:
        # each worker plans its own shards with the engine it loads from the spec
        raise typer.BadParameter(
            "--plan-window applies to --engine local (Ray workers plan their shards)", param_hint="--plan-window"
        )
    if engine.engine == "local":
        ray_only = {
            "--ray-address": engine.ray_address,
            "--workers": engine.workers,
            "--gpus-per-worker": engine.gpus_per_worker,
        }
        for option, value in ray_only.items():
            if value is not None:
                raise typer.BadParameter(f"{option} needs --engine ray", param_hint=option)
    return engine.engine


def scale_out(
    embedder: Embedder,
    engine: EngineOptions,
    *,
    on_progress: Any = None,
    memory_map: bool = False,
) -> Embedder:
    """``embedder`` for ``--engine local``; for ``--engine ray`` the same Embedder encoding through sharded jobs,
    whose workers load it themselves from its load spec (device chosen per worker);
    ``memory_map``: results are read-only memory maps of ``.npy`` files in the embedding cache."""
    if engine.engine == "local":
        return embedder
    from lmembed.scale import scaled  # lazy: Ray Data is optional and slow to import

    return scaled(embedder, engine, spec=worker_spec(embedder), on_progress=on_progress, memory_map=memory_map)


def worker_spec(embedder: Embedder) -> Any:
    """How Ray workers load ``embedder`` themselves: its own load spec (an ``lmembed.scale.EmbedderSpec``); each
    worker picks its own device (its GPU, or the CPU)."""
    from lmembed.scale import EmbedderSpec  # lazy: Ray Data is optional and slow to import

    return EmbedderSpec.of(embedder)


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
    try:  # a file made and dropped where the outputs will go (a read-only mount, /proc: os.access says yes to root)
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise typer.BadParameter(f"cannot write to {target}: {exc.strerror or exc}", param_hint=option) from None
    return path


ChunkingOpt = Annotated[
    str | None,
    typer.Option(
        "--chunking",
        help="Long documents: cut documents into --chunk-tokens windows (--chunk-overlap shared) and score "
        "each document by its 'first' chunk, its best chunk ('maxp') or the chunks' 'mean' (default: truncation).",
    ),
]
ChunkTokensOpt = Annotated[int, typer.Option("--chunk-tokens", help="Text tokens per chunk (with --chunking).")]
ChunkOverlapOpt = Annotated[
    int, typer.Option("--chunk-overlap", help="Tokens a chunk shares with the previous one (with --chunking).")
]
LateChunkingOpt = Annotated[
    bool,
    typer.Option(
        "--late-chunking",
        help="With --chunking: pool each chunk from one forward pass over the whole document (up to --max-length).",
    ),
]


def make_chunking(aggregate: str | None, tokens: int, overlap: int, late: bool) -> Any:
    """The :class:`~lmembed.encoding.chunking.Chunking` of --chunking/--chunk-tokens/--chunk-overlap/--late-chunking
    (``None`` without --chunking); a bad value is a clean parameter error."""
    from lmembed.encoding.chunking import AGGREGATES, Chunking

    if aggregate is None and not late:
        return None
    if aggregate not in AGGREGATES:
        raise typer.BadParameter(f"expected one of {', '.join(AGGREGATES)}", param_hint="--chunking")
    try:
        return Chunking(aggregate, tokens=tokens, overlap=overlap, late=late)  # type: ignore[arg-type]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--chunk-tokens/--chunk-overlap") from None


def typed_flags(ctx: typer.Context | None, *names: str) -> list[str]:
    """The flags among the parameters ``names`` of the command of ``ctx`` that the user typed on its command line (not
    defaults, nor an environment variable set for every command); none without a context (a call from Python). How a
    command tells an option it would ignore from one it was never given."""
    if ctx is None:
        return []
    flags = {param.name: param.opts[0] for param in ctx.command.params if param.opts}
    given = []
    for name in names:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            given.append(flags.get(name, f"--{name.replace('_', '-')}"))
    return given


def refuse_unused(ctx: typer.Context | None, names: tuple[str, ...] | list[str], reason: str) -> None:
    """Refuse the flags among ``names`` that the user gave (:func:`typed_flags`), each of which the command would
    ignore: ``reason`` says why (``"not used with --mode bm25"``)."""
    if given := typed_flags(ctx, *names):
        raise typer.BadParameter(
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} {reason}", param_hint=given[0]
        )
