"""Reading a sentence-transformers folder (``modules.json`` and each module's files) into lmembed's strategy, and
writing one back (the end of this module).

A published sentence-transformers model says how it embeds in its own files: ``modules.json`` lists the module
stack, ``sentence_bert_config.json`` (and the tokenizer's files) the truncation length and lowercasing, each
``N_Pooling/config.json`` the pooling mode and whether prompt tokens are pooled, Dense/LayerNorm/Normalize modules
what happens to the pooled vector, and ``config_sentence_transformers.json`` the prompts and similarity. This
module turns those files into :class:`~lmembed.config.EmbeddingConfig` options (``PublishedModel.options``),
remembers which file decided each option (``sources``), and loads the head layers' weights.

Everything lmembed reproduces exactly is read; anything else (custom code, CNN/LSTM/word-embedding modules,
multi-vector settings, an unknown pooling flag or activation, concatenated pooling modes) is refused with a
:class:`PublishedModelError` naming the module and the file: a module is never skipped silently.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import save_file

from lmembed.atomic import atomic_write_text
from lmembed.config import EmbeddingConfig
from lmembed.errors import ModelLoadError, UnsafeFileError
from lmembed.io import read_json
from lmembed.models.weights import UnsafeWeightsError, check_head_shapes, load_weights_file
from lmembed.paths import inside
from lmembed.schema import first_problem

MODULES_FILE = "modules.json"
MODEL_CONFIG_FILE = "config_sentence_transformers.json"
TRANSFORMER_CONFIG_FILES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
#: sentence-transformers' pooling modes → lmembed's pooling names
POOLING_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weighted_mean",
    "lasttoken": "last",
}
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
#: torch activation classes a Dense module may name → lmembed's activation names
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}
ACTIVATION_PATHS = {name: path for path, name in ACTIVATIONS.items()}
SIMILARITY_NAMES = {
    "cosine": "cosine",
    "dot": "dot",
    "dot_product": "dot",
    "euclidean": "euclidean",
    "manhattan": "manhattan",
}
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # sentence-transformers' documented order
HEAD_MODULES = ("Dense", "LayerNorm", "Normalize", "Dropout")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class PublishedModelError(ModelLoadError):
    """A sentence-transformers folder lmembed cannot reproduce exactly, or whose files are malformed."""


class UnsafeModuleError(PublishedModelError, UnsafeFileError):
    """A module path (``modules.json``, a Router's structure) that leaves the model folder: an absolute path, a
    ``..`` or a link to elsewhere. Refused before anything there is read."""


@dataclass
class PublishedModel:
    """What a sentence-transformers folder decides: strategy ``options``, the file behind each (``sources``), the
    folder holding the transformer (``model_dir``) and the post-pooling head's weights (one dict per layer)."""

    root: Path
    model_dir: Path
    options: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    head_weights: list[dict[str, torch.Tensor]] = field(default_factory=list)
    tokenizer_settings: dict[str, Any] = field(default_factory=dict)

    def decide(self, option: str, value: Any, source: Path | str) -> None:
        self.options[option] = value
        self.sources[option] = str(source)


def is_sentence_transformers_folder(path: str | Path) -> bool:
    return (Path(path) / MODULES_FILE).is_file()


def download_published_folder(repo_id: str) -> Path | None:
    """The local snapshot of Hub model ``repo_id``'s sentence-transformers files (its module stack and configs,
    the head modules' weights), or None when it has no ``modules.json``. Called once the backbone has loaded
    from the Hub, so the Hub is reachable."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download

        hf_hub_download(repo_id, MODULES_FILE)
        folder = Path(snapshot_download(repo_id, allow_patterns=["*.json", "*/*.json", "*/*.safetensors", "*/*.bin"]))
    except Exception:  # no modules.json (a plain transformers checkpoint), or the Hub is gone again
        return None
    return folder


def read_module_json(
    path: Path, what: str = "file", schema: type[BaseModel] | None = None, *, kind: type = dict
) -> Any:
    """The JSON content of ``path`` (a ``kind``: an object unless said); a missing or malformed file, one holding
    another type, or one whose fields ``schema`` refuses (the types of the fields lmembed reads), is a
    :class:`PublishedModelError` naming the file and field."""
    if not path.is_file():
        raise PublishedModelError(f"{path}: the {what} is missing")
    data = read_json(path, error=PublishedModelError, what=what, kind=kind)
    if schema is not None:
        try:
            schema.model_validate(data)
        except ValidationError as exc:
            problem = f"{path}: {first_problem(exc)} (the {what} as sentence-transformers writes it)"
            raise PublishedModelError(problem) from exc
    return data


# The fields lmembed reads of a published folder's files, typed strictly (a "false" or "64" in quotes is refused, not
# read as true or skipped); other fields are the readers' to refuse or to leave.
_Size = Annotated[int, Field(strict=True, ge=1, le=1 << 24)]
_Flag = Annotated[bool, Field(strict=True)]
_Name = Annotated[str, Field(strict=True)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class _TextProcessing(_Open):
    max_length: _Size | None = None


class _Processing(_Open):
    text: _TextProcessing | None = None


class TransformerFile(_Open):
    """``sentence_bert_config.json`` and its older names."""

    max_seq_length: _Size | None = None
    do_lower_case: _Flag | None = None
    transformer_task: _Name | None = None
    module_output_name: _Name | None = None
    processing_kwargs: _Processing | None = None
    model_kwargs: dict[str, Any] | None = None
    model_args: dict[str, Any] | None = None
    tokenizer_args: dict[str, Any] | None = None
    processor_kwargs: dict[str, Any] | None = None
    config_kwargs: dict[str, Any] | None = None
    config_args: dict[str, Any] | None = None


class PoolingFile(_Open):
    """``1_Pooling/config.json``: one mode as a name or a list of names, or the legacy one-flag-per-mode form."""

    pooling_mode: _Name | list[_Name] | None = None
    include_prompt: _Flag | None = None
    embedding_dimension: _Size | None = None
    word_embedding_dimension: _Size | None = None
    pooling_mode_cls_token: _Flag | None = None
    pooling_mode_max_tokens: _Flag | None = None
    pooling_mode_mean_tokens: _Flag | None = None
    pooling_mode_mean_sqrt_len_tokens: _Flag | None = None
    pooling_mode_weightedmean_tokens: _Flag | None = None
    pooling_mode_lasttoken: _Flag | None = None


class _RouterParameters(_Open):
    default_route: _Name | None = None
    route_mappings: dict[str, _Name] | None = None


class RouterFile(_Open):
    """``router_config.json`` (or a legacy Asym's ``config.json``)."""

    types: dict[str, Any] | None = None
    structure: dict[str, Any] | None = None
    parameters: _RouterParameters | None = None


class ModelFile(_Open):
    """``config_sentence_transformers.json``."""

    model_type: _Name | None = None
    prompts: dict[str, _Name] | None = None
    default_prompt_name: _Name | None = None
    similarity_fn_name: _Name | None = None


class _Limits(_Open):
    """The tokenizer's and the model's ``model_max_length`` / ``max_position_embeddings``: any JSON object."""


def read_published_folder(root: str | Path) -> PublishedModel:
    """Read the sentence-transformers folder ``root`` (it has a ``modules.json``) into a :class:`PublishedModel`.

    Every module path must lie inside ``root`` once links are followed (:func:`lmembed.paths.inside`); one that
    leaves it is an :class:`UnsafeModuleError` naming ``modules.json`` and the entry, before any module is read."""
    root = Path(root)
    entries = _module_entries(root / MODULES_FILE)
    folders = [_module_folder(root, entry["path"], f"modules[{i}].path") for i, entry in enumerate(entries)]
    kinds = [_module_kind(entry, root / MODULES_FILE) for entry in entries]
    if not kinds or kinds[0] != "Transformer":
        raise PublishedModelError(
            f"{root / MODULES_FILE}: the first module is {kinds[0] if kinds else 'missing'}; lmembed reproduces "
            "stacks that start with a Transformer module"
        )
    published = PublishedModel(root=root, model_dir=folders[0])
    _read_transformer(published, published.model_dir)
    head: list[dict[str, Any]] = []
    pooled = False
    for entry, kind, folder in zip(entries[1:], kinds[1:], folders[1:], strict=True):
        if kind == "Pooling" and not pooled:
            _read_pooling(published, folder)
            pooled = True
        elif kind in HEAD_MODULES and pooled:
            head.extend(_read_head_module(published, kind, folder, route=None))
        elif kind in ("Router", "Asym") and pooled:
            head.extend(_read_router(published, folder))
        else:
            where = "before the Pooling module" if not pooled else "here"
            raise PublishedModelError(
                f"{root / MODULES_FILE}: module {entry['name']!r} ({entry['type']}, in {folder}) cannot come {where}; "
                "lmembed reproduces Transformer → Pooling → Dense/LayerNorm/Normalize/Router stacks"
            )
    if not pooled:
        raise PublishedModelError(f"{root / MODULES_FILE}: the stack has no Pooling module")
    _settle_head(published, head, root / MODULES_FILE)
    _read_model_config(published, root / MODEL_CONFIG_FILE)
    EmbeddingConfig.from_dict(dict(published.options))  # every option read is one lmembed accepts
    return published


# ---------------------------------------------------------------------------------------------------- modules.json
def _module_entries(path: Path) -> list[dict[str, Any]]:
    data = read_module_json(path, "module list", kind=list)
    for i, entry in enumerate(data):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("type"), str)
            or not isinstance(entry.get("path"), str)
        ):
            raise PublishedModelError(f"{path}: entry {i} must be an object with string 'type' and 'path'")
        entry.setdefault("name", str(entry.get("idx", i)))
    return data


