"""int8 graphs: per-channel int8 weights, activations smoothed with ranges calibrated on the user's texts.

Why this recipe (measured with ``bench/profile_encode.py --int8-variants`` on ``minilm``, cosine to float32 over
250 real texts): static int8 (QDQ, ranges fixed at calibration, per-tensor activations) lost the most (mean
cosine 0.93, min 0.82) and was not faster here, because ONNX Runtime cannot fuse attention around
quantise/dequantise pairs; dynamic int8 on the fused graph ran 1.5x the float32 graph but a few hidden
channels with outlier values (BERT's LayerNorm outputs, GELU outputs) set every token's quantisation step
(mean 0.993, min 0.975 with per-channel weights). So the quantised graph is the fused float32 one with:

1. **smoothing** (SmoothQuant, Xiao et al. 2023): for each quantised product ``X @ W`` the calibration texts
   give each input channel's largest magnitude ``max|X_k|``; with ``s_k = max|X_k|^a / max|W_k|^(1-a)``
   the graph computes ``(X / s) @ (s W)``, the same product with the outlier channels shrunk and the
   weights, which quantise per output channel, absorbing them. ``X / s`` is one multiplication inserted
   in front of the product only (the residual stream keeps ``X``);
2. **dynamic int8** products (``MatMulInteger``/``QAttention`` in ONNX Runtime: per-channel int8 weights,
   activations quantised per call) for every weight product except those the calibration measurement finds
   too lossy (:func:`sensitive_nodes`).

The calibration texts are the caller's own (the first texts an int8 Embedder encodes, or those passed to
``Embedder.calibrate``); the quality gate (:mod:`lmembed.encoding.backends.quality`) checks the result on
texts held out from them.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: SmoothQuant's migration strength: 0 leaves activations as they are, 1 moves all their range to the weights.
SMOOTH_ALPHA = 0.5
#: A product whose smoothed int8 output error (relative RMS, on calibration activations) exceeds this stays float32.
MAX_NODE_ERROR = 0.05
#: Calibration rows kept per product for the error measurement.
ERROR_SAMPLE_ROWS = 2048


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


def activation_stats(
    model: Any, batches: Iterable[tuple[np.ndarray, np.ndarray]], products: Sequence[Product], threads: int
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
    for ids, mask in batches:
        outputs = session.run(names, {"input_ids": ids, "attention_mask": mask})
        real = mask.reshape(-1).astype(bool)
        for name, value in zip(names, outputs, strict=True):
            rows = value.reshape(-1, value.shape[-1])[real]
            peak = np.abs(rows).max(axis=0)
            absmax[name] = peak if name not in absmax else np.maximum(absmax[name], peak)
            take = rng.choice(len(rows), size=min(len(rows), ERROR_SAMPLE_ROWS // 4), replace=False)
            samples[name].append(rows[take])
    return absmax, {n: np.concatenate(s)[:ERROR_SAMPLE_ROWS] for n, s in samples.items()}


def smoothing_scales(act_absmax: np.ndarray, weight: np.ndarray, alpha: float = SMOOTH_ALPHA) -> np.ndarray:
    """SmoothQuant's per-input-channel scales ``s`` (``weight`` is ``[in, out]``)."""
    w_absmax = np.abs(weight).max(axis=1)
    scales = np.power(np.maximum(act_absmax, 1e-5), alpha) / np.power(np.maximum(w_absmax, 1e-5), 1 - alpha)
    return np.clip(scales, 1e-2, 1e3).astype(np.float32)


def int8_error(x: np.ndarray, weight: np.ndarray) -> float:
    """Relative RMS error of ``x @ weight`` computed the way the int8 graph does (per-tensor asymmetric uint8
    activations, per-output-channel symmetric int8 weights)."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    step = (hi - lo) / 255 or 1.0
    zero = np.round(-lo / step)
    xq = (np.clip(np.round(x / step) + zero, 0, 255) - zero) * step
    wstep = np.maximum(np.abs(weight).max(axis=0), 1e-12) / 127
    wq = np.clip(np.round(weight / wstep), -127, 127) * wstep
    exact = x @ weight
    return float(np.linalg.norm(xq @ wq - exact) / max(np.linalg.norm(exact), 1e-12))


def smooth(
    model: Any, products: Sequence[Product], absmax: dict[str, np.ndarray], alpha: float = SMOOTH_ALPHA
) -> dict[str, np.ndarray]:
    """Apply smoothing in place: weights' input rows times ``s``, a ``Mul`` by ``1/s`` in front of each product.
    Returns the scales per node name."""
    # lazy: onnx is an optional extra
    import onnx
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    scales_by_node = {}
    for i, product in enumerate(products):
        init = initializers[product.weight]
        weight = numpy_helper.to_array(init)
        scales = smoothing_scales(absmax[product.activation], weight, alpha)
        init.CopyFrom(numpy_helper.from_array((weight * scales[:, None]).astype(np.float32), product.weight))
        inverse = f"lmembed_smooth_{i}_inv"
        smoothed = f"lmembed_smooth_{i}_out"
        model.graph.initializer.append(numpy_helper.from_array((1.0 / scales).astype(np.float32), inverse))
        mul = onnx.helper.make_node("Mul", [product.activation, inverse], [smoothed], name=f"lmembed_smooth_{i}")
        position = list(model.graph.node).index(product.node)
        model.graph.node.insert(position, mul)
        product.node.input[0] = smoothed
        scales_by_node[product.node.name] = scales
    return scales_by_node


def sensitive_nodes(
    products: Sequence[Product],
    model: Any,
    samples: dict[str, np.ndarray],
    scales: dict[str, np.ndarray],
    max_error: float = MAX_NODE_ERROR,
) -> dict[str, float]:
    """The products whose smoothed int8 error on calibration activations exceeds ``max_error``
    (node name -> error); they stay float32."""
    # lazy: onnx is an optional extra
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    errors = {}
    for product in products:
        weight = numpy_helper.to_array(initializers[product.weight])  # already multiplied by s
        x = samples[product.activation] / scales[product.node.name]
        errors[product.node.name] = int8_error(x, weight)
    return {name: err for name, err in errors.items() if err > max_error}


def quantize_graph(
    source: Path, target: Path, batches: Sequence[tuple[np.ndarray, np.ndarray]], *, threads: int
) -> dict[str, Any]:
    """Smooth and quantise the float32 graph at ``source`` into ``target``; returns what was done (for the
    export's manifest)."""
    # lazy: onnx and onnxruntime are optional extras
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    products = weight_products(model)
    absmax, samples = activation_stats(model, batches, products, threads)
    scales = smooth(model, products, absmax)
    skipped = sensitive_nodes(products, model, samples, scales)
    smoothed = target.with_name("smoothed.onnx")
    onnx.save_model(model, str(smoothed))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger().disabled = True  # the quantiser logs "consider pre-processing" on the root logger
            try:
                quantize_dynamic(
                    str(smoothed),
                    str(target),
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=["MatMul", "Attention"],
                    nodes_to_exclude=sorted(skipped),
                    extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
                )
            finally:
                logging.getLogger().disabled = False
    finally:
        smoothed.unlink(missing_ok=True)
    log.info("int8: %d of %d weight products quantised", len(products) - len(skipped), len(products))
    return {
        "int8": {
            "recipe": "smoothquant+dynamic-per-channel",
            "smooth_alpha": SMOOTH_ALPHA,
            "products": len(products),
            "kept_float32": {k: round(v, 4) for k, v in sorted(skipped.items())},
            "calibration_batches": len(batches),
        }
    }


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
