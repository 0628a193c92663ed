"""What int8 learns from the calibration texts: the activations each weight product reads, which input
channels are outliers, which of them to multiply in float32, and weights rounded for those activations.

:func:`activation_stats` runs the float32 graph over the calibration batches (thinned to
:data:`CALIBRATION_MAX_TOKENS` real tokens by :func:`within_budget`, so the mix of text lengths is kept) and
records, for every product input, each channel's ``max|x|`` and a sample of token rows.

A few input channels of a decoder (its "massive activations") reach tens of times the others' magnitude; in
a per-row range they leave the other channels a few levels each. :func:`outlier_channels` names the channels
above :data:`OUTLIER_RATIO` times the median channel's, fixed at calibration so that a row's quantisation never
depends on the other rows (LLM.int8()'s decomposition, found once rather than per call), and
:func:`choose_splits` takes them out of the int8 product only where that lowers the worst error of the
products reading the input. :func:`compensate` then rounds each input's weights against its recorded rows
(:func:`~lmembed.encoding.backends.int8.rounding.compensated_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from lmembed.encoding.backends.int8.rewrite import Product
from lmembed.encoding.backends.int8.rounding import WEIGHT_LEVELS, Codes, compensated_weights, inlier_weight, int8_error
from lmembed.encoding.backends.runtime import CPU_PROVIDERS, session_options

#: Calibration rows kept per product for the error measurement.
ERROR_SAMPLE_ROWS = 2048
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
#: (``bench/main_job_time.py`` times the int8 preparation: bench/results/main-job-time/).
CALIBRATION_MAX_TOKENS = 16384


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
    session = ort.InferenceSession(probe.SerializeToString(), session_options(threads), providers=CPU_PROVIDERS)
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
