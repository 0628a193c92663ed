"""The arithmetic of int8 products, in NumPy: how a weight is rounded, and how far a rounded product lands from
the float32 one.

The int8 graph multiplies each activation row, rounded symmetrically on its own range (255 levels), by weights
rounded per output column to :data:`WEIGHT_LEVELS` levels either side of zero. Everything that decides a graph
is computed here on calibration activations before any node is written:

* :func:`int8_error` is the relative RMS error of ``x @ w`` computed exactly as the graph will (and, for
  comparison, as the per-call recipe it replaced did), so a product can be kept float32 on a measurement of the
  very arithmetic it would run;
* :func:`round_weights` rounds each weight to its nearest level; :func:`compensated_weights` rounds the weights
  of the products that read one input together, moving each channel's rounding error onto the channels not yet
  rounded, weighted by how the calibration activations co-vary (GPTQ's procedure). Nearest rounding leaves
  each weight an error that does not depend on the input, which survives the mean over a text's tokens where
  the activations' rounding noise averages away; compensation removes most of that part.

Why 7-bit weights: without VNNI, ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits, which
full-range weights can saturate. The figures behind these choices are in ``bench/results/int8-products/``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Largest weight magnitude in quantisation steps: 7 bits, so that uint8 x int8 pair sums fit 16 bits (AVX2).
WEIGHT_LEVELS = 63
#: Compensated weight rounding: damping added to the calibration Gram matrix's diagonal, as a share of its mean
#: (it keeps the inverse well conditioned where the sample has fewer rows than the input has channels).
COMPENSATION_DAMPING = 0.01
#: Compensated weight rounding: input channels rounded between two matrix updates of the channels still to round.
COMPENSATION_BLOCK = 128
#: int8 weight codes and the float32 step of each column: the weight is ``codes * step``.
Codes = tuple[np.ndarray, np.ndarray]


def int8_error(
    x: np.ndarray,
    weight: np.ndarray,
    *,
    per_row: bool = True,
    weight_levels: int | None = None,
    split: np.ndarray | None = None,
    codes: Codes | None = None,
) -> float:
    """Relative RMS error of ``x @ weight`` computed the way the int8 graph does: each activation row quantised
    symmetrically on its own range, weights per output column to :data:`WEIGHT_LEVELS`; the input channels in
    ``split`` are multiplied in float32 and left out of the rows' ranges. ``per_row=False`` models the per-call
    recipe it replaced (one asymmetric uint8 range over all rows, 8-bit weights), for comparison
    (``bench/int8_products.py``); ``weight_levels`` overrides either recipe's weight levels. ``codes`` are the
    per-row recipe's weights already rounded (:func:`compensated_weights`; with ``split``, those of the inlier
    channels)."""
    exact = x @ weight
    if codes is not None:
        approx = int8_product(x, weight, codes, split)
    elif not per_row:
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        step = (hi - lo) / 255 or 1.0
        zero = np.round(-lo / step)
        xq = (np.clip(np.round(x / step) + zero, 0, 255) - zero) * step
        approx = xq @ _quantise_columns(weight, weight_levels or 127)
    elif split is not None and len(split):
        keep = np.ones(x.shape[1], dtype=bool)
        keep[split] = False
        inliers = _quantise_rows(np.where(keep, x, 0)) @ _quantise_columns(weight * keep[:, None], weight_levels)
        approx = inliers + x[:, split] @ weight[split]
    else:
        approx = _quantise_rows(x) @ _quantise_columns(weight, weight_levels)
    return float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-12))


def int8_product(x: np.ndarray, weight: np.ndarray, codes: Codes, split: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight`` as the int8 graph computes it with the weights rounded to ``codes``: each row of ``x``
    rounded on its own range, the input channels in ``split`` multiplied in float32."""
    keep = np.ones(x.shape[1], dtype=bool)
    if split is not None:
        keep[split] = False
    return _quantise_rows(np.where(keep, x, 0)) @ (codes[0] * codes[1]) + x[:, ~keep] @ weight[~keep]


def inlier_weight(weight: np.ndarray, split: np.ndarray | None) -> np.ndarray:
    """``weight`` with the rows of the outlier channels ``split`` zeroed (those are multiplied in float32)."""
    if split is None:
        return weight
    out = weight.copy()
    out[split] = 0
    return out


