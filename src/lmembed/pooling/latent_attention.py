"""NV-Embed's latent-attention pooling head.

The token states of the last layer act as queries in a multi-head cross-attention whose keys and
values come from a trainable latent array (``num_latents`` × d). The attended output is added to the
token states, goes through a two-layer GELU MLP (again with a residual connection) and is then
mean-pooled over the poolable tokens. Without the residuals a freshly initialised head attends almost
uniformly to the latents and maps every text to the same vector, so training could never start.
The head is a small ``nn.Module`` saved and loaded with the embedder (``pooling_head.safetensors``).

:func:`build_latent_head` makes the head a strategy's ``latent`` config names: this one, or NV-Embed's
published head (:mod:`lmembed.pooling.nvembed_latent`).
"""

from __future__ import annotations

import torch
from torch import nn

from lmembed.config import ConfigError, LatentAttentionConfig
from lmembed.pooling.nvembed_latent import NVEmbedLatentPooling
from lmembed.pooling.poolers import mean_pool


class LatentAttentionPooling(nn.Module):
    def __init__(self, hidden_size: int, config: LatentAttentionConfig | None = None) -> None:
        super().__init__()
        cfg = config or LatentAttentionConfig()
        if hidden_size % cfg.num_heads:
            raise ConfigError(f"latent.num_heads={cfg.num_heads} does not divide the model's hidden size {hidden_size}")
        self.config = cfg
        self.latents = nn.Parameter(torch.randn(cfg.num_latents, hidden_size) * hidden_size**-0.5)
        self.attention = nn.MultiheadAttention(hidden_size, cfg.num_heads, batch_first=True)
        width = hidden_size * cfg.hidden_mult
        self.mlp = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, hidden_size))

    def forward(self, hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
        latents = self.latents.to(hidden.dtype).unsqueeze(0).expand(hidden.shape[0], -1, -1)
        attended, _ = self.attention(hidden, latents, latents, need_weights=False)
        states = hidden + attended  # residual: a fresh head starts near plain mean pooling
        states = states + self.mlp(states)
        return mean_pool(states, pool_mask)


def build_latent_head(hidden_size: int, config: LatentAttentionConfig | None = None) -> nn.Module:
    """A fresh latent-attention head of ``config``'s variant for a model of width ``hidden_size``."""
    cfg = config or LatentAttentionConfig()
    if cfg.variant == "nv-embed":
        return NVEmbedLatentPooling(hidden_size, cfg)
    return LatentAttentionPooling(hidden_size, cfg)
