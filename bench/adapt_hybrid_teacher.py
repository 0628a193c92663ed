"""Issue 38: how good is ``lmembed adapt --teacher hybrid``'s teacher, and which ``training.hybrid_weight``?

The teacher scores a (query, document) pair as ``cos(q, d) + w x bm25(q, d) / max_d' bm25(q, d')``: the starting
model's cosine plus BM25 over the corpus, scaled to [0, 1] per query (:class:`lmembed.training.adapt.HybridTeacher`).
Here that score ranks each set's whole corpus for real queries of a **selection** split (SciFact train, NFCorpus
dev; never test), for each weight of ``--weights``; ``w = 0`` is the starting model alone (the baseline in the same
run), and the BM25-only ranking is reported beside it. nDCG@10 x 100 with the set's registered MTEB settings.

    python bench/adapt_hybrid_teacher.py --sets scifact:train nfcorpus:dev --out bench/results/adapt/selection
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.paths import shared_datasets_dir


def _ndcg(task: Any, scores: np.ndarray) -> float:
    """nDCG@10 x 100 of ranking each query's documents by ``scores`` (queries x corpus), as the task scores it."""
    from lmembed.evaluation.metrics import evaluate_run

    data = task.data
    best = np.argsort(-scores, axis=1)[:, :100]
    run = {qid: {data.corpus_ids[j]: float(scores[i, j]) for j in best[i]} for i, qid in enumerate(data.query_ids)}
    result = evaluate_run(data.qrels, run, ignore_identical_ids=task.ignore_identical_ids, nauc=False)
    return 100 * float(result.scores["ndcg_at_10"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["scifact:train", "nfcorpus:dev"], help="SET:SPLIT")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--weights", nargs="+", type=float, default=[0.0, 0.1, 0.25, 0.5, 1.0, 2.0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapt/selection"))
    args = parser.parse_args()

    from lmembed.embedder import Embedder
    from lmembed.lexical.bm25 import LexicalIndex
    from lmembed.training.dev_eval import load_eval_tasks

    embedder = Embedder.from_pretrained(args.model, device="cpu", show_progress=False)
    report: dict[str, dict[str, float]] = {}
    for item in args.sets:
        name, split = item.split(":")
        task = load_eval_tasks([str(shared_datasets_dir() / "beir" / name)], split)[0]
        data = task.data
        q, c, _ = task.encode(embedder, batch_size=32)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        c = c / np.linalg.norm(c, axis=1, keepdims=True)
        dense = q @ c.T
        index = LexicalIndex.build(data.corpus_texts, data.corpus_ids)
        lexical = np.stack([index.scores(t) for t in data.query_texts])
        top = lexical.max(axis=1, keepdims=True)
        scaled = np.divide(lexical, top, out=np.zeros_like(lexical), where=top > 0)

        row = {f"w={w:g}": _ndcg(task, dense + w * scaled) for w in args.weights}
        row["bm25"] = _ndcg(task, lexical)
        report[item] = row
        print(item, {k: round(v, 2) for k, v in row.items()}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "hybrid-teacher.json", {"model": args.model, "ndcg_at_10": report})
    keys = list(next(iter(report.values())))
    lines = ["| set:split | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(f"{v[k]:.2f}" for k in keys) + " |" for s, v in report.items()]
    atomic_write_text(args.out / "hybrid-teacher.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
