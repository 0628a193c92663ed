"""Small-scale reproduction table: each seed recipe's model vs its untrained baseline, nDCG@10.

For every recipe in ``recipes/`` (or those named with ``--recipes``): run the recipe (data
preparation, every stage), then evaluate the base model (the recipe's ``model`` read out with the
``evaluate.baseline`` strategy, else the final stage's strategy) and the trained model on held-out
retrieval sets from ``../shared/datasets`` (``evaluate.datasets``; test splits, corpora subsampled to
``--max-docs`` documents and ``--max-queries`` queries, the same subsample for both models). Queries
get NV-Embed's task instructions when ``evaluate.instructions`` is true; ``evaluate.dims`` adds
Matryoshka truncations and ``evaluate.layers`` shallower read-out layers (2DMSE; the pass stops there).
Prints one JSON document and a Markdown table.

    python bench/recipes_table.py --quick            # smoke run: 2 steps per stage, tiny eval sets
    python bench/recipes_table.py                    # the recipes' own (CPU-sized) settings
    python bench/recipes_table.py --recipes gte angle --max-docs 2000

CPU note: SmolLM2-135M takes tens of seconds per training step on two cores; the recipes' default
step counts keep each recipe to minutes, which is enough to show the pipeline works, not to
reproduce the papers' numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
QUICK_OVERRIDES: dict[str, Any] = {
    "steps": 2,
    "batch_size": 4,
    "max_length": 48,
    "warmup_steps": 0,
    "num_negatives": 1,
    "max_rows": 32,
    "max_corpus": 200,
    "max_texts": 64,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="*", default=None, help="recipe names or YAML paths (default: all)")
    parser.add_argument("--quick", action="store_true", help="2 steps per stage, tiny data and eval sets")
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "bench-recipes")
    parser.add_argument("--max-docs", type=int, default=None, help="eval corpus size (default 500; quick 60)")
    parser.add_argument("--max-queries", type=int, default=None, help="eval queries (default 100; quick 10)")
    parser.add_argument("--datasets", nargs="*", default=None, help="override evaluate.datasets")
    parser.add_argument("--steps", type=int, default=None, help="override every stage's step count")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is faster on a shared CPU)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    return parser.parse_args(argv)


def left_out_by_default(path: Path) -> bool:
    """Recipes the default table skips: a ``rerank`` stage yields a reranker, not an embedder (bench/rerank.py
    measures it), and a ``synthesize`` prepare step generates its data with an LLM first (tens of minutes here;
    name the recipe with ``--recipes`` to run it)."""
    from lmembed.training.recipes import load_recipe

    recipe = load_recipe(path)
    return any(stage.get("type") == "rerank" for stage in recipe.stages) or any(
        step.get("kind") == "synthesize" for step in recipe.prepare
    )


def recipe_paths(names: list[str] | None) -> list[Path]:
    if not names:
        return [p for p in sorted((REPO / "recipes").glob("*.yaml")) if not left_out_by_default(p)]
    paths = []
    for name in names:
        path = Path(name)
        paths.append(path if path.suffix in (".yaml", ".yml") else REPO / "recipes" / f"{name}.yaml")
    return paths


def eval_tasks(datasets: list[str], max_queries: int, max_docs: int) -> list[Any]:
    from lmembed.training.dev_eval import load_eval_tasks

    return load_eval_tasks(datasets, "test", max_queries=max_queries, max_docs=max_docs, seed=0)


def score(embedder: Any, tasks: list[Any], instructions: bool) -> dict[str, float]:
    """nDCG@10 per task (with NV-Embed's instruction for the task when asked)."""
    from lmembed.evaluation.instructions import instruction_for

    out = {}
    for task in tasks:
        instruction = instruction_for(task.name) if instructions else None
        result = task.with_instruction(instruction).evaluate(embedder, batch_size=16)
        out[task.name] = round(float(result.scores["ndcg_at_10"]), 4)
    return out


def baseline_strategy(recipe: Any, final_dir: Path) -> dict[str, Any]:
    """The base model's read-out: the trained model's pooling, attention and truncation, with
    ``evaluate.baseline`` (e.g. mean pooling instead of an untrained latent-attention head) on top."""
    saved = json.loads((final_dir / "lmembed.json").read_text())["strategy"]
    strategy = {k: saved[k] for k in ("pooling", "attention", "max_length") if k in saved}
    strategy.update(recipe.evaluate.get("baseline") or {})
    return strategy


def evaluate_pair(recipe: Any, model_dir: Path, tasks: list[Any]) -> list[dict[str, Any]]:
    """Rows of the table for one recipe: baseline vs trained, per dataset (and per Matryoshka dim)."""
    from lmembed import Embedder

    instructions = bool(recipe.evaluate.get("instructions"))
    base = Embedder.from_pretrained(recipe.model, show_progress=False, **baseline_strategy(recipe, model_dir))
    trained = Embedder.from_pretrained(str(model_dir), show_progress=False)
    rows = []
    points = [
        (layer, dim)
        for layer in recipe.evaluate.get("layers") or [None]
        for dim in recipe.evaluate.get("dims") or [None]
    ]
    for layer, dim in points:
        changes = {k: v for k, v in (("layer", layer), ("dim", dim)) if v is not None}
        pair = [e.with_config(e.config.with_options(**changes)) if changes else e for e in (base, trained)]
        before, after = (score(e, tasks, instructions) for e in pair)
        for name in before:
            rows.append(
                {
                    "dataset": name,
                    "dim": dim,
                    **({"layer": layer} if layer is not None else {}),
                    "baseline": before[name],
                    "recipe": after[name],
                    "delta": round(after[name] - before[name], 4),
                    "baseline_strategy": base.config.label(),
                    "recipe_strategy": trained.config.label(),
                }
            )
    return rows


def run_one(path: Path, args: argparse.Namespace, tasks_for: Any) -> dict[str, Any]:
    from lmembed.training.recipes import load_recipe, run_recipe

    recipe = load_recipe(path)
    overrides: dict[str, Any] = {"output": str(args.output / recipe.name)}
    if args.quick:
        overrides.update(QUICK_OVERRIDES)
    if args.steps:
        overrides["steps"] = args.steps
    record: dict[str, Any] = {"recipe": recipe.name, "paper": recipe.paper, "model": recipe.model}
    started = time.perf_counter()
    try:
        result = run_recipe(recipe, overrides=overrides)
        record["train_s"] = round(time.perf_counter() - started, 1)
        record["stages"] = [
            {"name": s.name, "type": s.type, "steps": s.steps, "first_loss": s.first_loss, "last_loss": s.last_loss}
            for s in result.stages
        ]
        datasets = args.datasets or recipe.evaluate.get("datasets") or ["scifact"]
        record["rows"] = evaluate_pair(recipe, Path(result.model_dir), tasks_for(tuple(datasets)))
    except Exception as exc:  # one broken recipe must not hide the others
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=6)
    record["total_s"] = round(time.perf_counter() - started, 1)
    return record


