"""Position interpolation: read a RoPE decoder beyond its trained window by scaling positions down.

:func:`interpolate_positions` switches a loaded decoder's rotary embedding to linear scaling by ``factor``
(Chen et al., 2023): position ``p`` is rotated as ``p / factor`` was, so ``factor`` times as many tokens fit in the
angles the model was trained on, and ``max_position_embeddings`` grows by ``factor`` (the engine's length cap).
Supported where the family has one rotary module driven by ``rope_parameters`` with ``rope_type="default"``
(Llama, Mistral, Qwen2, Qwen3); other models (absolute positions, several rotary modules, a RoPE already
scaled) are refused with a :class:`PositionInterpolationError` (a :class:`~lmembed.errors.ConfigError`). The
factor joins the backbone's fingerprint, so the embedding cache never mixes vectors read with and without it.
``Embedder.from_pretrained(..., rope_scale=F)`` and the command line's ``--rope-scale F`` apply it at load time.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lmembed.errors import ConfigError


class PositionInterpolationError(ConfigError):
    """A model cannot be read with position interpolation (or the factor is not > 1)."""


#: The config attribute that records an interpolation (read by ``Backbone.fingerprint``).
MARKER = "lmembed_position_interpolation"


#: the families whose one rotary embedding is interpolated (tested in tests/models/test_context.py)
SUPPORTED = "llama, mistral, qwen2, qwen3"


def _rotary(model: nn.Module) -> tuple[nn.Module, str, nn.Module]:
    """The one rotary-embedding module of ``model``: (its parent, its attribute name, the module)."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "inv_freq") and hasattr(module, "rope_type")
    ]
    if len(found) != 1:
        raise PositionInterpolationError(
            f"position interpolation needs exactly one rotary embedding module; {type(model).__name__} has "
            f"{len(found)} (families supported: {SUPPORTED})"
        )
    name, module = found[0]
    parent_name, _, attribute = name.rpartition(".")
    return model.get_submodule(parent_name) if parent_name else model, attribute, module


def interpolation_factor(model: nn.Module) -> float | None:
    """The factor ``model``'s positions were interpolated by (``None``: not interpolated)."""
    factor = getattr(getattr(model, "config", None), MARKER, None)
    return None if factor is None else float(factor)


def interpolate_positions(backbone: Any, factor: float) -> None:
    """Scale ``backbone``'s RoPE positions linearly by ``factor`` (> 1) in place; see the module doc."""
    if not factor > 1:
        raise PositionInterpolationError(f"position interpolation factor={factor} must be > 1")
    config = backbone.model.config
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) and "rope_type" in v for v in rope.values()):
        raise PositionInterpolationError(  # Gemma 3: one RoPE per attention kind (full, sliding)
            f"{config.model_type} has a rotary embedding per attention kind ({', '.join(rope)}); position "
            f"interpolation supports {SUPPORTED} only"
        )
    if not isinstance(rope, dict) or "rope_type" not in rope:
        raise PositionInterpolationError(f"{config.model_type} has no rotary position embedding to interpolate")
    if rope["rope_type"] != "default":
        raise PositionInterpolationError(
            f"{config.model_type}'s RoPE is already scaled (rope_type={rope['rope_type']!r})"
        )
    parent, attribute, module = _rotary(backbone.model)
    config.rope_parameters = {**rope, "rope_type": "linear", "factor": float(factor)}
    config.max_position_embeddings = int(config.max_position_embeddings * factor)
    rebuilt = type(module)(config=config)
    setattr(parent, attribute, rebuilt.to(module.inv_freq.device))
    setattr(config, MARKER, float(factor))
    backbone.invalidate_fingerprint()
