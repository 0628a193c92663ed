"""Padding-free (packed) forward passes: the texts of a batch laid end to end in one row, no padding computed.

A padded batch of texts with lengths ``n_1 .. n_B`` costs ``B x max(n)`` tokens in every linear layer and
``B x max(n)^2`` in attention; packed, it costs ``sum(n)`` and ``sum(n^2)``. The texts share one row of
``sum(n)`` tokens; each text's positions restart at its own first position (``position_ids``), and attention
stays inside each text, bounded by ``cu_seqlens`` (the cumulative lengths ``0, n_1, n_1 + n_2, ...``).

Which kernel keeps attention inside each text (what was found in the installed packages, transformers 5.24 and
torch 2.13; ``bench/results/gpu-throughput/README.md`` has the file and line of each refusal):

* transformers' own packed path reads packed rows from ``position_ids`` only for flash-attention implementations
  (``flash_attention_2/3``: the ``flash_attn`` package or a Hub kernel, neither of which is here) and, for SDPA,
  through ``create_causal_mask``, which builds a dense ``(total, total)`` block-diagonal mask: decoders only
  (``create_bidirectional_mask`` passes no ``position_ids``), and attention still costs ``sum(n)^2``.
* ``torch.nn.attention.varlen.varlen_attn`` (torch 2.13) is attention over ``cu_seqlens`` itself: CUDA only (its
  flash kernel, float16/bfloat16), no CPU kernel.

So this module registers its own attention function with transformers (:data:`PACKED_ATTENTION`, through
``AttentionInterface``): on CUDA in float16/bfloat16 it calls ``varlen_attn``; elsewhere it runs SDPA once per text
(the same kernel as a padded pass, without the padding). It needs no mask (transformers makes none for an
implementation without a mask function) and reads causality from each attention module's ``is_causal`` flag, which
:func:`lmembed.models.attention.configure_attention` sets for a decoder's mode (encoders: bidirectional).

Works for models that take ``position_ids`` and whose attention calls transformers' attention interface (BERT
family, Llama, Mistral, Qwen2/3 ...), without sliding-window layers. Not wired into
:class:`~lmembed.encoding.engine.EncodingEngine`: :func:`encode_packed` is the whole path, pure functions around one
model, so that a benchmark can measure it beside the padded engine.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from lmembed.config import ConfigError, EmbeddingConfig
from lmembed.models.depth import exit_depth, forward_states
from lmembed.models.families import AFTER_PADDING, COUNTED, forward_parameters, position_convention
from lmembed.pooling.layers import find_final_norm, normalize_layer, select_states
from lmembed.pooling.poolers import STATELESS_POOLERS
from lmembed.protocols import ENCODE_BATCH_SIZE

if TYPE_CHECKING:
    from lmembed.encoding.engine import EncodingEngine

__all__ = [
    "PACKED_ATTENTION",
    "PackedBatch",
    "encode_packed",
    "first_position",
    "pack",
    "packed_attention",
    "packed_attention_for",
    "packed_hidden_states",
    "unpack",
    "varlen_kernel_used",
]

#: The name under which :func:`packed_attention` is registered with transformers' ``AttentionInterface``.
PACKED_ATTENTION = "lmembed_packed"


@dataclass(frozen=True)
class PackedBatch:
    """One packed row: ``input_ids`` and ``position_ids`` of shape ``(1, total)``, ``cu_seqlens`` (int32,
    ``texts + 1``: where each text starts, then the total) and each text's length."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: tuple[int, ...]

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def attention_kwargs(self) -> dict[str, Any]:
        """What the model's forward passes on to every attention call (transformers' flash-attention names)."""
        return {
            "cu_seq_lens_q": self.cu_seqlens,
            "cu_seq_lens_k": self.cu_seqlens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }


def pack(sequences: Sequence[Sequence[int]], device: torch.device | str = "cpu", start: int = 0) -> PackedBatch:
    """The token ids of ``sequences`` end to end in one row; each text's positions count from ``start``."""
    lengths = tuple(len(s) for s in sequences)
    if not lengths or min(lengths) < 1:
        raise ConfigError("pack: every text needs at least one token, and a batch at least one text")
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
    positions = np.concatenate([np.arange(start, start + n, dtype=np.int64) for n in lengths])
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return PackedBatch(
        torch.from_numpy(ids)[None].to(device),
        torch.from_numpy(positions)[None].to(device),
        torch.from_numpy(bounds).to(device),
        lengths,
    )