def markdown(records: list[dict[str, Any]]) -> str:
    lines = [
        "| recipe | dataset | dim | baseline nDCG@10 | recipe nDCG@10 | delta | train s |",
        "|---|---|---|---|---|---|---|",
    ]
    for rec in records:
        if "error" in rec:
            lines.append(f"| {rec['recipe']} | error: {rec['error'][:80]} | | | | | |")
            continue
        for row in rec["rows"]:
            dim = row["dim"] or "full"
            lines.append(
                f"| {rec['recipe']} | {row['dataset']} | {dim} | {row['baseline']:.4f} | {row['recipe']:.4f} | "
                f"{row['delta']:+.4f} | {rec['train_s']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    max_docs = args.max_docs or (60 if args.quick else 500)
    max_queries = args.max_queries or (10 if args.quick else 100)
    cache: dict[tuple[str, ...], list[Any]] = {}

    def tasks_for(datasets: tuple[str, ...]) -> list[Any]:
        if datasets not in cache:
            cache[datasets] = eval_tasks(list(datasets), max_queries, max_docs)
        return cache[datasets]

    records: list[dict[str, Any]] = []
    report = {
        "quick": args.quick,
        "eval": {"max_docs": max_docs, "max_queries": max_queries, "split": "test"},
        "recipes": records,
    }
    for path in recipe_paths(args.recipes):
        print(f"== {path.stem}", file=sys.stderr, flush=True)
        records.append(run_one(path, args, tasks_for))
        print(f"   done in {records[-1]['total_s']}s {records[-1].get('error', '')}", file=sys.stderr, flush=True)
        print(markdown(records[-1:]), file=sys.stderr, flush=True)
        if args.json:  # after every recipe, so an interrupted run keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print()
    print(markdown(records))
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    raise SystemExit(main())
