"""Where the term channel does not belong: symmetric tasks (STS, pair classification), a check of its generality.

``lmembed adapt`` appends a term channel fitted on the corpus (:mod:`lmembed.pooling.terms`); it was chosen on
retrieval sets, where a query shares rare words with its document. Here minilm and minilm with a channel fitted
on each task's own texts (the default 4,096 buckets, weight 0.5; texts read as documents, both sides alike) are
scored on every STS and pair-classification set in ``../shared/datasets``: the baseline is minilm in the same run,
the figure the difference of the task's main score (× 100).

    python bench/terms_symmetric.py --out bench/results/adapt/v4
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.embedder import Embedder
from lmembed.evaluation.suites import resolve_task
from lmembed.paths import shared_datasets_dir
from lmembed.training.adapt_recipe import AdaptRecipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapt/v4"))
    args = parser.parse_args()
    shared = shared_datasets_dir()
    folders = sorted((shared / "sts").iterdir()) + sorted((shared / "pair_classification").iterdir())
    terms = AdaptRecipe().terms
    start = Embedder.from_pretrained("minilm", show_progress=False, cache=False)
    rows = []
    for folder in folders:
        task = resolve_task(folder.name if (shared / "sts" / folder.name).exists() else str(folder))
        plain = task.evaluate(start).scores["main_score"]
        fitted = start.fit_terms(task.texts(), dims=terms.dims, weight=terms.weight)
        with_terms = task.evaluate(fitted).scores["main_score"]
        rows.append({"task": task.name, "minilm": 100 * plain, "with_channel": 100 * with_terms})
        print(rows[-1], flush=True)
    lines = ["| task | minilm | minilm + channel | difference |", "|---|---|---|---|"]
    lines += [
        f"| {r['task']} | {r['minilm']:.2f} | {r['with_channel']:.2f} | {r['with_channel'] - r['minilm']:+.2f} |"
        for r in rows
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "terms-symmetric.json", {"terms": terms.model_dump(), "rows": rows})
    atomic_write_text(args.out / "terms-symmetric.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
