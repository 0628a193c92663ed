"""Loading a backbone (model + tokenizer) from a bundled name, a local directory or a Hub id."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer

from lmembed.errors import LmembedError, ModelLoadError
from lmembed.io import loads_json, read_json
from lmembed.load_spec import STRATEGY_FILE
from lmembed.models.attention import ModeGate
from lmembed.models.bundled import BUNDLED, resolve_bundled
from lmembed.models.context import interpolation_factor
from lmembed.models.families import detect_kind
from lmembed.models.weights import CONFIG_FILE, check_config_sizes, check_shard_indexes, pretrained_safely
from lmembed.paths import check_links_inside

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Backbone:
    """A loaded transformer with its tokenizer and the facts the engine needs."""

    model: nn.Module
    tokenizer: Any
    name: str
    path: str
    is_decoder: bool  # attends causally in its native mode (decided by models.families.detect_kind)
    dtype: torch.dtype
    device: torch.device
    _fingerprint: str | None = field(default=None, repr=False)  # the weights' part, where hashed at load (int8)
    quantization: str | None = None  # "int8": torch's dynamic int8 Linear modules (``quantize="int8"``)
    #: int8: the float model it was quantised from, kept until its quality gate has read it (then dropped)
    float_reference: nn.Module | None = field(default=None, repr=False, compare=False)
    _key: str | None = field(default=None, init=False, repr=False, compare=False)  # fingerprint(), once computed
    _stamp: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)  # _key's state
    #: who runs the model now, in which attention mode (Embedders made with ``with_config`` share it, and threads)
    modes: ModeGate = field(default_factory=ModeGate, init=False, repr=False, compare=False)

    @property
    def weights_fingerprint(self) -> str | None:
        """The weights' part of :meth:`fingerprint` as last computed (None before it was)."""
        return self._fingerprint

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    def fingerprint(self) -> str:
        """Everything about the model that decides a vector: every weight (names, shapes, values), the model
        config and the tokenizer (:func:`setup_fingerprint`). The model part of embedding-cache and export-cache
        keys; the same on every load of the same folder. Hashed once, and again when :meth:`state_stamp` finds the
        model changed since: a weight written in place (a training step, ``load_state_dict``, ``add_``) or replaced,
        a config field, a tokenizer setting (truncation or padding side, maximum length, added tokens) or the
        tokenizer itself; else the cache would serve the vectors of the model as it was. A change the stamp cannot
        see (a tokenizer's normaliser replaced inside its backend) needs :meth:`invalidate_fingerprint`."""
        stamp = self.state_stamp()
        if self._key is not None and stamp != self._stamp:
            if (self._stamp is None or stamp[0] != self._stamp[0]) and self.quantization is None:
                self._fingerprint = None  # the weights changed: hashed again (an int8 model's hash is its load's)
            self._key = None
        if self._key is None:
            self._stamp = stamp
            if self._fingerprint is None:
                self._fingerprint = weights_fingerprint(self.model)
            key = self._fingerprint
            factor = interpolation_factor(self.model)
            if factor is not None:  # RoPE scaled (models.context): same weights, other vectors
                key += f"-pi{factor:g}"
            self._key = f"{key}-c{setup_fingerprint(self.model.config, self.tokenizer)}"
        return self._key

    def invalidate_fingerprint(self) -> None:
        """Hash the model again at the next :meth:`fingerprint` (after a change :meth:`state_stamp` cannot see)."""
        self._fingerprint = None
        self._key = None

    def state_stamp(self) -> tuple[Any, ...]:
        """A cheap record of the model's state, to tell whether it changed since it was hashed: each weight's and
        buffer's storage and version counter (torch counts every in-place write), the config's fields and the
        tokenizer's settings; microseconds, where hashing the weights takes a second."""
        weights = tuple(_tensor_state(t) for t in (*self.model.parameters(), *self.model.buffers()))
        config = json.dumps(_vector_fields(self.model.config.to_dict()), sort_keys=True, default=str)
        tokenizer = self.tokenizer
        settings = tokenizer_state(tokenizer, pipeline=False)[0] if tokenizer is not None else []
        size = len(tokenizer) if tokenizer is not None else 0
        return weights, config, id(tokenizer), size, json.dumps(settings, sort_keys=True, default=str)