def unpack(states: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """``(1, total, hidden)`` packed states as ``(texts, longest, hidden)``, right-padded with zeros."""
    pieces = states.reshape(-1, states.shape[-1]).split(list(batch.lengths))
    return nn.utils.rnn.pad_sequence(list(pieces), batch_first=True)


def first_position(model: nn.Module, is_decoder: bool) -> int:
    """The position id of a text's first token in ``model`` (0; fairseq-style encoders: ``pad_token_id + 1``).
    A model whose forward takes no ``position_ids`` cannot be packed (its positions would not restart)."""
    convention = position_convention(model, is_decoder)
    if convention == COUNTED:
        return 0
    if convention == AFTER_PADDING:
        pad = getattr(model.config, "pad_token_id", None)
        if pad is None:
            raise ConfigError("packed: positions numbered after padding need the config's pad_token_id, unset")
        return int(pad) + 1
    raise ConfigError(
        f"packed: model_type={getattr(model.config, 'model_type', '?')!r} numbers its own positions (its forward "
        "takes no position_ids), so texts packed in one row would not restart at their first position"
    )


def varlen_kernel_used(query: torch.Tensor) -> bool:
    """Whether :func:`packed_attention` runs torch's variable-length flash kernel for ``query`` (CUDA, half
    precision) rather than one SDPA call per text."""
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function over a packed row: ``query`` ``(1, heads, total, dim)``, ``key``/``value``
    ``(1, kv_heads, total, dim)``; returns ``(1, total, heads, dim)``. Each text attends only to itself, causally
    where the module's ``is_causal`` says so."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        raise RuntimeError(f"the {PACKED_ATTENTION} attention needs cu_seq_lens_q (run it through encode_packed)")
    if kwargs.get("sliding_window") is not None:
        raise ConfigError("packed: sliding-window attention layers are not supported")
    if attention_mask is not None:
        raise RuntimeError(f"the {PACKED_ATTENTION} attention takes no mask; the model made one")
    causal = bool(getattr(module, "is_causal", False))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if varlen_kernel_used(query):
        from torch.nn.attention.varlen import varlen_attn

        longest = int(kwargs.get("max_length_q") or int((bounds[1:] - bounds[:-1]).max()))
        out = varlen_attn(
            query[0].transpose(0, 1),
            key[0].transpose(0, 1),
            value[0].transpose(0, 1),
            bounds,
            bounds,
            longest,
            longest,
            scale=scaling,
            window_size=(-1, 0) if causal else (-1, -1),
        )
        return out.unsqueeze(0), None
    edges = bounds.tolist()
    parts = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=causal and b - a > 1, scale=scaling
        )
        for a, b in itertools.pairwise(edges)
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)


@contextmanager
def packed_attention_for(model: nn.Module) -> Iterator[None]:
    """``model``'s attention switched to :data:`PACKED_ATTENTION` inside the block, restored after it. The switch is
    on the model's config, which every user of the model shares: not for a model another thread is running."""
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


def packed_hidden_states(
    model: nn.Module, batch: PackedBatch, *, depth: int | None = None, is_decoder: bool = False
) -> tuple[torch.Tensor, ...]:
    """The hidden states (embeddings, then each block's output, ``(1, total, hidden)`` each) of a packed row through
    the first ``depth`` blocks of ``model`` (all by default), with its attention switched to the packed kernel."""
    params = forward_parameters(model)
    inputs: dict[str, Any] = {"input_ids": batch.input_ids, "position_ids": batch.position_ids}
    if "token_type_ids" in params:  # BERT's default segment ids are a buffer as long as its position table
        inputs["token_type_ids"] = torch.zeros_like(batch.input_ids)
    if is_decoder and "use_cache" in params:
        inputs["use_cache"] = False
    inputs.update(batch.attention_kwargs())
    layers = getattr(model.config, "num_hidden_layers", None)
    with packed_attention_for(model):
        states, _ = forward_states(model, inputs, depth=depth if depth is not None else layers)
    return states


#: how far a text's states may move when another text is packed before it (float rounding of a longer row), in units
#: of the model's dtype's epsilon, and at least 1e-4; a text that attends to another moves by tenths
ISOLATION_EPSILONS = 64
#: the models whose packing was probed, and in which mode (the probe runs once per model and mode)
_ISOLATED: weakref.WeakKeyDictionary[nn.Module, set[tuple[int, bool]]] = weakref.WeakKeyDictionary()