def _module_folder(root: Path, path: str, field: str, source: str = MODULES_FILE) -> Path:
    """The folder of a module, refused unless it lies inside ``root`` (links followed)."""
    return inside(root, path, file=root / source, field=field, error=UnsafeModuleError)


def _module_kind(entry: dict[str, Any], source: Path) -> str:
    """The module's class name, for sentence-transformers' own modules; anything else is refused."""
    module_type = entry["type"]
    kind = module_type.rsplit(".", 1)[-1]
    if not module_type.startswith("sentence_transformers."):
        raise PublishedModelError(
            f"{source}: module {entry['name']!r} is custom code ({module_type}); lmembed runs only "
            "sentence-transformers' own modules and never executes a model's code"
        )
    if kind not in ("Transformer", "Pooling", "Router", "Asym", *HEAD_MODULES):
        raise PublishedModelError(
            f"{source}: module {entry['name']!r} ({module_type}, in {entry['path'] or '.'}) is not one lmembed can "
            "reproduce (it reads Transformer, Pooling, Dense, LayerNorm, Normalize, Dropout and Router/Asym)"
        )
    return kind


# ---------------------------------------------------------------------------------------------------- Transformer
TRANSFORMER_KEYS = {
    "max_seq_length",
    "do_lower_case",
    "transformer_task",
    "modality_config",
    "module_output_name",
    "processing_kwargs",
    "unpad_inputs",
    "query_length",
    "document_length",
    "query_expansion",
    "model_args",
    "model_kwargs",
    "tokenizer_args",
    "processor_kwargs",
    "config_args",
    "config_kwargs",
}
HARMLESS_MODEL_KWARGS = {"torch_dtype", "dtype", "attn_implementation", "trust_remote_code", "low_cpu_mem_usage"}
TOKENIZER_KWARGS = {"padding_side", "truncation_side", "model_max_length", "use_fast", "trust_remote_code"}


