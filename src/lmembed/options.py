"""The options that choose how a model is loaded (:class:`ModelOptions`) and where encoding runs
(:class:`EngineOptions`): frozen values built once, at the edge (a command line, a config file, a caller),
and passed down whole.

Each option is one field, and the field carries everything said about it: its type, its default, and, for
those the command line offers, its flag and help text (:func:`flag`). ``lmembed.cli.options`` turns the
fields into command-line options, so an option added here is offered by every command that takes the group,
with no other edit. This module imports nothing heavy: the command line reads it to print ``--help``.

:class:`LoraOptions` is training's LoRA group. Another options dataclass that offers one of these options
declares it with :func:`field_of` (the same type, flag and help; its own default where it differs), so an
option is declared once: training's model side (:class:`lmembed.training.train_config.TrainedModel`) is built
this way from :class:`ModelOptions` and :class:`LoraOptions`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lmembed.config import ATTENTION_HELP, POOLING_HELP
from lmembed.errors import ConfigError

#: The metadata key under which a field keeps its command-line flag (see :func:`flag`).
FLAG = "lmembed.flag"

POOLING_DOC = "Pooling strategy (default: the model's own). " + " ".join(
    f"'{name}': {text}" for name, text in POOLING_HELP.items()
)
ATTENTION_DOC = "Attention for decoders. " + " ".join(f"'{name}': {text}" for name, text in ATTENTION_HELP.items())
LAYER_DOC = (
    "Hidden layer(s) to read: an index (0 = embeddings, -1 = final output, -2 = penultimate ...) "
    "or a comma list averaged together, e.g. '15,16'."
)
ROPE_SCALE_DOC = (
    "Position interpolation for RoPE decoders (Llama, Mistral, Qwen2, Qwen3): positions are scaled down by FACTOR "
    "(> 1), so FACTOR times the trained window can be read (raise --max-length with it); refused for other models."
)
DEVICE_DOC = (
    "cpu, cuda, cuda:N or auto: a CUDA GPU when there is one, else (to encode) Apple's MPS when there is one, "
    "else the CPU; training and adaptation take CUDA or the CPU."
)
BACKEND_DOC = (
    "What runs the model: 'torch' (the reference; CPU or GPU; the default for float32), 'onnx' (ONNX Runtime on "
    "the CPU: exported once, cached, run as a fused graph; vectors within cosine 0.9999 of torch's; the default for "
    "int8; needs pip install 'lmembed\\[onnx]') or 'cuda-graphs' (the torch model on a GPU, each batch widened to a "
    "bucketed shape whose forward pass is captured once as a CUDA graph and replayed: for small models, whose "
    "passes are bound by launching kernels; vectors within float rounding of torch's)."
)
PRECISION_DOC = (
    "float32 (default), or int8: quantised (per-row activations, per-column weights on --backend onnx), "
    "calibrated on --calibration texts and checked against float32 by a quality gate that warns with the gap."
)
DTYPE_DOC = "float32, bfloat16 or float16."
PLAN_WINDOW_DOC = (
    "Tokenise and batch N texts at a time, the next N tokenised while these compute (default: all first, the "
    "least padding). Pays for long texts on a small model on a GPU."
)
CALIBRATION_DOC = (
    "--precision int8: a text file, one text per line, a few hundred of your own texts to calibrate on "
    "(default: a sample of the first texts encoded)."
)
ENGINE_DOC = (
    "Where the work runs: 'local' (this process) or 'ray' (resumable sharded jobs on Ray Data: one worker "
    "per GPU, or per CPU; results identical to 'local'; needs pip install 'lmembed\\[scale]')."
)
RAY_ADDRESS_DOC = "--engine ray: join this running cluster ('auto', 'ray://head:10001'); default: start a local one."
WORKERS_DOC = "--engine ray: number of workers (default: one per GPU, else per CPU)."
GPUS_PER_WORKER_DOC = (
    "--engine ray: GPUs each worker takes (0.5: two workers share one; 0: workers on CPUs even where the cluster "
    "has GPUs). Default: 1 where the cluster has GPUs, else 0."
)

DEFAULT_DTYPE = "float32"
DEFAULT_DEVICE = "cpu"
DEFAULT_PRECISION = "float32"
DEFAULT_ENGINE = "local"
#: Where encoding can run (``lmembed.scale.make_engine`` builds each).
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class Flag:
    """How a field is offered on the command line: its declarations (``--echo/--no-echo``), help text, the
    type the command line reads when it differs from the field's (``--layer`` is read as text), the parser
    from that text to the field's value, and the smallest number accepted."""

    decls: tuple[str, ...]
    help: str
    cli_type: Any = None
    parse: Callable[[Any], Any] | None = None
    min: int | None = None

    @property
    def name(self) -> str:
        """The flag as an error message names it (``--echo``)."""
        return self.decls[0].split("/")[0]