def _check_supported(engine: EncodingEngine, config: EmbeddingConfig) -> None:
    where = "packed encoding"
    if engine.backend.name != "torch":
        raise ConfigError(f"{where} runs on the torch backend, not {engine.backend.name!r}")
    model = engine.backbone.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model: the model it wraps
    if not getattr(type(base), "_supports_attention_backend", False):
        # MPNet, DeBERTa, RemBERT, I-BERT, ConvBERT, BigBird, Megatron-BERT ... compute attention in their own code:
        # the packed kernel is never called, and every text of a row attended to the others (cosine 0.69-0.98)
        raise ConfigError(
            f"{where}: model_type={getattr(model.config, 'model_type', '?')!r} computes attention in its own code, "
            "not through transformers' attention interface, so texts packed in one row would attend to each other; "
            "encode it padded (the engine's default)"
        )
    if config.head or config.pooling not in STATELESS_POOLERS:
        raise ConfigError(f"{where}: pooling={config.pooling!r} with a head is not supported (no pooling heads)")
    num_layers = engine.backbone.num_layers
    if config.final_norm is False and num_layers in {normalize_layer(x, num_layers) for x in config.layers}:
        raise ConfigError(f"{where}: final_norm=False on the last layer is not supported")


def _check_isolated(model: nn.Module, start: int, depth: int, is_decoder: bool, device: torch.device) -> None:
    """Packing must keep each text to itself, whatever the model's class says: a short text's states alone and
    after another text in the same row must agree (the other text first, so a causal model's leak shows too)."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    probed = _ISOLATED.setdefault(model, set())
    if vocab < 16 or (depth, is_decoder) in probed:
        return
    text, other = [5, 9, 13, 7, 11], [8, 12, 6, 10]
    alone = packed_hidden_states(model, pack([text], device, start), depth=depth, is_decoder=is_decoder)[-1]
    beside = packed_hidden_states(model, pack([other, text], device, start), depth=depth, is_decoder=is_decoder)[-1]
    a, b = alone[0].float(), beside[0, len(other) :].float()
    moved = float((a - b).abs().max()) / max(1.0, float(a.abs().max()))
    dtype = alone.dtype if alone.dtype.is_floating_point else torch.float32
    if moved > max(1e-4, ISOLATION_EPSILONS * torch.finfo(dtype).eps):
        raise ConfigError(
            f"packed encoding: model_type={getattr(model.config, 'model_type', '?')!r} let a text attend to another "
            f"packed in the same row (its states moved by {moved:.2e}); encode it padded (the engine's default)"
        )
    probed.add((depth, is_decoder))


def encode_packed(
    engine: EncodingEngine,
    texts: Sequence[str],
    config: EmbeddingConfig,
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    max_batch_tokens: int | None = None,
    instruction: str | None = None,
) -> np.ndarray:
    """Raw pooled float32 vectors of ``texts`` (input order, before normalisation), as ``engine`` computes them
    for ``config`` but with each batch packed: the engine's tokenisation, batch plan and pooling, no padding in
    the forward pass. Torch backend, stateless pooling (no heads); no cache."""
    from lmembed.encoding.engine import plan_batches

    _check_supported(engine, config)
    backbone = engine.backbone
    model = backbone.model
    mode = config.attention if backbone.is_decoder else "bidirectional"
    features = engine.input_builder(config).build_all(list(texts), instruction)
    start = first_position(model, backbone.is_decoder)
    num_layers = backbone.num_layers
    depth = exit_depth({normalize_layer(x, num_layers) for x in config.layers}, num_layers)
    norm = find_final_norm(model) if backbone.is_decoder else None
    pooler = STATELESS_POOLERS[config.pooling]
    out = np.empty((len(features), backbone.hidden_size), dtype=np.float32)
    with backbone.modes.hold(mode), torch.inference_mode():
        engine.backend.prepare([config], mode)  # a decoder's attention mode: the modules' is_causal flags
        if features:
            _check_isolated(model, start, depth, backbone.is_decoder, backbone.device)
        for chunk in plan_batches([len(f) for f in features], batch_size, max_batch_tokens):
            batch = pack([features[j].input_ids for j in chunk], backbone.device, start)
            hidden = packed_hidden_states(model, batch, depth=depth, is_decoder=backbone.is_decoder)
            states = select_states(
                hidden, config.layers, final_norm=config.final_norm, norm=norm, raw_last=None, num_layers=num_layers
            )
            padded = unpack(states, batch)
            pool_np = np.zeros(padded.shape[:2], dtype=np.int64)  # numpy rows, one tensor (not a tensor per row)
            attn_np = np.zeros_like(pool_np)
            for row, j in enumerate(chunk):
                pool_np[row, : len(features[j])] = features[j].pool_mask
                attn_np[row, : len(features[j])] = 1
            pool, attn = (torch.from_numpy(a).to(padded.device) for a in (pool_np, attn_np))
            if config.pooling == "weighted_mean" and config.prompt_style != "lmembed":
                pooled = pooler(padded, pool, attn)
            else:
                pooled = pooler(padded, pool)
            out[chunk] = pooled.float().cpu().numpy()
    return out
