"""Unit-length rows: the one L2 normalisation of vectors held as numpy arrays (pooled embeddings, a search's
queries and documents, a teacher's scores), after pooling as sentence-transformers' ``Normalize`` module does it."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

#: a row shorter than this is divided by it instead (a zero row stays zero, never NaN)
MIN_NORM = 1e-12
#: rows are scaled in blocks of about this many elements (the norm's temporary is one block's size)
NORM_BLOCK_ELEMENTS = 1 << 22


def unit_rows(vectors: ArrayLike, *, dtype: DTypeLike | None = np.float32, in_place: bool = False) -> np.ndarray:
    """A C-contiguous copy of the 2-D ``vectors`` with each row scaled to unit L2 norm (zero rows stay zero), in
    ``dtype``; ``dtype=None`` keeps a floating input's precision (and reads whole numbers as float64).

    ``in_place=True`` scales ``vectors`` itself when it already is a writable C-contiguous array of that dtype (the
    caller gives it away: an index build normalises the vectors it encoded without a second copy). Rows are scaled a
    block at a time, so no temporary of the whole matrix's size is made; each row's result is the same bits as
    scaling the whole matrix at once."""
    out: Any = np.asarray(vectors)
    if dtype is None:
        dtype = np.result_type(out.dtype, np.float32)
    reuse = in_place and out.dtype == dtype and out.flags.c_contiguous and out.flags.writeable
    out = out if reuse else np.array(out, dtype=dtype, order="C", copy=True)
    if out.ndim != 2:
        raise ValueError(f"vectors must be a 2-D matrix, got shape {out.shape}")
    floor = out.dtype.type(MIN_NORM)
    step = max(1, NORM_BLOCK_ELEMENTS // max(out.shape[1], 1))
    for start in range(0, len(out), step):
        block = out[start : start + step]
        block /= np.maximum(np.linalg.norm(block, axis=1, keepdims=True), floor)
    return out
