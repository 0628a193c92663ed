"""Declarative training recipes: a YAML file of data-preparation steps and training stages.

A recipe reproduces a published training procedure as a sequence of stages, each one either a
contrastive trainer run (:class:`~lmembed.training.train_config.TrainConfig`) or a pre-training
stage (:mod:`lmembed.training.stages`, set by an :class:`~lmembed.training.train_config.ObjectiveConfig`:
``mntp``, ``simcse``, ``anchor``, ``angle``, ``grit``). Every stage starts from the model the previous stage
saved, with a fresh optimizer (NV-Embed restarts it between its stages). Layout::

    name: nv-embed-two-stage
    model: smollm2-135m                 # the first stage's model
    output: runs/recipes/nv-embed       # each stage writes <output>/<stage name>/
    defaults: {pooling: mean, ...}      # merged into every stage (only the fields a stage knows)
    prepare:                            # optional; run first, each writes one JSONL file
      - name: scifact
        kind: beir                      # beir | classification | clustering | sts | pairs | rows
        input: beir/scifact             # a path, or a dataset name / path under shared/datasets
        instruction: "Given a scientific claim, ..."   # sts: NV-Embed's STS one unless given ("": none)
        mine: {teacher: minilm, k: 7, method: perc_pos, margin: 0.95}   # optional
    stages:
      - name: stage1
        type: contrastive               # or rerank | mntp | simcse | anchor | angle | grit
        data: ["{prepared:scifact}"]    # prepared files are referred to by name
        steps: 100
      - name: stage2
        type: contrastive
        batching: homogeneous           # task-homogeneous batches (default: blended; round_robin: in turn)
        data: [{path: "{prepared:sts}", symmetric: true}]   # instruct the documents too
    evaluate: {...}                     # free-form; read by bench/recipes_table.py, ignored here

Strings may use ``{output}`` (the recipe's output folder) and ``{prepared:NAME}`` (a prepared file).
Relative paths are taken from the current directory.

Stage options are trainer (or objective) options: task-homogeneous batching (``batching:
homogeneous``) and instructed documents for symmetric data (``symmetric: true`` on a data source,
NV-Embed's STS rows) are the trainer's own.

:func:`run_recipe` takes test/benchmark ``overrides``: ``model``, ``output``, ``teacher`` (mining
teacher), ``max_rows`` (cap on prepared rows), ``max_corpus`` (cap on the documents a mining step
embeds: the positives plus random others) and any stage option (``steps``, ``batch_size`` ...),
applied to every stage that has it.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmembed.datasets import resolve_local
from lmembed.errors import LmembedError
from lmembed.io import read_text
from lmembed.mining import MiningStats, load_corpus, mine_hard_negatives, read_rows, write_rows
from lmembed.training import converters as conv
from lmembed.training.rows import BATCHING_MODES
from lmembed.training.train_config import (
    OBJECTIVE_NAMES,
    ObjectiveConfig,
    ObjectiveConfigError,
    TrainConfig,
    TrainConfigError,
)

log = logging.getLogger(__name__)

# ``rerank``: the contrastive trainer training a reranker (TrainConfig.reranker; default cross-encoder).
STAGE_TYPES = ("contrastive", "rerank", *OBJECTIVE_NAMES)
TRAINER_STAGES = ("contrastive", "rerank")
PREPARE_KINDS = ("beir", "classification", "clustering", "sts", "pairs", "rows")
RECIPE_KEYS = {"name", "description", "paper", "model", "output", "defaults", "prepare", "stages", "evaluate"}
SPECIAL_OVERRIDES = ("model", "output", "teacher", "max_rows", "max_corpus")
_PLACEHOLDER = re.compile(r"\{(output|prepared:[^}]+)\}")


class RecipeError(LmembedError, ValueError):
    """A recipe file is malformed; the message names the recipe and, where it applies, the stage."""


# ---------------------------------------------------------------------------------------------- model
@dataclass
class StageResult:
    """One finished stage."""

    name: str
    type: str
    model_dir: Path
    seconds: float
    steps: int
    first_loss: float | None = None
    last_loss: float | None = None


@dataclass
class RecipeResult:
    """A finished recipe: the prepared files, every stage, and the final model."""

    name: str
    output: Path
    prepared: dict[str, Path] = field(default_factory=dict)
    stages: list[StageResult] = field(default_factory=list)

    @property
    def model_dir(self) -> Path | None:
        return self.stages[-1].model_dir if self.stages else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "output": str(self.output),
            "model_dir": str(self.model_dir) if self.model_dir else None,
            "prepared": {k: str(v) for k, v in self.prepared.items()},
            "stages": [{**s.__dict__, "model_dir": str(s.model_dir)} for s in self.stages],
        }


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
    source: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # applied last, to stages that know the field


# ---------------------------------------------------------------------------------------------- loading
def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: invalid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping with 'model', 'stages' ...")
    return data


def _check_stage(where: str, stage: Any, seen: set[str]) -> None:
    if not isinstance(stage, dict):
        raise RecipeError(f"{where}: a stage must be a mapping")
    name = stage.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise RecipeError(f"{where}: every stage needs a 'name' of letters, digits, '-', '_' or '.'")
    if name in seen:
        raise RecipeError(f"{where}: stage name {name!r} is used twice")
    seen.add(name)
    if stage.get("type", "contrastive") not in STAGE_TYPES:
        raise RecipeError(f"{where}: stage type {stage.get('type')!r} is unknown; choose one of {STAGE_TYPES}")
    if stage.get("batching", "blended") not in BATCHING_MODES:
        raise RecipeError(f"{where}: batching {stage['batching']!r} is unknown; choose one of {BATCHING_MODES}")


def _check_prepare(where: str, step: Any, seen: set[str]) -> None:
    if not isinstance(step, dict) or not isinstance(step.get("name"), str):
        raise RecipeError(f"{where}: a prepare step is a mapping with a 'name'")
    if step["name"] in seen:
        raise RecipeError(f"{where}: prepared data name {step['name']!r} is used twice")
    seen.add(step["name"])
    if step.get("kind") not in PREPARE_KINDS:
        raise RecipeError(f"{where}: kind {step.get('kind')!r} is unknown; choose one of {PREPARE_KINDS}")
    if "input" not in step:
        raise RecipeError(f"{where}: a prepare step needs an 'input'")
    _check_step_values(where, step)


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


def _check_step_values(where: str, step: dict[str, Any]) -> None:
    """A prepare step's numbers are whole numbers and its ``options``/``mine`` keys are ones the converter and
    the miner take (found here, naming the step, rather than as a TypeError when the step runs)."""
    mine = step.get("mine")
    numbers = {key: step.get(key) for key in ("seed", "max_rows")}
    if isinstance(mine, dict):
        numbers |= {f"mine.{key}": mine.get(key) for key in ("k", "max_corpus")}
    for key, value in numbers.items():
        try:
            int(value) if value is not None else None
        except (TypeError, ValueError):
            raise RecipeError(f"{where}: {key} must be a whole number, got {value!r}") from None
    options = step.get("options") or {}
    if not isinstance(options, dict):
        raise RecipeError(f"{where}: options must be a mapping")
    converter = _CONVERTERS.get(step["kind"])
    passed = _PASSED | _PASSED_BY_KIND.get(step["kind"], set())
    _refuse_unknown(where, "options", options, _keywords(converter) - passed if converter else set())
    if isinstance(mine, dict):
        _refuse_unknown(where, "mine", mine, _keywords(mine_hard_negatives) - {"rows", "corpus", "stats"} | _MINE_OWN)


def _refuse_unknown(where: str, what: str, given: Mapping[str, Any], known: set[str]) -> None:
    if unknown := sorted(set(given) - known):
        known_keys = ", ".join(sorted(known)) or "none"
        raise RecipeError(f"{where}: {what}: unknown key(s) {', '.join(unknown)}; known: {known_keys}")


def parse_recipe(data: Mapping[str, Any], source: Path | None = None) -> Recipe:
    """Validate the structure of a recipe mapping (stage options are checked when the stage runs)."""
    where = str(source or "recipe")
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise RecipeError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; known: {sorted(RECIPE_KEYS)}")
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        raise RecipeError(f"{where}: 'stages' must be a non-empty list")
    names: set[str] = set()
    for i, stage in enumerate(stages):
        _check_stage(f"{where}: stage {i + 1}", stage, names)
    prepared: set[str] = set()
    for i, step in enumerate(data.get("prepare") or []):
        _check_prepare(f"{where}: prepare step {i + 1}", step, prepared)
    if not data.get("model") and not stages[0].get("model"):
        raise RecipeError(f"{where}: no 'model' given")
    name = str(data.get("name") or (source.stem if source else "recipe"))
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
        source=source,
    )


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe YAML file."""
    path = Path(path)
    if not path.exists():
        raise RecipeError(f"recipe {path} does not exist")
    return parse_recipe(_read_yaml(path), path)


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
        if overrides.get("max_corpus") is not None and isinstance(step.get("mine"), dict):
            step["mine"]["max_corpus"] = int(overrides["max_corpus"])
    unknown = sorted(set(extra) - _known(TrainConfig) - _known(ObjectiveConfig))
    if unknown:
        raise RecipeError(f"override(s) {', '.join(unknown)} match no stage option")
    recipe.overrides.update(extra)
    return recipe


