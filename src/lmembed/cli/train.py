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

import dataclasses
import inspect
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from lmembed import terminal
from lmembed.cli.boundary import GuardedCommand
from lmembed.cli.options import check_writable
from lmembed.options import Flag, flags_of, parse_targets
from lmembed.training.rows import DataSource
from lmembed.training.train_config import TrainConfig, TrainConfigError, option_key

#: The options of ``lmembed train`` that are no TrainConfig field: how the ``--data`` sources are weighted and
#: instructed (given after ``--data``), and where the options come from (given last).
_SOURCE_OPTIONS = {
    "weight": Annotated[
        list[float] | None,
        typer.Option("--weight", help="Sampling weight per --data, in the same order (default: uniform)."),
    ],
    "instruction": Annotated[
        str | None, typer.Option("--instruction", help="Instruction for query rows that carry none.")
    ],
}
_FILE_OPTIONS = {
    "config": Annotated[Path | None, typer.Option("--config", help="YAML file with training options.")],
    "recipe": Annotated[
        Path | None,
        typer.Option("--recipe", help="A multi-stage recipe YAML (see recipes/); runs every stage end to end."),
    ],
}


def _param_name(spec: Flag) -> str:
    """The command's parameter for a flag: ``--lora-targets`` → ``lora_targets``."""
    return spec.name.lstrip("-").replace("-", "_")


def _shown_default(spec: Flag, default: Any) -> str | bool:
    """What ``--help`` shows as a field's default (its TrainConfig value; a value the command line does not give
    leaves a --config file's value in place, :func:`_given_only`), or False for none to show."""
    if isinstance(default, bool):
        if "/" in spec.decls[0]:  # --merge-lora/--keep-adapter: the flag that is on
            on, off = spec.decls[0].split("/")
            return on if default else off
        return False
    if default is None or default == [] or default == "":
        return False
    return str(default)


def _parameters() -> list[inspect.Parameter]:
    """The command's options: every TrainConfig field that carries a flag (in field order, the --data
    sources' own options after --data), then --config and --recipe."""
    defaults = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(TrainConfig)
    }
    hints = get_type_hints(TrainConfig)
    annotations: dict[str, Any] = {}
    offered: dict[str, Any] = {}
    for name, spec in flags_of(TrainConfig).items():
        kind = spec.cli_type if spec.cli_type is not None else hints[name] | None
        extra = {} if spec.min is None else {"min": spec.min}
        shown = _shown_default(spec, defaults[name])
        option = typer.Option(*spec.decls, help=spec.help, show_default=shown is not False, **extra)
        annotations[_param_name(spec)] = Annotated[kind, option]
        if shown is not False:  # --help shows it as every command shows a default; train() drops it unless given
            offered[_param_name(spec)] = defaults[name]
        if name == "data":
            annotations.update(_SOURCE_OPTIONS)
    annotations.update(_FILE_OPTIONS)
    keyword = inspect.Parameter.KEYWORD_ONLY
    context = inspect.Parameter("ctx", keyword, annotation=typer.Context)  # which values were given
    return [context] + [
        inspect.Parameter(name, keyword, default=offered.get(name), annotation=kind)
        for name, kind in annotations.items()
    ]


