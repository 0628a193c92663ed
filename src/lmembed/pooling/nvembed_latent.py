"""NV-Embed's published latent-attention pooling head, with the parameter names of its checkpoints.

NV-Embed (v1 and v2, ``modeling_nvembed.py`` of the Hub repositories) pools the bidirectional Mistral's last,
normed token states ``h`` in two residual blocks and a masked mean:

1. ``h = h + Wo · attn(Wq · LN(h), Wk · LN'(L), Wv · LN'(L))``: every token state attends to the trainable
   latent array ``L`` (``num_latents`` × d), with ``num_heads`` heads each ``head_dim`` wide (4096 in the
   published models, so the attention is ``num_heads · head_dim`` wide), no biases, no mask, scaled by
   ``head_dim ** -0.5``; ``LN`` and ``LN'`` are two LayerNorms (token states and latents).
2. ``h = h + W2 · GEGLU(W1 · LN''(h))`` where ``W1`` widens to ``2 · hidden_mult · d`` (``hidden_mult`` is 4),
   ``GEGLU(a ‖ g) = a · gelu(g)``.
3. The mean of ``h`` over the pool mask's tokens.

The submodules are named so that :meth:`torch.nn.Module.state_dict` equals the checkpoint's
``latent_attention_model.*`` tensors with that prefix removed, and a head saved by lmembed reloads the same way.
This is a different calculation from lmembed's own trainable head (:mod:`lmembed.pooling.latent_attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmembed.config import ConfigError, LatentAttentionConfig
from lmembed.pooling.poolers import mean_pool


class _CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (batch, heads, n, head_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        keys, values = self.to_kv(context).chunk(2, dim=-1)
        out = F.scaled_dot_product_attention(self._split(self.to_q(x)), self._split(keys), self._split(values))
        return self.to_out(out.transpose(1, 2).flatten(-2))


class _GEGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, gates = x.chunk(2, dim=-1)
        return values * F.gelu(gates)


class _AttentionBlock(nn.Module):
    """``fn(LN(x), LN'(context))``, the checkpoint's ``cross_attend_blocks.0``."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(dim)
        self.fn = _CrossAttention(dim, heads, head_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x), self.norm_context(context))


class _FeedForwardBlock(nn.Module):
    """``W2 · GEGLU(W1 · LN(x))``, the checkpoint's ``cross_attend_blocks.1``."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = nn.Module()
        self.fn.net = nn.Sequential(nn.Linear(dim, 2 * mult * dim), _GEGLU(), nn.Linear(mult * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn.net(self.norm(x))


class NVEmbedLatentPooling(nn.Module):
    """NV-Embed's pooling head (see the module doc); ``forward(hidden, pool_mask)`` as every lmembed pooler."""

    def __init__(self, hidden_size: int, config: LatentAttentionConfig) -> None:
        super().__init__()
        if config.variant != "nv-embed":
            raise ConfigError(f"NVEmbedLatentPooling needs latent variant 'nv-embed', not {config.variant!r}")
        head_dim = config.head_dim or hidden_size // config.num_heads
        self.config = config
        self.latents = nn.Parameter(torch.randn(config.num_latents, hidden_size))
        self.cross_attend_blocks = nn.ModuleList(
            [
                _AttentionBlock(hidden_size, config.num_heads, head_dim),
                _FeedForwardBlock(hidden_size, config.hidden_mult),
            ]
        )

    def forward(self, hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
        attend, feed_forward = self.cross_attend_blocks
        latents = self.latents.to(hidden.dtype).expand(hidden.shape[0], -1, -1)
        hidden = hidden + attend(hidden, latents)
        hidden = hidden + feed_forward(hidden)
        return mean_pool(hidden, pool_mask)
