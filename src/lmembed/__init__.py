"""lmembed: turn language models into text-embedding models."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Embedder", "EmbeddingConfig", "__version__"]


def __getattr__(name: str):  # lazy: importing lmembed must not import torch
    if name == "Embedder":
        from lmembed.embedder import Embedder  # lazy: `import lmembed` must not import torch

        return Embedder
    if name == "EmbeddingConfig":
        from lmembed.config import EmbeddingConfig  # lazy, like Embedder

        return EmbeddingConfig
    raise AttributeError(name)
