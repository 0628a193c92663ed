"""int8 graphs: per-channel int8 weights, activations quantised per call, lossy products left in float32.

Chosen from measurements on ``minilm`` (cosine of mean-pooled vectors to the float32 graph over 250 real
texts, speed relative to the fused float32 graph, one run each, this 2-core AVX2 CPU; the commands are in
``bench/profile_encode.py``'s docstring):

* static int8 (QDQ, activation ranges fixed at calibration, per-tensor): mean cosine 0.926, min 0.830, and no
  faster (0.8-1.0x): ONNX Runtime cannot fuse attention around quantise/dequantise pairs;
* dynamic int8 on the fused graph, per-tensor weights: 1.5x, mean 0.947, min 0.800;
* the same with per-channel weights: 1.5-1.9x, mean 0.993, min 0.975;
* per-channel, FFN output products kept float32: 1.26x, mean 0.996, min 0.986;
* SmoothQuant-style smoothing (activations divided per channel by ``max|X|^a / max|W|^(1-a)``, weights
  multiplied) before dynamic int8 made it worse here (a = 0.5: mean 0.969; a = 0.75: mean 0.989), so it is
  not used.

So the graph is the fused float32 one with dynamic int8 products (``MatMulInteger``/``QAttention``:
per-output-channel int8 weights, activations quantised per call over the batch) except those whose int8
error, measured on activations recorded while running the user's calibration texts, exceeds
:data:`MAX_NODE_ERROR` (:func:`sensitive_nodes`). Because activations are quantised per call, an int8 vector
depends slightly on which texts share its batch (within the quality gate, never bit for bit). The quality gate
(:mod:`lmembed.encoding.backends.quality`) checks the result on calibration texts held out from the measurement.
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

#: A product whose int8 output error (relative RMS on calibration activations) exceeds this stays float32.
MAX_NODE_ERROR = 0.06
#: Calibration rows kept per product for the error measurement.
ERROR_SAMPLE_ROWS = 2048
#: Padded tokens per calibration run: every product's input is recorded at once, so this bounds the memory used
#: (a 30-layer decoder records ~100k floats per token).
CALIBRATION_TOKENS = 1024


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
    for ids, mask in _small(batches):
        outputs = session.run(names, {"input_ids": ids, "attention_mask": mask})
        real = mask.reshape(-1).astype(bool)
        for name, value in zip(names, outputs, strict=True):
            rows = value.reshape(-1, value.shape[-1])[real]
            peak = np.abs(rows).max(axis=0)
            absmax[name] = peak if name not in absmax else np.maximum(absmax[name], peak)
            take = rng.choice(len(rows), size=min(len(rows), ERROR_SAMPLE_ROWS // 16), replace=False)
            samples[name].append(rows[take])
        del outputs
    return absmax, {n: np.concatenate(s)[:ERROR_SAMPLE_ROWS] for n, s in samples.items()}


def _small(batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """``batches`` cut into runs of at most :data:`CALIBRATION_TOKENS` padded tokens (one row at least)."""
    for ids, mask in batches:
        rows = max(1, CALIBRATION_TOKENS // max(1, ids.shape[1]))
        for start in range(0, len(ids), rows):
            yield ids[start : start + rows], mask[start : start + rows]


def int8_error(x: np.ndarray, weight: np.ndarray, *, per_row: bool = False) -> float:
    """Relative RMS error of ``x @ weight`` computed the way the int8 graph does (per-tensor asymmetric uint8
    activations, per-output-channel symmetric int8 weights); ``per_row`` gives each activation row (token) its
    own range instead, the candidate recipe measured by ``bench/int8_products.py``."""
    axis = 1 if per_row else None
    lo = np.minimum(x.min(axis=axis, keepdims=True), 0.0)
    hi = np.maximum(x.max(axis=axis, keepdims=True), 0.0)
    step = (hi - lo) / 255
    step[step == 0] = 1.0
    zero = np.round(-lo / step)
    xq = (np.clip(np.round(x / step) + zero, 0, 255) - zero) * step
    wstep = np.maximum(np.abs(weight).max(axis=0), 1e-12) / 127
    wq = np.clip(np.round(weight / wstep), -127, 127) * wstep
    exact = x @ weight
    return float(np.linalg.norm(xq @ wq - exact) / max(np.linalg.norm(exact), 1e-12))


def sensitive_nodes(
    products: Sequence[Product], model: Any, samples: dict[str, np.ndarray], max_error: float = MAX_NODE_ERROR
) -> dict[str, float]:
    """Every product's int8 error on calibration activations (node name -> relative RMS error) and, as the
    second result, those above ``max_error``, which stay float32."""
    # lazy: onnx is an optional extra
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    errors = {}
    for product in products:
        weight = numpy_helper.to_array(initializers[product.weight])
        errors[product.node.name] = int8_error(samples[product.activation], weight)
    return {name: err for name, err in errors.items() if err > max_error}


def quantize_graph(
    source: Path, target: Path, batches: Sequence[tuple[np.ndarray, np.ndarray]], *, threads: int
) -> dict[str, Any]:
    """Quantise the fused float32 graph at ``source`` into ``target``, measuring on ``batches`` (calibration
    token ids and masks) which products stay float32; returns what was done (for the export's manifest)."""
    # lazy: onnx and onnxruntime are optional extras
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source))
    products = weight_products(model)
    _, samples = activation_stats(model, batches, products, threads)
    skipped = sensitive_nodes(products, model, samples)
    root = logging.getLogger()
    previous = root.disabled
    root.disabled = True  # the quantiser logs "consider pre-processing" warnings on the root logger
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(
                str(source),
                str(target),
                per_channel=True,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Attention"],
                nodes_to_exclude=sorted(skipped),
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
            )
    finally:
        root.disabled = previous
    log.info("int8: %d of %d weight products quantised", len(products) - len(skipped), len(products))
    return {
        "int8": {
            "recipe": "dynamic int8, per-channel weights, lossy products kept float32",
            "max_node_error": MAX_NODE_ERROR,
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
