"""The ONNX side of int8: finding a graph's weight products and replacing them by per-row int8 nodes.

:func:`weight_products` lists the products the recipe can quantise: ``MatMul`` nodes with a constant 2-D
weight, and the fused ``Attention`` nodes of an encoder. :func:`per_row_int8` rewrites the chosen ones in
place. Each becomes: its input's rows scaled by their own ``max|x| / 127`` and quantised to uint8 at zero point
128 (``QuantizeLinear`` with a per-row scale), an integer product with the int8 weight codes and per-column
steps (``MatMulIntegerToFloat``), and the result multiplied back by the row scale. An input read by several
products (the three attention projections, a decoder's gate/up projections) is quantised once. An input with
outlier channels has them zeroed before its rows' ranges are taken and multiplied in float32 beside the int8
product. A fused ``Attention`` becomes three such products feeding ``MultiHeadAttention``.

Because every row is quantised on its own, a text's int8 vector does not depend on which texts share its batch
beyond what float32 rounding already does. The nodes compute exactly what
:func:`lmembed.encoding.backends.int8.rounding.int8_product` models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmembed.encoding.backends.int8.rounding import WEIGHT_LEVELS, Codes, inlier_weight, round_weights


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
