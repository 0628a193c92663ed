"""Which int8 recipe loses least, product by product: per-tensor vs per-row (per-token) activation ranges.

Runs ``--model``'s fused float32 ONNX graph (the one ``backend="onnx"`` uses) over ``--n`` real calibration texts
(the encode_throughput mix), records every weight product's input activations, and reports each product's
relative RMS output error with per-channel int8 weights and (a) one activation range per call, the recipe the
int8 backend runs today, or (b) one range per token row. The baseline is (a): the ratio column is b / a.

Results: ``bench/results/int8-products/<model>.json`` and ``.md``.

    python bench/int8_products.py --n 192
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from _common import REPO
from encode_throughput import _features, load_texts
from lmembed import Embedder
from lmembed.encoding.backends import int8 as I8
from lmembed.errors import LmembedError

OUT = REPO / "bench" / "results" / "int8-products"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=192)
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    for option in ("n", "max_length"):
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
    model = onnx.load(str(engine.prepare_backend([embedder.config]) / GRAPH_FILE))
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
        per_tensor, per_row = I8.int8_error(x, w), I8.int8_error(x, w, per_row=True)
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
    OUT.mkdir(parents=True, exist_ok=True)
    name = args.model.replace("/", "_")
    (OUT / f"{name}.json").write_text(json.dumps({"summary": summary, "products": rows}, indent=2))
    lines = [
        f"# int8 error per product: {args.model}, {args.n} texts",
        "",
        "| product | op | per-tensor (today) | per-row | per-row / per-tensor |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['node']} | {r['op']} | {r['per_tensor']:.4f} | {r['per_row']:.4f} | {r['ratio']:.2f}x |" for r in rows
    ]
    lines += [
        "",
        f"Median ratio per-row / per-tensor: **{summary['median_ratio_per_row_vs_per_tensor']:.2f}x**; "
        f"worst product {summary['max_per_tensor']:.4f} (per-tensor) vs {summary['max_per_row']:.4f} (per-row).",
    ]
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
