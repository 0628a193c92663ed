"""The schema of a training recipe file: :class:`Recipe`, :class:`RecipeError` and the checks of its structure.

See :mod:`lmembed.training.recipes` for the layout. :func:`parse_recipe` checks the structure of a recipe (its
keys, stage types, prepare kinds, and the keys of each step's ``options`` and ``mine``, which must be ones the
converter and the miner take) before anything runs; the stage options themselves are checked by
:class:`~lmembed.training.train_config.TrainConfig` or :class:`~lmembed.training.train_config.ObjectiveConfig`
when the stage runs. :func:`apply_overrides` applies test/benchmark overrides. Nothing here runs a step.
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePath
from typing import Any

from lmembed.citations import CITATIONS, unknown_keys
from lmembed.errors import LmembedError
from lmembed.io import read_text
from lmembed.mining import mine_hard_negatives
from lmembed.schema import FileModel, KeyPath, Where, check_keys, read_yaml_file
from lmembed.synthesis.generators import GENERATOR_OPTIONS, check_generator
from lmembed.synthesis.recipes import find_recipe
from lmembed.training import converters as conv
from lmembed.training.rows import BATCHING_MODES
from lmembed.training.train_config import OBJECTIVE_NAMES, ObjectiveConfig, TrainConfig

# ``rerank``: the contrastive trainer training a reranker (TrainConfig.reranker; default cross-encoder).
STAGE_TYPES = ("contrastive", "rerank", *OBJECTIVE_NAMES)
TRAINER_STAGES = ("contrastive", "rerank")
PREPARE_KINDS = ("beir", "classification", "clustering", "sts", "pairs", "rows", "synthesize")
SPECIAL_OVERRIDES = ("model", "output", "teacher", "generator", "max_rows", "max_corpus")
#: A stage's or prepared data's name: it names a folder or file in the output folder, so it holds no '/' and does
#: not start with '.' (no '..', no hidden file).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
NAME_RULE = "letters, digits, '-', '_' or '.', not starting with '.'"


class RecipeError(LmembedError, ValueError):
    """A recipe file is malformed; the message names the recipe and, where it applies, the stage."""


@dataclass
class Recipe:
    """A parsed recipe file (see the module docstring)."""

    name: str
    model: str
    output: str
    stages: list[dict[str, Any]]
    prepare: list[dict[str, Any]] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)
    evaluate: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    paper: str = ""
    #: the recipe's papers (keys of lmembed.citations.CITATIONS): the trained model's card cites them
    cites: tuple[str, ...] = ()
    source: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # applied last, to stages that know the field
    #: the file and lines of the recipe's keys, for messages (``Where(source)`` without lines when built in code)
    where: Where | None = field(default=None, repr=False, compare=False)


# ---------------------------------------------------------------------------------------------- loading
class RecipeFile(FileModel):
    """The top level of a recipe file (see :mod:`lmembed.training.recipes`); :func:`parse_recipe` checks the
    values: stages and prepare steps below, stage options when the stage runs."""

    name: Any = None
    description: Any = None
    paper: Any = None
    cites: Any = None
    model: Any = None
    output: Any = None
    defaults: Any = None
    prepare: Any = None
    stages: Any = None
    evaluate: Any = None  # free-form; read by bench/recipes_table.py


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    data, lines = read_yaml_file(path, RecipeError, read_text(path))
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping with 'model', 'stages' ...")
    return data, lines


def _check_stage(where: str, stage: Any, seen: set[str]) -> None:
    if not isinstance(stage, dict):
        raise RecipeError(f"{where}: a stage must be a mapping")
    name = stage.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RecipeError(f"{where}: every stage needs a 'name' of {NAME_RULE} (it names a folder)")
    if name in seen:
        raise RecipeError(f"{where}: stage name {name!r} is used twice")
    seen.add(name)
    if stage.get("type", "contrastive") not in STAGE_TYPES:
        raise RecipeError(f"{where}: stage type {stage.get('type')!r} is unknown; choose one of {STAGE_TYPES}")
    if stage.get("batching", "blended") not in BATCHING_MODES:
        raise RecipeError(f"{where}: batching {stage['batching']!r} is unknown; choose one of {BATCHING_MODES}")


def _check_prepare(where: Where, index: int, step: Any, seen: set[str]) -> None:
    path: KeyPath = ("prepare", index)
    label = f"{where.at(path)}: prepare step {index + 1}"
    if not isinstance(step, dict) or not isinstance(step.get("name"), str):
        raise RecipeError(f"{label}: a prepare step is a mapping with a 'name'")
    if not NAME.fullmatch(step["name"]):
        raise RecipeError(
            f"{where.at((*path, 'name'))}: prepare step {index + 1}: name {step['name']!r} must be {NAME_RULE} "
            "(it names a file in the output folder)"
        )
    if step["name"] in seen:
        raise RecipeError(f"{label}: prepared data name {step['name']!r} is used twice")
    chosen = step.get("output")
    if chosen is not None and (
        not isinstance(chosen, str)
        or PurePath(chosen).is_absolute()
        or chosen.startswith("~")
        or ".." in PurePath(chosen.replace("\\", "/")).parts
    ):
        raise RecipeError(
            f"{where.at((*path, 'output'))}: prepare step {index + 1}: prepare.output={chosen!r} must be a file "
            "name inside the recipe's output/data folder"
        )
    seen.add(step["name"])
    if step.get("kind") not in PREPARE_KINDS:
        raise RecipeError(f"{label}: kind {step.get('kind')!r} is unknown; choose one of {PREPARE_KINDS}")
    if step["kind"] == "synthesize":
        _check_synthesize(label, step)
    elif "input" not in step:
        raise RecipeError(f"{label}: a prepare step needs an 'input'")
    _check_step_values(where, index, step)


class SynthesizeStepFile(FileModel):
    """The keys a ``synthesize`` prepare step reads: the common ones (``name``, ``kind``, ``output``,
    ``max_rows``, ``seed``, ``mine``, ``options``: the generator's options) and its own."""

    name: Any = None
    kind: Any = None
    output: Any = None
    max_rows: Any = None
    seed: Any = None
    mine: Any = None
    options: Any = None
    recipe: Any = None  # a synthesis recipe file or name
    generator: Any = None
    input: Any = None
    embedder: Any = None
    embedder_options: Any = None
    limit: Any = None
    corpus_limit: Any = None
    shard_size: Any = None


def _check_synthesize(where: str, step: dict[str, Any]) -> None:
    """A synthesize step names a synthesis recipe that exists and a generator; its keys are known."""
    _refuse_unknown(where, "synthesize step", step, set(SynthesizeStepFile.model_fields))
    for key in ("recipe", "generator"):
        if not isinstance(step.get(key), str) or not step[key]:
            raise RecipeError(f"{where}: a synthesize step needs '{key}'")
    try:
        find_recipe(step["recipe"])
        check_generator(step["generator"], models=False)  # its form; the model is looked up when the step runs
    except LmembedError as exc:
        raise RecipeError(f"{where}: {exc}") from exc
    for key in ("limit", "corpus_limit", "shard_size"):
        value = step.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RecipeError(f"{where}: {key} must be a whole number >= 1, got {value!r}")


#: Each prepare kind's converter; a step's ``options`` go to it, beside the arguments the recipe passes itself.
_CONVERTERS = {
    "beir": conv.beir_rows,
    "classification": conv.classification_rows,
    "clustering": conv.clustering_rows,
    "sts": conv.sts_rows,
    "pairs": conv.pair_rows,
}
_PASSED = {"instruction", "task", "max_rows", "seed"}
_PASSED_BY_KIND = {"beir": {"split"}, "sts": {"teacher", "num_negatives", "mining"}}
#: The keys of a step's ``mine`` the recipe reads itself (the others go to :func:`mine_hard_negatives`).
_MINE_OWN = {"teacher", "teacher_options", "corpus", "max_corpus"}


def _keywords(function: Any) -> set[str]:
    """The parameters of ``function`` that can be given by name, but its first (the data)."""
    params = list(inspect.signature(function).parameters.values())[1:]
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


#: A prepare step's numbers (a key path in the step) and the smallest value each takes.
_STEP_NUMBERS: dict[tuple[str, ...], int] = {
    ("seed",): 0,
    ("max_rows",): 1,
    ("mine", "k"): 1,
    ("mine", "max_corpus"): 1,
}


def _check_step_values(file: Where, index: int, step: dict[str, Any]) -> None:
    """A prepare step's numbers are whole numbers in range and its ``options``/``mine`` keys are ones the converter
    and the miner take (found here, naming the step, rather than as a TypeError when the step runs)."""
    where = f"{file.at(('prepare', index))}: prepare step {index + 1}"
    mine = step.get("mine")
    for key, minimum in _STEP_NUMBERS.items():
        holder = mine if key[0] == "mine" else step
        value = holder.get(key[-1]) if isinstance(holder, dict) else None
        if value is None:
            continue
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            number = None
        named = f"{file.at(('prepare', index, *key))}: prepare step {index + 1}: {'.'.join(key)}"
        if number is None or isinstance(value, bool) or (isinstance(value, float) and value != number):
            raise RecipeError(f"{named} must be a whole number, got {value!r}")
        if number < minimum:
            raise RecipeError(f"{named} must be >= {minimum}, got {value!r}")
    options = step.get("options") or {}
    if not isinstance(options, dict):
        raise RecipeError(f"{where}: options must be a mapping")
    converter = _CONVERTERS.get(step["kind"])
    passed = _PASSED | _PASSED_BY_KIND.get(step["kind"], set())
    if step["kind"] == "synthesize":
        known = set(GENERATOR_OPTIONS - {"budget"}) | {"max_requests", "max_tokens"}
    else:
        known = _keywords(converter) - passed if converter else set()
    _refuse_unknown(where, "options", options, known)
    if isinstance(mine, dict):
        _refuse_unknown(where, "mine", mine, _keywords(mine_hard_negatives) - {"rows", "corpus", "stats"} | _MINE_OWN)


def _refuse_unknown(where: str, what: str, given: Mapping[str, Any], known: set[str]) -> None:
    if unknown := sorted(set(given) - known):
        known_keys = ", ".join(sorted(known)) or "none"
        raise RecipeError(f"{where}: {what}: unknown key(s) {', '.join(unknown)}; known: {known_keys}")


def parse_recipe(
    data: Mapping[str, Any],
    source: Path | None = None,
    lines: Mapping[KeyPath, int] | None = None,
    *,
    where: Where | None = None,
) -> Recipe:
    """Validate the structure of a recipe mapping (stage options are checked by
    :func:`lmembed.training.recipes.check_stages`); ``lines`` (from :func:`lmembed.schema.load_yaml_with_lines`)
    put the line of each mistake in its message; ``where`` replaces ``source`` and ``lines`` for a recipe inside
    another file (an experiment's arm), raising :class:`RecipeError`."""
    where = where or Where(str(source or "recipe"), lines, RecipeError)
    check_keys(RecipeFile, data, where, (), "top-level")
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise RecipeError(f"{where.at(('stages',))}: 'stages' must be a non-empty list")
    names: set[str] = set()
    for i, stage in enumerate(stages):
        _check_stage(f"{where.at(('stages', i))}: stage {i + 1}", stage, names)
    prepared: set[str] = set()
    steps = data.get("prepare") or []
    if not isinstance(steps, list):
        raise RecipeError(f"{where.at(('prepare',))}: 'prepare' must be a list of steps")
    for i, step in enumerate(steps):
        _check_prepare(where, i, step, prepared)
    for key in ("defaults", "evaluate"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RecipeError(f"{where.at((key,))}: '{key}' must be a mapping")
    if not data.get("model") and not stages[0].get("model"):
        raise RecipeError(f"{where.at(('model',))}: no 'model' given")
    name = str(data.get("name") or (source.stem if source else "recipe"))
    cites = data.get("cites") or []
    if not isinstance(cites, list) or not all(isinstance(c, str) for c in cites):
        raise RecipeError(f"{where.at(('cites',))}: 'cites' must be a list of citation keys")
    if unknown := unknown_keys(cites):
        raise RecipeError(
            f"{where.at(('cites',))}: 'cites' names {', '.join(unknown)}, which lmembed.citations does not hold "
            f"(it holds {', '.join(CITATIONS)})"
        )
    return Recipe(
        name=name,
        model=str(data.get("model") or ""),
        output=str(data.get("output") or f"runs/recipes/{name}"),
        stages=copy.deepcopy(list(stages)),
        prepare=copy.deepcopy(list(data.get("prepare") or [])),
        defaults=dict(data.get("defaults") or {}),
        evaluate=dict(data.get("evaluate") or {}),
        description=str(data.get("description") or ""),
        paper=str(data.get("paper") or ""),
        cites=tuple(cites),
        source=source,
        where=where,
    )


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe YAML file."""
    path = Path(path)
    if not path.exists():
        raise RecipeError(f"recipe {path} does not exist")
    data, lines = _read_yaml(path)
    return parse_recipe(data, path, lines)


def apply_overrides(recipe: Recipe, overrides: Mapping[str, Any] | None) -> Recipe:
    """A copy of ``recipe`` with test/benchmark overrides applied (see the module docstring)."""
    if not overrides:
        return recipe
    recipe = copy.deepcopy(recipe)
    extra = {k: v for k, v in overrides.items() if k not in SPECIAL_OVERRIDES}
    if overrides.get("model"):
        recipe.model = str(overrides["model"])
        recipe.stages[0].pop("model", None)
    if overrides.get("output"):
        recipe.output = str(overrides["output"])
    for step in recipe.prepare:
        if overrides.get("max_rows") is not None:
            step["max_rows"] = min(int(overrides["max_rows"]), int(step.get("max_rows") or 1 << 62))
        if overrides.get("teacher") and isinstance(step.get("mine"), dict):
            step["mine"]["teacher"] = str(overrides["teacher"])
        if step.get("kind") == "synthesize":
            _override_synthesis(step, overrides)
        if overrides.get("max_corpus") is not None and isinstance(step.get("mine"), dict):
            step["mine"]["max_corpus"] = int(overrides["max_corpus"])
    unknown = sorted(set(extra) - stage_option_names(TrainConfig) - stage_option_names(ObjectiveConfig))
    if unknown:
        raise RecipeError(f"override(s) {', '.join(unknown)} match no stage option")
    kinds = {stage.get("type", "contrastive") for stage in recipe.stages}
    taken = set().union(
        *(stage_option_names(TrainConfig if kind in TRAINER_STAGES else ObjectiveConfig) for kind in kinds)
    )
    if untaken := sorted(set(extra) - taken):  # an option of another kind of stage: it would change nothing here
        stages = ", ".join(f"{stage['name']} ({stage.get('type', 'contrastive')})" for stage in recipe.stages)
        error = RecipeError(f"override(s) {', '.join(untaken)}: no stage of this recipe takes it (stages: {stages})")
        error.option = untaken[0]  # type: ignore[attr-defined]  # the caller knows where it gave it
        raise error
    recipe.overrides.update(extra)
    return recipe


def _override_synthesis(step: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """A synthesize step's generator, embedder (the teacher) and seed passages, as the overrides say."""
    if overrides.get("generator"):
        step["generator"] = str(overrides["generator"])
    if overrides.get("teacher") and step.get("embedder"):
        step["embedder"] = str(overrides["teacher"])
    if overrides.get("max_corpus") is not None:
        step["corpus_limit"] = min(int(overrides["max_corpus"]), int(step.get("corpus_limit") or 1 << 62))


def stage_option_names(config_class: type) -> set[str]:
    """The option names of a stage's config class."""
    return {f.name for f in fields(config_class)}


__all__ = [
    "PREPARE_KINDS",
    "SPECIAL_OVERRIDES",
    "STAGE_TYPES",
    "TRAINER_STAGES",
    "Recipe",
    "RecipeError",
    "RecipeFile",
    "SynthesizeStepFile",
    "apply_overrides",
    "load_recipe",
    "parse_recipe",
    "stage_option_names",
]
