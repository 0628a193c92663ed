"""Causal or bidirectional attention for decoder LMs, without silent fallbacks.

How it works: transformers (4.56+/5.x) builds each decoder's mask through ``masking_utils``, which
returns a caller-supplied 4-D mask unchanged. For bidirectional attention we therefore hand the
model a 4-D additive mask that only hides padding, and we also clear every attention module's
``is_causal`` flag so that kernels which ignore masks (SDPA's ``is_causal`` fast path, flash
attention) cannot re-impose causality.

Which models are decoders at all is decided from the model itself (:mod:`lmembed.models.families`).

Why it cannot silently revert: only families listed in :data:`BIDIRECTIONAL_FAMILIES` (each covered by
a test) are accepted (any other decoder is refused as soon as an Embedder is given a bidirectional
strategy), and :func:`verify_attention` probes the model whenever its mode is switched: it changes the
last token of a two-sequence batch and checks whether the first token's state moves. Other tools
broke when transformers changed mask handling (a ``None`` mask at batch size 1, SDPA's
``is_causal`` left on, a removed ``_update_causal_mask`` override); each of those would make the
probe fail loudly here instead of producing quietly causal embeddings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from lmembed.errors import LmembedError
from lmembed.io import is_whole_number
from lmembed.models.families import CAUSAL_TOLERANCE, PROBE_LENGTH, first_token_change

# model_type values whose bidirectional path is tested (tests/models/test_attention.py).
BIDIRECTIONAL_FAMILIES: dict[str, str] = {
    "llama": "Llama / SmolLM",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma3_text": "Gemma 3",
}
SUPPORTED_IMPLEMENTATIONS = ("eager", "sdpa")
_MODE_ATTRIBUTE = "_lmembed_attention_mode"


class AttentionError(LmembedError, RuntimeError):
    """The requested attention mode cannot be guaranteed for this model."""


def check_bidirectional_supported(model: nn.Module) -> None:
    """Raise unless ``model`` belongs to a family with a tested bidirectional path."""
    config = model.config
    model_type = getattr(config, "model_type", "?")
    if model_type not in BIDIRECTIONAL_FAMILIES:
        names = ", ".join(f"{v} ({k})" for k, v in BIDIRECTIONAL_FAMILIES.items())
        raise AttentionError(
            f"bidirectional attention is not supported for model_type={model_type!r}; "
            f"lmembed has a tested bidirectional path only for: {names}"
        )
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_IMPLEMENTATIONS:
        raise AttentionError(
            f"bidirectional attention needs attn_implementation in {SUPPORTED_IMPLEMENTATIONS}, got {impl!r}"
        )


def set_causal_flags(model: nn.Module, causal: bool) -> int:
    """Set ``is_causal`` on every attention module; returns how many modules were changed."""
    count = 0
    for module in model.modules():
        if hasattr(module, "is_causal") and isinstance(module.is_causal, bool):
            module.is_causal = causal
            count += 1
    return count


def four_d_mask(mode: str, attention_mask: torch.Tensor, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
    """Additive (batch, 1, query, key) mask hiding padded keys, and later keys too when ``mode`` is causal. With
    ``window``, a sliding-window layer's mask: causal, keys ``window`` or more positions back are hidden as well;
    bidirectional, keys ``window`` or more positions away on either side (transformers' bidirectional overlay)."""
    keep = attention_mask[:, None, None, :].to(torch.bool)
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    distance = positions[:, None] - positions[None, :]  # query minus key
    allowed = None
    if mode == "causal":
        allowed = distance >= 0
        if window is not None:
            allowed = allowed & (distance < window)
    elif window is not None:
        allowed = distance.abs() < window
    keep = keep.expand(-1, 1, attention_mask.shape[1], -1) if allowed is None else keep & allowed[None, None]
    zeros = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return zeros.masked_fill(~keep, torch.finfo(dtype).min)


def bidirectional_window(config: object) -> int | None:
    """The window of the sliding-window layers of ``config``'s model run bidirectionally (None: none windowed).

    Only Gemma 3 has a bidirectional convention for its local layers, transformers' own
    (``use_bidirectional_attention``, as EmbeddingGemma sets it): a key is seen when it is less than
    ``sliding_window // 2 + 1`` positions away on either side, the causal window halved about the query
    (a config that already has the flag holds the halved value). Other families run bidirectionally without a
    window, as LLM2Vec's bidirectional Mistral does."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or ()
    if getattr(config, "model_type", None) != "gemma3_text" or "sliding_attention" not in layer_types:
        return None
    if not is_whole_number(window) or window < 1:
        return None
    return window if getattr(config, "use_bidirectional_attention", False) else window // 2 + 1


def mask_for(mode: str, attention_mask: torch.Tensor, dtype: torch.dtype, config: object) -> torch.Tensor | dict:
    """The ``attention_mask`` argument to pass to a decoder with ``config`` for ``mode``: causal, the 2-D mask (the
    model builds its own causal masks); bidirectional, a 4-D mask hiding only padding, and for a model whose local
    layers keep a bidirectional window (:func:`bidirectional_window`) one mask per layer type."""
    if mode != "bidirectional":
        return attention_mask
    everywhere = four_d_mask(mode, attention_mask, dtype)
    window = bidirectional_window(config)
    if window is None:
        return everywhere
    return {"full_attention": everywhere, "sliding_attention": four_d_mask(mode, attention_mask, dtype, window)}


def first_token_sensitivity(model: nn.Module, mode: str) -> float:
    """How much the first token's final state moves (relative to its size) when only the last token
    changes, with the mask ``mode`` calls for.

    Zero (up to float noise) means causal attention; clearly positive means bidirectional.
    """
    param = next(model.parameters())
    ones = torch.ones((2, PROBE_LENGTH), dtype=torch.long, device=param.device)
    return first_token_change(model, mask_for(mode, ones, param.dtype, model.config))


def verify_attention(model: nn.Module, mode: str) -> None:
    """Probe the model once and raise if it does not attend the way ``mode`` says."""
    delta = first_token_sensitivity(model, mode)
    if mode == "bidirectional" and delta <= CAUSAL_TOLERANCE:
        raise AttentionError(
            "bidirectional attention was requested but the first token ignores later tokens "
            f"(max change {delta:.2e}); this transformers version changed its mask handling"
        )
    if mode == "causal" and delta > CAUSAL_TOLERANCE:
        raise AttentionError(f"causal attention was requested but the first token sees later ones ({delta:.2e})")


def configure_attention(model: nn.Module, mode: str, *, verify: bool = True) -> None:
    """Put a decoder into ``mode`` (``causal`` or ``bidirectional``) and check that it took.

    The mode is recorded on the model itself (see :func:`configured_mode`), so every Embedder that shares
    the model knows when another one has switched it.
    """
    if mode == "bidirectional":
        check_bidirectional_supported(model)
    setattr(model, _MODE_ATTRIBUTE, None)  # unknown until the switch is complete (and verified)
    set_causal_flags(model, causal=(mode == "causal"))
    if verify:
        verify_attention(model, mode)
    setattr(model, _MODE_ATTRIBUTE, mode)


def configured_mode(model: nn.Module) -> str | None:
    """The mode :func:`configure_attention` last put ``model`` in; None if it never did (native state)."""
    return getattr(model, _MODE_ATTRIBUTE, None)


class ModeGate:
    """Who may run a shared model, and in which attention mode. A decoder's mode lives on its modules (their
    ``is_causal`` flags), which every Embedder made from it with ``with_config`` shares: threads that run the same
    mode run together; one that needs the other mode waits until they are done, then switches it (two threads of
    a causal and a bidirectional sibling gave each other's vectors, and the causality check failed in between).
    A thread that holds one mode and asks for the other is refused, not left waiting on itself."""

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._mode: str | None = None
        self._holders = 0
        self._mine = threading.local()

    @contextmanager
    def hold(self, mode: str) -> Iterator[None]:
        held = getattr(self._mine, "modes", [])
        if held and held[-1] != mode:
            raise AttentionError(
                f"this thread runs the model with {held[-1]} attention and asked for {mode} inside that run"
            )
        with self._turn:
            while self._holders and self._mode != mode and not held:
                self._turn.wait()
            self._mode = mode
            self._holders += 1
        self._mine.modes = [*held, mode]
        try:
            yield
        finally:
            self._mine.modes = held
            with self._turn:
                self._holders -= 1
                if not self._holders:
                    self._turn.notify_all()
