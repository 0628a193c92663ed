"""Bench: does a GRIT-trained model still generate? Perplexity against the base model and an embedding-only run.

GRIT (``recipes/grit.yaml``) trains one decoder with a contrastive loss (bidirectional attention) and a
next-token loss (causal attention). Contrastive training alone moves the weights away from language
modelling; the generative loss should keep them close. This bench trains two arms from the recipe on the
same data, steps and seed:

* **grit**: the recipe as written (both losses summed every step);
* **embedding-only**: the same stage with ``generative_weight: 0`` (no generative pass at all);

and scores them and the untrained base model with causal attention on held-out text:

* ``ppl_answers``: perplexity of held-out NLI entailment hypotheses given their premise, in the recipe's
  ``<|user|> ... <|assistant|>`` format (rows not in the prepared training file);
* ``ppl_plain``: perplexity of plain held-out sentences (STS-B test, first sentences), no format.

It also reports STS-B test Spearman of the embeddings (first ``--sts-pairs`` pairs, instruction-free,
the GritLM format's ``<|embed|>`` prefix) so that the two trained arms can be compared as embedders too.

    python bench/grit_perplexity.py --quick        # 2 steps, tiny data: checks the pipeline
    python bench/grit_perplexity.py                # the recipe's CPU-sized run (40 steps)
    python bench/grit_perplexity.py --steps 10 --batch-size 4 --held-out 60 --sts-pairs 100   # a busy 2-core box
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

from _common import REPO, read_jsonl, shared_or_exit

RECIPE = REPO / "recipes" / "grit.yaml"
STAGE = "grit"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 steps, 16 rows, 20 held-out texts")
    parser.add_argument("--steps", type=int, default=None, help="training steps per arm (default: the recipe's)")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size per arm (default: the recipe's)")
    parser.add_argument("--held-out", type=int, default=200, help="held-out texts per perplexity set")
    parser.add_argument("--sts-pairs", type=int, default=300, help="STS-B test pairs for the embedding check")
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "bench-grit")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results" / "grit-perplexity.json")
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def train_arm(recipe: Any, name: str, output: Path, overrides: dict[str, Any], weight: float) -> dict[str, Any]:
    from lmembed.training.recipes import run_recipe

    arm = copy.deepcopy(recipe)
    for stage in arm.stages:
        stage["generative_weight"] = weight
    started = time.perf_counter()
    result = run_recipe(arm, overrides={**overrides, "output": str(output / name)})
    records = [json.loads(line) for line in (output / name / STAGE / "metrics.jsonl").read_text().splitlines()]
    return {
        "model_dir": str(result.model_dir),
        "seconds": round(time.perf_counter() - started, 1),
        "first_loss": records[0].get("loss"),
        "last_loss": records[-1].get("loss"),
        "last_embedding_loss": records[-1].get("loss_embedding"),
        "last_generative_loss": records[-1].get("loss_generative"),
    }


def held_out_answers(prepared: Path, count: int) -> tuple[list[str], list[str]]:
    """Entailment pairs whose premise is not among the prepared (training) generative rows."""
    used = {row["query"] for row in read_jsonl(prepared)}
    rows = [r for r in read_jsonl(shared_or_exit("training/nli_entailment_pairs.jsonl")) if r["anchor"] not in used]
    rows = rows[-count:]
    return [r["anchor"] for r in rows], [r["positive"] for r in rows]


def sts_pairs(count: int) -> tuple[list[str], list[str], list[float]]:
    rows = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"), count)
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [float(r["score"]) for r in rows]


def score(embedder: Any, template: str, answers: tuple[list[str], list[str]], sts: tuple) -> dict[str, float]:
    import numpy as np
    from scipy.stats import spearmanr

    from lmembed.training.stages.generative import perplexity

    prompts, texts = answers
    first, second, gold = sts
    a, b = embedder.encode(first), embedder.encode(second)
    cosine = (np.asarray(a) * np.asarray(b)).sum(axis=1)
    return {
        "ppl_answers": round(perplexity(embedder, texts, prompts=prompts, template=template), 3),
        "ppl_plain": round(perplexity(embedder, first), 3),
        "sts_spearman": round(float(spearmanr(cosine, gold).statistic) * 100, 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from lmembed import Embedder
    from lmembed.training.recipes import load_recipe
    from lmembed.training.stages.grit import EMBED_PREFIX, EMBED_TEMPLATE

    torch.set_num_threads(args.threads)
    recipe = load_recipe(RECIPE)
    overrides: dict[str, Any] = {}
    if args.quick:
        overrides = {"steps": 2, "max_rows": 16, "batch_size": 4}
        args.held_out, args.sts_pairs = 20, 20
    if args.steps:
        overrides["steps"] = args.steps
    if args.batch_size:
        overrides["batch_size"] = args.batch_size
    arms = {
        "grit": train_arm(recipe, "grit", args.output, overrides, 1.0),
        "embedding-only": train_arm(recipe, "embedding-only", args.output, overrides, 0.0),
    }
    stage = recipe.stages[0]
    template = stage["generation_template"]
    answers = held_out_answers(args.output / "grit" / "data" / "nli_generation.jsonl", args.held_out)
    sts = sts_pairs(args.sts_pairs)
    strategy = recipe.defaults
    base = Embedder.from_pretrained(
        recipe.model,
        pooling=strategy["pooling"],
        attention=strategy["attention"],
        max_length=strategy["max_length"],
        instruction_template=EMBED_TEMPLATE,
        plain_prefix=EMBED_PREFIX,
        cache=False,
        show_progress=False,
    )
    scores = {"base (untrained)": score(base, template, answers, sts)}
    for name, arm in arms.items():
        model = Embedder.from_pretrained(arm["model_dir"], cache=False, show_progress=False)
        scores[name] = {**score(model, template, answers, sts), **{k: v for k, v in arm.items() if k != "model_dir"}}
    report = {
        "recipe": str(RECIPE.relative_to(REPO)),
        "model": recipe.model,
        "steps": overrides.get("steps", stage.get("steps")),
        "batch_size": overrides.get("batch_size", recipe.defaults.get("batch_size")),
        "held_out_answers": len(answers[1]),
        "plain_texts": len(sts[0]),
        "sts_pairs": len(sts[0]),
        "scores": scores,
    }
    print(json.dumps(report, indent=2))
    if not args.quick:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
