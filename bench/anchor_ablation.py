"""Bench: does Anchor stage I (bidirectional reconstruction) help stage II (contrastive training)?

The Anchor paper reports that a model pre-trained with EBQ2D/EBD2Q reconstruction starts contrastive
training at a much lower loss and converges faster. This bench runs ``recipes/anchor-stage1-stage2.yaml``
twice on the same data, at the same total step budget:

* **I + II**: the recipe as written (stage I for S1 steps, then stage II for S2 steps);
* **II only**: stage II from the base model for S1 + S2 steps.

It prints stage II's loss at its start and end for both runs (as ratios I+II / II-only), draws both
stage-II loss curves in one PNG, and (unless ``--no-eval``) compares the final models' nDCG@10 on
held-out retrieval sets (subsampled; the same subsample for both), with the untrained base model as
the reference row.

    python bench/anchor_ablation.py --quick     # 2 + 2 steps, tiny data: checks the pipeline
    python bench/anchor_ablation.py             # the recipe's CPU-sized step counts
    python bench/anchor_ablation.py --steps 200 200 --set device=cuda --set batch_size=32 --eval-device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "anchor-stage1-stage2.yaml"
STAGE1, STAGE2 = "stage1-reconstruction", "stage2-contrastive"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 steps per stage, tiny data and eval sets")
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "bench-anchor")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "anchor-ablation")
    parser.add_argument("--no-eval", action="store_true", help="loss curves only")
    parser.add_argument("--max-docs", type=int, default=None, help="eval corpus size (default 300; quick 40)")
    parser.add_argument("--max-queries", type=int, default=None, help="eval queries (default 50; quick 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, nargs=2, metavar=("S1", "S2"), help="stage I and stage II steps")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for every stage (YAML value)"
    )
    parser.add_argument("--eval-device", default="cpu")
    return parser.parse_args(argv)


def stage_losses(folder: Path) -> list[float]:
    """The per-step training losses a stage logged (``metrics.jsonl``)."""
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def run_variant(recipe: Any, output: Path, overrides: dict[str, Any], stages: list[str] | None) -> dict[str, Any]:
    from lmembed.training.recipes import run_recipe

    started = time.perf_counter()
    result = run_recipe(recipe, overrides={**overrides, "output": str(output)}, stages=stages)
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "model_dir": str(result.model_dir),
        "stage2_losses": stage_losses(output / STAGE2),
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, marker=".", label=label)
    ax.set_xlabel("stage II step")
    ax.set_ylabel("InfoNCE loss")
    ax.set_title("Anchor ablation on smollm2-135m: stage II loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def evaluate(recipe: Any, runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """nDCG@10 of the base model and each variant's final model on the same subsampled sets."""
    from lmembed import Embedder
    from recipes_table import baseline_strategy, eval_tasks, score

    max_docs = args.max_docs or (40 if args.quick else 300)
    max_queries = args.max_queries or (8 if args.quick else 50)
    tasks = eval_tasks(list(recipe.evaluate.get("datasets") or ["scifact"]), max_queries, max_docs)
    instructions = bool(recipe.evaluate.get("instructions"))
    some_dir = Path(next(iter(runs.values()))["model_dir"])
    device = args.eval_device
    base = Embedder.from_pretrained(recipe.model, device=device, **baseline_strategy(recipe, some_dir))
    models = {"base (untrained)": base}
    models.update({name: Embedder.from_pretrained(run["model_dir"], device=device) for name, run in runs.items()})
    return {name: score(model, tasks, instructions) for name, model in models.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from lmembed.training.recipes import load_recipe

    torch.set_num_threads(args.threads)
    recipe = load_recipe(RECIPE)
    steps = {stage["name"]: int(stage.get("steps", 0)) for stage in recipe.stages}
    common: dict[str, Any] = {}
    if args.quick:
        steps = {STAGE1: 2, STAGE2: 2}
        common = {"max_rows": 32, "max_corpus": 200, "max_texts": 64, "batch_size": 4}
    if args.steps:
        steps = {STAGE1: args.steps[0], STAGE2: args.steps[1]}
    for item in args.set:
        key, _, value = item.partition("=")
        common[key.strip()] = yaml.safe_load(value)
    both = {**common, "stage_steps": steps}
    print(f"stage steps: I+II = {steps[STAGE1]} + {steps[STAGE2]}; II only = {steps[STAGE1] + steps[STAGE2]}")

    for stage in recipe.stages:  # per-stage step counts (an override would set every stage alike)
        stage["steps"] = steps[stage["name"]]
    runs = {"I + II": run_variant(recipe, args.output / "stage1-stage2", common, None)}
    recipe.stages[-1]["steps"] = steps[STAGE1] + steps[STAGE2]
    runs["II only"] = run_variant(recipe, args.output / "stage2-only", common, [STAGE2])

    with_i, without = runs["I + II"]["stage2_losses"], runs["II only"]["stage2_losses"]
    window = max(1, min(5, len(with_i) // 4))
    summary = {
        "stage II first loss (I+II / II only)": with_i[0] / without[0],
        f"stage II mean of first {window} losses (ratio)": mean(with_i[:window]) / mean(without[:window]),
        f"stage II mean of last {window} losses at step {len(with_i)} (ratio)": mean(with_i[-window:])
        / mean(without[len(with_i) - window : len(with_i)]),
        f"II only: mean of last {window} losses at step {len(without)} vs I+II at step {len(with_i)} (ratio)": mean(
            without[-window:]
        )
        / mean(with_i[-window:]),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    plot({"stage I + stage II": with_i, "stage II only": without}, args.results / "stage2_loss.png")
    report: dict[str, Any] = {"quick": args.quick, "steps": both, "runs": runs, "summary": summary}
    if not args.no_eval:
        report["ndcg@10"] = evaluate(recipe, runs, args)
    print_report(report)
    (args.results / "anchor_ablation.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.results / 'anchor_ablation.json'} and {args.results / 'stage2_loss.png'}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    print("\n=== Anchor ablation (smollm2-135m) ===")
    for name, run in report["runs"].items():
        losses = run["stage2_losses"]
        span = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        print(f"{name:<8} stage II: {len(losses)} steps, {span}  [{run['seconds']} s]")
    for label, value in report["summary"].items():
        print(f"  {label}: {value:.3f}")
    scores = report.get("ndcg@10")
    if scores:
        datasets = list(next(iter(scores.values())))
        print(f"\n{'model':<18}" + "".join(f"{d:>10}" for d in datasets))
        for name, row in scores.items():
            print(f"{name:<18}" + "".join(f"{row[d]:10.4f}" for d in datasets))
        first, second = scores["I + II"], scores["II only"]
        ratios = [first[d] / second[d] if second[d] else float("nan") for d in datasets]
        print(f"{'I+II / II only':<18}" + "".join(f"{r:10.2f}" for r in ratios))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    raise SystemExit(main())