def _tensor_state(tensor: torch.Tensor) -> tuple[int, int]:
    try:
        return tensor.data_ptr(), tensor._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) keeps no version counter
        return tensor.data_ptr(), -1


#: Config fields that say where or how a model was loaded, not what it computes; they stay out of the fingerprint so
#: that copies and reloads of a folder share cache entries. Private fields (``_name_or_path``,
#: ``_attn_implementation``, ...) are left out too; the dtype is in the weights' hash.
CONFIG_BOOKKEEPING = frozenset(
    {
        "transformers_version",
        "torch_dtype",
        "dtype",
        "architectures",
        "base_model_name_or_path",
        "use_cache",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "torchscript",
    }
)


def _vector_fields(value: Any) -> Any:
    """A config's ``to_dict()`` without its bookkeeping fields (:data:`CONFIG_BOOKKEEPING`), sub-configs included."""
    if isinstance(value, dict):
        return {
            str(k): _vector_fields(v)
            for k, v in value.items()
            if not (str(k).startswith("_") or k in CONFIG_BOOKKEEPING)
        }
    if isinstance(value, list | tuple):
        return [_vector_fields(v) for v in value]
    return value


def tokenizer_state(tokenizer: Any, *, pipeline: bool = True) -> tuple[list[Any], str]:
    """What of a tokenizer decides token ids: its settings (class, special tokens, padding and truncation sides,
    maximum length) and its whole pipeline as text (a fast tokenizer's backend JSON: added tokens, normaliser,
    pre-tokeniser, post-processor, decoder, vocabulary and merges; a slow one's vocabulary; with ``pipeline=False``
    the settings alone, and an empty text)."""
    if tokenizer is None:
        return [], ""
    rust = getattr(tokenizer, "backend_tokenizer", None)
    if not pipeline:
        text = ""
    elif rust is not None:
        text = rust.to_str()
        # the JSON opens with the version and the truncation and padding of the last call (set per call by whoever
        # tokenised last, not the tokenizer's own): the pipeline proper starts at the added tokens
        _, found, rest = text.partition('"added_tokens":')
        text = rest if found else text
    elif callable(getattr(tokenizer, "get_vocab", None)):
        text = json.dumps(sorted(tokenizer.get_vocab().items()), default=str)
    else:
        text = ""  # not a transformers tokenizer: its class and settings are all there is to hash
    settings = [
        type(tokenizer).__name__,
        getattr(tokenizer, "special_tokens_map", None),
        getattr(tokenizer, "padding_side", None),
        getattr(tokenizer, "truncation_side", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    return settings, text


def setup_fingerprint(config: Any, tokenizer: Any) -> str:
    """A 16-hex-digit hash of the model config (less :data:`CONFIG_BOOKKEEPING`) and the tokenizer
    (:func:`tokenizer_state`): the same weights with another sliding window, RoPE base or vocabulary get another."""
    settings, pipeline = tokenizer_state(tokenizer)
    state = {"config": _vector_fields(config.to_dict()), "tokenizer": settings}
    digest = hashlib.blake2b(json.dumps(state, sort_keys=True, default=str).encode(), digest_size=8)
    digest.update(b"\x00")
    digest.update(pipeline.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def weights_fingerprint(*modules: nn.Module) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for module in modules:
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def model_class_for(config: Any) -> Any:
    """The transformers class that loads a checkpoint as an embedder's backbone: ``AutoModel``, except a T5
    checkpoint, whose encoder alone is read (as sentence-transformers reads sentence-t5): its encoder-decoder
    ``T5Model`` would need decoder inputs."""
    if getattr(config, "model_type", None) == "t5":
        from transformers import T5EncoderModel

        return T5EncoderModel
    return AutoModel


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise ModelLoadError(f"device={device!r} is not a device name (use cpu, cuda, cuda:N, mps or auto)")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"device={device!r} is not a valid device (use cpu, cuda, cuda:N, mps or auto)") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' was requested but no CUDA GPU is available; use device='cpu' or 'auto'")
    if resolved.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("device='mps' was requested but this torch has no usable Apple GPU; use 'cpu' or 'auto'")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"device={device!r}: lmembed runs on cpu, cuda or mps")
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype={dtype!r} is unknown; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


#: Where a training run (``lmembed train -o RUN``) and a stage keep their final model, and the file in which a
#: recipe run lists its stages.
RUN_MODEL_DIR = "model"
RECIPE_RESULT_FILE = "recipe_result.json"


def find_model_dir(path: Path) -> Path:
    """``path`` when it is a checkpoint; the model inside it when it is a run folder: ``RUN/model`` of
    ``lmembed train``, or the last finished stage's model of a recipe run. Raises :class:`ModelLoadError`
    when ``path`` is neither."""
    if path.is_file():
        raise ModelLoadError(f"{path} is a file; a model is a folder holding config.json (or a bundled name)")
    if (path / "config.json").exists() or (path / "modules.json").exists():  # a checkpoint, a sentence-transformers one
        return path
    if (path / RUN_MODEL_DIR / "config.json").exists():
        return path / RUN_MODEL_DIR
    recipe = path / RECIPE_RESULT_FILE
    if recipe.exists():
        stages = read_json(recipe, error=ModelLoadError, what="recipe result").get("stages") or []
        if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
            raise ModelLoadError(f"{recipe}: stages: not a list of stage records (not as a recipe writes it)")
        for stage in reversed(stages):
            candidate = path / str(stage.get("name", "")) / RUN_MODEL_DIR
            if stage.get("name") and (candidate / "config.json").exists():
                return candidate
    if (path / "model.onnx").is_file() and (path / STRATEGY_FILE).is_file():
        raise ModelLoadError(
            f"{path} is an lmembed export (model.onnx, for ONNX Runtime without lmembed); lmembed loads the model it "
            "was exported from (its lmembed.json names it under 'load'), with --backend onnx to run the same graph"
        )
    raise ModelLoadError(
        f"{path} exists but holds no model: no config.json there, no {RUN_MODEL_DIR}/ of a training run, "
        f"and no finished recipe stage"
    )


def is_hub_id(name: str) -> bool:
    """True when ``name`` has the form of a Hub id, ``org/name`` (whether the Hub knows it is its own business)."""
    return name.count("/") == 1 and not name.startswith((".", "/"))


def resolve_model_path(name_or_path: str) -> str:
    """Bundled short name → local checkpoint; an existing directory (or a run folder, see
    :func:`find_model_dir`) → its model; anything else is a Hub id."""
    if name_or_path in BUNDLED:
        return str(resolve_bundled(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(find_model_dir(path))
    if is_hub_id(name_or_path):
        return name_or_path  # a Hub id: transformers downloads it (needs internet)
    raise ModelLoadError(
        f"model {name_or_path!r} is neither a bundled name ({', '.join(BUNDLED)}), "
        "an existing directory, nor a Hub id of the form 'org/name'"
    )


def check_model_name(name_or_path: str) -> None:
    """Refuse ``name_or_path`` where :func:`resolve_model_path` could not use it (:class:`ModelLoadError`), without
    loading or converting anything: a bundled name is taken as it is."""
    if name_or_path not in BUNDLED:
        resolve_model_path(name_or_path)


def load_backbone(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    attn_implementation: str | None = "sdpa",
    trust_remote_code: bool = False,
    quantize: str | None = None,
    exact_tokenizer: bool = False,
) -> Backbone:
    """Load model and tokenizer; the model is the base transformer (no LM head), in eval mode.

    ``quantize="int8"`` applies PyTorch's dynamic int8 quantisation to the Linear layers except the FFN output
    projections (CPU inference only): weights are stored in int8, activations quantised on the fly. This is the
    torch backend's int8 (``Embedder.from_pretrained(..., backend="torch", precision="int8")``); the default int8
    path runs on ONNX Runtime (:mod:`lmembed.encoding.backends.int8`), which measured faster and closer to
    float32 here.

    ``exact_tokenizer=True`` (for directories lmembed saved itself) loads the tokenizer class recorded in
    ``tokenizer_config.json`` rather than the one transformers associates with the model type.
    """
    start = time.perf_counter()
    path = resolve_model_path(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    torch_device = resolve_device(device)
    check_local_model(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as exc:  # not a folder here, and the Hub could not give it (unreachable, no such repository)
        first = _first_line(exc)
        raise ModelLoadError(f"{name_or_path}: cannot be loaded: {first}") from exc
    except LmembedError:
        raise
    except CONFIG_READ_ERRORS as exc:  # a value of config.json transformers cannot take
        raise config_error(path, exc) from exc
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model_class = model_class_for(config)
    try:
        try:
            model = pretrained_safely(model_class, path, config=config, unread=UNREAD_TENSORS, **kwargs)
        except LmembedError:
            raise
        except ValueError as exc:
            # SDPA is the default request; architectures without it (Mamba, RWKV ...) get transformers' default.
            if attn_implementation != "sdpa" or "does not support an attention implementation" not in str(exc):
                raise
            log.info("%s has no SDPA attention; loading it with transformers' default implementation", path)
            kwargs.pop("attn_implementation")
            model = pretrained_safely(model_class, path, config=config, unread=UNREAD_TENSORS, **kwargs)
    except LmembedError:
        raise
    except OSError as exc:  # no weight file transformers can read (a copy cut short), or the Hub could not give one
        first = _first_line(exc, 300)
        raise ModelLoadError(f"{name_or_path}: the model's weights cannot be loaded: {first}") from exc
    except CONFIG_READ_ERRORS as exc:  # the model cannot be built from config.json's values (an unknown activation)
        raise config_error(path, exc) from exc
    model.to(torch_device).eval()
    tokenizer = None
    if exact_tokenizer:
        tokenizer = load_recorded_tokenizer(path)
    if tokenizer is None:
        tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    check_token_ids(tokenizer, model, path)
    fingerprint, reference = None, None
    if quantize is not None:
        reference = model
        model, fingerprint = quantize_int8(model, quantize, torch_device)
    log.info("loaded %s in %.1f s", name_or_path, time.perf_counter() - start)
    return Backbone(
        model=model,
        tokenizer=tokenizer,
        name=name_or_path,
        path=path,
        is_decoder=detect_kind(model).is_decoder,
        dtype=torch_dtype,
        device=torch_device,
        _fingerprint=fingerprint,
        quantization=quantize,
        float_reference=reference,
    )


#: tensors an embedder's backbone may lack (transformers then fills them at random): those lmembed never reads, the
#: BERT-style pooler over the first token (the strategy pools the hidden states itself)
UNREAD_TENSORS = ("pooler",)

#: what transformers raises on a config value it cannot take (its strict dataclasses raise their own kind)
CONFIG_READ_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, KeyError, TypeError, AttributeError, AssertionError, IndexError, StrictDataclassError,
)  # fmt: skip


def _first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of what a library's exception says (its type's name when it says nothing), cut at ``limit``."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def config_error(path: str | Path, exc: BaseException) -> ModelLoadError:
    """A :class:`ModelLoadError` naming ``config.json`` (or the model, from the Hub) and transformers' reason."""
    where = Path(path) / CONFIG_FILE if Path(path).is_dir() else path
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return ModelLoadError(f"{where}: transformers cannot build the model from it ({type(exc).__name__}: {first})")


def check_local_model(path: str | Path) -> None:
    """What every loader checks of a local model folder before transformers opens it: no link leads outside it
    (transformers opens files by name, links followed), no shard index names a file outside it (transformers joins
    those names to the folder), and its config's sizes fit its weights (models.weights). A Hub id is left to
    transformers."""
    if Path(path).is_dir():
        check_links_inside(Path(path))  # UnsafeFileError, as every path that leaves a folder
        check_shard_indexes(Path(path))
        check_config_sizes(Path(path))


#: the files of a tokenizer's settings beside ``tokenizer.json``, each a JSON object
TOKENIZER_SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json")
#: fields of ``tokenizer_config.json`` whose type transformers trusts, and what each must be
_TOKENIZER_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model_max_length": ((int, float), "a number"),
    "do_lower_case": ((bool,), "true or false"),
    "add_bos_token": ((bool,), "true or false"),
    "add_eos_token": ((bool,), "true or false"),
    "add_prefix_space": ((bool,), "true or false"),
    "clean_up_tokenization_spaces": ((bool,), "true or false"),
    "split_special_tokens": ((bool,), "true or false"),
}


def check_tokenizer_settings(folder: Path) -> None:
    """A local tokenizer's settings files, read before transformers reads them: each a JSON object without a key
    given twice, and the fields transformers uses unchecked of their types (a ``model_max_length`` of ``"big"``
    ended in an internal TypeError at the first text; ``padding_side`` other than left/right was believed)."""
    for name in TOKENIZER_SETTINGS_FILES:
        path = folder / name
        if not path.is_file():
            continue
        settings = read_json(path, error=ModelLoadError, what="tokenizer settings")
        if name != "tokenizer_config.json":
            continue
        for key, (kinds, what) in _TOKENIZER_FIELD_TYPES.items():
            value = settings.get(key)
            if value is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
                raise ModelLoadError(f"{path}: {key}={value!r} must be {what}")
        limit = settings.get("model_max_length")
        if isinstance(limit, int | float) and not limit >= 1:
            raise ModelLoadError(f"{path}: model_max_length={limit!r} must be at least 1")
        for key in ("padding_side", "truncation_side"):
            if key in settings and settings[key] not in ("left", "right"):
                raise ModelLoadError(f"{path}: {key}={settings[key]!r} must be 'left' or 'right'")


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` of ``path`` (every loader's); a tokenizer file it cannot read is a :class:`ModelLoadError`
    naming the file (the tokenizers library raises bare exceptions, KeyErrors and Rust panics on malformed files):
    ``tokenizer.json`` when it cannot be read alone, else the settings beside it."""
    folder = Path(path)
    tokenizer_file = folder / "tokenizer.json"
    if folder.is_dir():
        check_tokenizer_settings(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, RecursionError, MemoryError):
        raise  # not the file's content (an unreachable Hub raises OSError, handled by the caller)
    except BaseException as exc:  # a pyo3 PanicException derives from BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        if tokenizer_file.is_file():  # read again only to say why, once the tokenizer has failed on it
            try:
                loads_json(tokenizer_file.read_bytes())
            except ValueError as bad:  # not UTF-8, not JSON, a key given twice
                raise ModelLoadError(f"{tokenizer_file}: not readable JSON ({bad})") from exc
        first = _first_line(exc, 200)
        named = tokenizer_file if tokenizer_file.is_file() else folder
        if tokenizer_file.is_file() and _reads_alone(tokenizer_file):
            named = _settings_file_at_fault(folder, str(exc)) or named
        raise ModelLoadError(f"{named}: the tokenizer cannot be read from it ({type(exc).__name__}: {first})") from exc
    _check_vocabulary(tokenizer, folder)
    return tokenizer


def _settings_file_at_fault(folder: Path, said: str) -> Path | None:
    """The settings file beside ``tokenizer.json`` that a tokenizer's failure is about: of those holding a key the
    failure names, the one transformers reads last (``special_tokens_map.json``'s tokens override the config's),
    else the first one there."""
    present = [folder / n for n in TOKENIZER_SETTINGS_FILES if (folder / n).is_file()]
    naming = [
        path
        for path in present
        if any(re.search(rf"\b{re.escape(key)}\b", said) for key in read_json(path, error=ModelLoadError))
    ]
    return naming[-1] if naming else (present[0] if present else None)


def _check_vocabulary(tokenizer: Any, folder: Path) -> None:
    """A tokenizer whose vocabulary is nothing but its special tokens (a folder whose vocabulary file is missing:
    transformers builds one from the settings alone) would read every word as unknown, and every text alike."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        return
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    if vocab and set(vocab) <= special:
        raise ModelLoadError(
            f"{folder}: the tokenizer holds no vocabulary beyond its {len(vocab)} special tokens, so every word would "
            "be read as unknown; the folder lacks its vocabulary file (tokenizer.json, vocab.txt, vocab.json with "
            "merges.txt, or a SentencePiece model)"
        )


def _reads_alone(tokenizer_file: Path) -> bool:
    """Whether the tokenizers library reads ``tokenizer.json`` by itself (so a failure lies in the settings)."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(tokenizer_file))
    except BaseException as exc:  # a pyo3 PanicException derives from BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return False
    return True


def check_token_ids(tokenizer: Any, model: nn.Module, source: str | Path) -> None:
    """Every id the tokenizer can give has a row in the model's input embeddings; a token beyond them (a
    ``tokenizer.json`` edited, or taken from another model) ended in an internal IndexError at the first text
    holding it. Refused at load, naming the token, its id and the rows."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    rust = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(rows, int) or rust is None:
        return
    vocab = rust.get_vocab(with_added_tokens=True)
    if not vocab:
        return
    token, top = max(vocab.items(), key=lambda item: item[1])
    if top >= rows:
        folder = Path(source)
        named = folder / "tokenizer.json" if (folder / "tokenizer.json").is_file() else source
        raise ModelLoadError(
            f"{named}: token {token!r} has id {top}, beyond the model's {rows} embedding rows (vocab_size in "
            "config.json): the tokenizer is not this model's"
        )


def load_recorded_tokenizer(path: str) -> Any | None:
    """The tokenizer of a saved directory, loaded with exactly the class its ``tokenizer_config.json`` names.

    ``AutoTokenizer`` prefers the class transformers registers for some model types (Qwen2, ...) over the
    recorded one, which for a tokenizer lmembed saved itself gives different token ids; None when the
    file names no class transformers knows, or custom code (``auto_map``) is involved.
    """
    # lazy: transformers is heavy and only needed once a model is loaded
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config_file = Path(path) / "tokenizer_config.json"
    if not config_file.exists():
        return None
    recorded = read_json(config_file, error=ModelLoadError, what="tokenizer settings")
    name = recorded.get("tokenizer_class")
    if name is not None and not isinstance(name, str):
        raise ModelLoadError(f"{config_file}: tokenizer_class={name!r} is not a class name")
    if not isinstance(name, str) or "auto_map" in recorded:
        return None
    tokenizer_class = tokenizer_class_from_name(name) or tokenizer_class_from_name(name.removesuffix("Fast"))
    if tokenizer_class is None:
        return None
    return tokenizer_class.from_pretrained(path)


# Linear layers fed by the FFN activation carry large outliers; int8 there costs the most accuracy.
INT8_SKIP = ("down_proj", "fc2", "c_proj")


def _int8_skipped(name: str) -> bool:
    is_bert_ffn_out = name.endswith("output.dense") and "attention" not in name
    return is_bert_ffn_out or name.endswith(INT8_SKIP)


#: the least share of a model's weight matrices (embeddings aside) torch's dynamic int8 must quantise
MIN_INT8_SHARE = 0.5


def _int8_share(model: nn.Module, targets: set[str]) -> float:
    """The share of ``model``'s weight matrices (parameters of two or more dimensions, embedding tables aside) held by
    the Linear layers ``targets`` names: what dynamic int8 quantises of it."""
    tables = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    total = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and id(p) not in tables)
    quantised = sum(m.weight.numel() for name, m in model.named_modules() if name in targets)
    return quantised / total if total else 0.0


def quantize_int8(model: nn.Module, scheme: str, device: torch.device) -> tuple[nn.Module, str]:
    """Dynamic int8 quantisation (per-channel weights) of the Linear layers, except the FFN output
    projections; returns the model and its cache fingerprint."""
    if scheme != "int8":
        raise ModelLoadError(f"quantize={scheme!r} is unknown; the only scheme is 'int8' (dynamic, CPU)")
    if device.type != "cpu":
        raise ModelLoadError("quantize='int8' (dynamic quantisation) runs on the CPU only; use device='cpu'")
    # lazy: torch's quantisation package loads only for the int8 path
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    fingerprint = weights_fingerprint(model) + "-int8"
    targets = {
        name: per_channel_dynamic_qconfig
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and not _int8_skipped(name)
    }
    share = _int8_share(model, set(targets))
    if share < MIN_INT8_SHARE:  # I-BERT's QuantLinear layers are not nn.Linear: it ran as float32, labelled int8
        raise ModelLoadError(
            f"quantize='int8': model_type={getattr(model.config, 'model_type', '?')!r} keeps {1 - share:.0%} of its "
            "weight matrices in layers torch's dynamic int8 does not quantise (it quantises nn.Linear), so it would "
            "run almost as float32 under an int8 label; use precision='float32', or backend='onnx' with int8"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao deprecation notice
        return quantize_dynamic(model, targets, dtype=torch.qint8), fingerprint


def backbone_from_model(model: nn.Module, tokenizer: Any, name: str = "in-memory") -> Backbone:
    """Wrap an already-built model (e.g. a tiny random one in a test) as a backbone."""
    param = next(model.parameters())
    model.eval()
    return Backbone(
        model=model,
        tokenizer=tokenizer,
        name=name,
        path="",
        is_decoder=detect_kind(model).is_decoder,
        dtype=param.dtype,
        device=param.device,
    )
