"""A backbone made of a base model and a stack of LoRA adapters (LLM2Vec's published checkpoints).

An LLM2Vec model is published as two adapter folders: the supervised adapter, whose ``adapter_config.json``
names the MNTP folder as its base, and the MNTP folder (config, tokenizer and an adapter whose base is the
original decoder). llm2vec loads the base, merges the MNTP adapter, then applies the supervised one; merging
both here gives the same weights. Each adapter is applied with peft, so its target modules, rank and scaling
are read from its own config.

An adapter's ``base_model_name_or_path`` names another model: a Hub id, an absolute folder (where peft records
a local base, e.g. the MNTP folder beside a supervised adapter), or a path relative to the adapter's own folder,
which must lie inside it once links are followed (:func:`lmembed.paths.inside`): a ``..`` or a link leading
elsewhere is refused before anything there is read. A relative name is never looked up in the working directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmembed.errors import ModelLoadError, UnsafeFileError
from lmembed.models.loading import (
    Backbone,
    backbone_from_model,
    check_local_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from lmembed.models.presets import adapter_base
from lmembed.models.weights import (
    check_adapter,
    is_unpickling_refusal,
    pretrained_safely,
    unsafe_pickle_error,
)
from lmembed.paths import inside

log = logging.getLogger(__name__)

MAX_ADAPTERS = 4  # a chain longer than this is a loop in the adapters' base names
ADAPTER_CONFIG = "adapter_config.json"


class UnsafeAdapterPathError(ModelLoadError, UnsafeFileError):
    """An adapter's ``base_model_name_or_path`` that names a path outside the adapter's folder."""


def local_folder(name_or_path: str, *, hub_only: bool = False) -> Path:
    """A local folder for ``name_or_path``: the folder itself, or a Hub id's snapshot (downloaded once).
    ``hub_only``: a Hub id named by a file, never looked up as a folder of the working directory."""
    path = Path(name_or_path).expanduser()
    if not hub_only and path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download  # lazy: only for Hub ids

        return Path(snapshot_download(name_or_path))
    except Exception as exc:  # offline, unknown id, no access: one clear line
        raise ModelLoadError(f"adapter {name_or_path!r}: not a local folder and not downloadable ({exc})") from exc


def base_folder(adapter: Path, base: str) -> Path:
    """The local folder of the base an adapter names: an absolute folder as named, a relative path inside
    ``adapter`` (refused when it leaves it through ``..`` or a link), else a Hub id's snapshot."""
    if Path(base).is_absolute():
        log.info("%s: the base model is the folder %s", adapter / ADAPTER_CONFIG, base)
        return local_folder(base)
    named_path = base.startswith((".", "~", "\\")) or ".." in Path(base).parts
    if named_path or (adapter / base).exists():
        return inside(
            adapter, base, file=adapter / ADAPTER_CONFIG, field="base_model_name_or_path", error=UnsafeAdapterPathError
        )
    return local_folder(base, hub_only=True)


def adapter_chain(name_or_path: str) -> tuple[list[Path], Path]:
    """The adapter folders from the outermost (the one given) inwards, and the folder of the base model they
    extend."""
    chain: list[Path] = []
    folder = local_folder(name_or_path)
    while len(chain) <= MAX_ADAPTERS:
        base = adapter_base(folder)
        if base is None:
            if not chain:
                raise ModelLoadError(f"{folder}: no adapter_config.json, so it is not an adapter checkpoint")
            return chain, folder
        chain.append(folder)
        folder = base_folder(folder, base)
    raise ModelLoadError(f"{name_or_path}: more than {MAX_ADAPTERS} adapters chained by their base names (a loop?)")


def load_adapter_stack(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = "sdpa",
) -> Backbone:
    """The base model with every adapter of the chain merged, innermost first, and the tokenizer of the innermost
    folder that has one (LLM2Vec ships it with the MNTP adapter)."""
    # lazy: transformers and peft load only when such a model is loaded
    from peft import PeftModel
    from transformers import AutoConfig, AutoModel

    chain, base = adapter_chain(name_or_path)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    for folder in chain:  # every adapter's weights and rank, before anything is built (models.weights)
        check_adapter(folder)
    check_local_model(base)
    model = pretrained_safely(AutoModel, str(base), config=AutoConfig.from_pretrained(str(base)), **kwargs)
    for folder in reversed(chain):
        log.info("merging adapter %s", folder)
        try:
            model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
        except RuntimeError as exc:  # peft's size-mismatch report: the adapter was made for another base
            if is_unpickling_refusal(exc):
                raise unsafe_pickle_error(folder, exc) from None
            raise ModelLoadError(f"{folder}: the adapter does not fit its base model {base} ({exc})") from exc
    with_tokenizer = [f for f in reversed(chain) if (f / "tokenizer_config.json").exists()]
    tokenizer = load_tokenizer(with_tokenizer[0] if with_tokenizer else base)
    model.to(resolve_device(device)).eval()
    backbone = backbone_from_model(model, tokenizer, name=name_or_path)
    backbone.path = str(chain[0])
    return backbone
