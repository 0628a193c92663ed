"""Choosing which hidden states to pool: one layer, a fused set of layers, with or without the
decoder's final norm."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lmembed.errors import LmembedError


class LayerSelectionError(LmembedError, IndexError):
    """A layer index is out of range for the model."""


def normalize_layer(index: int, num_layers: int) -> int:
    """Map a possibly negative index onto 0..num_layers (0 = embeddings, num_layers = output)."""
    total = num_layers + 1
    if not -total <= index < total:
        raise LayerSelectionError(
            f"layer {index} is out of range for a model with {num_layers} layers "
            f"(valid: 0..{num_layers} or -{total}..-1)"
        )
    return index % total


def find_final_norm(model: nn.Module) -> nn.Module | None:
    """The decoder's final norm module (``model.norm`` in Llama/Mistral/Qwen/Gemma), if any."""
    for name in ("norm", "final_layernorm", "ln_f"):
        module = getattr(model, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def select_states(
    hidden_states: Sequence[torch.Tensor],
    layers: Sequence[int],
    *,
    final_norm: bool | None,
    norm: nn.Module | None,
    raw_last: torch.Tensor | None,
    num_layers: int | None = None,
) -> torch.Tensor:
    """Average of the requested layers' states (one layer = that layer).

    ``hidden_states`` follows transformers: entry ``L`` (the last) is already normed in decoders.
    ``final_norm=True`` norms every selected layer, ``False`` reads raw states (``raw_last`` for
    the last layer), ``None`` takes the states as transformers gives them. ``num_layers`` is the model's
    ``L`` when ``hidden_states`` stops short of it (a pass stopped early, :mod:`lmembed.models.depth`): its
    entries are then all raw states of layers below ``L``.
    """
    num_layers = len(hidden_states) - 1 if num_layers is None else num_layers
    picked = []
    for layer in layers:
        i = normalize_layer(layer, num_layers)
        state = hidden_states[i]
        if norm is not None and final_norm is not None:
            if i == num_layers and final_norm is False:
                if raw_last is None:
                    raise LayerSelectionError("raw last-layer states were not captured")
                state = raw_last
            elif i < num_layers and final_norm:
                state = norm(state)
        picked.append(state)
    if len(picked) == 1:
        return picked[0]
    return torch.stack(picked, dim=0).mean(dim=0)
