"""A backbone made of a base model and a stack of LoRA adapters (LLM2Vec's published checkpoints).

An LLM2Vec model is published as two adapter folders: the supervised adapter, whose ``adapter_config.json``
names the MNTP folder as its base, and the MNTP folder (config, tokenizer and an adapter whose base is the
original decoder). llm2vec loads the base, merges the MNTP adapter, then applies the supervised one; merging
both here gives the same weights. Each adapter is applied with peft, so its target modules, rank and scaling
are read from its own config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmembed.errors import ModelLoadError
from lmembed.models.loading import Backbone, backbone_from_model, resolve_device, resolve_dtype
from lmembed.models.presets import adapter_base

log = logging.getLogger(__name__)

MAX_ADAPTERS = 4  # a chain longer than this is a loop in the adapters' base names


def local_folder(name_or_path: str) -> Path:
    """A local folder for ``name_or_path``: the folder itself, or a Hub id's snapshot (downloaded once)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download  # lazy: only for Hub ids

        return Path(snapshot_download(name_or_path))
    except Exception as exc:  # offline, unknown id, no access: one clear line
        raise ModelLoadError(f"adapter {name_or_path!r}: not a local folder and not downloadable ({exc})") from exc


def adapter_chain(name_or_path: str) -> tuple[list[Path], str]:
    """The adapter folders from the outermost (the one given) inwards, and the base model they extend."""
    chain: list[Path] = []
    current = name_or_path
    while len(chain) <= MAX_ADAPTERS:
        folder = local_folder(current)
        base = adapter_base(folder)
        if base is None:
            if not chain:
                raise ModelLoadError(f"{folder}: no adapter_config.json, so it is not an adapter checkpoint")
            return chain, current
        chain.append(folder)
        current = base
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
    from transformers import AutoModel, AutoTokenizer

    chain, base = adapter_chain(name_or_path)
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModel.from_pretrained(str(local_folder(base)), **kwargs)
    for folder in reversed(chain):
        log.info("merging adapter %s", folder)
        model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    with_tokenizer = [f for f in reversed(chain) if (f / "tokenizer_config.json").exists()]
    tokenizer = AutoTokenizer.from_pretrained(str(with_tokenizer[0] if with_tokenizer else local_folder(base)))
    model.to(resolve_device(device)).eval()
    backbone = backbone_from_model(model, tokenizer, name=name_or_path)
    backbone.path = str(chain[0])
    return backbone