def _given_only(ctx: typer.Context | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with every value the command line did not give set to None (a default shown by --help must not
    override a --config file's value)."""
    if ctx is None:
        return options

    def given(name: str) -> bool:  # typer's own click: its ParameterSource, compared by name
        source = ctx.get_parameter_source(name)
        return source is not None and source.name != "DEFAULT"

    return {k: v if given(k) else None for k, v in options.items()}


def train(ctx: typer.Context | None = None, **options: Any) -> None:
    """Train an embedding model contrastively (InfoNCE with in-batch negatives by default), a reranker
    (--reranker), or run a published recipe with --recipe (other options given then override every stage that
    has them)."""
    options = _given_only(ctx, options)
    config_file = options.pop("config")
    recipe_file = options.pop("recipe")
    if recipe_file is not None:
        if config_file is not None:
            raise typer.BadParameter(
                "a recipe sets every stage's options; --config (a training run's file) is not read with it: give "
                "one, or the options to change as flags",
                param_hint="--config",
            )
        if options.get("output"):
            check_writable(Path(options["output"]), "--output", folder=True)
        _run_recipe(recipe_file, {k: v for k, v in options.items() if v is not None})
        return

    cfg = build_config(config_file, options)  # a bad value is reported by the CLI's error boundary
    check_writable(Path(cfg.output), "--output", folder=True)
    from lmembed.training.trainer import Trainer  # lazy: torch loads only when training runs

    result = Trainer(cfg).train()
    if result.model_dir is not None:
        terminal.console(stderr=True).print(
            f"trained model: {result.model_dir}  (steps {result.start_step}→{result.end_step})"
        )


_PARAMETERS = _parameters()
train.__signature__ = inspect.Signature(_PARAMETERS)  # type: ignore[attr-defined]
train.__annotations__ = {p.name: p.annotation for p in _PARAMETERS} | {"return": None}


def _run_recipe(path: Path, overrides: dict[str, Any]) -> None:
    not_for_recipes = sorted({"data", "weight", "instruction", "lora_targets", "resume"} & set(overrides))
    if not_for_recipes:
        names = ", ".join("--" + n.replace("_", "-") for n in not_for_recipes)
        raise typer.BadParameter(f"{names} cannot be combined with --recipe (the recipe names its own data)")
    from lmembed.training.recipes import RecipeError, run_recipe  # lazy: the recipe runner is not needed for --help

    try:
        result = run_recipe(path, overrides=overrides)
    except RecipeError as exc:
        option = getattr(exc, "option", None)  # a stage refused an option given here
        spec = flags_of(TrainConfig).get(option) if option else None
        message = str(exc) if str(exc).startswith(str(path)) else f"--recipe {path}: {exc}"
        if spec is not None:
            raise typer.BadParameter(message, param_hint=spec.name) from exc
        raise typer.BadParameter(message) from exc
    console = terminal.console(stderr=True)
    console.print(f"recipe {result.name} finished in {result.output}:")
    for stage in result.stages:
        known = stage.first_loss is not None and stage.last_loss is not None
        loss = f", loss {stage.first_loss:.4f} -> {stage.last_loss:.4f}" if known else ""
        console.print(f"  {stage.name} ({stage.type}): {stage.steps} steps in {stage.seconds:.0f} s{loss}")
    console.print(f"model: {result.model_dir}")


def build_config(config_file: Path | None, options: dict[str, Any]) -> TrainConfig:
    """Merge a YAML file (if any) with command-line options that were given."""
    base = TrainConfig.from_yaml(config_file) if config_file else TrainConfig()
    options = dict(options)
    data, weights, instruction = options.pop("data"), options.pop("weight"), options.pop("instruction")
    targets = options.pop("lora_targets")
    if targets:
        options["lora_target_modules"] = parse_targets(targets)
    if data:
        if weights and len(weights) != len(data):
            raise TrainConfigError(f"{len(weights)} --weight values for {len(data)} --data sources")
        options["data"] = [
            DataSource(path=p, weight=weights[i] if weights else None, instruction=instruction)
            for i, p in enumerate(data)
        ]
    elif weights or instruction:
        raise TrainConfigError("--weight/--instruction apply to --data sources given on the command line")
    try:
        cfg = base.updated(**options)
    except TrainConfigError as exc:  # a value given on the command line is named by its flag
        flag = given_flag(option_key(str(exc)), options, weights)
        if flag is None:
            raise
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    cfg.check_ready()
    return cfg


def given_flag(key: tuple[str | int, ...], options: dict[str, Any], weights: list[float] | None) -> str | None:
    """The flag of the option at ``key`` (a TrainConfig field an error names) when the command line gave it."""
    if not key:
        return None
    if key[0] == "data" and key[-1] == "weight":
        return "--weight" if weights else None
    spec = flags_of(TrainConfig).get(str(key[0]))
    return spec.name if spec is not None and options.get(str(key[0])) is not None else None


def main() -> None:
    """Run ``train`` as a stand-alone program (``python -m lmembed.cli.train ...``), inside the error boundary."""
    standalone = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    standalone.command(cls=GuardedCommand)(train)
    standalone()


if __name__ == "__main__":
    main()