# ---------------------------------------------------------------------------------------------- strings and paths
def _substitute(value: Any, context: Mapping[str, str]) -> Any:
    """Replace ``{output}`` / ``{prepared:NAME}`` in every string of a nested value."""
    if isinstance(value, str):

        def replace(match: re.Match[str]) -> str:
            key = match.group(1)
            if key not in context:
                raise RecipeError(f"{match.group(0)} names no prepared data (known: {sorted(context)})")
            return context[key]

        return _PLACEHOLDER.sub(replace, value)
    if isinstance(value, list):
        return [_substitute(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, context) for k, v in value.items()}
    return value


def resolve_input(spec: str) -> Path:
    """An existing path, or a dataset name / relative path found by :mod:`lmembed.datasets`."""
    try:
        return resolve_local(spec)
    except Exception as exc:
        raise RecipeError(f"input {spec!r} is neither a path nor a dataset lmembed can find locally") from exc


def resolve_data(data: Sequence[Any]) -> list[Any]:
    """Data-source paths made concrete: existing paths stay, dataset names / shared paths resolve (a plain
    string, or the ``path`` of a source given as a mapping)."""
    out = []
    for item in data:
        if isinstance(item, str):
            item = str(resolve_input(item))
        elif isinstance(item, dict) and isinstance(item.get("path"), str):
            item = {**item, "path": str(resolve_input(item["path"]))}
        out.append(item)
    return out


