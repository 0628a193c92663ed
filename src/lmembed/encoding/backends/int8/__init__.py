"""int8 graphs for the ONNX backend: the fused float32 graph with its weight products run in int8, calibrated on
the user's own texts and checked against float32.

The recipe, and why each part of it:

* **per-row activations.** Every token row of a product's input is quantised on its own range, so a text's int8
  vector does not depend on which texts share its batch (one range per call, ONNX Runtime's dynamic
  quantisation, let a long neighbour coarsen a short text's rows);
* **outlier channels in float32.** A few input channels of a decoder reach tens of times the others' magnitude
  and would leave the rest of each row a few levels; those found at calibration are multiplied in float32;
* **7-bit per-column weights, rounded with compensation.** 7 bits keep ONNX Runtime's 16-bit pair sums from
  saturating on CPUs without VNNI; compensated rounding (GPTQ) cancels the part of the weights' rounding error
  that mean pooling would otherwise keep;
* **lossy products stay float32.** Each product's error is measured on calibration activations with the
  arithmetic the graph will run; above :data:`MAX_NODE_ERROR` it is not quantised. The quality gate
  (:mod:`lmembed.encoding.backends.quality`) then checks whole vectors on calibration texts held out from this.

One concern per module: :mod:`.rounding` (the rounding and error arithmetic, NumPy only), :mod:`.calibration`
(what is recorded from the calibration texts and chosen from it), :mod:`.rewrite` (the ONNX nodes), and
:mod:`.recipe` (:func:`quantize_graph`, which runs them in order). The measurements behind the choices, with the
commands that made them, are in ``bench/results/int8-products/README.md``.
"""

from __future__ import annotations

from lmembed.encoding.backends.int8.calibration import (
    CALIBRATION_MAX_TOKENS,
    CALIBRATION_TOKENS,
    ERROR_SAMPLE_ROWS,
    MAX_OUTLIER_CHANNELS,
    OUTLIER_RATIO,
    activation_stats,
    by_input,
    choose_splits,
    compensate,
    outlier_channels,
    within_budget,
)
from lmembed.encoding.backends.int8.recipe import MAX_NODE_ERROR, RECIPE, quantize_graph
from lmembed.encoding.backends.int8.rewrite import Product, per_row_int8, product_weights, weight_products
from lmembed.encoding.backends.int8.rounding import (
    COMPENSATION_BLOCK,
    COMPENSATION_DAMPING,
    WEIGHT_LEVELS,
    Codes,
    column_steps,
    compensated_weights,
    inlier_weight,
    int8_error,
    int8_product,
    round_weights,
)

__all__ = [
    "CALIBRATION_MAX_TOKENS",
    "CALIBRATION_TOKENS",
    "COMPENSATION_BLOCK",
    "COMPENSATION_DAMPING",
    "ERROR_SAMPLE_ROWS",
    "MAX_NODE_ERROR",
    "MAX_OUTLIER_CHANNELS",
    "OUTLIER_RATIO",
    "RECIPE",
    "WEIGHT_LEVELS",
    "Codes",
    "Product",
    "activation_stats",
    "by_input",
    "choose_splits",
    "column_steps",
    "compensate",
    "compensated_weights",
    "inlier_weight",
    "int8_error",
    "int8_product",
    "outlier_channels",
    "per_row_int8",
    "product_weights",
    "quantize_graph",
    "round_weights",
    "weight_products",
    "within_budget",
]
