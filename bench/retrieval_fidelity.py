"""Issue 3 benchmark: `minilm` on every retrieval set we hold vs MTEB's published nDCG@10.

For each set prints our nDCG@10 (and MAP/MRR/Recall), the published MTEB figure from
../shared/datasets/reference_scores.json, and the difference (target: within ±0.5 points). Then, on
SciFact, the end-to-end time against a reference implementation measured in the same run
(sentence-transformers encode + pytrec_eval on a full score matrix), as a ratio, and the time of a
cached re-evaluation.

    python bench/retrieval_fidelity.py [--sets scifact,nfcorpus,arguana] [--skip-reference]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from _common import published_scores, save_json, shared_or_exit

REFERENCE_KEYS = ("ndcg_at_10", "map_at_10", "mrr_at_10", "recall_at_10", "recall_at_100")


def reference_run(task) -> tuple[float, float]:
    """sentence-transformers encode + brute-force scores + pytrec_eval: time and nDCG@10."""
    import pytrec_eval
    from sentence_transformers import SentenceTransformer

    from lmembed.models.bundled import resolve_bundled

    start = time.perf_counter()
    st = SentenceTransformer(str(resolve_bundled("minilm")), device="cpu")
    q = st.encode(task.data.query_texts, batch_size=32, normalize_embeddings=True)
    c = st.encode(task.data.corpus_texts, batch_size=32, normalize_embeddings=True)
    scores = q @ c.T
    top = np.argsort(-scores, axis=1)[:, :1000]
    run = {
        qid: {task.data.corpus_ids[j]: float(scores[i, j]) for j in top[i]} for i, qid in enumerate(task.data.query_ids)
    }
    qrels = {q: {d: int(s) for d, s in docs.items()} for q, docs in task.data.qrels.items()}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    ndcg = float(np.mean([v["ndcg_cut_10"] for v in per_query.values()]))
    return time.perf_counter() - start, ndcg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sets", default="scifact,nfcorpus,arguana")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--fresh-cache", action="store_true", help="start from an empty embedding cache")
    args = parser.parse_args()
    from lmembed import Embedder
    from lmembed.evaluation.suites import resolve_task

    shared_or_exit("beir")
    rows, out = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        emb = Embedder.from_pretrained("minilm", cache_dir=tmp if args.fresh_cache else None)
        for name in args.sets.split(","):
            task = resolve_task(name)
            first = task.evaluate(emb)  # served from the cache where an earlier run embedded this set
            start = time.perf_counter()
            second = task.evaluate(emb)
            cached_s = time.perf_counter() - start
            assert abs(first.scores["ndcg_at_10"] - second.scores["ndcg_at_10"]) < 1e-9
            ref = published_scores(task.name)
            ours = first.scores["ndcg_at_10"]
            diff = 100 * (ours - ref["ndcg_at_10"]) if "ndcg_at_10" in ref else float("nan")
            rows.append((task.name, ours, ref.get("ndcg_at_10", float("nan")), diff, first, cached_s))
            out[task.name] = {
                "ours": {k: first.scores[k] for k in REFERENCE_KEYS},
                "published": ref,
                "diff_points_ndcg_at_10": diff,
                "first_run_s": first.evaluation_time,
                "cached_run_s": cached_s,
                "timings": first.extra.get("timings", {}),
            }
        print("\n| task | ours nDCG@10 | MTEB nDCG@10 | diff (points) | MAP@10 | MRR@10 | first run s | cached s |")
        print("|---|---|---|---|---|---|---|---|")
        for name, ours, ref, diff, res, cached_s in rows:
            print(
                f"| {name} | {100 * ours:.2f} | {100 * ref:.2f} | {diff:+.2f} | {100 * res.scores['map_at_10']:.2f} "
                f"| {100 * res.scores['mrr_at_10']:.2f} | {res.evaluation_time:.1f} | {cached_s:.2f} |"
            )
        if not args.skip_reference and "SciFact" in out:
            task = resolve_task("scifact")
            ref_s, ref_ndcg = reference_run(task)
            ours_s = out["SciFact"]["first_run_s"]
            out["SciFact"]["reference"] = {"seconds": ref_s, "ndcg_at_10": ref_ndcg}
            print(
                f"\nSciFact end-to-end: lmembed {ours_s:.1f}s vs sentence-transformers+pytrec_eval {ref_s:.1f}s "
                f"→ speed ratio {ref_s / ours_s:.2f}x (reference nDCG@10 {100 * ref_ndcg:.2f}); "
                f"cached re-evaluation {out['SciFact']['cached_run_s']:.2f}s "
                f"(search {out['SciFact']['timings'].get('search_s', float('nan')):.3f}s, "
                f"metrics {out['SciFact']['timings'].get('metrics_s', float('nan')):.3f}s)"
            )
    print(f"saved {save_json(out, 'retrieval_fidelity')}")


if __name__ == "__main__":
    main()