def _read_transformer(published: PublishedModel, folder: Path) -> None:
    config_file = next((folder / n for n in TRANSFORMER_CONFIG_FILES if (folder / n).is_file()), None)
    config = read_module_json(config_file, "Transformer config", TransformerFile) if config_file else {}
    source = config_file or folder
    if unknown := set(config) - TRANSFORMER_KEYS:
        raise PublishedModelError(f"{source}: unknown Transformer setting(s) {', '.join(sorted(unknown))}")
    _refuse_unless(source, config, "transformer_task", ("feature-extraction",))
    _refuse_unless(source, config, "module_output_name", ("token_embeddings",))
    modality = config.get("modality_config")
    if modality not in (None, {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}):
        chat = isinstance(modality, dict) and "message" in modality
        why = (
            " (with a 'message' input, sentence-transformers wraps every text in the tokenizer's chat template, "
            "which lmembed does not reproduce)"
            if chat
            else ""
        )
        raise PublishedModelError(f"{source}: modality_config={modality!r}; lmembed reads plain text models only{why}")
    for key in ("query_length", "document_length", "query_expansion"):
        if config.get(key) is not None:
            raise PublishedModelError(f"{source}: {key}={config[key]!r} is a multi-vector setting lmembed does not run")
    model_kwargs = config.get("model_kwargs") or config.get("model_args") or {}
    if unknown := set(model_kwargs) - HARMLESS_MODEL_KWARGS:
        raise PublishedModelError(f"{source}: model kwargs {', '.join(sorted(unknown))} are not reproduced by lmembed")
    if config.get("config_kwargs") or config.get("config_args"):
        raise PublishedModelError(f"{source}: config kwargs (changes to the model's config.json) are not reproduced")
    tokenizer_kwargs = config.get("processor_kwargs") or config.get("tokenizer_args") or {}
    if unknown := set(tokenizer_kwargs) - TOKENIZER_KWARGS:
        raise PublishedModelError(f"{source}: tokenizer kwargs {', '.join(sorted(unknown))} are not reproduced")
    published.tokenizer_settings = {
        k: v for k, v in tokenizer_kwargs.items() if k in ("padding_side", "truncation_side")
    }
    for key, side in published.tokenizer_settings.items():
        if side not in ("left", "right"):
            raise PublishedModelError(f"{source}: tokenizer kwarg {key}={side!r}; it is 'left' or 'right'")
    processing = config.get("processing_kwargs") or {}
    text = processing.get("text", {}) if isinstance(processing, dict) else None
    if not isinstance(text, dict) or set(processing) - {"text"} or set(text) - {"max_length"}:
        raise PublishedModelError(
            f"{source}: processing_kwargs={processing!r}; lmembed reproduces only text.max_length"
        )
    max_length = text.get("max_length") or _max_seq_length(config, tokenizer_kwargs, folder)
    if max_length is not None:
        published.decide("max_length", int(max_length), source if config.get("max_seq_length") else folder)
    if config.get("do_lower_case"):
        published.decide("lowercase", True, source)


