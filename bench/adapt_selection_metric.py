"""Issue 38: which step would each held-back selection metric keep, and how do those steps score on real queries?

For an ``lmembed adapt`` run folder, every trained step it checkpointed (and the start, step 0) is scored on the
run's own held-back pseudo-queries with both selection metrics of ``recipes/adapt`` (``selection.metric``):
``own`` (nDCG@10 of each query's own document) and ``teacher`` (agreement with the hybrid teacher's ranking of the
slice, :func:`lmembed.training.adapt.agreement`), unmerged (the weights as trained). With ``--split`` the same
steps are also scored on that split's real queries (SciFact train, NFCorpus dev; never test), so a metric's pick
can be judged. Figures are differences against step 0 (the starting model) of the same run.

    python bench/adapt_selection_metric.py --run runs/adapt-bench/nfcorpus/listwise --set nfcorpus --split dev
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.paths import shared_datasets_dir


def _at_step(run: Path, step: int) -> Any:
    from safetensors.torch import load_file

    from lmembed.embedder import Embedder
    from lmembed.training.trainable import TrainableEmbedder

    plan = json.loads((run / "adapt_plan.json").read_text())
    embedder = Embedder.from_pretrained(plan["model"], device="cpu", show_progress=False, cache=False)
    if step == 0:
        return embedder
    checkpoint = run / "checkpoints" / f"step-{step:07d}" / "trainable.safetensors"
    trainable = TrainableEmbedder(embedder)
    trainable.load_trainable_state_dict(load_file(str(checkpoint)))
    trainable.eval()
    return embedder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="an adapt run folder (with checkpoints/)")
    parser.add_argument("--set", required=True, help="its BEIR set under ../shared/datasets/beir")
    parser.add_argument("--split", default=None, help="also score real queries of this split (train or dev)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapt/selection"))
    args = parser.parse_args()

    import torch

    from lmembed.training.adapt import HeldOut, HybridTeacher, PseudoQuery, read_adapt_corpus
    from lmembed.training.adapt_recipe import AdaptRecipe
    from lmembed.training.dev_eval import load_eval_tasks

    plan = json.loads((args.run / "adapt_plan.json").read_text())
    recipe = AdaptRecipe.model_validate(plan["recipe"])
    folder = shared_datasets_dir() / "beir" / args.set
    docs = read_adapt_corpus(folder / "corpus.jsonl")
    index = {d.id: i for i, d in enumerate(docs)}
    rows = [json.loads(line) for line in (args.run / "heldout.jsonl").read_text().splitlines()]
    held = [PseudoQuery(r["query"], "", index[r["doc_id"]], r["source"]) for r in rows]
    held_out = HeldOut.build(held, docs, recipe.selection.max_documents, recipe.seed)
    start = _at_step(args.run, 0)
    held_out.follow(HybridTeacher(start, docs, recipe.training.hybrid_weight), recipe.training.temperature)
    steps = [0, *sorted(int(p.name.removeprefix("step-")) for p in (args.run / "checkpoints").glob("step-*"))]
    task = load_eval_tasks([str(folder)], args.split)[0] if args.split else None
    report: dict[str, dict[str, float]] = {}
    for step in steps:
        embedder = start if step == 0 else _at_step(args.run, step)  # the start is loaded once
        with torch.no_grad():
            scores = held_out.score(embedder)
            if task is not None:
                scores[f"{args.split}_ndcg_at_10"] = float(task.evaluate(embedder, batch_size=32).scores["ndcg_at_10"])
        report[str(step)] = scores
        print(step, {k: round(v, 4) for k, v in scores.items()}, flush=True)
    picks = {m: max(steps, key=lambda s, m=m: (report[str(s)][m], -s)) for m in ("ndcg_at_10", "teacher_ndcg_at_10")}
    name = f"selection-metric-{args.set}-{args.run.name}"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / f"{name}.json", {"run": str(args.run), "steps": report, "picks": picks})
    keys = list(report["0"])
    lines = ["| step | " + " | ".join(f"{k} (− step 0)" for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for step in steps:
        cells = [
            f"{100 * report[str(step)][k]:.2f} ({100 * (report[str(step)][k] - report['0'][k]):+.2f})" for k in keys
        ]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", f"kept by own: step {picks['ndcg_at_10']}; by teacher: step {picks['teacher_ndcg_at_10']}"]
    atomic_write_text(args.out / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
