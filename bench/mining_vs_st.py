"""Hard-negative mining: lmembed vs sentence-transformers on the SciFact training queries.

Both sides use the same teacher (the bundled ``minilm`` = all-MiniLM-L6-v2), the same candidate pool
(the SciFact corpus plus the positives), the same number of negatives and the same 95% rule:
lmembed's ``perc_pos`` with ``margin=0.95`` keeps a candidate when ``score < 0.95 * positive``;
sentence-transformers' ``relative_margin=0.05`` drops it when ``score > positive - 0.05 * |positive|``
(identical for positive scores, up to ties at the boundary). Both use the lowest positive score of a
query with several positives and retrieve ``10 * k + max positives`` candidates.

Printed: per-query overlap of the chosen negatives, and wall time (lmembed cold, i.e. with an empty
embedding cache, and warm, i.e. a second run served by the cache; sentence-transformers without a
cache), with the ratio lmembed / ST. Run from the repository root::

    python bench/mining_vs_st.py                 # the whole train split (slow on a small CPU)
    python bench/mining_vs_st.py --max-docs 500  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="beir/scifact", help="BEIR folder or name under shared/datasets")
    parser.add_argument("--split", default="train")
    parser.add_argument("--teacher", default="minilm")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--margin", type=float, default=0.95, help="lmembed perc_pos fraction (ST: 1 - margin)")
    parser.add_argument("--max-docs", type=int, default=None, help="keep only this many corpus documents")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    return parser.parse_args(argv)


def load_data(args: argparse.Namespace) -> tuple[list[dict], list[str]]:
    """Training rows (one per judged query) and the candidate corpus."""
    from lmembed.evaluation.retrieval_data import load_beir
    from lmembed.training.converters import beir_rows
    from lmembed.training.recipes import resolve_input

    folder = resolve_input(args.dataset)
    rows = beir_rows(folder, args.split)
    corpus = load_beir(folder, args.split).corpus_texts
    if args.max_docs:
        positives = {p for r in rows for p in r["positive"]}
        others = [t for t in corpus if t not in positives]
        corpus = sorted(positives) + others[: max(0, args.max_docs - len(positives))]
    return rows, corpus


def run_lmembed(args: argparse.Namespace, rows: list[dict], corpus: list[str]) -> dict:
    from lmembed import Embedder
    from lmembed.mining import mine_hard_negatives

    with tempfile.TemporaryDirectory(prefix="lmembed-cache-") as cache:
        teacher = Embedder.from_pretrained(args.teacher, cache_dir=cache, show_progress=False)
        options = {"k": args.k, "method": "perc_pos", "margin": args.margin, "batch_size": args.batch_size}
        started = time.perf_counter()
        mined = mine_hard_negatives(teacher, rows, corpus, **options)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        mine_hard_negatives(teacher, rows, corpus, **options)
        warm = time.perf_counter() - started
    return {"negatives": {r["query"]: r["negatives"] for r in mined}, "cold_s": cold, "warm_s": warm}


def run_st(args: argparse.Namespace, rows: list[dict], corpus: list[str]) -> dict:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from lmembed.models.loading import resolve_model_path

    pairs = [(r["query"], p) for r in rows for p in r["positive"]]
    dataset = Dataset.from_dict({"anchor": [q for q, _ in pairs], "positive": [p for _, p in pairs]})
    model = SentenceTransformer(resolve_model_path(args.teacher), device="cpu")
    started = time.perf_counter()
    mined = mine_hard_negatives(
        dataset,
        model,
        corpus=list(corpus),
        num_negatives=args.k,
        relative_margin=1.0 - args.margin,
        sampling_strategy="top",
        output_format="triplet",
        batch_size=args.batch_size,
        verbose=False,
    )
    seconds = time.perf_counter() - started
    negatives: dict[str, list[str]] = defaultdict(list)
    for anchor, negative in zip(mined["anchor"], mined["negative"], strict=True):
        if negative not in negatives[anchor]:
            negatives[anchor].append(negative)
    return {"negatives": dict(negatives), "seconds": seconds}


def compare(ours: dict[str, list[str]], theirs: dict[str, list[str]], queries: list[str], k: int) -> dict:
    """Overlap statistics. Queries for which neither side found a negative (every candidate scored
    above the ceiling) are counted separately and left out of the overlap averages."""
    overlap, jaccard, identical, both_empty = [], [], 0, 0
    for query in queries:
        a, b = ours.get(query, []), theirs.get(query, [])
        if not a and not b:
            both_empty += 1
            continue
        common = len(set(a) & set(b))
        overlap.append(common / max(len(a), len(b)))
        jaccard.append(common / len(set(a) | set(b)))
        identical += int(a == b)
    compared = max(1, len(overlap))
    return {
        "queries": len(queries),
        "queries_compared": len(overlap),
        "queries_without_negatives_both": both_empty,
        "mean_overlap": sum(overlap) / compared,
        "mean_jaccard": sum(jaccard) / compared,
        "identical_lists": identical / compared,
        "lmembed_negatives_per_query": sum(len(ours.get(q, [])) for q in queries) / len(queries),
        "st_negatives_per_query": sum(len(theirs.get(q, [])) for q in queries) / len(queries),
        "k": k,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    rows, corpus = load_data(args)
    print(f"{len(rows)} queries, {len(corpus)} candidate documents, teacher={args.teacher}, k={args.k}", flush=True)
    ours = run_lmembed(args, rows, corpus)
    print(f"lmembed: cold {ours['cold_s']:.1f}s, warm (cached) {ours['warm_s']:.2f}s", flush=True)
    theirs = run_st(args, rows, corpus)
    print(f"sentence-transformers: {theirs['seconds']:.1f}s", flush=True)
    queries = list(dict.fromkeys(r["query"] for r in rows))
    report = compare(ours["negatives"], theirs["negatives"], queries, args.k)
    report.update(
        {
            "lmembed_cold_s": ours["cold_s"],
            "lmembed_warm_s": ours["warm_s"],
            "st_s": theirs["seconds"],
            "time_ratio_cold": ours["cold_s"] / theirs["seconds"],
            "time_ratio_warm": ours["warm_s"] / theirs["seconds"],
            "documents": len(corpus),
        }
    )
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    raise SystemExit(main())
