"""Early exit: a forward pass that runs only a backbone's first ``depth`` transformer blocks.

A strategy that reads layer ``k`` of an ``L``-layer model needs nothing from blocks ``k+1 .. L``, so running them is
wasted work: :func:`forward_states` stops the pass after the deepest block any of its read-outs needs, which costs
about ``k / L`` of the full pass (2D Matryoshka's inference side; Li et al., 2024).

How it stops: the module list of blocks (``model.layers`` in Llama/Mistral/Qwen/Gemma, ``encoder.layer`` in BERT)
is swapped, for the duration of the call, for a list of its first ``depth`` blocks: the same module objects, so
weights, LoRA adapters and hooks are untouched, and the model's own forward runs unchanged over fewer blocks. The
states it returns are exactly those of the full pass at layers ``0 .. depth``: the deepest one is taken as it
leaves its block (a decoder's final norm, which transformers applies to the last state of whatever ran, is left
to the read-out, as it is for every intermediate layer of a full pass). A model whose block list cannot be found
runs whole, which is slower but gives the same states.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["block_list", "early_exit", "exit_depth", "forward_states"]


def block_list(model: nn.Module) -> tuple[nn.Module, str] | None:
    """The module holding ``model``'s list of transformer blocks and that list's attribute name: the first
    ``nn.ModuleList`` (in module order) with ``config.num_hidden_layers`` entries; None when there is none."""
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(count, int) or count < 1:
        return None
    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == count:
                return module, name
    return None


def exit_depth(layers: Iterable[int], num_layers: int) -> int:
    """How many blocks a pass must run to read ``layers`` (indices already in ``0 .. num_layers``, 0 = the
    embeddings): the deepest of them, and at least one (the embeddings are read as the first block's input)."""
    return max(1, max(layers, default=num_layers))


@contextmanager
def early_exit(model: nn.Module, depth: int) -> Iterator[nn.Module | None]:
    """Within the block, ``model`` runs its first ``depth`` blocks only. Yields the last block that runs, or None
    when the whole model runs (``depth`` covers every block, or the block list is not found)."""
    found = block_list(model)
    if found is None:
        yield None
        return
    parent, name = found
    blocks = getattr(parent, name)
    if depth >= len(blocks):
        yield None
        return
    setattr(parent, name, blocks[:depth])  # a new ModuleList of the same block objects
    try:
        yield blocks[depth - 1]
    finally:
        setattr(parent, name, blocks)


def forward_states(
    model: nn.Module,
    inputs: Mapping[str, Any],
    *,
    depth: int,
    raw_last: nn.Module | None = None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """``model(**inputs, output_hidden_states=True)`` run through its first ``depth`` blocks.

    Returns the hidden states ``0 .. depth`` (all ``L + 1`` of them when the whole model runs) and, for a whole
    pass, the raw output of ``raw_last`` (the last block, hooked when given: the state before the final norm).
    In a pass stopped early the last entry is the stopping block's own output, so every entry is a raw state, as
    layers below ``L`` are in a full pass.
    """
    captured: dict[str, torch.Tensor] = {}

    def keep(_module: nn.Module, _inputs: Any, output: Any) -> None:
        captured["raw"] = output[0] if isinstance(output, tuple) else output

    with early_exit(model, depth) as stop:
        hooked = stop if stop is not None else raw_last
        handle = hooked.register_forward_hook(keep) if hooked is not None else None
        try:
            hidden_states = tuple(model(**inputs, output_hidden_states=True).hidden_states)
        finally:
            if handle is not None:
                handle.remove()
    if stop is not None:
        return (*hidden_states[:-1], captured["raw"]), None
    return hidden_states, captured.get("raw")
