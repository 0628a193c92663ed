"""int8 vs float32 retrieval quality: nDCG@10 of ``--model`` (``minilm``) int8 and float32, both on ONNX Runtime.

int8 is calibrated on 256 documents of each set's own corpus (the user's texts), as ``Embedder`` does. The
gate this checks: int8 within ``--max-gap`` nDCG@10 points of float32 on every set. Full test sets by default;
``--max-docs N --max-queries Q`` scores a subsample (every set's name then says so, e.g. ``SciFact[1000 docs,
200 queries]``) when the full sets do not fit the time at hand. Results: ``bench/results/int8-retrieval/``.

    python bench/int8_retrieval.py                               # full SciFact, NFCorpus, ArguAna
    python bench/int8_retrieval.py --max-docs 1000 --max-queries 200
    python bench/int8_retrieval.py --model smollm2-135m --data scifact --max-docs 500 --max-length 256
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

from _common import REPO

OUT = REPO / "bench" / "results" / "int8-retrieval"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["scifact", "nfcorpus", "arguana"])
    parser.add_argument("--model", default="minilm", help="any model (default pooling); results/<name> unless minilm")
    parser.add_argument("--max-length", type=int, default=None, help="token limit (default: the model's own)")
    parser.add_argument("--max-docs", type=int, default=None)
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--max-gap", type=float, default=0.5, help="allowed nDCG@10 loss, in points")
    args = parser.parse_args()

    from lmembed import Embedder
    from lmembed.atomic import atomic_write_json, atomic_write_text
    from lmembed.encoding.backends.base import spread_sample
    from lmembed.evaluation.runner import evaluate_strategies
    from lmembed.evaluation.suites import resolve_task

    rows = []
    for name in args.data:
        task = resolve_task(name)
        if args.max_docs or args.max_queries:
            task = task.subsample(max_docs=args.max_docs, max_queries=args.max_queries, policy="relevant-first")
        texts = task.data.corpus_texts
        scores = {}
        seconds = {}
        for precision in ("float32", "int8"):
            emb = Embedder.from_pretrained(
                args.model,
                cache=False,
                show_progress=False,
                backend="onnx",
                precision=precision,
                max_length=args.max_length,
            )
            if precision == "int8":
                emb.calibrate(spread_sample(texts, 256))
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                (result,) = evaluate_strategies(emb, [task], [emb.config])
            seconds[precision] = time.perf_counter() - start
            scores[precision] = 100 * result.result.main_score
            gate = emb.backend.describe().get("quality_gate")
            if caught:
                print(f"  {precision}: {caught[-1].message}")
        gap = scores["float32"] - scores["int8"]
        rows.append(
            {
                "task": task.name,
                "ndcg_at_10_float32": scores["float32"],
                "ndcg_at_10_int8": scores["int8"],
                "gap_points": gap,
                "within_gate": gap <= args.max_gap,
                "seconds": seconds,
                "int8_quality_gate": gate,
            }
        )
        print(f"{task.name}: float32 {scores['float32']:.2f}, int8 {scores['int8']:.2f}, gap {gap:+.2f} points")
    out = OUT if args.model == "minilm" else OUT / args.model.replace("/", "_")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "result.json", {"rows": rows, "max_gap": args.max_gap, "load_average": os.getloadavg()})
    lines = ["| task | float32 nDCG@10 | int8 nDCG@10 | gap (points) | within gate |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['task']} | {r['ndcg_at_10_float32']:.2f} | {r['ndcg_at_10_int8']:.2f} | {r['gap_points']:+.2f} | "
        f"{'yes' if r['within_gate'] else 'no'} |"
        for r in rows
    ]
    atomic_write_text(out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
