"""Which int8 recipe loses least: one activation range per call vs one per token row, per product and end to end.

Runs ``--model``'s fused float32 ONNX graph (the one ``backend="onnx"`` uses) over ``--n`` real calibration texts
(the encode_throughput mix), records every weight product's input activations, and reports each product's
relative RMS output error under (a) one asymmetric activation range per call with 8-bit per-channel weights
(ONNX Runtime's dynamic quantisation, the int8 backend's recipe until stop 18: the baseline) and (b) one symmetric
range per token row with 7-bit per-channel weights (the int8 backend's recipe now,
:func:`lmembed.encoding.backends.int8.int8_error`). The ratio column is b / a.

With ``--graphs`` it then builds both as whole graphs: (a) with ``onnxruntime.quantization.quantize_dynamic``
(the products whose (a) error exceeds ``MAX_NODE_ERROR`` kept float32, as the backend did), (b) with the backend's
own :func:`~lmembed.encoding.backends.int8.quantize_graph`, and (b) again with 8-bit weights (without VNNI, ONNX
Runtime's uint8 x int8 kernel sums pairs of products in 16 bits, which full-range weights can saturate). Each
runs over the texts interleaved with the float32 graph (the baseline, best of ``--repeats``): speed relative to
float32, cosine of mean-pooled vectors to float32, and the largest change of a text's vector when the texts are
re-batched (reverse order, other batch sizes).

Results: ``bench/results/int8-products/<model>.json`` and ``.md``.

    python bench/int8_products.py --n 192
    python bench/int8_products.py --n 400 --graphs      # + the whole graphs (about 5 minutes)
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
from lmembed.errors import LmembedError

OUT = REPO / "bench" / "results" / "int8-products"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=192)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--graphs", action="store_true", help="also run both recipes as whole graphs")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for option in ("n", "max_length", "repeats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: must be at least 1, got {getattr(args, option)}")
    # lazy: onnx is an optional extra
    import onnx
    from onnx import numpy_helper

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
    _, samples = I8.activation_stats(model, batches, products, threads=2)
    weights = {i.name: i for i in model.graph.initializer}
    rows = []
    for product in products:
        w = numpy_helper.to_array(weights[product.weight])
        x = samples[product.activation]
        per_tensor, per_row = I8.int8_error(x, w, per_row=False), I8.int8_error(x, w)
        rows.append(
            {
                "node": product.node.name,
                "op": product.node.op_type,
                "per_tensor": per_tensor,
                "per_row": per_row,
                "ratio": per_row / per_tensor,
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
    }
    per_call_float32 = {r["node"] for r in rows if r["per_tensor"] > I8.MAX_NODE_ERROR}
    graphs = graph_section(source, batches, args.repeats, per_call_float32) if args.graphs else None
    OUT.mkdir(parents=True, exist_ok=True)
    name = args.model.replace("/", "_")
    result = {"summary": summary, "products": rows, **({"graphs": graphs} if graphs else {})}
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# int8 error per product: {args.model}, {args.n} texts",
        "",
        "| product | op | (a) per call | (b) per row | b / a |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['node']} | {r['op']} | {r['per_tensor']:.4f} | {r['per_row']:.4f} | {r['ratio']:.2f}x |" for r in rows
    ]
    lines += [
        "",
        f"Median ratio b / a: **{summary['median_ratio_per_row_vs_per_tensor']:.2f}x**; "
        f"worst product {summary['max_per_tensor']:.4f} (a) vs {summary['max_per_row']:.4f} (b).",
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


def graph_section(source: Path, batches: list, repeats: int, per_call_float32: set[str]) -> dict:
    """Recipes (a) and (b) as whole graphs against the float32 graph at ``source``: speed, cosine, re-batching."""
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
        """The same rows, in reverse order and cut into batches of other sizes (then put back in order)."""
        ids = [row for b_ids, _ in batches for row in b_ids]
        masks = [row for _, b_mask in batches for row in b_mask]
        order = list(range(len(ids)))[::-1]
        out, size = [], 0
        while order:
            size = size % 31 + 7
            chunk, order = order[:size], order[size:]
            width = max(int(masks[i].sum()) for i in chunk)  # right padding (minilm), with pad id 0 here

            def fit(row: np.ndarray, width: int = width) -> np.ndarray:
                return np.pad(row[:width], (0, max(0, width - len(row))))

            out.append((chunk, np.stack([fit(ids[i]) for i in chunk]), np.stack([fit(masks[i]) for i in chunk])))
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
        I8.quantize_graph(source, per_row, batches[::3], threads=2)
        full_weights = Path(tmp) / "per_row_8bit.onnx"  # what the 7-bit choice is measured against
        I8.quantize_graph(source, full_weights, batches[::3], threads=2, weight_levels=127)
        graphs = [
            ("float32", source),
            ("(a) int8 per call", per_call),
            ("(b) int8 per row", per_row),
            ("(b) with 8-bit weights", full_weights),
        ]
        sessions = {
            name: ort.InferenceSession(str(path), I8.session_options(2), providers=["CPUExecutionProvider"])
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