def _quantise_rows(x: np.ndarray) -> np.ndarray:
    """Each row of ``x`` rounded to 255 symmetric levels of its own range (as values, not codes)."""
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    step[step == 0] = 1.0
    return np.clip(np.round(x / step), -127, 127) * step


def _quantise_columns(weight: np.ndarray, levels: int | None) -> np.ndarray:
    """Each column of ``weight`` rounded to ``2 * levels + 1`` symmetric levels of its own range."""
    codes, step = round_weights(weight, levels or WEIGHT_LEVELS)
    return codes * step


def column_steps(weight: np.ndarray, levels: int) -> np.ndarray:
    """The quantisation step of each column of ``weight``: its largest magnitude over ``levels``."""
    return (np.maximum(np.abs(weight).max(axis=0), 1e-12) / levels).astype(np.float32)


def round_weights(weight: np.ndarray, levels: int = WEIGHT_LEVELS) -> Codes:
    """``weight`` rounded to the nearest of ``2 * levels + 1`` symmetric levels of each column's range."""
    step = column_steps(weight, levels)
    return np.clip(np.round(weight / step), -levels, levels).astype(np.int8), step


def compensated_weights(weights: Sequence[np.ndarray], rows: np.ndarray, levels: int = WEIGHT_LEVELS) -> list[Codes]:
    """The weights of products reading the same input (``rows``: a sample of it, one token per row) rounded so
    that the products' error on such inputs is small, not each weight's own error (GPTQ's rounding, Frantar et
    al. 2022, here at 7 bits per column).

    Input channels are rounded one at a time, each column on its own step as in :func:`round_weights`; the
    rounding error of channel ``i``, weighted by how the sample's channels co-vary (the inverse of their Gram
    matrix ``X^T X``), is moved onto the channels not yet rounded, which absorb it. Rounding to the nearest
    level leaves each weight's error independent of the input, so the error of a mean-pooled vector keeps a
    fixed part that averaging over tokens does not remove; compensated rounding cuts that part several times
    (``bench/int8_products.py``). Channels never active in the sample are rounded to the nearest level."""
    # lazy: scipy is only needed when quantising
    from scipy.linalg import lapack

    widths = np.cumsum([w.shape[1] for w in weights])[:-1]
    w = np.concatenate(weights, axis=1).astype(np.float32)
    step = column_steps(w, levels)
    rows = np.asarray(rows, dtype=np.float32)
    gram = (rows.T @ rows).astype(np.float64)
    diagonal = np.diag(gram).copy()
    diagonal[diagonal == 0] = 1.0  # inactive channels: no error to move, and an invertible matrix
    np.fill_diagonal(gram, diagonal + COMPENSATION_DAMPING * float(diagonal.mean()))
    # ``spread``, the upper Cholesky factor U of the inverse (inverse = U^T U): row i says how channel i's error
    # moves to the channels after it. With the channel order reversed (J), J G J = L L^T gives U = J L^-1 J,
    # a third of the arithmetic of inverting G and factoring the inverse.
    lower = np.linalg.cholesky(gram[::-1, ::-1])
    inverse, info = lapack.dtrtri(lower, lower=1)
    if info:
        raise ValueError(f"compensated rounding: the calibration Gram matrix is singular (LAPACK info {info})")
    spread = np.ascontiguousarray(inverse[::-1, ::-1], dtype=np.float32)
    codes = np.empty(w.shape, dtype=np.int8)
    channels = w.shape[0]
    for start in range(0, channels, COMPENSATION_BLOCK):
        stop = min(start + COMPENSATION_BLOCK, channels)
        block = w[start:stop]
        moved = np.empty_like(block)
        for i in range(stop - start):
            c = start + i
            code = np.clip(np.round(block[i] / step), -levels, levels)
            codes[c] = code
            moved[i] = (block[i] - code * step) / spread[c, c]
            block[i + 1 :] -= np.outer(spread[c, c + 1 : stop], moved[i])
        w[stop:] -= spread[start:stop, stop:].T @ moved
    return [(c, s) for c, s in zip(np.split(codes, widths, axis=1), np.split(step, widths), strict=True)]
