"""Unit-length rows: the one L2 normalisation of vectors held as numpy arrays (pooled embeddings, a search's
queries and documents, a teacher's scores), after pooling as sentence-transformers' ``Normalize`` module does it."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

#: a row shorter than this is divided by it instead (a zero row stays zero, never NaN)
MIN_NORM = 1e-12


def unit_rows(vectors: ArrayLike, *, dtype: DTypeLike | None = np.float32) -> np.ndarray:
    """A C-contiguous copy of the 2-D ``vectors`` with each row scaled to unit L2 norm (zero rows stay zero), in
    ``dtype``; ``dtype=None`` keeps a floating input's precision (and reads whole numbers as float64)."""
    out: Any = np.asarray(vectors)
    if dtype is None:
        dtype = np.result_type(out.dtype, np.float32)
    out = np.array(out, dtype=dtype, order="C", copy=True)
    if out.ndim != 2:
        raise ValueError(f"vectors must be a 2-D matrix, got shape {out.shape}")
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), out.dtype.type(MIN_NORM))
    return out