def _refuse_unless(source: Path, config: dict[str, Any], key: str, allowed: tuple[str, ...]) -> None:
    if key in config and config[key] not in allowed:
        raise PublishedModelError(f"{source}: {key}={config[key]!r}; lmembed reproduces only {', '.join(allowed)}")


def _max_seq_length(config: dict[str, Any], tokenizer_kwargs: dict[str, Any], folder: Path) -> int | None:
    """The truncation length sentence-transformers uses: ``max_seq_length`` as given, else the tokenizer's
    ``model_max_length`` capped at the model's ``max_position_embeddings``."""
    if isinstance(config.get("max_seq_length"), int):
        return config["max_seq_length"]
    if isinstance(tokenizer_kwargs.get("model_max_length"), int):
        return tokenizer_kwargs["model_max_length"]
    limits = []
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        value = read_module_json(tokenizer_config, "tokenizer config", _Limits).get("model_max_length")
        if isinstance(value, int | float) and value < 1e12:
            limits.append(int(value))
    model_config = folder / "config.json"
    if model_config.is_file():
        positions = read_module_json(model_config, "model config", _Limits).get("max_position_embeddings")
        if isinstance(positions, int) and positions > 0:
            limits.append(positions)
    return min(limits) if limits else None


# ---------------------------------------------------------------------------------------------------- Pooling
POOLING_KEYS = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt"}


def _read_pooling(published: PublishedModel, folder: Path) -> None:
    source = folder / "config.json"
    config = read_module_json(source, "Pooling config", PoolingFile)
    if unknown := set(config) - POOLING_KEYS - set(LEGACY_POOLING_FLAGS):
        raise PublishedModelError(f"{source}: unknown pooling flag(s) {', '.join(sorted(unknown))}")
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for flag, mode in LEGACY_POOLING_FLAGS.items() if config.get(flag)]
        if not modes and "pooling_mode_mean_tokens" in config:  # its default is true; the others' false
            raise PublishedModelError(
                f"{source}: every pooling_mode_* flag is false: sentence-transformers would pool nothing (a vector "
                "of no dimensions); lmembed does not guess a pooling"
            )
        modes = modes or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1:
        raise PublishedModelError(
            f"{source}: pooling modes {modes} are concatenated; lmembed reproduces one pooling mode per model"
        )
    if modes[0] not in POOLING_MODES:
        raise PublishedModelError(f"{source}: pooling_mode={modes[0]!r} is unknown; known: {', '.join(POOLING_MODES)}")
    pooling = POOLING_MODES[modes[0]]
    published.decide("pooling", pooling, source)
    if pooling == "last":
        published.decide("add_eos", False, source)  # sentence-transformers pools the tokenizer's own last token
    include = config.get("include_prompt", True)
    if not isinstance(include, bool):
        raise PublishedModelError(f"{source}: include_prompt must be true or false, got {include!r}")
    published.decide("include_prompt", include, source)


