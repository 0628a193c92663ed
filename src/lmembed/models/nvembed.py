"""Loading an NV-Embed checkpoint (``NVEmbedModel``: nvidia/NV-Embed-v1, -v2) without its remote code.

The checkpoint's ``config.json`` holds the Mistral decoder's config (``text_config``, model type
``bidir_mistral``: a Mistral run bidirectionally) and the pooling head's (``latent_attention_config``); its
safetensors hold the decoder under ``embedding_model.*`` and the head under ``latent_attention_model.*``. This
module reads both: the decoder becomes an ordinary transformers ``MistralModel`` backbone (lmembed applies the
bidirectional mask itself, :mod:`lmembed.models.attention`), the head's tensors and shape are returned for
:mod:`lmembed.pooling.nvembed_latent` to load, with the strategy fields the checkpoint decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import MistralConfig, MistralModel

from lmembed.errors import ModelLoadError
from lmembed.io import read_json
from lmembed.models.families import detect_kind
from lmembed.models.loading import Backbone, load_tokenizer, quantize_int8, resolve_device, resolve_dtype
from lmembed.models.weights import shard_files
from lmembed.paths import check_links_inside

DECODER_PREFIX = "embedding_model."
HEAD_PREFIX = "latent_attention_model."
FEED_FORWARD_MULT = 4  # modeling_nvembed.py's FeedForward(dim, mult=4), not recorded in config.json
SOURCES = {
    "latent": "config.json latent_attention_config",
    "include_prompt": "config.json padding_side, is_mask_instruction",
    "normalize": "config.json latent_attention_config.output_normalize",
}
_NOT_MISTRAL_FIELDS = ("model_type", "architectures", "auto_map", "_name_or_path")


@dataclass
class NVEmbedCheckpoint:
    """A loaded NV-Embed checkpoint: the decoder, the head's tensors, the strategy fields its files decide."""

    backbone: Backbone
    head_state: dict[str, torch.Tensor]
    strategy: dict[str, Any]
    sources: dict[str, str]  # strategy field -> the config.json entry that decided it (``lmembed doctor``)


def load_nvembed(
    name_or_path: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    attn_implementation: str | None = "sdpa",
    quantize: str | None = None,
) -> NVEmbedCheckpoint:
    """Load a local NV-Embed folder or Hub id (see the module doc)."""
    folder = _local_folder(name_or_path)
    check_links_inside(folder)  # as every loader's folder (models.loading.check_local_model); its sizes: below
    config = _read_config(folder / "config.json")
    decoder, head = _read_weights(folder)
    torch_dtype, torch_device = resolve_dtype(dtype), resolve_device(device)
    text = {k: v for k, v in _section(config, "text_config", folder).items() if k not in _NOT_MISTRAL_FIELDS}
    model = MistralModel._from_config(
        MistralConfig(**text), dtype=torch_dtype, attn_implementation=attn_implementation or "eager"
    )
    missing, unexpected = model.load_state_dict(decoder, strict=False)
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: the {DECODER_PREFIX}* weights do not fit text_config's Mistral "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    model.to(torch_device).eval()
    fingerprint, reference = None, None
    if quantize is not None:  # the float model is kept for the int8 quality gate (Backbone.float_reference)
        reference = model
        model, fingerprint = quantize_int8(model, quantize, torch_device)
    backbone = Backbone(
        model=model,
        tokenizer=load_tokenizer(folder),
        name=name_or_path,
        path=str(folder),
        is_decoder=detect_kind(model).is_decoder,
        dtype=torch_dtype,
        device=torch_device,
        _fingerprint=fingerprint,
        quantization=quantize,
        float_reference=reference,
    )
    return NVEmbedCheckpoint(backbone, head, _strategy(config, folder, model.config.hidden_size), dict(SOURCES))


def _local_folder(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download  # lazy: only a Hub id needs it

    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    return Path(snapshot_download(name_or_path, allow_patterns=patterns))


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing (an NV-Embed checkpoint keeps its configs there)")
    return read_json(path, error=ModelLoadError)


def _section(config: dict[str, Any], name: str, folder: Path) -> dict[str, Any]:
    section = config.get(name)
    if not isinstance(section, dict):
        raise ModelLoadError(f"{folder / 'config.json'}: no {name} object (is this an NVEmbedModel checkpoint?)")
    return section


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    files = sorted(set(shard_files(folder, index).values())) if index.exists() else sorted(folder.glob("*.safetensors"))
    absent = [str(f) for f in files if not f.exists()]
    if not files or absent:
        raise ModelLoadError(f"{folder}: weight file(s) missing: {', '.join(absent) or 'no *.safetensors'}")
    return files


def _read_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The decoder's and the head's tensors, with their prefixes removed."""
    decoder: dict[str, torch.Tensor] = {}
    head: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.startswith(DECODER_PREFIX):
                    decoder[name.removeprefix(DECODER_PREFIX)] = weights.get_tensor(name)
                elif name.startswith(HEAD_PREFIX):
                    head[name.removeprefix(HEAD_PREFIX)] = weights.get_tensor(name)
    if not decoder or not head:
        wanted = DECODER_PREFIX if not decoder else HEAD_PREFIX
        raise ModelLoadError(f"{folder}: no {wanted}* tensors in its safetensors (an NVEmbedModel checkpoint has both)")
    return decoder, head


def _strategy(config: dict[str, Any], folder: Path, hidden_size: int) -> dict[str, Any]:
    """The strategy fields the checkpoint's config.json decides: the head's shape, whether the instruction is
    kept out of the mean (only with right padding and ``is_mask_instruction``, as its ``encode``), normalisation."""
    latent = _section(config, "latent_attention_config", folder)
    widths = {latent.get("hidden_dim", hidden_size), latent.get("latent_dim", hidden_size)}
    if widths != {hidden_size}:
        raise ModelLoadError(
            f"{folder / 'config.json'}: latent_attention_config hidden_dim/latent_dim {sorted(widths)} differ from "
            f"the Mistral's hidden_size {hidden_size}; NV-Embed's head needs them equal"
        )
    masks_instruction = config.get("padding_side", "right") == "right" and config.get("is_mask_instruction", True)
    return {
        "latent": {
            "variant": "nv-embed",
            "num_latents": int(latent.get("num_latents_value", 512)),
            "num_heads": int(latent.get("num_cross_heads", 8)),
            "head_dim": int(latent.get("cross_dim_head", hidden_size)),
            "hidden_mult": FEED_FORWARD_MULT,
        },
        "include_prompt": not masks_instruction,
        "normalize": bool(latent.get("output_normalize", True)),
    }
