"""The int8 recipe end to end: :func:`quantize_graph` turns a fused float32 graph into its int8 graph.

It records the calibration activations, chooses each input's outlier channels, rounds the weights with
compensation, measures every product's int8 error on the recorded rows with the rounded weights (the
arithmetic the graph will run, :func:`~lmembed.encoding.backends.int8.rounding.int8_error`), keeps float32 the
products whose error exceeds :data:`MAX_NODE_ERROR`, and rewrites the rest. What it did goes into the export's
manifest; :data:`RECIPE` goes into the export's key, so a graph built by another recipe is never loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.encoding.backends.int8.calibration import activation_stats, choose_splits, compensate, within_budget
from lmembed.encoding.backends.int8.rewrite import per_row_int8, product_weights, weight_products
from lmembed.encoding.backends.int8.rounding import WEIGHT_LEVELS, Codes, int8_error
from lmembed.errors import ConfigError

log = logging.getLogger(__name__)

#: A product whose int8 output error (relative RMS on calibration activations) exceeds this stays float32.
MAX_NODE_ERROR = 0.06
#: Recorded in the int8 export's key: a graph built by another recipe is never loaded for this one.
RECIPE = "per-row activations with outlier channels in float32, 7-bit per-column weights rounded with compensation"


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
    (:func:`~lmembed.encoding.backends.int8.rounding.compensated_weights`) and which products stay float32;
    returns what was done (for the export's manifest). ``weight_levels`` other than :data:`WEIGHT_LEVELS`,
    ``split_outliers=False`` and ``compensated=False`` (weights rounded to the nearest level) are for measuring
    the choices (``bench/int8_products.py``)."""
    if not 1 <= weight_levels <= 127:
        raise ConfigError(f"weight_levels: must be 1 to 127 (int8 weights), got {weight_levels}")
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