# ---------------------------------------------------------------------------------------------- prepare
def _spec_hash(step: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(step, sort_keys=True, default=str).encode()).hexdigest()[:16]


_TEACHERS: dict[str, Any] = {}


def _teacher(name: str, options: Mapping[str, Any]) -> Any:
    """Load (once per process) the mining teacher, with the embedding cache on."""
    key = json.dumps([name, dict(options)], sort_keys=True)
    if key not in _TEACHERS:
        from lmembed.embedder import Embedder  # lazy: keeps `lmembed --help` free of torch

        _TEACHERS.clear()  # keep at most one teacher in memory
        _TEACHERS[key] = Embedder.from_pretrained(name, show_progress=False, **options)
    return _TEACHERS[key]


def _convert(step: dict[str, Any], path: Path, teacher: Any | None) -> list[dict[str, Any]]:
    """Rows for one prepare step, before any separate mining."""
    kind, options = step["kind"], dict(step.get("options") or {})
    common = {"max_rows": step.get("max_rows"), "seed": int(step.get("seed", 0))}
    instruction, task = step.get("instruction"), step.get("task") or step["name"]
    if kind == "beir":
        return conv.beir_rows(path, step.get("split", "train"), instruction=instruction, task=task, **common, **options)
    if kind == "classification":
        return conv.classification_rows(path, instruction=instruction, task=task, **common, **options)
    if kind == "clustering":
        return conv.clustering_rows(path, instruction=instruction, task=task, **common, **options)
    if kind == "sts":
        mine = dict(step.get("mine") or {})
        for key in ("teacher", "teacher_options", "corpus"):
            mine.pop(key, None)
        k = int(mine.pop("k", 7))
        if "max_corpus" in mine:
            options.setdefault("pool_size", int(mine.pop("max_corpus")))
        return conv.sts_rows(
            path,
            instruction=conv.STS_INSTRUCTION if instruction is None else instruction,  # "": none
            task=task,
            teacher=teacher,
            num_negatives=k,
            mining=mine,
            **common,
            **options,
        )
    if kind == "pairs":
        return conv.pair_rows(path, instruction=instruction, task=task, **common, **options)
    rows = read_rows(path)
    return rows[: common["max_rows"]] if common["max_rows"] else rows


