"""Give a finished adapt run the default recipe's last stage, the term channel, without training again.

Defaults v4 are v3's recipe plus the term channel (``terms:``), which is fitted after training on the saved model;
the training keys did not change. So a v3 run folder holds exactly the weights v4 trains, and this copies it
(``--source``) to ``--dest`` and runs the stage adapt runs (``lmembed.training.adapt_run.attach_terms``), then
scores the held-back pseudo-queries with the channel and rewrites the summary as adapt writes it (recipe, ``terms``,
``timings.terms_s``). ``lmembed adapt`` run afresh gives the same model: checked on SciFact
(bench/results/adapt/README.md, "v4 defaults").

    python bench/adapt_terms_stage.py --source runs/adapt-bench/scifact/adapt-v3 \\
        --dest runs/adapt-bench/scifact/adapt \\
        --corpus ../shared/datasets/beir/scifact/corpus.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

from lmembed.atomic import atomic_write_json
from lmembed.training.adapt import HELDOUT_FILE, HeldOut, read_adapt_corpus
from lmembed.training.adapt_recipe import AdaptRecipe
from lmembed.training.adapt_run import attach_terms, read_held_back


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="a finished adapt run (v3 defaults)")
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="the corpus the run was adapted to")
    args = parser.parse_args()
    if args.dest.exists():
        raise SystemExit(f"{args.dest} exists; choose another --dest")
    summary = json.loads((args.source / "adapt_summary.json").read_text())
    recipe = AdaptRecipe()
    wanted = {k: v for k, v in recipe.model_dump().items() if k != "terms"}
    if {k: v for k, v in summary["recipe"].items() if k != "terms"} != wanted:
        raise SystemExit(f"{args.source}: was not run with the default recipe's training keys")
    docs = read_adapt_corpus(args.corpus)
    shutil.copytree(args.source, args.dest)
    model_dir = args.dest / "model"
    started = time.perf_counter()
    fitted = attach_terms(model_dir, docs, recipe)
    held = read_held_back(args.dest / HELDOUT_FILE, docs)
    held_out = HeldOut.build(held, docs, recipe.selection.max_documents, recipe.seed)
    saved = held_out.score(fitted)
    seconds = round(time.perf_counter() - started, 2)
    assert fitted.config.terms is not None
    summary.update(
        recipe=recipe.model_dump(),
        terms={**dataclasses.asdict(fitted.config.terms), "saved_scores": saved},
        model_dir=str(model_dir),
    )
    summary["timings"]["terms_s"] = seconds
    summary["seconds"] = round(summary["seconds"] + seconds, 2)
    summary["terms_stage_from"] = str(args.source)
    atomic_write_json(args.dest / "adapt_summary.json", summary)
    print(json.dumps({"dest": str(args.dest), "terms_s": seconds, "saved_scores": saved}))


if __name__ == "__main__":
    main()
