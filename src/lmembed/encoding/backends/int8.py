"""int8 graphs: per-row int8 activations, outlier channels in float32, 7-bit per-column weights rounded with
compensation, lossy products left in float32.

Every weight product ``X @ W`` of the fused float32 graph becomes: each row (token) of ``X`` scaled by its own
``max|x| / 127`` and quantised to uint8 at zero point 128 (``QuantizeLinear`` with a per-row scale), an integer
product with int8 weights quantised per output column (``MatMulIntegerToFloat``), and the result multiplied back by
the row scale. Rows sharing one input are quantised once (the three attention projections, a decoder's
gate/up projections). The fused ``Attention`` nodes of an encoder become three such products feeding
``MultiHeadAttention``. Because every row is quantised on its own, a text's int8 vector does not depend on which
texts share its batch beyond what float32 rounding already does (none for ``minilm``; a decoder's left padding
changes float32 by ~1e-7 between batch shapes, which int8 rounding can amplify to ~1e-2).

**Outlier channels.** A few input channels of a decoder (its "massive activations") reach tens of times the
others' magnitude; in a per-row range they leave the other channels a few levels each. An input channel whose
calibration ``max|x|`` exceeds :data:`OUTLIER_RATIO` times the median channel's (at most
:data:`MAX_OUTLIER_CHANNELS`) is zeroed before the row's range is taken and multiplied in float32 instead (the
decomposition of LLM.int8(), with the channels fixed at calibration rather than found per call), where that
lowers the error of the products reading the input (:func:`choose_splits`).

**Compensated weight rounding.** A weight rounded to its nearest level carries an error that does not depend on
the input, so the part of a product's error it causes survives mean pooling over a text's tokens, while the
activations' rounding noise averages away; in ``smollm2-135m`` it was most of the error of a product's mean over
tokens. The weights reading each input are therefore rounded with compensation for the calibration activations
recorded at that input (:func:`compensated_weights`, GPTQ's procedure), on the same per-column grid: the median
error of a product's mean over held-out tokens fell from 0.0117 to 0.0025 over its 210 products
(``bench/int8_products.py``). Its last-layer retrieval scores still move by about a point with the calibration
sample (``bench/main_job_time.py``).

Measured with ``python bench/int8_products.py --graphs`` (cosine of mean-pooled vectors to the float32 graph over
real texts, speed relative to the fused float32 graph in the same run, this 2-core AVX2 CPU without VNNI):

* ``minilm`` (400 texts): one range per call (ONNX Runtime's dynamic quantisation, per-channel weights, the
  lossiest products kept float32): min cosine 0.9904, vectors move by up to 0.035 when re-batched; per row: 0.9933;
  per row with outlier channels: 0.9944, re-batching moves nothing; speed 1.40x / 1.42x / 1.37x;
* ``smollm2-135m`` (128 texts, 128 tokens): 58 / 19 / 0 of 210 products too lossy for int8 (worst relative error
  0.24 / 0.12 / 0.045); min cosine 0.919 / 0.988 / 0.994; speed 1.37x / 1.67x / 1.59x.

Earlier recipes (``bench/profile_encode.py``'s docstring): static int8 (QDQ, per-tensor ranges fixed at
calibration) reached mean cosine 0.926 and was no faster, as ONNX Runtime cannot fuse attention around
quantise/dequantise pairs; SmoothQuant-style smoothing made the dynamic recipe worse (a = 0.5: mean 0.969).
Weights use 7 bits (+-63): without VNNI, ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits,
which full-range weights can saturate (8-bit weights measured min cosine 0.9928 against 0.9933 for 7-bit).

A product whose int8 error (relative RMS on activations recorded while running the user's calibration texts, the
recipe modelled exactly by :func:`int8_error` with the rounded weights) exceeds
:data:`MAX_NODE_ERROR` stays float32. The quality gate (:mod:`lmembed.encoding.backends.quality`) checks the result
on calibration texts held out from the measurement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: A product whose int8 output error (relative RMS on calibration activations) exceeds this stays float32.
MAX_NODE_ERROR = 0.06
#: Calibration rows kept per product for the error measurement.
ERROR_SAMPLE_ROWS = 2048
#: Largest weight magnitude in quantisation steps: 7 bits, so that uint8 x int8 pair sums fit 16 bits (AVX2).
WEIGHT_LEVELS = 63
#: Recorded in the int8 export's key: a graph built by another recipe is never loaded for this one.
RECIPE = "per-row activations with outlier channels in float32, 7-bit per-column weights rounded with compensation"
#: Compensated weight rounding: damping added to the calibration Gram matrix's diagonal, as a share of its mean
#: (it keeps the inverse well conditioned where the sample has fewer rows than the input has channels).
COMPENSATION_DAMPING = 0.01
#: Compensated weight rounding: input channels rounded between two matrix updates of the channels still to round.
COMPENSATION_BLOCK = 128
#: An input channel whose calibration max|x| exceeds this many times the median channel's is an outlier channel:
#: it is multiplied in float32, and left out of its row's int8 range (LLM.int8()'s decomposition, with the
#: channels fixed at calibration so that a row's quantisation never depends on the other rows).
OUTLIER_RATIO = 6.0
#: At most this many outlier channels per product input.
MAX_OUTLIER_CHANNELS = 8
#: Padded tokens per calibration run: every product's input is recorded at once, so this bounds the memory used
#: (a 30-layer decoder records ~100k floats per token).
CALIBRATION_TOKENS = 1024
#: Real tokens of calibration input recorded at most: every batch gives the same share of its rows, so the mix of
#: text lengths is kept. The per-row recipe takes no activation ranges from calibration, only the outlier channels
#: and the error sample, and a float32 pass over a few hundred long texts took longer than the encoding it was for
#: (85 s of the main job's 148 s int8 preparation for smollm2-135m, ``bench/main_job_time.py``).
CALIBRATION_MAX_TOKENS = 16384

#: int8 weight codes and the float32 step of each column: the weight is ``codes * step``.
Codes = tuple[np.ndarray, np.ndarray]


@dataclass
class Product:
    """One weight product in the graph: ``node`` multiplies its first input by the initializer ``weight``."""

    node: Any  # onnx.NodeProto
    weight: str
    activation: str


def weight_products(model: Any) -> list[Product]:
    """The graph's ``MatMul`` nodes with a constant 2-D weight, and fused ``Attention`` nodes."""
    initializers = {init.name: init for init in model.graph.initializer}
    products = []
    for node in model.graph.node:
        if node.op_type == "Attention" or (node.op_type == "MatMul" and node.input[1] in initializers):
            weight = node.input[1]
            if weight in initializers and len(initializers[weight].dims) == 2:
                products.append(Product(node, weight, node.input[0]))
    return products