# ---------------------------------------------------------------------------------------------------- head modules
def _read_head_module(published: PublishedModel, kind: str, folder: Path, route: str | None) -> list[dict[str, Any]]:
    """The head layer spec(s) for one Dense/LayerNorm/Normalize/Dropout module (Dropout: none, it is the identity
    at inference), loading its weights into ``published.head_weights``."""
    if kind == "Dropout":
        return []
    source = folder / "config.json"
    config = read_module_json(source, f"{kind} config") if kind != "Normalize" or source.is_file() else {}
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise PublishedModelError(f"{source}: {key}={config[key]!r}; lmembed reads sentence_embedding heads only")
    spec: dict[str, Any] = {"type": "normalize"}
    if kind == "Dense":
        spec = _dense_spec(config, source)
    elif kind == "LayerNorm":
        if set(config) != {"dimension"} or not isinstance(config["dimension"], int):
            raise PublishedModelError(f"{source}: a LayerNorm config holds exactly an int 'dimension', got {config}")
        spec = {"type": "layer_norm", "dimension": config["dimension"]}
    if route is not None:
        spec["route"] = route
    if kind != "Normalize":
        spec["path"] = folder.relative_to(published.root).as_posix()
        check_head_shapes(spec, folder, source)  # sizes against the weights, before any layer is built
        published.head_weights.append(load_weights(folder))
    else:
        published.head_weights.append({})
    return [spec]


DENSE_KEYS = {"in_features", "out_features", "bias", "activation_function", "use_residual"}


def _dense_spec(config: dict[str, Any], source: Path) -> dict[str, Any]:
    if unknown := set(config) - DENSE_KEYS - {"module_input_name", "module_output_name"}:
        raise PublishedModelError(f"{source}: unknown Dense setting(s) {', '.join(sorted(unknown))}")
    if not isinstance(config.get("in_features"), int) or not isinstance(config.get("out_features"), int):
        raise PublishedModelError(f"{source}: a Dense config needs int in_features and out_features")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise PublishedModelError(
            f"{source}: activation_function={activation!r} is unknown to lmembed; known: {', '.join(ACTIVATIONS)}"
        )
    return {
        "type": "dense",
        "in_features": config["in_features"],
        "out_features": config["out_features"],
        "bias": bool(config.get("bias", True)),
        "activation": ACTIVATIONS[activation],
        "residual": bool(config.get("use_residual", False)),
    }


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            return load_weights_file(path)  # safetensors, or a pickle holding plain tensors only
        except UnsafeWeightsError:
            raise
        except ModelLoadError as exc:  # a truncated or foreign file: name it
            raise PublishedModelError(str(exc)) from exc
    raise PublishedModelError(f"{folder}: the weight file is missing (expected {' or '.join(WEIGHT_FILES)})")


# ---------------------------------------------------------------------------------------------------- Router / Asym
def _read_router(published: PublishedModel, folder: Path) -> list[dict[str, Any]]:
    """An asymmetric stage after pooling: each route (query, document) runs its own head modules."""
    source = folder / "router_config.json"
    if not source.is_file():
        source = folder / "config.json"  # the legacy Asym layout
    config = read_module_json(source, "Router config", RouterFile)
    if not isinstance(config.get("types"), dict):
        raise PublishedModelError(f"{source}: expected an object with 'types' and 'structure'")
    structure = config.get("structure")
    if not isinstance(structure, dict) or not structure:
        raise PublishedModelError(f"{source}: 'structure' must map each route to its modules")
    parameters = config.get("parameters") or {}
    routes = _route_names(parameters, structure, source)
    specs: list[dict[str, Any]] = []
    for task, route in routes.items():
        if not isinstance(structure[route], list):
            raise PublishedModelError(f"{source}: structure.{route} must be a list of module names")
        for j, module_id in enumerate(structure[route]):
            module_type = config["types"].get(module_id)
            if not isinstance(module_type, str):
                raise PublishedModelError(f"{source}: route {route!r} names module {module_id!r}, which has no type")
            module_folder = _module_folder(folder, module_id, f"structure.{route}[{j}]", source.name)
            kind = _module_kind({"name": module_id, "type": module_type, "path": module_id}, source)
            if kind not in HEAD_MODULES:
                raise PublishedModelError(
                    f"{source}: route {route!r} holds a {kind} module ({module_id}); lmembed reproduces Routers whose "
                    "routes hold only Dense/LayerNorm/Normalize modules after one shared Transformer and Pooling"
                )
            specs.extend(_read_head_module(published, kind, module_folder, route=task))
    published.decide("route", "document", source)  # texts without a task take the default (documents') route
    return specs


