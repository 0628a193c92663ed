"""Issue 38: what ``--teacher hybrid`` saves by reusing the miner's cosines for its labels.

On one BEIR corpus, the default recipe's title (and crop) pseudo-queries are mined once with the starting model
(``mine_rows``, which keeps each row's cosines in its provenance); then the same rows are labelled by the hybrid
teacher twice, in the same run: encoding the rows' queries and documents again (the baseline, as before) and
reusing the mined cosines. Prints both times, their ratio, and the largest difference between the two labels.

    python bench/adapt_label_reuse.py --set nfcorpus --queries 1000
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

from lmembed.atomic import atomic_write_json
from lmembed.paths import shared_datasets_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="nfcorpus")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--queries", type=int, default=1000, help="pseudo-queries to mine and label")
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapt/label-reuse.json"))
    args = parser.parse_args()

    from lmembed.embedder import Embedder
    from lmembed.training.adapt import HybridTeacher, filter_queries, label_rows, mine_rows, read_adapt_corpus
    from lmembed.training.adapt_recipe import AdaptRecipe
    from lmembed.training.adapt_run import make_queries

    recipe = AdaptRecipe()
    docs = read_adapt_corpus(shared_datasets_dir() / "beir" / args.set / "corpus.jsonl")
    embedder = Embedder.from_pretrained(args.model, device="cpu", show_progress=False, cache=False)  # times, not hits
    made, _ = make_queries(docs, recipe, embedder, Path("."), None)
    queries = filter_queries(made)[0][: args.queries]
    started = time.perf_counter()
    rows, _ = mine_rows(embedder, queries, docs, **recipe.mining.model_dump(exclude={"candidates"}))
    mining = time.perf_counter() - started
    times, labels = {}, {}
    for name, reuse in (("encode again", False), ("reuse mined cosines", True)):
        teacher = HybridTeacher(embedder, docs, recipe.training.hybrid_weight, mined_by_embedder=reuse)
        started = time.perf_counter()
        labels[name] = label_rows(copy.deepcopy(rows), teacher, 1)
        times[name] = time.perf_counter() - started
    difference = max(
        abs(a - b)
        for x, y in zip(labels["encode again"], labels["reuse mined cosines"], strict=True)
        for a, b in zip(
            [x["teacher_scores"]["positive"], *x["teacher_scores"]["negatives"]],
            [y["teacher_scores"]["positive"], *y["teacher_scores"]["negatives"]],
            strict=True,
        )
    )
    ratio = times["encode again"] / times["reuse mined cosines"]
    report = {
        "set": args.set,
        "rows": len(rows),
        "mining_s": round(mining, 2),
        "label_s": {k: round(v, 2) for k, v in times.items()},
        "speed-up (encode again / reuse)": round(ratio, 1),
        "max_label_difference": difference,
    }
    atomic_write_json(args.out, report)
    print(report)


if __name__ == "__main__":
    main()
