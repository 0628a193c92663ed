"""Issue 5 benchmark: `minilm` on every non-retrieval MTEB task we hold vs the published scores.

Prints, per task, our main score, MTEB's published main score (../shared/datasets/reference_scores.json)
and the difference in points (target: within ±0.5). Retrieval fidelity is bench/retrieval_fidelity.py.

    python bench/mteb_fidelity.py [--tasks STSBenchmark,SICK-R,...]
"""

from __future__ import annotations

import argparse
import time

from _common import published_scores, save_json, shared_or_exit

TASKS = (
    "STSBenchmark",
    "SICK-R",
    "STS12",
    "STS13",
    "STS14",
    "STS15",
    "STS16",
    "Banking77Classification",
    "EmotionClassification",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    from lmembed import Embedder
    from lmembed.evaluation.suites import build_task, locate

    root = shared_or_exit()
    emb = Embedder.from_pretrained("minilm")
    rows, out = [], {}
    for name in args.tasks.split(","):
        task = build_task(locate(name, root))
        start = time.perf_counter()
        result = task.evaluate(emb)
        seconds = time.perf_counter() - start
        ref = published_scores(name).get("main_score", float("nan"))
        diff = 100 * (result.main_score - ref)
        rows.append((name, result.task_type, result.main_metric, result.main_score, ref, diff, seconds))
        out[name] = {"ours": result.main_score, "published": ref, "diff_points": diff, "seconds": seconds}
    print("\n| task | type | metric | ours | MTEB published | diff (points) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, metric, ours, ref, diff, seconds in rows:
        print(f"| {name} | {kind} | {metric} | {100 * ours:.2f} | {100 * ref:.2f} | {diff:+.2f} | {seconds:.1f} |")
    worst = max(abs(r[5]) for r in rows)
    print(f"\nlargest difference: {worst:.2f} points ({'within' if worst <= 0.5 else 'OUTSIDE'} the ±0.5 target)")
    print(f"saved {save_json(out, 'mteb_fidelity')}")


if __name__ == "__main__":
    main()