def flag(default: Any, *decls: str, help: str, **more: Any) -> Any:
    """A dataclass field with ``default`` that the command line offers as ``decls`` (see :class:`Flag`); a list
    or dict default is copied for each instance (a ``default_factory``)."""
    metadata = {FLAG: Flag(decls, help, **more)}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.copy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def parse_layer(value: str | int | tuple[int, ...] | None) -> int | tuple[int, ...] | None:
    """'-1' → -1; '15,16' → (15, 16); None, ints and tuples of ints stay as they are."""
    if value is None or isinstance(value, int | tuple):
        return value
    try:
        parts = [int(p) for p in value.split(",") if p.strip()]
    except ValueError as exc:
        raise ConfigError(f"{value!r}: expected an int or a comma list of ints") from exc
    if not parts:
        raise ConfigError("empty value")
    return parts[0] if len(parts) == 1 else tuple(parts)


@dataclass(frozen=True)
class ModelOptions:
    """How to load a model and read it out: strategy (pooling ... max_length) and runtime (dtype ... cache).

    ``None`` strategy options mean the model's own (a saved Embedder's ``lmembed.json``, else the defaults of
    :class:`~lmembed.config.EmbeddingConfig`). :meth:`loading` gives the keyword arguments of
    :meth:`lmembed.embedder.Embedder.from_pretrained`.
    """

    pooling: str | None = flag(None, "--pooling", help=POOLING_DOC)
    layer: int | tuple[int, ...] | None = flag(None, "--layer", help=LAYER_DOC, cli_type=str | None, parse=parse_layer)
    attention: str | None = flag(None, "--attention", help=ATTENTION_DOC)
    echo: bool | None = flag(None, "--echo/--no-echo", help="Echo embeddings: feed the text twice, pool the 2nd copy.")
    dim: int | None = flag(None, "--dim", min=1, help="Matryoshka: keep the first DIM dimensions (then normalise).")
    max_length: int | None = flag(
        None, "--max-length", min=1, help="Truncate texts to this many tokens (default: model's own)."
    )
    rope_scale: float | None = flag(None, "--rope-scale", help=ROPE_SCALE_DOC)
    dtype: str = flag(DEFAULT_DTYPE, "--dtype", help=DTYPE_DOC)
    device: str = flag(DEFAULT_DEVICE, "--device", help=DEVICE_DOC)
    backend: str | None = flag(None, "--backend", help=BACKEND_DOC)
    precision: str = flag(DEFAULT_PRECISION, "--precision", help=PRECISION_DOC)
    calibration: Path | None = flag(None, "--calibration", help=CALIBRATION_DOC)  # noqa: RUF009 (a field)
    no_cache: bool = flag(False, "--no-cache", help="Do not read or write the embedding cache.")
    plan_window: int | None = flag(None, "--plan-window", min=1, help=PLAN_WINDOW_DOC)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", parse_layer(self.layer))  # '15,16' from a file or a flag → (15, 16)

    def loading(self) -> dict[str, Any]:
        """Keyword arguments of ``Embedder.from_pretrained`` (``calibration`` is read by whoever loads: it is
        a file of texts, applied with ``Embedder.calibrate``)."""
        values = asdict(self)
        values.pop("calibration")
        values["cache"] = not values.pop("no_cache")
        values["precision"] = None if self.precision == DEFAULT_PRECISION else self.precision
        return values


