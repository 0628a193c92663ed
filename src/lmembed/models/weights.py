"""The one reader of weight files from elsewhere, and the checks a model folder passes before anything is allocated.

A model folder comes from anyone: a Hub snapshot, a colleague's run, a shared drive. Two things in it can hurt:

* a pickled weight file (``pytorch_model.bin``, ``adapter_model.bin``, a head's ``.bin``): unpickling can run any
  code the file names. Weights are read from safetensors where the folder has them; a pickled file is read only
  with ``torch.load(weights_only=True)``, which accepts plain tensors and containers and refuses everything else.
  A refused file is refused for good (:class:`UnsafeWeightsError`): it is never read any other way.
* numbers in ``config.json`` that do not fit the weights, or any sane model (a negative width, a vocabulary of
  10¹⁰ rows, forty layers where the file holds two). Each is checked here against sane bounds, against what the
  weight files on disk could hold, and against the tensor shapes the files record (read from the safetensors
  header, or from a pickled file loaded onto the ``meta`` device, which reads no tensor data), so a bad folder
  ends in one :class:`ConfigSizeError` naming the file and the field instead of a raw library error or an
  allocation of terabytes.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lmembed.errors import ModelLoadError
from lmembed.io import is_number, loads_json, read_json
from lmembed.paths import inside

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
#: the files that tell transformers a folder's weights are in safetensors (one file, or an index of shards)
TRANSFORMERS_SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
#: every size field of a config: the largest value any real model uses is far below these bounds
SIZE_BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 22,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 14,
    "max_position_embeddings": 1 << 24,
    "type_vocab_size": 1 << 16,
    "num_labels": 1 << 16,
    "n_embd": 1 << 20,
    "n_layer": 1 << 12,
    "n_head": 1 << 12,
    "n_positions": 1 << 24,
    "n_inner": 1 << 22,
    "d_model": 1 << 20,
    "ffn_dim": 1 << 22,
}
#: sizes that may be zero (DeBERTa-v2 has no token-type embeddings: ``type_vocab_size`` 0)
ZERO_ALLOWED = frozenset({"type_vocab_size"})
#: the field names a config may give one size under (GPT-2 style names map to the common ones)
ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "d_model": "hidden_size",
}
#: fields whose products make the largest single tensors: (rows, columns)
PRODUCTS = (("vocab_size", "hidden_size"), ("hidden_size", "intermediate_size"), ("hidden_size", "hidden_size"))
#: a weight element takes at least half a byte on disk (4-bit quantisation), so the files hold at most this many
#: elements per byte
ELEMENTS_PER_BYTE = 2
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


class UnsafeWeightsError(ModelLoadError):
    """A weight file that cannot be read without running code it names (a pickle with more than tensors)."""


class ConfigSizeError(ModelLoadError):
    """A size, shape or count in a model folder's config that is not positive, not sane or not what its weights
    hold."""


# ---------------------------------------------------------------------------------------------------- reading
#: bits per element of each dtype a safetensors header may name (the format's own list)
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes a safetensors file records, read from its JSON header (no tensor is read).

    The header is checked whole, as the safetensors library would check it only once the weights are read (and
    then with an error that names neither file nor tensor): each tensor's dtype is one the format knows, its data
    offsets span exactly the bytes its shape and dtype take, the tensors tile the data part of the file from its
    first byte to its last without gap or overlap, and ``__metadata__`` maps strings to strings."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise ModelLoadError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(MAX_HEADER_BYTES, path.stat().st_size - 8):
                raise ModelLoadError(f"{path}: not a safetensors file (its header length {length} is impossible)")
            header = loads_json(handle.read(length))
            data_bytes = path.stat().st_size - 8 - length
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, a name given twice
        raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from exc
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: not a safetensors file (its header is not an object)")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelLoadError(f"{path}: __metadata__: not an object of strings, as the safetensors format has it")
    shapes: dict[str, tuple[int, ...]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shapes[name], begin, end = _tensor_entry(path, name, entry)
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves bytes {at}-{begin} unused before it"
            raise ModelLoadError(f"{path}: tensor {name!r}: data_offsets {[begin, end]} {what}")
        at = end
    if at != data_bytes:
        raise ModelLoadError(
            f"{path}: the tensors' data_offsets end at byte {at} of the data, which holds {data_bytes} bytes "
            "(a file cut short, or one with more than its header says)"
        )
    return shapes


def _tensor_entry(path: Path, name: str, entry: Any) -> tuple[tuple[int, ...], int, int]:
    """``(shape, begin, end)`` of one tensor's header entry, checked against its dtype's size."""
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{path}: tensor {name!r}: its header entry is not an object")
    shape, dtype, offsets = entry.get("shape"), entry.get("dtype"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ModelLoadError(f"{path}: tensor {name!r} has no valid shape in the header")
    if dtype not in SAFETENSORS_DTYPE_BITS:
        raise ModelLoadError(f"{path}: tensor {name!r}: dtype {dtype!r} is not a safetensors dtype")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise ModelLoadError(f"{path}: tensor {name!r}: data_offsets {offsets!r} are not [begin, end] byte offsets")
    elements = 1
    for dim in shape:
        elements *= dim
    bits = elements * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8:
        raise ModelLoadError(f"{path}: tensor {name!r}: {dtype} {shape} takes {bits} bits, not whole bytes")
    if offsets[1] - offsets[0] != bits // 8:
        raise ModelLoadError(
            f"{path}: tensor {name!r}: {dtype} {shape} takes {bits // 8} bytes, but its data_offsets span "
            f"{offsets[1] - offsets[0]}"
        )
    return tuple(shape), offsets[0], offsets[1]


def load_pickled_weights(path: Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)``: plain tensors and containers only. A file that asks for anything
    else raises :class:`UnsafeWeightsError`; it is never loaded another way. ``map_location="meta"`` reads the
    shapes without the data."""
    import pickle

    import torch  # lazy: the module is imported by light code paths too

    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise unsafe_pickle_error(path, exc) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable weight file ({type(exc).__name__})") from exc
    if not isinstance(state, Mapping):
        raise ModelLoadError(f"{path}: holds a {type(state).__name__}, not a mapping of tensor names to tensors")
    return dict(state)