def _mine(step: dict[str, Any], rows: list[dict[str, Any]], path: Path, teacher: Any) -> list[dict[str, Any]]:
    options = dict(step["mine"])
    for key in ("teacher", "teacher_options"):
        options.pop(key, None)
    corpus_spec = options.pop("corpus", None)
    max_corpus = options.pop("max_corpus", None)
    if corpus_spec:
        corpus = load_corpus(resolve_input(corpus_spec))
    elif step["kind"] == "beir":
        corpus = load_corpus(path)
    else:
        corpus = None
    if corpus is not None and max_corpus is not None:
        corpus = _shrink_corpus(corpus, rows, int(max_corpus), int(step.get("seed", 0)))
    stats = MiningStats()
    mined = mine_hard_negatives(teacher, rows, corpus, stats=stats, **options)
    log.info("mined %s: %s", step["name"], stats.to_dict())
    return mined


def _shrink_corpus(corpus: list[str], rows: list[dict[str, Any]], size: int, seed: int) -> list[str]:
    """The rows' positives plus random other documents, ``size`` in all (at least the positives)."""
    positives = list(dict.fromkeys(p for r in rows for p in _as_list(r.get("positive"))))
    taken = set(positives)
    others = [t for t in dict.fromkeys(corpus) if t not in taken]
    room = max(0, size - len(positives))
    if len(others) > room:
        keep = np.sort(np.random.default_rng(seed).choice(len(others), size=room, replace=False))
        others = [others[int(i)] for i in keep]
    return positives + others


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def prepare_data(step: dict[str, Any], output: Path) -> Path:
    """Run one prepare step; reuses the file when it was written from the same step before."""
    target = Path(step.get("output") or output / "data" / f"{step['name']}.jsonl")
    stamp = target.with_name(target.name + ".recipe.json")
    digest = _spec_hash(step)
    if target.exists() and stamp.exists() and json.loads(stamp.read_text()).get("hash") == digest:
        log.info("prepared data %s is up to date", target)
        return target
    path = resolve_input(str(step["input"]))
    mine = step.get("mine")
    teacher = _teacher(mine["teacher"], mine.get("teacher_options") or {}) if isinstance(mine, dict) else None
    rows = _convert(step, path, teacher)
    if teacher is not None and step["kind"] != "sts":
        rows = _mine(step, rows, path, teacher)
    if not rows:
        raise RecipeError(f"prepare step {step['name']!r} produced no rows")
    write_rows(rows, target)
    stamp.write_text(json.dumps({"hash": digest, "rows": len(rows), "step": step}, default=str, indent=2))
    return target


# ---------------------------------------------------------------------------------------------- stages
def _known(config_class: type) -> set[str]:
    return {f.name for f in fields(config_class)}


def stage_options(recipe: Recipe, stage: Mapping[str, Any], model: str, output: Path) -> dict[str, Any]:
    """The config options of one stage: recipe defaults (fields the stage knows) + the stage's own."""
    kind = stage.get("type", "contrastive")
    trainer = kind in TRAINER_STAGES
    known = _known(TrainConfig if trainer else ObjectiveConfig)
    options = {k: v for k, v in recipe.defaults.items() if k in known}
    options.update({k: v for k, v in stage.items() if k not in ("name", "type")})
    options.update({k: v for k, v in recipe.overrides.items() if k in known})
    options.setdefault("model", model)
    options["output"] = str(output / stage["name"])
    if kind == "rerank":
        options.setdefault("reranker", "cross-encoder")
    elif not trainer:
        options["objective"] = kind
    extra = {k: v for k, v in options.items() if k not in known}
    if extra and not trainer:  # objective-specific knobs go to the objective itself
        options = {k: v for k, v in options.items() if k in known}
        options["options"] = {**extra, **dict(options.get("options") or {})}
    return options


