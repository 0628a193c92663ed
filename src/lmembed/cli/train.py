"""``lmembed train``: contrastive training, or a published recipe, from the command line.

Every option maps to a :class:`~lmembed.training.train_config.TrainConfig` field. ``--config FILE``
reads a YAML file of such fields first; options given on the command line override it. Examples::

    lmembed train --model smollm2-135m --data train.jsonl --pooling mean --attention bidirectional \\
        --lora --loss infonce --batch-size 32 --steps 500 --output runs/smollm2
    lmembed train --config run.yaml --resume
    lmembed train --reranker cross-encoder --model minilm --data mined.jsonl --loss listwise_softmax \
        --num-negatives 7 --max-length 256 --lr 3e-5 --output runs/ce   # a reranker, same loop
    lmembed train --recipe recipes/nv-embed-two-stage.yaml --steps 20 --output runs/nv   # options override stages
    accelerate launch --num_processes 2 -m lmembed.cli.train --config run.yaml   # data parallel

``python -m lmembed.cli.train`` runs the command on its own (what ``accelerate launch`` needs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from lmembed.cli.boundary import GuardedCommand
from lmembed.cli.options import ATTENTION_DOC, DEVICE_DOC, POOLING_DOC, check_writable
from lmembed.training.recipes import RecipeError, run_recipe
from lmembed.training.rows import DataSource
from lmembed.training.train_config import TrainConfig, TrainConfigError


def _opt(help_text: str, *names: str) -> Any:
    return typer.Option(*names, help=help_text)


def train(
    model: Annotated[str | None, _opt("Bundled name, local directory or Hub id.", "--model", "-m")] = None,
    data: Annotated[
        list[str] | None, _opt("Training JSONL file or BEIR folder; repeat to mix datasets.", "--data")
    ] = None,
    weight: Annotated[
        list[float] | None, _opt("Sampling weight per --data, in the same order (default: uniform).", "--weight")
    ] = None,
    instruction: Annotated[str | None, _opt("Instruction for query rows that carry none.", "--instruction")] = None,
    pooling: Annotated[str | None, _opt(POOLING_DOC, "--pooling")] = None,
    attention: Annotated[str | None, _opt(ATTENTION_DOC, "--attention")] = None,
    max_length: Annotated[int | None, _opt("Truncate texts to this many tokens.", "--max-length")] = None,
    lora: Annotated[
        bool | None, _opt("LoRA adapters or full fine-tuning (default: LoRA for decoders).", "--lora/--no-lora")
    ] = None,
    lora_r: Annotated[int | None, _opt("LoRA rank (16).", "--lora-r")] = None,
    lora_alpha: Annotated[int | None, _opt("LoRA alpha (32).", "--lora-alpha")] = None,
    lora_dropout: Annotated[float | None, _opt("LoRA dropout (0.1).", "--lora-dropout")] = None,
    lora_targets: Annotated[
        str | None, _opt("Comma list of module names for LoRA, or 'all-linear' (default).", "--lora-targets")
    ] = None,
    merge_lora: Annotated[
        bool | None, _opt("Save with LoRA merged (default) or keep the adapter.", "--merge-lora/--keep-adapter")
    ] = None,
    gradient_checkpointing: Annotated[
        bool | None, _opt("Recompute activations in backward to save memory.", "--gradient-checkpointing")
    ] = None,
    dtype: Annotated[str | None, _opt("Weights dtype: float32 or bfloat16 (autocast).", "--dtype")] = None,
    device: Annotated[str | None, _opt(DEVICE_DOC + " Default: cpu.", "--device")] = None,
    reranker: Annotated[
        str | None,
        _opt(
            "Train the model as a reranker: cross-encoder, llm (yes/no prompt) or auto (by its folder); each row's "
            "positive and --num-negatives negatives are scored with its query (use a reranker --loss).",
            "--reranker",
        ),
    ] = None,
    loss: Annotated[
        str | None,
        _opt(
            "infonce (default), triplet, gte, matryoshka; margin_mse or distill_kl distil the rows' teacher_scores; "
            "a reranker: listwise_softmax or pointwise_bce.",
            "--loss",
        ),
    ] = None,
    temperature: Annotated[
        float | None, _opt("Temperature (default: the loss's, InfoNCE 0.02).", "--temperature")
    ] = None,
    similarity: Annotated[str | None, _opt("cos or dot.", "--similarity")] = None,
    num_negatives: Annotated[int | None, _opt("Hard negatives per query (1).", "--num-negatives")] = None,
    batch_size: Annotated[int | None, _opt("Global batch size (32).", "--batch-size")] = None,
    grad_cache_chunk: Annotated[
        int | None, _opt("Use GradCache with chunks of this many rows.", "--grad-cache-chunk")
    ] = None,
    steps: Annotated[int | None, _opt("Optimisation steps (1000).", "--steps")] = None,
    lr: Annotated[float | None, _opt("Peak learning rate (2e-5).", "--lr")] = None,
    weight_decay: Annotated[float | None, _opt("AdamW weight decay (0.01).", "--weight-decay")] = None,
    warmup_steps: Annotated[int | None, _opt("Linear warm-up steps (50).", "--warmup-steps")] = None,
    max_grad_norm: Annotated[float | None, _opt("Gradient clipping norm (1.0).", "--max-grad-norm")] = None,
    seed: Annotated[int | None, _opt("Random seed (42).", "--seed")] = None,
    batching: Annotated[
        str | None, _opt("blended (rows of all datasets; default) or homogeneous (one per batch).", "--batching")
    ] = None,
    skip_invalid: Annotated[
        bool | None, _opt("Skip (and count) invalid rows instead of stopping.", "--skip-invalid")
    ] = None,
    decontaminate_against: Annotated[
        str | None,
        _opt(
            "Comma list of evaluation sets (scifact,nfcorpus): drop rows whose query or positive repeats their "
            "items (exact, n-gram, near-duplicate, BM25); the report goes to the output folder.",
            "--decontaminate-against",
        ),
    ] = None,
    save_every: Annotated[int | None, _opt("Checkpoint every N steps (0: off).", "--save-every")] = None,
    eval_data: Annotated[
        list[str] | None, _opt("BEIR folder or dataset name for dev nDCG@10; repeatable.", "--eval-data")
    ] = None,
    eval_every: Annotated[int | None, _opt("Evaluate every N steps (0: off).", "--eval-every")] = None,
    eval_split: Annotated[str | None, _opt("Split of the dev sets (test).", "--eval-split")] = None,
    eval_max_queries: Annotated[int | None, _opt("Evaluate on at most N queries.", "--eval-max-queries")] = None,
    eval_max_docs: Annotated[int | None, _opt("Shrink dev corpora to N documents.", "--eval-max-docs")] = None,
    output: Annotated[str | None, _opt("Output folder (runs/train).", "--output", "-o")] = None,
    resume: Annotated[bool | None, _opt("Continue from the newest checkpoint in --output.", "--resume")] = None,
    progress: Annotated[bool | None, _opt("Show a progress bar.", "--progress/--no-progress")] = None,
    config: Annotated[Path | None, _opt("YAML file with training options.", "--config")] = None,
    recipe: Annotated[
        Path | None, _opt("A multi-stage recipe YAML (see recipes/); runs every stage end to end.", "--recipe")
    ] = None,
) -> None:
    """Train an embedding model contrastively (InfoNCE with in-batch negatives by default), a reranker
    (--reranker), or run a published recipe with --recipe (other options given then override every stage that
    has them)."""
    options = dict(locals())
    config_file = options.pop("config")
    recipe_file = options.pop("recipe")
    if recipe_file is not None:
        if options.get("output"):
            check_writable(Path(options["output"]), "--output", folder=True)
        _run_recipe(recipe_file, {k: v for k, v in options.items() if v is not None})
        return

    cfg = build_config(config_file, options)  # a bad value is reported by the CLI's error boundary
    check_writable(Path(cfg.output), "--output", folder=True)
    from lmembed.training.trainer import Trainer  # lazy: torch loads only when training runs

    result = Trainer(cfg).train()
    if result.model_dir is not None:
        Console(stderr=True).print(f"trained model: {result.model_dir}  (steps {result.start_step}→{result.end_step})")


def _run_recipe(path: Path, overrides: dict[str, Any]) -> None:
    not_for_recipes = sorted({"data", "weight", "instruction", "lora_targets", "resume"} & set(overrides))
    if not_for_recipes:
        names = ", ".join("--" + n.replace("_", "-") for n in not_for_recipes)
        raise typer.BadParameter(f"{names} cannot be combined with --recipe (the recipe names its own data)")
    try:
        result = run_recipe(path, overrides=overrides)
    except RecipeError as exc:
        raise typer.BadParameter(f"--recipe {path}: {exc}") from exc
    Console(stderr=True).print(f"recipe {path} finished: {result}")


def build_config(config_file: Path | None, options: dict[str, Any]) -> TrainConfig:
    """Merge a YAML file (if any) with command-line options that were given."""
    base = TrainConfig.from_yaml(config_file) if config_file else TrainConfig()
    options = dict(options)
    data, weights, instruction = options.pop("data"), options.pop("weight"), options.pop("instruction")
    targets = options.pop("lora_targets")
    if targets:
        options["lora_target_modules"] = targets if targets == "all-linear" else [t.strip() for t in targets.split(",")]
    if data:
        if weights and len(weights) != len(data):
            raise TrainConfigError(f"{len(weights)} --weight values for {len(data)} --data sources")
        options["data"] = [
            DataSource(path=p, weight=weights[i] if weights else None, instruction=instruction)
            for i, p in enumerate(data)
        ]
    elif weights or instruction:
        raise TrainConfigError("--weight/--instruction apply to --data sources given on the command line")
    cfg = base.updated(**options)
    cfg.check_ready()
    return cfg


def main() -> None:
    """Run ``train`` as a stand-alone program (``python -m lmembed.cli.train ...``), inside the error boundary."""
    standalone = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    standalone.command(cls=GuardedCommand)(train)
    standalone()


if __name__ == "__main__":
    main()