def product_weights(model: Any, products: Sequence[Product]) -> dict[str, np.ndarray]:
    """The weight arrays of ``products`` (initializer name -> array)."""
    # lazy: onnx is an optional extra
    from onnx import numpy_helper

    wanted = {p.weight for p in products}
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name in wanted}


def activation_stats(
    model: Any,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    products: Sequence[Product],
    threads: int,
    sample_rows: int = ERROR_SAMPLE_ROWS,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per input channel ``max|X|`` of every product's activation over the real (unpadded) tokens of
    ``batches``, and a sample of activation rows for the error measurement."""
    # lazy: onnx and onnxruntime are optional extras
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = list(dict.fromkeys(p.activation for p in products))
    existing = {o.name for o in probe.graph.output}
    for name in names:
        if name not in existing:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), session_options(threads), providers=_CPU)
    absmax: dict[str, np.ndarray] = {}
    samples: dict[str, list[np.ndarray]] = {n: [] for n in names}
    rng = np.random.default_rng(0)
    runs = list(_small(batches))
    # rows kept per run: a sixteenth of the sample, or more where the calibration texts have fewer tokens, so that
    # short texts still give about ``sample_rows`` rows (the compensated rounding is fitted on them)
    share = sample_rows / max(1, sum(int(mask.sum()) for _, mask in runs))
    for ids, mask in runs:
        outputs = session.run(names, {"input_ids": ids, "attention_mask": mask})
        real = mask.reshape(-1).astype(bool)
        size = min(int(real.sum()), max(sample_rows // 16, int(np.ceil(share * real.sum()))))
        for name, value in zip(names, outputs, strict=True):
            rows = value.reshape(-1, value.shape[-1])[real]
            peak = np.abs(rows).max(axis=0)
            absmax[name] = peak if name not in absmax else np.maximum(absmax[name], peak)
            take = rng.choice(len(rows), size=size, replace=False)
            samples[name].append(rows[take])
        del outputs
    return absmax, {n: np.concatenate(s)[:sample_rows] for n, s in samples.items()}


def within_budget(
    batches: Iterable[tuple[np.ndarray, np.ndarray]], budget: int = CALIBRATION_MAX_TOKENS
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``batches`` thinned to about ``budget`` real tokens: the same share of every batch's rows, evenly spaced."""
    batches = list(batches)
    total = sum(int(mask.sum()) for _, mask in batches)
    share = min(1.0, budget / max(total, 1))
    thinned = []
    for ids, mask in batches:
        rows = np.unique(np.linspace(0, len(ids) - 1, max(1, round(share * len(ids)))).round().astype(np.int64))
        thinned.append((ids[rows], mask[rows]))
    return thinned


def _small(batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """``batches`` cut into runs of at most :data:`CALIBRATION_TOKENS` padded tokens (one row at least)."""
    for ids, mask in batches:
        rows = max(1, CALIBRATION_TOKENS // max(1, ids.shape[1]))
        for start in range(0, len(ids), rows):
            yield ids[start : start + rows], mask[start : start + rows]


def outlier_channels(absmax: np.ndarray) -> np.ndarray:
    """The input channels whose calibration ``max|x|`` exceeds :data:`OUTLIER_RATIO` times the median channel's
    (the largest :data:`MAX_OUTLIER_CHANNELS`), sorted."""
    limit = OUTLIER_RATIO * max(float(np.median(absmax)), 1e-12)
    candidates = np.flatnonzero(absmax > limit)
    largest = candidates[np.argsort(-absmax[candidates])][:MAX_OUTLIER_CHANNELS]
    return np.sort(largest).astype(np.int64)


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


def by_input(products: Sequence[Product]) -> dict[str, list[Product]]:
    """``products`` grouped by the activation they read (activation name -> its readers, in graph order)."""
    readers: dict[str, list[Product]] = {}
    for product in products:
        readers.setdefault(product.activation, []).append(product)
    return readers


def choose_splits(
    products: Sequence[Product],
    weights: dict[str, np.ndarray],
    absmax: dict[str, np.ndarray],
    samples: dict[str, np.ndarray],
    weight_levels: int = WEIGHT_LEVELS,
    split_outliers: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """For each product input with outlier channels (:func:`outlier_channels`), those channels, where taking them
    out of the int8 product lowers the worst error of the products that read the input (activation name ->
    channel indices); and every product's int8 error under that choice (node name -> relative RMS error).
    ``split_outliers=False`` splits nothing (for measuring the choice, ``bench/int8_products.py``)."""
    readers = by_input(products)
    splits: dict[str, np.ndarray] = {}
    errors: dict[str, float] = {}
    for name, group in readers.items():
        x = samples[name]
        chosen = {p.node.name: int8_error(x, weights[p.weight], weight_levels=weight_levels) for p in group}
        split = outlier_channels(absmax[name]) if split_outliers else np.zeros(0, dtype=np.int64)
        if len(split):
            with_split = {
                p.node.name: int8_error(x, weights[p.weight], weight_levels=weight_levels, split=split) for p in group
            }
            if max(with_split.values()) < max(chosen.values()):
                splits[name], chosen = split, with_split
        errors.update(chosen)
    return splits, errors


def compensate(
    products: Sequence[Product],
    weights: dict[str, np.ndarray],
    samples: dict[str, np.ndarray],
    splits: dict[str, np.ndarray],
    weight_levels: int = WEIGHT_LEVELS,
) -> dict[str, Codes]:
    """Every product's weights rounded by :func:`compensated_weights` against its input's calibration sample,
    the input's outlier channels (``splits``) left out of both (node name -> codes); none for an input whose
    sample has fewer rows than it has channels (calibration on a handful of short texts), which keeps rounding
    to the nearest level."""
    readers = by_input(products)
    out: dict[str, Codes] = {}
    for name, group in readers.items():
        if len(samples[name]) < samples[name].shape[1]:
            continue  # fewer rows than channels: the fit would follow the sample, not the inputs (nearest rounding)
        keep = np.ones(samples[name].shape[1], dtype=bool)
        keep[splits.get(name, [])] = False
        inliers = [inlier_weight(weights[p.weight], splits.get(name)) for p in group]
        rounded = compensated_weights(inliers, np.where(keep, samples[name], 0), weight_levels)
        out.update({p.node.name: codes for p, codes in zip(group, rounded, strict=True)})
    return out


def quantize_graph(
    source: Path,
    target: Path,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    threads: int,
    weight_levels: int = WEIGHT_LEVELS,
    split_outliers: bool = True,
    compensated: bool = True,
) -> dict[str, Any]:
    """Quantise the fused float32 graph at ``source`` into ``target``, measuring on ``batches`` (calibration
    token ids and masks) which inputs have outlier channels to multiply in float32, how to round the weights
    (:func:`compensated_weights`) and which products stay float32; returns what was done (for the export's
    manifest). ``weight_levels`` other than :data:`WEIGHT_LEVELS`, ``split_outliers=False`` and
    ``compensated=False`` (weights rounded to the nearest level) are for measuring the choices
    (``bench/int8_products.py``)."""
    if not 1 <= weight_levels <= 127:
        raise ValueError(f"weight_levels: must be 1 to 127 (int8 weights), got {weight_levels}")
    # lazy: onnx is an optional extra
    import onnx

    model = onnx.load(str(source))
    products = weight_products(model)
    batches = within_budget(batches)
    absmax, samples = activation_stats(model, batches, products, threads)
    weights = product_weights(model, products)
    splits, errors = choose_splits(products, weights, absmax, samples, weight_levels, split_outliers)
    codes: dict[str, Codes] = {}
    if compensated:
        codes = compensate(products, weights, samples, splits, weight_levels)
        errors = {
            p.node.name: int8_error(
                samples[p.activation], weights[p.weight], split=splits.get(p.activation), codes=codes[p.node.name]
            )
            if p.node.name in codes
            else errors[p.node.name]
            for p in products
        }
    skipped = {name: error for name, error in errors.items() if error > MAX_NODE_ERROR}  # these stay float32
    kept_float32 = set(skipped)
    chosen = [p for p in products if p.node.name not in skipped]
    kept_float32 |= per_row_int8(model, chosen, weight_levels=weight_levels, splits=splits, codes=codes)
    large = model.ByteSize() > 1_800_000_000  # protobuf's 2 GB limit: weights go beside the graph
    onnx.save(model, str(target), save_as_external_data=large, location=target.name + ".data" if large else None)
    log.info("int8: %d of %d weight products quantised", len(products) - len(kept_float32), len(products))
    return {
        "int8": {
            "recipe": RECIPE,
            "weight_levels": weight_levels,
            "weight_rounding": "compensated" if compensated else "nearest",
            "compensated_products": len(codes),
            "max_node_error": MAX_NODE_ERROR,
            "products": len(products),
            "outlier_channels": {name: [int(c) for c in split] for name, split in sorted(splits.items())},
            "kept_float32": {
                k: round(skipped[k], 4) if k in skipped else "unsupported attention" for k in sorted(kept_float32)
            },
            "calibration_batches": len(batches),
            "calibration_tokens": sum(int(mask.sum()) for _, mask in batches),
        }
    }


class _Rewriter:
    """Builds the per-row int8 nodes and initializers that replace weight products."""

    def __init__(
        self,
        weights: dict[str, np.ndarray],
        weight_levels: int,
        splits: dict[str, np.ndarray] | None = None,
        codes: dict[str, Codes] | None = None,
    ) -> None:
        # lazy: onnx is an optional extra
        from onnx import helper, numpy_helper

        self.node, self.tensor = helper.make_node, numpy_helper.from_array
        self.weights, self.levels, self.splits, self.codes = weights, weight_levels, splits or {}, codes or {}
        self.initializers = [
            self.tensor(np.array(1.0, np.float32), "i8_one"),
            self.tensor(np.array(128, np.uint8), "i8_zero"),
            self.tensor(np.array(0, np.int8), "i8_wzero"),
            self.tensor(np.array(1 / 127, np.float32), "i8_step"),
            self.tensor(np.array(1e-12, np.float32), "i8_tiny"),
            self.tensor(np.array([0], np.int64), "i8_0"),
            self.tensor(np.array([-1], np.int64), "i8_last"),
            self.tensor(np.array([-1, 1], np.int64), "i8_column"),
        ]
        self.quantised: dict[str, str] = {}  # activation name -> prefix of its quantised rows
        self.shapes: set[tuple[str, int]] = set()

    def quantise_rows(self, x: str, width: int) -> list[Any]:
        """Nodes quantising each row of ``x`` (last dimension ``width``) once: ``<p>q`` uint8 rows of a 2-D view,
        ``<p>scale`` their scales as a column, ``<p>lead`` the leading dimensions of ``x``."""
        if x in self.quantised:
            return []
        p = self.quantised[x] = f"i8_{len(self.quantised)}_"
        node = self.node
        self.initializers.append(self.tensor(np.array([-1, width], np.int64), p + "view"))
        nodes, inliers = [], x
        split = self.splits.get(x)
        if split is not None:  # outlier channels: zeroed for the int8 rows, gathered for a float32 product
            keep = np.ones(width, np.float32)
            keep[split] = 0
            self.initializers += [self.tensor(keep, p + "keep"), self.tensor(split.astype(np.int64), p + "split")]
            inliers = p + "inliers"
            nodes += [
                node("Mul", [x, p + "keep"], [inliers]),
                node("Reshape", [x, p + "view"], [p + "raw2"]),
                node("Gather", [p + "raw2", p + "split"], [p + "outliers"], axis=1),
            ]
        return [
            *nodes,
            node("ReduceMax", [inliers], [p + "hi"], axes=[-1], keepdims=1),
            node("ReduceMin", [inliers], [p + "lo"], axes=[-1], keepdims=1),
            node("Neg", [p + "lo"], [p + "neg_lo"]),
            node("Max", [p + "hi", p + "neg_lo", "i8_tiny"], [p + "peak"]),
            node("Mul", [p + "peak", "i8_step"], [p + "rs"]),
            node("Reshape", [p + "rs", "i8_last"], [p + "flat_scale"]),
            node("Reshape", [p + "rs", "i8_column"], [p + "scale"]),
            node("Shape", [p + "flat_scale"], [p + "rows"]),
            node("ConstantOfShape", [p + "rows"], [p + "zeros"], value=self.tensor(np.array([128], np.uint8))),
            node("Shape", [x], [p + "shape"]),
            node("Slice", [p + "shape", "i8_0", "i8_last"], [p + "lead"]),
            node("Reshape", [inliers, p + "view"], [p + "x2"]),
            node("QuantizeLinear", [p + "x2", p + "flat_scale", p + "zeros"], [p + "q"], axis=0),
        ]

    def product(self, x: str, weight: np.ndarray, out: str, name: str, codes: Codes | None = None) -> list[Any]:
        """Nodes computing ``out = x @ weight`` from the quantised rows of ``x``, the weight rounded to ``codes``
        (else to the nearest level)."""
        nodes = self.quantise_rows(x, weight.shape[0])
        p, w = self.quantised[x], f"i8w_{name}"
        split = self.splits.get(x)
        if codes is None:
            codes = round_weights(inlier_weight(weight, split), self.levels)
        self.initializers += [self.tensor(codes[0], w + "_q"), self.tensor(codes[1], w + "_step")]
        shape = f"{p}out{weight.shape[1]}"
        if (p, weight.shape[1]) not in self.shapes:
            self.shapes.add((p, weight.shape[1]))
            self.initializers.append(self.tensor(np.array([weight.shape[1]], np.int64), shape + "_width"))
            nodes.append(self.node("Concat", [p + "lead", shape + "_width"], [shape], axis=0))
        return [
            *nodes,
            self.node(
                "MatMulIntegerToFloat",
                [p + "q", w + "_q", "i8_one", w + "_step", "i8_zero", "i8_wzero"],
                [w + "_int"],
                domain="com.microsoft",
            ),
            self.node("Mul", [w + "_int", p + "scale"], [w + "_rows"]),
            *self._outlier_product(p, w, weight, split),
            self.node("Reshape", [w + "_rows" if split is None else w + "_sum", shape], [out]),
        ]

    def _outlier_product(self, p: str, w: str, weight: np.ndarray, split: np.ndarray | None) -> list[Any]:
        """Nodes adding the outlier channels' float32 product to the int8 one (``<w>_sum``); none without."""
        if split is None:
            return []
        self.initializers.append(self.tensor(weight[split].astype(np.float32), w + "_outlier"))
        return [
            self.node("MatMul", [p + "outliers", w + "_outlier"], [w + "_float"]),
            self.node("Add", [w + "_rows", w + "_float"], [w + "_sum"]),
        ]

    def attention(self, node: Any) -> list[Any] | None:
        """A fused ``Attention`` node as three int8 products and ``MultiHeadAttention``, or None where the node
        uses more than input, packed weights, bias and a mask."""
        # lazy: onnx is an optional extra
        from onnx import helper

        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if len(node.input) > 4 or set(attributes) - {"num_heads", "mask_filter_value"}:
            return None
        x, w, b = node.input[:3]
        weight, hidden = self.weights[w], self.weights[w].shape[1] // 3
        codes = self.codes.get(node.name)
        nodes, parts = [], []
        for j, part in enumerate("qkv"):
            columns = slice(j * hidden, (j + 1) * hidden)
            parts.append(f"i8a_{node.name}_{part}")
            part_codes = None if codes is None else (codes[0][:, columns], codes[1][columns])
            nodes += self.product(x, weight[:, columns], parts[-1], f"{node.name}_{part}", part_codes)
        mask = node.input[3] if len(node.input) > 3 else ""
        attention = self.node(
            "MultiHeadAttention", [*parts, b, mask], list(node.output), domain="com.microsoft", **attributes
        )
        return [*nodes, attention]


def per_row_int8(
    model: Any,
    products: Sequence[Product],
    *,
    weight_levels: int = WEIGHT_LEVELS,
    splits: dict[str, np.ndarray] | None = None,
    codes: dict[str, Codes] | None = None,
) -> set[str]:
    """Replace ``products`` in ``model`` (in place) by per-row int8 products with weights quantised to
    ``weight_levels`` (or as ``codes`` has them rounded, node name -> codes) and the input channels of ``splits``
    (activation name -> channels) multiplied in float32; returns the names of those left in float32 because
    their form is not supported (attention with past state or rotary embeddings)."""
    # lazy: onnx is an optional extra
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    chosen = {p.node.name for p in products}
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name in {p.weight for p in products}}
    rewriter = _Rewriter(weights, weight_levels, splits, codes)
    nodes, replaced, unsupported = [], set(), set()
    for node in graph.node:
        new = None
        if node.name in chosen and node.op_type == "Attention":
            new = rewriter.attention(node)
            if new is None:
                unsupported.add(node.name)
        elif node.name in chosen:
            new = rewriter.product(
                node.input[0], weights[node.input[1]], node.output[0], node.name, (codes or {}).get(node.name)
            )
        if new is None:
            nodes.append(node)
        else:
            nodes += new
            replaced.add(node.input[1])
    still_used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name not in replaced or i.name in still_used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + rewriter.initializers)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return unsupported


_CPU = ["CPUExecutionProvider"]


def session_options(threads: int) -> Any:
    """ONNX Runtime session options: ``threads`` intra-op threads, no spinning (the cores are shared), every
    graph optimisation on."""
    # lazy: onnxruntime is an optional extra
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options