def _run_contrastive(options: dict[str, Any], stage: Mapping[str, Any]) -> tuple[Path, list[float], int]:
    from lmembed.training.trainer import Trainer  # lazy: keeps `lmembed --help` free of torch

    options = dict(options)
    options["data"] = resolve_data(options.get("data") or [])
    try:
        config = TrainConfig.from_dict(options)
    except (TrainConfigError, TypeError, ValueError) as exc:
        raise RecipeError(f"stage {stage['name']!r}: {exc}") from exc
    trainer = Trainer(config)
    result = trainer.train()
    if result.model_dir is None:
        raise RecipeError(f"stage {stage['name']!r}: the trainer saved no model")
    return Path(result.model_dir), list(result.losses), result.end_step


def _run_objective(options: dict[str, Any], stage: Mapping[str, Any]) -> tuple[Path, list[float], int]:
    from lmembed.training.stages import run_objective  # lazy: keeps `lmembed --help` free of torch

    options = {**options, "data": resolve_data(options.get("data") or [])}
    try:
        config = ObjectiveConfig.from_dict(options)
    except (ObjectiveConfigError, TypeError) as exc:
        raise RecipeError(f"stage {stage['name']!r}: {exc}") from exc
    result = run_objective(config)
    return result.model_dir, result.losses, len(result.losses)


def run_stage(recipe: Recipe, stage: dict[str, Any], model: str, output: Path) -> StageResult:
    """Run one stage starting from ``model``; returns where its model was saved."""
    started = time.perf_counter()
    options = stage_options(recipe, stage, model, output)
    kind = stage.get("type", "contrastive")
    log.info("recipe %s: stage %s (%s) from %s", recipe.name, stage["name"], kind, options["model"])
    runner = _run_contrastive if kind in TRAINER_STAGES else _run_objective
    model_dir, losses, steps = runner(options, stage)
    return StageResult(
        name=stage["name"],
        type=kind,
        model_dir=model_dir,
        seconds=time.perf_counter() - started,
        steps=steps,
        first_loss=losses[0] if losses else None,
        last_loss=losses[-1] if losses else None,
    )


# ---------------------------------------------------------------------------------------------- entry point
def plan_recipe(recipe: Recipe) -> list[dict[str, Any]]:
    """The resolved options of every stage, without running anything (``{prepared:..}`` left as paths
    under ``<output>/data``). Useful to review a recipe and in tests."""
    output = Path(recipe.output)
    context = _context(recipe, output)
    plans = []
    model = recipe.model
    for stage in recipe.stages:
        resolved = _substitute(stage, context)
        options = stage_options(recipe, resolved, model, output)
        plans.append({"name": stage["name"], "type": stage.get("type", "contrastive"), **options})
        model = str(output / stage["name"] / "model")
    return plans


def _context(recipe: Recipe, output: Path) -> dict[str, str]:
    context = {"output": str(output)}
    for step in recipe.prepare:
        context[f"prepared:{step['name']}"] = str(step.get("output") or output / "data" / f"{step['name']}.jsonl")
    return context


def run_recipe(
    path: str | Path | Recipe,
    *,
    overrides: Mapping[str, Any] | None = None,
    stages: list[str] | None = None,
) -> RecipeResult:
    """Prepare the data and run every stage of a recipe (or only the named ``stages``, in order).

    When stages are skipped, a later stage starts from the skipped stage's saved model if it exists
    (so a recipe can be resumed stage by stage), else from the recipe's model.
    """
    recipe = path if isinstance(path, Recipe) else load_recipe(path)
    recipe = apply_overrides(recipe, overrides)
    output = Path(recipe.output)
    output.mkdir(parents=True, exist_ok=True)
    context = _context(recipe, output)
    result = RecipeResult(recipe.name, output)
    for step in recipe.prepare:
        resolved = _substitute(step, context)
        result.prepared[step["name"]] = prepare_data(resolved, output)
    model = recipe.model
    for stage in recipe.stages:
        if stages is not None and stage["name"] not in stages:
            saved = output / stage["name"] / "model"
            model = str(saved) if saved.exists() else model
            continue
        resolved = _substitute(stage, context)
        finished = run_stage(recipe, resolved, model, output)
        result.stages.append(finished)
        model = str(finished.model_dir)
    (output / "recipe_result.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result


__all__ = [
    "Recipe",
    "RecipeError",
    "RecipeResult",
    "StageResult",
    "apply_overrides",
    "load_recipe",
    "parse_recipe",
    "plan_recipe",
    "prepare_data",
    "resolve_data",
    "resolve_input",
    "run_recipe",
    "run_stage",
    "stage_options",
]