def _route_names(parameters: dict[str, Any], structure: dict[str, Any], source: Path) -> dict[str, str]:
    """Which route queries and documents take, as sentence-transformers resolves them (mappings first, then a
    route named after the task, then the default route)."""
    mappings: dict[Any, str] = {}
    for key, value in (parameters.get("route_mappings") or {}).items():
        try:
            mappings[ast.literal_eval(key)] = value
        except (ValueError, SyntaxError) as exc:
            raise PublishedModelError(f"{source}: route_mappings key {key!r} is not a (task, modality) pair") from exc
    default = parameters.get("default_route")
    routes = {}
    for task in ("query", "document"):
        route = next(
            (mappings[k] for k in ((task, "text"), (task, None), (None, "text"), (None, None)) if k in mappings),
            task if task in structure else default,
        )
        if route not in structure:
            raise PublishedModelError(f"{source}: no route for {task}s (routes: {', '.join(structure)})")
        routes[task] = route
    if default not in (None, routes["document"]):
        raise PublishedModelError(
            f"{source}: default_route={default!r} differs from the documents' route; lmembed embeds texts without a "
            "task as documents"
        )
    return routes


# ---------------------------------------------------------------------------------------------------- model config
def _read_model_config(published: PublishedModel, path: Path) -> None:
    config = read_module_json(path, "model config", ModelFile) if path.is_file() else {}
    if config.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        raise PublishedModelError(
            f"{path}: model_type={config['model_type']!r}; lmembed reads SentenceTransformer models"
        )
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise PublishedModelError(f"{path}: 'prompts' must map prompt names to strings")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise PublishedModelError(
            f"{path}: default_prompt_name={default!r} is not one of the prompts {sorted(prompts)}"
        )
    similarity = config.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITY_NAMES:
        raise PublishedModelError(f"{path}: similarity_fn_name={similarity!r} is unknown")
    published.decide("similarity", SIMILARITY_NAMES[similarity], path)
    if not published.options.get("normalize"):
        # cosine needs unit vectors for lmembed's inner-product scoring (the direction is the model's own); dot,
        # euclidean and manhattan read the vectors as the model returns them
        published.decide("normalize", published.options["similarity"] == "cosine", path)
    if any(prompts.values()):
        published.decide("prompts", dict(prompts), path)
        published.decide("prompt_style", "sentence_transformers", path)
        published.decide("instruction_template", "{instruction}", path)
        published.decide("query_instruction", prompts.get("query") or None, path)
        document = next((prompts[n] for n in DOCUMENT_PROMPT_NAMES if n in prompts), "")
        published.decide("document_instruction", document or None, path)
        if default is not None:
            published.decide("default_prompt_name", default, path)
    elif published.options.get("include_prompt"):
        del published.options["include_prompt"]  # no prompts: lmembed's instructions stay out of pooling
        published.sources.pop("include_prompt", None)


def _settle_head(published: PublishedModel, head: list[dict[str, Any]], source: Path) -> None:
    """A final shared Normalize becomes ``normalize=True``; the other layers form ``head``."""
    weights = published.head_weights
    if head and head[-1]["type"] == "normalize" and "route" not in head[-1]:
        head, weights = head[:-1], weights[:-1]
        published.decide("normalize", True, source)
    published.head_weights = weights
    if head:
        published.decide("head", head, source)


# ---------------------------------------------------------------------------------------------------- tokenizer
def apply_lowercase(tokenizer: Any) -> None:
    """Make a fast tokenizer lowercase its input first, as sentence-transformers does for ``do_lower_case``."""
    from tokenizers.normalizers import Lowercase, Sequence

    rust = getattr(tokenizer, "backend_tokenizer", None)  # the tokenizers library's object inside a fast tokenizer
    if rust is None:
        raise PublishedModelError("do_lower_case needs a fast tokenizer")
    normalizer = rust.normalizer
    parts = list(normalizer) if isinstance(normalizer, Sequence) else [normalizer] if normalizer else []
    if any(isinstance(part, Lowercase) for part in parts):
        return
    rust.normalizer = Sequence([Lowercase(), *parts])


