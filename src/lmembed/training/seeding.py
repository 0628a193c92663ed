"""Seeding of every random generator a training run draws from (python, numpy, torch on all devices).

Both training loops call :func:`set_seed` once with the run's seed before building the model, and the
contrastive trainer again with ``seed + rank`` so that each process draws its own dropout masks.
Saving and restoring the generators' *state* for exact resumption is :mod:`lmembed.training.checkpoint`'s job.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["set_seed"]


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