def unsafe_pickle_error(path: Path | str, exc: BaseException | None = None) -> UnsafeWeightsError:
    """The refusal of a pickled file that holds more than tensors; it names what the file asks to run, never how to
    load it anyway."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc)) if exc is not None else None
    what = f" (it asks to run {found.group(1)})" if found else ""
    return UnsafeWeightsError(
        f"{path}: this pickled file is not loadable safely{what}: it holds more than plain tensors, and "
        "unpickling it could run code. lmembed reads such files only as plain tensors; ask the model's author for "
        "a .safetensors copy"
    )


def is_unpickling_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` (or one it was raised from) is torch's refusal of a pickle under ``weights_only=True``."""
    import pickle

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, pickle.UnpicklingError) or "Weights only load failed" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def weight_files(folder: Path, stem: str = "") -> tuple[list[Path], list[Path]]:
    """The folder's top-level safetensors files and pickled weight files whose name starts with ``stem``."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.startswith(stem)) if folder.is_dir() else []
    safe = [p for p in files if p.name.endswith(".safetensors")]
    pickled = [p for p in files if p.name.endswith(PICKLE_SUFFIXES) and not p.name.startswith("training_args")]
    return safe, pickled


def folder_weights(folder: Path, stem: str = "") -> tuple[dict[str, tuple[tuple[int, ...], Path]], int]:
    """Each tensor's shape and file, and the bytes of the files read. Safetensors files when the folder has them
    (the loaders are told to use them), else the pickled ones, read onto the ``meta`` device (which refuses a
    pickle that holds more than tensors)."""
    safe, pickled = weight_files(folder, stem)
    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for path in safe:
        shapes.update({name: (shape, path) for name, shape in read_safetensors_header(path).items()})
    if not safe:
        for path in pickled:
            for name, tensor in load_pickled_weights(path, map_location="meta").items():
                if hasattr(tensor, "shape"):
                    shapes[str(name)] = (tuple(tensor.shape), path)
    size = sum(p.stat().st_size for p in (safe or pickled))
    return shapes, size


def load_weights_file(path: Path) -> dict[str, Any]:
    """The tensors of one weight file: safetensors as they are, a pickled file only as plain tensors."""
    if path.name.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as exc:  # a truncated or foreign file: name it
            raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from exc
    return load_pickled_weights(path)


def shard_files(folder: Path, index: Path) -> dict[str, Path]:
    """Each tensor's shard file as a sharded checkpoint's index (``model.safetensors.index.json``) names it. Every
    file it names must lie inside ``folder``: transformers opens them by joining the names to the folder, so a
    ``../`` or an absolute name would read weights from anywhere (:class:`UnsafeFileError` naming the index and
    the file it names)."""
    weight_map = read_json(index, error=ModelLoadError, what="weight index").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelLoadError(f"{index}: weight_map: not an object of tensor names to shard file names")
    named: dict[str, Path] = {}
    for file in set(weight_map.values()):
        named[file] = inside(folder, file, file=index, field="weight_map[...]")
    return {tensor: named[file] for tensor, file in weight_map.items()}


def check_shard_indexes(folder: Path) -> None:
    """Every shard index at the top of ``folder`` (``*.index.json``) names only files inside it."""
    for index in sorted(folder.glob("*.index.json")):
        if index.is_file():
            shard_files(folder, index)


# ---------------------------------------------------------------------------------------------------- config checks
def read_config(folder: Path) -> dict[str, Any] | None:
    path = folder / CONFIG_FILE
    if not path.is_file():
        return None
    return read_json(path, error=ModelLoadError, what="model config")


def _size_sections(config: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    yield "", config
    for key in ("text_config", "encoder", "decoder"):
        if isinstance(config.get(key), dict):
            yield f"{key}.", config[key]


def check_size_value(value: Any, field: str, source: Path | str, bound: int | None = None) -> int:
    """``value`` as a size: a positive int within ``bound`` (default: the field's bound); else a
    :class:`ConfigSizeError` naming ``source`` and ``field``."""
    name = field.rsplit(".", 1)[-1]
    bound = bound if bound is not None else SIZE_BOUNDS.get(name, 1 << 24)
    if isinstance(value, float) and value.is_integer():
        what = f"{value:g} is a float"
    elif not isinstance(value, int) or isinstance(value, bool):
        what = f"{value!r} is not an integer"
    elif value < (0 if name in ZERO_ALLOWED else 1):
        what = f"{value} is {'negative' if name in ZERO_ALLOWED else 'not positive'}"
    elif value > bound:
        what = f"{value} is beyond any real model (at most {bound})"
    else:
        return value
    raise ConfigSizeError(f"{source}: {field}={value!r}: {what}; a size must be a positive integer")


#: numbers of a config that must be positive and finite: RoPE's base, the norms' epsilons
POSITIVE_NUMBERS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
#: RoPE scaling factors beyond this stretch positions past anything a published model does
MAX_ROPE_FACTOR = 1 << 10


def _positive_number(value: Any, field: str, source: Path, bound: float | None = None) -> None:
    number_ok = is_number(value, finite=True) and value > 0
    if not number_ok:
        raise ConfigSizeError(f"{source}: {field}={value!r} must be a positive finite number")
    if bound is not None and value > bound:
        raise ConfigSizeError(f"{source}: {field}={value!r} is beyond any published model's (at most {bound})")


def check_config_values(section: Mapping[str, Any], prefix: str, source: Path) -> None:
    """The numbers of a config section besides sizes that transformers believes: RoPE's base and scaling factor
    and the norms' epsilons positive and finite (a negative base gave NaN positions), a sliding window a positive
    integer."""
    for field in POSITIVE_NUMBERS:
        if section.get(field) is not None:
            _positive_number(section[field], prefix + field, source)
    for key in ("rope_scaling", "rope_parameters"):
        rope = section.get(key)
        if isinstance(rope, Mapping):
            for field in ("rope_theta",):
                if rope.get(field) is not None:
                    _positive_number(rope[field], f"{prefix}{key}.{field}", source)
            if rope.get("factor") is not None:
                _positive_number(rope["factor"], f"{prefix}{key}.factor", source, MAX_ROPE_FACTOR)
    window = section.get("sliding_window")
    if window is not None and window != 0:  # 0: some configs' word for none
        check_size_value(window, prefix + "sliding_window", source)


def check_config_sizes(folder: Path) -> None:
    """Check the sizes of ``folder/config.json`` before transformers reads it: positive integers within bounds, no
    single tensor larger than the weight files could hold, no more layers than the files have tensors."""
    config = read_config(folder)
    if config is None:
        return
    source = folder / CONFIG_FILE
    safe, pickled = weight_files(folder)
    files = safe or pickled
    tensor_count = sum(len(read_safetensors_header(p)) for p in safe) if safe else None
    capacity = ELEMENTS_PER_BYTE * sum(p.stat().st_size for p in files) + (1 << 20)
    for prefix, section in _size_sections(config):
        check_config_values(section, prefix, source)
        sizes: dict[str, int] = {}
        for field in SIZE_BOUNDS:
            if section.get(field) is not None:
                sizes[ALIASES.get(field, field)] = check_size_value(section[field], prefix + field, source)
        if not files or config.get("quantization_config"):
            continue
        for rows, columns in PRODUCTS:
            if rows in sizes and columns in sizes and sizes[rows] * sizes[columns] > capacity:
                raise ConfigSizeError(
                    f"{source}: {prefix}{rows}={sizes[rows]} × {prefix}{columns}={sizes[columns]} makes one tensor "
                    f"of {sizes[rows] * sizes[columns]:,} numbers, more than the weight files "
                    f"({', '.join(p.name for p in files)}) could hold"
                )
        layers = sizes.get("num_hidden_layers")
        if layers is not None and tensor_count is not None and layers > tensor_count:
            raise ConfigSizeError(
                f"{source}: {prefix}num_hidden_layers={layers}, but the weight files hold {tensor_count} tensors"
            )


def check_against_weights(
    folder: Path, config: Any, model_class: Any, *, trust_remote_code: bool = False, stem: str = ""
) -> None:
    """Build the model ``model_class.from_config(config)`` on the ``meta`` device (nothing is allocated) and compare
    every tensor it expects with the shape the folder's weight files record: a mismatch, or layers the config has
    and the files lack, is a :class:`ConfigSizeError` naming ``config.json``, the field and the weight file."""
    import torch

    if getattr(config, "quantization_config", None):
        return  # quantised tensors are stored packed, in other shapes
    shapes, _ = folder_weights(folder, stem)
    if not shapes:
        return
    source = folder / CONFIG_FILE
    try:
        with torch.device("meta"):
            model = model_class.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, ZeroDivisionError) as exc:  # sizes that do not fit together (heads that do not divide ...)
        raise ConfigSizeError(f"{source}: the config does not describe a buildable model ({exc})") from exc
    except Exception as exc:  # a model whose construction needs real tensors: transformers' own checks remain
        log.debug("%s: no shape check (the model cannot be built on the meta device: %s)", source, exc)
        return
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") or ""
    found = {_strip(name, prefix): value for name, value in shapes.items()}
    for name, shape in expected.items():
        key = _strip(name, prefix)
        if key in found and found[key][0] != shape:
            actual, path = found[key]
            raise ConfigSizeError(
                f"{source}: {_blame(config, shape, actual)} does not match the weights: {path.name} holds {key} "
                f"of shape {list(actual)}, the config makes it {list(shape)}"
            )
    _check_layers(source, config, {_strip(n, prefix) for n in expected}, found)


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else name


def _blame(config: Any, expected: tuple[int, ...], actual: tuple[int, ...]) -> str:
    """The config field (``field=value``) whose value made the mismatched dimension, as well as it can be told."""
    wrong = [e for e, a in zip(expected, actual, strict=False) if e != a] or list(expected)
    names = [f for f in SIZE_BOUNDS if f != "num_hidden_layers"] + ["num_key_value_heads", "head_dim"]
    for field in names:
        value = getattr(config, field, None)
        if isinstance(value, int) and value in wrong:
            return f"{field}={value}"
    if len(expected) != len(actual):
        return "the config"
    return "the config (sizes " + ", ".join(str(e) for e in wrong) + ")"


def _check_layers(
    source: Path, config: Any, expected: set[str], found: Mapping[str, tuple[tuple[int, ...], Path]]
) -> None:
    """A tensor the config expects at layer ``i`` that the files lack while they hold it at another layer: the
    config has more layers than the weights (transformers would fill them with random numbers)."""
    patterns = {_LAYER_INDEX.sub(".#.", name, count=1) for name in found}
    missing = sorted(
        int(m.group(1))
        for name in expected - set(found)
        if (m := _LAYER_INDEX.search(name)) and _LAYER_INDEX.sub(".#.", name, count=1) in patterns
    )
    if missing:
        layers = getattr(config, "num_hidden_layers", None)
        field = f"num_hidden_layers={layers}" if layers is not None else "the layer count"
        files = sorted({p.name for _, p in found.values()})
        raise ConfigSizeError(
            f"{source}: {field} does not match the weights: the weight files ({', '.join(files)}) hold no layer "
            f"{missing[0]}"
        )


# ---------------------------------------------------------------------------------------------------- head layers
MAX_HEAD_FEATURES = 1 << 20


def check_head_shapes(spec: Mapping[str, Any], folder: Path, source: Path | str) -> None:
    """A sentence-transformers Dense or LayerNorm layer (``spec``, as :mod:`lmembed.pooling.head` builds it) against
    the shapes its weight file in ``folder`` records, before the layer is built: positive sizes within bounds, equal
    to the weights'. ``source`` is the file that gave ``spec`` (named in the refusal)."""
    if spec.get("type") == "dense":
        n_in = check_size_value(spec.get("in_features"), "in_features", source, MAX_HEAD_FEATURES)
        n_out = check_size_value(spec.get("out_features"), "out_features", source, MAX_HEAD_FEATURES)
        wanted = {"linear.weight": (n_out, n_in)}
        if spec.get("bias", True):
            wanted["linear.bias"] = (n_out,)
        if spec.get("residual") and n_in != n_out:
            wanted["residual.weight"] = (n_out, n_in)
        fields = {n_in: f"in_features={n_in}", n_out: f"out_features={n_out}"}
    elif spec.get("type") == "layer_norm":
        dim = check_size_value(spec.get("dimension"), "dimension", source, MAX_HEAD_FEATURES)
        wanted = {"norm.weight": (dim,), "norm.bias": (dim,)}
        fields = {dim: f"dimension={dim}"}
    else:
        return
    shapes, _ = folder_weights(folder)
    if not shapes and not any(weight_files(folder)):
        return  # no weight file: the loader names the missing file
    for name, shape in wanted.items():
        if name not in shapes:
            raise ConfigSizeError(f"{folder}: the weight file holds no {name} (tensors: {', '.join(sorted(shapes))})")
        actual, path = shapes[name]
        if actual != shape:
            wrong = [e for e, a in zip(shape, actual, strict=False) if e != a] or list(shape)
            blamed = next((fields[w] for w in wrong if w in fields), "the sizes")
            raise ConfigSizeError(
                f"{source}: {blamed} does not match the weights: {path} holds {name} of shape {list(actual)}, the "
                f"config makes it {list(shape)}"
            )


# ---------------------------------------------------------------------------------------------------- adapters
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model"
MAX_LORA_RANK = 1 << 16


def check_adapter(folder: Path) -> None:
    """A peft LoRA adapter folder before peft reads it: its weights are safetensors or plain tensors (a pickle with
    more is refused) and its rank ``r`` is a sane positive integer equal to the rank its ``lora_A`` tensors have."""
    source = folder / ADAPTER_CONFIG
    config = read_json(source, error=ModelLoadError, what="adapter config")
    rank = check_size_value(config.get("r", 8), "r", source, MAX_LORA_RANK)
    shapes, _ = folder_weights(folder, ADAPTER_WEIGHTS)
    if not shapes:
        raise ModelLoadError(
            f"{folder}: holds {ADAPTER_CONFIG} but no adapter weights ({ADAPTER_WEIGHTS}.safetensors or .bin)"
        )
    if config.get("rank_pattern"):
        return  # ranks differ per module
    for name, (shape, path) in sorted(shapes.items()):
        if "lora_A" in name and len(shape) == 2 and shape[0] != rank:
            raise ConfigSizeError(
                f"{source}: r={rank} does not match the weights: {path.name} holds {name} of shape {list(shape)}"
            )


# ---------------------------------------------------------------------------------------------------- loading
def pretrained_safely(
    model_class: Any, path: str, *, config: Any = None, unread: tuple[str, ...] = (), **kwargs: Any
) -> Any:
    """``model_class.from_pretrained(path, config=config, **kwargs)`` of a model folder from elsewhere.

    A local folder's sizes are checked first (:func:`check_config_sizes` has run on the raw file before the config
    was parsed; :func:`check_against_weights` runs here), its safetensors files are the ones read when it has
    any, and a pickled file that ``weights_only`` loading refuses raises :class:`UnsafeWeightsError`. A tensor the
    model has and the weights lack is refused (:class:`~lmembed.errors.ModelLoadError` naming it): transformers would
    fill it with random values, so every load would give other vectors. ``unread``: names of modules whose tensors
    may be missing (the caller never reads them, as a BERT pooler under an embedder, or means them to be new, as a
    reranker's head on a backbone that has none)."""
    folder = Path(path)
    local = folder.is_dir()
    if local:
        if config is not None:
            check_against_weights(
                folder, config, model_class, trust_remote_code=bool(kwargs.get("trust_remote_code", False))
            )
        if "gguf_file" not in kwargs and any((folder / name).is_file() for name in TRANSFORMERS_SAFETENSORS):
            kwargs.setdefault("use_safetensors", True)  # never fall back to a pickled file beside them
    try:
        model, info = model_class.from_pretrained(path, config=config, output_loading_info=True, **kwargs)
    except Exception as exc:
        if is_unpickling_refusal(exc):
            culprit = next(iter(weight_files(folder)[1]), folder) if local else path
            raise unsafe_pickle_error(culprit, exc) from None
        raise
    missing = sorted(name for name in info.get("missing_keys", ()) if not set(name.split(".")[:-1]) & set(unread))
    if missing:
        safe, pickled = weight_files(folder) if local else ([], [])
        files = ", ".join(p.name for p in [*safe, *pickled]) if local else "its weight files"
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(
            f"{path}: the model needs {', '.join(missing[:5])}{more}, and its weights as read ({files or 'none'}; "
            "a sharded checkpoint's by its index) give none of them: transformers would fill them with random "
            "values, and every load would give other vectors"
        )
    return model


__all__ = [
    "ConfigSizeError",
    "UnsafeWeightsError",
    "check_adapter",
    "check_against_weights",
    "check_config_sizes",
    "check_head_shapes",
    "check_size_value",
    "folder_weights",
    "load_pickled_weights",
    "load_weights_file",
    "pretrained_safely",
    "read_safetensors_header",
    "unsafe_pickle_error",
]
