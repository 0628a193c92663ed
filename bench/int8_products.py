"""Which int8 recipe loses least: one activation range per call, one per token row, one per token row with
outlier channels in float32, and that with compensated weight rounding; per product and end to end.

Runs ``--model``'s fused float32 ONNX graph (the one ``backend="onnx"`` uses) over ``--n`` real calibration texts
(the encode_throughput mix), records every weight product's input activations, and reports each product's
relative RMS output error under (a) one asymmetric activation range per call with 8-bit per-channel weights
(ONNX Runtime's dynamic quantisation, the int8 backend's recipe until stop 18: the baseline), (b) one symmetric
range per token row with 7-bit per-channel weights (stops 18-19), and (c) the same with each input's outlier
channels (calibration max|x| over 6x the median channel's) multiplied in float32 and left out of the rows'
ranges (stops 20-21), all with weights rounded to the nearest level, and (d) the same with weights rounded with
compensation for the calibration activations (:func:`lmembed.encoding.backends.int8.compensated_weights`: the
int8 backend's recipe now). All are modelled by :func:`lmembed.encoding.backends.int8.int8_error`. Besides each
product's error token by token it reports the error of the products' mean over tokens (what mean pooling keeps)
for (c) and (d), the weights of (d) fitted on the first half of the recorded rows and both measured on the
second half (other texts: the rows come in length-sorted batches).

With ``--graphs`` it then builds them as whole graphs: (a) with ``onnxruntime.quantization.quantize_dynamic``
(the products whose (a) error exceeds ``MAX_NODE_ERROR`` kept float32, as the backend did), (b) and (c) with
the backend's own :func:`~lmembed.encoding.backends.int8.quantize_graph`, (d) likewise, and with ``--eight-bit``
(d) again with 8-bit weights (without VNNI, ONNX Runtime's uint8 x int8 kernel sums pairs of products in 16 bits,
which full-range weights can saturate). Each runs over the texts interleaved with the float32 graph (the baseline, best
of ``--repeats``): speed relative to float32, cosine of mean-pooled vectors to float32, and the largest change of
a text's vector when the texts are re-batched (reverse order, other batch sizes).

Results: ``bench/results/int8-products/<model>.json`` and ``.md``.

    python bench/int8_products.py --n 192
    python bench/int8_products.py --n 400 --graphs      # + the whole graphs (about 5 minutes)
    python bench/int8_products.py --model smollm2-135m --n 128 --max-length 128 --graphs --repeats 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from _common import REPO
from encode_throughput import _features, interleave, load_texts, timed
from lmembed import Embedder
from lmembed.encoding.backends import int8 as I8
from lmembed.encoding.backends.runtime import session_options
from lmembed.errors import LmembedError

OUT = REPO / "bench" / "results" / "int8-products"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=192)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--graphs", action="store_true", help="also run both recipes as whole graphs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eight-bit", action="store_true", help="with --graphs: also the recipe with 8-bit weights")
    args = parser.parse_args()
    for option in ("n", "max_length", "repeats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: must be at least 1, got {getattr(args, option)}")
    # lazy: onnx is an optional extra
    import onnx

    from lmembed.encoding.backends.store import GRAPH_FILE
    from lmembed.encoding.engine import collate, plan_batches

    texts = load_texts(args.n)
    try:
        embedder = Embedder.from_pretrained(args.model, cache=False, show_progress=False, backend="onnx")
    except LmembedError as err:
        parser.error(f"--model: {err}")
    engine = embedder.engine
    source = engine.prepare_backend([embedder.config]) / GRAPH_FILE
    model = onnx.load(str(source))
    # the engine's own reading of the texts (instructions, special tokens, padding side), length-sorted batches of 32
    features = _features(embedder, texts, args.max_length)
    batches = [
        tuple(t.numpy() for t in collate([features[j] for j in chunk], engine.pad_id, engine.padding_side, "cpu")[:2])
        for chunk in plan_batches([len(f) for f in features], 32)
    ]
    products = I8.weight_products(model)
    # twice the backend's sample: each half (fit, check) has as many rows as the backend fits on
    absmax, samples = I8.activation_stats(model, batches, products, threads=2, sample_rows=2 * I8.ERROR_SAMPLE_ROWS)
    weights = I8.product_weights(model, products)
    splits, _ = I8.choose_splits(products, weights, absmax, samples)
    half = {name: len(x) // 2 for name, x in samples.items()}
    fitted = I8.compensate(products, weights, {n: x[: half[n]] for n, x in samples.items()}, splits)
    missing = sorted({p.node.name for p in products} - set(fitted))
    if missing:
        parser.error(f"too few calibration tokens to fit compensated rounding for {missing[0]}: raise --n")
    rows = []
    for product in products:
        w, x = weights[product.weight], samples[product.activation]
        per_tensor, per_row = I8.int8_error(x, w, per_row=False), I8.int8_error(x, w)
        split = splits.get(product.activation)
        held_out = x[half[product.activation] :]
        nearest = I8.round_weights(I8.inlier_weight(w, split))
        rows.append(
            {
                "node": product.node.name,
                "op": product.node.op_type,
                "per_tensor": per_tensor,
                "per_row": per_row,
                "ratio": per_row / per_tensor,
                "outlier_channels": 0 if split is None else len(split),
                "per_row_outliers": I8.int8_error(x, w, split=split),
                "pooled_nearest": pooled_error(held_out, w, split, nearest),
                "pooled_compensated": pooled_error(held_out, w, split, fitted[product.node.name]),
            }
        )
    ratios = np.array([r["ratio"] for r in rows])
    summary = {
        "model": args.model,
        "texts": args.n,
        "products": len(rows),
        "median_ratio_per_row_vs_per_tensor": float(np.median(ratios)),
        "max_per_tensor": max(r["per_tensor"] for r in rows),
        "max_per_row": max(r["per_row"] for r in rows),
        "max_per_row_outliers": max(r["per_row_outliers"] for r in rows),
        "over_max_node_error": {
            recipe: sum(r[recipe] > I8.MAX_NODE_ERROR for r in rows)
            for recipe in ("per_tensor", "per_row", "per_row_outliers")
        },
        "inputs_with_outlier_channels": len(splits),
        "median_pooled_error_nearest": float(np.median([r["pooled_nearest"] for r in rows])),
        "median_pooled_error_compensated": float(np.median([r["pooled_compensated"] for r in rows])),
    }
    per_call_float32 = {r["node"] for r in rows if r["per_tensor"] > I8.MAX_NODE_ERROR}
    padding = (engine.padding_side, engine.pad_id)
    graphs = (
        graph_section(source, batches, args.repeats, per_call_float32, args.eight_bit, padding) if args.graphs else None
    )
    OUT.mkdir(parents=True, exist_ok=True)
    name = args.model.replace("/", "_")
    result = {"summary": summary, "products": rows, **({"graphs": graphs} if graphs else {})}
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# int8 error per product: {args.model}, {args.n} texts",
        "",
        "| product | op | (a) per call | (b) per row | b / a | (c) per row, outlier channels float32 | channels "
        "| mean over tokens: (c) | (d) compensated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['node']} | {r['op']} | {r['per_tensor']:.4f} | {r['per_row']:.4f} | {r['ratio']:.2f}x "
        f"| {r['per_row_outliers']:.4f} | {r['outlier_channels']} | {r['pooled_nearest']:.4f} "
        f"| {r['pooled_compensated']:.4f} |"
        for r in rows
    ]
    over = summary["over_max_node_error"]
    lines += [
        "",
        f"Median ratio b / a: **{summary['median_ratio_per_row_vs_per_tensor']:.2f}x**; "
        f"worst product {summary['max_per_tensor']:.4f} (a) vs {summary['max_per_row']:.4f} (b) vs "
        f"{summary['max_per_row_outliers']:.4f} (c). Products above MAX_NODE_ERROR ({I8.MAX_NODE_ERROR}), which "
        f"stay float32: (a) {over['per_tensor']}, (b) {over['per_row']}, (c) {over['per_row_outliers']}; "
        f"inputs with outlier channels: {summary['inputs_with_outlier_channels']}. Error of the mean over held-out "
        f"tokens, median over products: {summary['median_pooled_error_nearest']:.4f} with weights rounded to the "
        f"nearest level (c), {summary['median_pooled_error_compensated']:.4f} with compensated rounding (d).",
    ]
    if graphs:
        lines += [
            "",
            f"## Whole graphs, {args.n} texts, best of {args.repeats} interleaved runs (baseline: the float32 graph)",
            "",
            "| graph | speed vs float32 | mean cosine | min cosine | max change when re-batched |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {g} | {r['speed_vs_float32']:.2f}x | {r['mean_cos']:.5f} | {r['min_cos']:.5f} "
            f"| {r['rebatch_max_abs']:.2e} |"
            for g, r in graphs.items()
        ]
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def pooled_error(x: np.ndarray, weight: np.ndarray, split: np.ndarray | None, codes: I8.Codes) -> float:
    """Relative error of the mean over ``x``'s rows of the int8 product (rows rounded per row, the outlier channels
    ``split`` in float32, weights as ``codes``): the part of the error that mean pooling does not average away."""
    exact = (x @ weight).mean(axis=0)
    approx = I8.int8_product(x, weight, codes, split).mean(axis=0)
    return float(np.linalg.norm(approx - exact) / max(np.linalg.norm(exact), 1e-12))


def graph_section(
    source: Path,
    batches: list,
    repeats: int,
    per_call_float32: set[str],
    eight_bit: bool,
    padding: tuple[str, int],
) -> dict:
    """The recipes as whole graphs against the float32 graph at ``source``: speed, cosine, re-batching
    (``padding``: the engine's padding side and pad id)."""
    padding_side, pad_id = padding
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def pooled(session: Any, batch_list: list) -> np.ndarray:
        out = []
        for ids, mask in batch_list:
            states = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            weight = mask[..., None].astype(np.float32)
            vectors = (states * weight).sum(1) / weight.sum(1)
            out.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
        return np.concatenate(out)

    def rebatched() -> list:
        """The same rows, in reverse order and cut into batches of other sizes (then put back in order), padded
        again to each new batch's longest text on the engine's side with its pad id."""
        real = [ids[mask.astype(bool)] for b_ids, b_mask in batches for ids, mask in zip(b_ids, b_mask, strict=True)]
        order = list(range(len(real)))[::-1]
        out, size = [], 0
        while order:
            size = size % 31 + 7
            chunk, order = order[:size], order[size:]
            width = max(len(real[i]) for i in chunk)

            def fit(row: np.ndarray, value: int, width: int = width) -> np.ndarray:
                pad = (width - len(row), 0) if padding_side == "left" else (0, width - len(row))
                return np.pad(row, pad, constant_values=value)

            ids = np.stack([fit(real[i], pad_id) for i in chunk])
            mask = np.stack([fit(np.ones(len(real[i]), dtype=real[i].dtype), 0) for i in chunk])
            out.append((chunk, ids, mask))
        return out

    with tempfile.TemporaryDirectory() as tmp:
        per_call, per_row = Path(tmp) / "per_call.onnx", Path(tmp) / "per_row.onnx"
        quantize_dynamic(
            str(source),
            str(per_call),
            per_channel=True,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Attention"],
            nodes_to_exclude=sorted(per_call_float32),
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        I8.quantize_graph(source, per_row, batches[::3], threads=2, split_outliers=False, compensated=False)
        outliers = Path(tmp) / "per_row_outliers.onnx"
        I8.quantize_graph(source, outliers, batches[::3], threads=2, compensated=False)
        compensated = Path(tmp) / "compensated.onnx"  # the backend's recipe
        I8.quantize_graph(source, compensated, batches[::3], threads=2)
        graphs = [
            ("float32", source),
            ("(a) int8 per call", per_call),
            ("(b) int8 per row", per_row),
            ("(c) per row, outlier channels float32", outliers),
            ("(d) (c) with compensated weight rounding", compensated),
        ]
        if eight_bit:
            full_weights = Path(tmp) / "per_row_8bit.onnx"  # what the 7-bit choice is measured against
            I8.quantize_graph(source, full_weights, batches[::3], threads=2, weight_levels=127)
            graphs.append(("(d) with 8-bit weights", full_weights))
        sessions = {
            name: ort.InferenceSession(str(path), session_options(2), providers=["CPUExecutionProvider"])
            for name, path in graphs
        }
        reshuffled = rebatched()
        seconds, vectors = interleave(
            {name: (lambda s=s: timed(lambda: pooled(s, batches))) for name, s in sessions.items()}, repeats
        )
        result = {}
        for name, session in sessions.items():
            again = np.empty_like(vectors[name])
            for rows, ids, mask in reshuffled:
                again[rows] = pooled(session, [(ids, mask)])
            cos = (vectors[name] * vectors["float32"]).sum(1)
            result[name] = {
                "seconds": min(seconds[name]),
                "speed_vs_float32": min(seconds["float32"]) / min(seconds[name]),
                "mean_cos": float(cos.mean()),
                "min_cos": float(cos.min()),
                "rebatch_max_abs": float(np.abs(again - vectors[name]).max()),
            }
    return result


if __name__ == "__main__":
    main()