# ---------------------------------------------------------------------------------------------- writing
# The same format written back: a saved Embedder whose strategy sentence-transformers can express also loads with
# ``SentenceTransformer(dir)`` and gives the same vectors (Embedder.save decides when it can).

#: lmembed's pooling names → the Pooling module's flag, derived from the reading tables above
ST_POOLING_MODES = {POOLING_MODES[mode]: flag for flag, mode in LEGACY_POOLING_FLAGS.items()}
ST_HEAD = {
    "dense": "sentence_transformers.models.Dense",
    "layer_norm": "sentence_transformers.models.LayerNorm",
    "normalize": "sentence_transformers.models.Normalize",
}


def write_sentence_transformers_files(directory: Path, cfg: EmbeddingConfig, hidden_size: int, max_length: int) -> None:
    """``modules.json``, the Pooling module, ``sentence_bert_config.json`` and (when there are prompts or another
    similarity) ``config_sentence_transformers.json`` for strategy ``cfg``; head layers' weights and configs are
    written by :func:`save_head_layers`."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    for layer in cfg.head:
        path = layer.get("path", f"{len(modules)}_Normalize")
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path, "type": ST_HEAD[layer["type"]]})
    if cfg.normalize:
        path = f"{len(modules)}_Normalize"
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": path, "type": ST_HEAD["normalize"]})
    for module in modules[2:]:
        (directory / module["path"]).mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": hidden_size, "include_prompt": cfg.include_prompt}
    pooling.update({mode: name == cfg.pooling for name, mode in ST_POOLING_MODES.items()})
    (directory / "1_Pooling").mkdir(exist_ok=True)
    files: dict[str, Any] = {
        MODULES_FILE: modules,
        "1_Pooling/config.json": pooling,
        TRANSFORMER_CONFIG_FILES[0]: {"max_seq_length": max_length, "do_lower_case": cfg.lowercase},
    }
    model_config = _st_model_config(cfg)
    if model_config:
        files[MODEL_CONFIG_FILE] = model_config
    for name, content in files.items():
        atomic_write_text(directory / name, json.dumps(content, indent=2))


def _st_model_config(cfg: EmbeddingConfig) -> dict[str, Any]:
    """``config_sentence_transformers.json``: the prompts (a published model's own, with the strategy's query and
    document prompts), the default prompt and the similarity."""
    prompts = dict(cfg.prompts)
    if cfg.query_instruction:
        prompts["query"] = cfg.instruction_template.format(instruction=cfg.query_instruction)
    if cfg.document_instruction:
        prompts["document"] = cfg.instruction_template.format(instruction=cfg.document_instruction)
    if not prompts and cfg.similarity == "cosine":
        return {}
    if prompts:
        prompts.setdefault("query", "")
        prompts.setdefault("document", "")
    data: dict[str, Any] = {"prompts": prompts, "similarity_fn_name": cfg.similarity}
    if cfg.default_prompt_name is not None:
        data["default_prompt_name"] = cfg.default_prompt_name
    return data


def save_head_layers(head: Any, directory: Path, state: dict[str, torch.Tensor] | None) -> None:
    """Each Dense/LayerNorm layer of a post-pooling ``head`` (``pooling.head.PostPoolingHead``: its ``specs`` and
    ``layer_state(i)``) into its module folder, as sentence-transformers lays it out (``state``: whole tensors
    named ``layers.I.*`` to write instead of the head's own)."""
    for i, spec in enumerate(head.specs):
        if spec["type"] == "normalize":
            continue
        folder = directory / spec["path"]
        folder.mkdir(parents=True, exist_ok=True)
        layer_state = head.layer_state(i)
        if state is not None:
            prefix = f"layers.{i}."
            layer_state = {
                k[len(prefix) :]: v.detach().cpu().contiguous() for k, v in state.items() if k.startswith(prefix)
            }
        save_file(layer_state, str(folder / "model.safetensors"))
        atomic_write_text(folder / "config.json", json.dumps(_st_layer_config(spec), indent=2))


def _st_layer_config(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["type"] == "layer_norm":
        return {"dimension": spec["dimension"]}
    config = {
        "in_features": spec["in_features"],
        "out_features": spec["out_features"],
        "bias": spec.get("bias", True),
        "activation_function": ACTIVATION_PATHS[spec.get("activation", "identity")],
    }
    if spec.get("residual"):
        config["use_residual"] = True
    return config