@dataclass(frozen=True)
class EngineOptions:
    """Where encoding (or synthesis) runs: ``engine`` (``local`` or ``ray``) and the Ray options.

    ``ray_address`` joins a running cluster (``auto``, ``ray://host:10001``, ``host:6379``), otherwise a local
    one is started with ``num_cpus`` CPUs (default: all of this machine's); ``workers`` actors (default: one per
    GPU when ``gpus_per_worker`` is set or the cluster has GPUs, else one per ``threads_per_worker`` CPUs); a
    worker that dies is restarted up to ``worker_restarts`` times before the job fails.
    """

    engine: str = flag(DEFAULT_ENGINE, "--engine", help=ENGINE_DOC)
    ray_address: str | None = flag(None, "--ray-address", help=RAY_ADDRESS_DOC)
    workers: int | None = flag(None, "--workers", min=1, help=WORKERS_DOC)
    threads_per_worker: int = 1
    gpus_per_worker: float | None = flag(None, "--gpus-per-worker", min=0, help=GPUS_PER_WORKER_DOC)
    num_cpus: int | None = None
    worker_restarts: int = 2

    def ray(self) -> dict[str, Any]:
        """Every option but ``engine``: the settings of a Ray engine."""
        values = asdict(self)
        values.pop("engine")
        return values


def parse_targets(value: str | list[str] | None) -> str | list[str] | None:
    """--lora-targets: 'all-linear' stays; 'q_proj, v_proj' → ['q_proj', 'v_proj']; lists and None stay."""
    if value is None or isinstance(value, list) or value == "all-linear":
        return value
    return [t.strip() for t in value.split(",") if t.strip()]


@dataclass(frozen=True)
class LoraOptions:
    """Training's LoRA group: adapters or full fine-tuning, and the adapters' shape (NV-Embed's r=16, alpha=32,
    dropout 0.1 by default). ``lora=None`` picks LoRA for decoders and full fine-tuning for encoders."""

    lora: bool | None = flag(
        None, "--lora/--no-lora", help="LoRA adapters or full fine-tuning (default: LoRA for decoders)."
    )
    lora_r: int = flag(16, "--lora-r", help="LoRA rank.")
    lora_alpha: int = flag(32, "--lora-alpha", help="LoRA alpha.")
    lora_dropout: float = flag(0.1, "--lora-dropout", help="LoRA dropout.")
    lora_target_modules: str | list[str] = flag(  # noqa: RUF009 (a field)
        "all-linear",
        "--lora-targets",
        help="Comma list of module names for LoRA, or 'all-linear'.",
        cli_type=str | None,
        parse=parse_targets,
    )


_KEEP: Any = object()


def field_of(group: type, name: str, *, default: Any = _KEEP, help: str | None = None) -> Any:
    """A new dataclass field declared as field ``name`` of the options dataclass ``group`` (same type, flag and
    help), for another options dataclass that offers it too (training's model side reuses :class:`ModelOptions`
    and :class:`LoraOptions` this way); ``default`` and ``help`` replace the group's where given."""
    declared = {f.name: f for f in fields(group)}[name]
    spec: Flag = declared.metadata[FLAG]
    return flag(
        declared.default if default is _KEEP else default,
        *spec.decls,
        help=spec.help if help is None else help,
        cli_type=spec.cli_type,
        parse=spec.parse,
        min=spec.min,
    )


def flags_of(options: type) -> dict[str, Flag]:
    """The fields of an options dataclass the command line offers, by field name, in field order."""
    return {f.name: f.metadata[FLAG] for f in fields(options) if FLAG in f.metadata}


__all__ = [
    "EngineOptions",
    "Flag",
    "LoraOptions",
    "ModelOptions",
    "field_of",
    "flag",
    "flags_of",
    "parse_layer",
    "parse_targets",
]
