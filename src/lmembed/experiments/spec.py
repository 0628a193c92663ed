"""Reading and checking an experiment file: every mistake is reported with the file and line it is on.

Layout (every key but ``model``, ``arms`` and ``evaluate.tasks`` is optional)::

    name: echo-vs-classic                  # default: the file's name
    paper: review-universal-text-embeddings-mteb.txt
    claim: "echo embeddings beat classic ones for a causal decoder, without training"
    paper_result: "Mistral-7B, MTEB avg: echo 52.1 vs classic 47.9"   # what the paper reports (free text)
    scale: "smollm2-135m; SciFact 300 docs / 60 queries; STS-B 300 pairs"
    model: smollm2-135m                    # the base model of every arm
    device: cpu                            # cpu | cuda | auto (training and evaluation)
    strategy: {pooling: mean, max_length: 128}   # extraction strategy shared by the arms
    train: {data: [training/nli_triplets.jsonl], steps: 40, batch_size: 16}  # shared by training arms
    seeds: [0, 1, 2]
    evaluate:
      tasks: [scifact, stsbenchmark, {path: my/beir/folder, type: Retrieval, name: Mine}]
      max_docs: 300                        # retrieval corpus: judged documents first, then random ones
      max_queries: 60
      max_items: 300                       # other task types: at most this many pairs / texts / rows
      sample_seed: 0                       # the subsample (the same for every arm and seed)
      batch_size: 16
      instructions: nv-embed               # a table of task instructions (default: none)
    arms:
      classic: {strategy: {echo: false}}   # no training: evaluated once, without a run
      echo: {strategy: {echo: true}}
      tuned: {train: {steps: 60}}          # a contrastive run: shared ``train`` + these options
      two-stage: {recipe: recipes/nv-embed-two-stage.yaml, overrides: {steps: 20}}
      after-mntp: {model_from: {arm: llm2vec, stage: mntp}}   # an earlier stage of another arm's recipe
      encoder: {model: minilm}
    compare:                               # default: every arm against the first, no claim
      - {a: echo, b: classic, claim: better}        # better | worse | none
      - {a: tuned, b: classic, claim: better, tasks: [SciFact]}
      - {a: big-tuned, b: big, minus: [tuned, classic], claim: better}   # the gap a − b against c − d

An arm's ``strategy`` updates the shared one; a layer may be named (``mid``, ``penultimate``, ``last``,
``15+16``). A training arm's ``pooling``, ``attention`` and ``max_length`` are used for training too.
``seeds`` applies to arms that train; an arm that needs no training is evaluated once. Everything is checked
before anything runs: unknown keys, unknown arms, strategy and training options, recipe overrides.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from lmembed.config import EmbeddingConfig
from lmembed.encoding.cache import ENCODING_VERSION
from lmembed.errors import LmembedError, UnknownNameError
from lmembed.io import read_text
from lmembed.schema import FileModel, KeyPath, Where, check_fields, check_keys, load_yaml_with_lines, read_yaml_file
from lmembed.training.recipes import (
    Recipe,
    RecipeError,
    apply_overrides,
    check_stage_work,
    check_stages,
    load_recipe,
    parse_recipe,
)
from lmembed.training.train_config import MAX_SEED, TrainConfig, option_key

CLAIMS = {"better": 1, "worse": -1, "none": 0}
DEVICES = ("cpu", "cuda", "auto")
LAYER_NAMES = ("mid", "middle", "penultimate", "last")
_ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Set by the experiment for every run; an experiment file may not set them for an arm.
_RUN_OWNED = ("output", "seed", "resume", "model")


class ExperimentSpecError(LmembedError, ValueError):
    """An experiment file (or a ``--set`` value) is malformed; the message names the file and line."""


# ---------------------------------------------------------------------------------------------- the file's schema
class ExperimentFile(FileModel):
    """The top level of an experiment file (see the module doc); :func:`parse_spec` checks each value."""

    name: Any = None
    description: Any = None
    paper: Any = None
    claim: Any = None
    paper_result: Any = None
    scale: Any = None
    model: Any = None
    device: Any = None
    dtype: Any = None
    strategy: Any = None  # EmbeddingConfig's fields (checked against them)
    train: Any = None  # TrainConfig's fields (checked against them)
    seeds: Any = None
    evaluate: Any = None
    arms: Any = None
    compare: Any = None


class ArmFile(FileModel):
    """One arm under ``arms``."""

    model: Any = None
    strategy: Any = None
    train: Any = None
    recipe: Any = None
    overrides: Any = None
    model_from: Any = None
    description: Any = None


class ModelFromFile(FileModel):
    """An arm's ``model_from``: an earlier stage of another arm's recipe."""

    arm: Any = None
    stage: Any = None


class EvaluateFile(FileModel):
    """The ``evaluate`` section."""

    tasks: Any = None
    max_docs: Any = None
    max_queries: Any = None
    max_items: Any = None
    sample_seed: Any = None
    batch_size: Any = None
    instructions: Any = None
    max_length: Any = None


class TaskFile(FileModel):
    """A task of ``evaluate.tasks`` given as a mapping."""

    name: Any = None
    path: Any = None
    type: Any = None
    split: Any = None


class CompareFile(FileModel):
    """One comparison under ``compare``."""

    a: Any = None
    b: Any = None
    minus: Any = None
    claim: Any = None
    tasks: Any = None


# ---------------------------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class TaskRef:
    """One task of the evaluation suite: a registry name, or data at a path (``type`` optional)."""

    name: str | None = None
    path: str | None = None
    type: str | None = None
    split: str = "test"

    @property
    def label(self) -> str:
        return self.name or Path(self.path or "task").name


@dataclass(frozen=True)
class EvalSpec:
    """The evaluation suite: tasks and how they are shrunk for a small machine."""

    tasks: tuple[TaskRef, ...]
    max_docs: int | None = None
    max_queries: int | None = None
    max_items: int | None = None
    sample_seed: int = 0
    batch_size: int = 16
    instructions: str | None = None
    max_length: int | None = None


@dataclass(frozen=True)
class ArmSpec:
    """One arm: what model it evaluates and how that model is made (nothing, a run, or a recipe)."""

    name: str
    model: str
    strategy: Mapping[str, Any]
    train: Mapping[str, Any] | None = None
    recipe: Mapping[str, Any] | None = None  # the recipe file's content (so a run does not re-read it)
    recipe_path: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    model_from: tuple[str, str] | None = None  # (arm, stage)
    description: str = ""

    @property
    def trains(self) -> bool:
        """True when the arm has a training run of its own (per seed)."""
        return self.train is not None or self.recipe is not None

    @property
    def per_seed(self) -> bool:
        """True when the arm is run once per seed (it trains, or reads another arm's per-seed model)."""
        return self.trains or self.model_from is not None

    def fingerprint(self, evaluation: EvalSpec, seed: int | None, dtype: str = "float32") -> str:
        """A digest of everything that decides this arm's result for ``seed`` at ``dtype`` (stale results are
        re-run). The default float32 is left out of the digest, so runs recorded before dtype joined it still
        match; any other dtype gives another digest (a run at bfloat16 is never reused for float32). A run.json
        written before runs recorded their items.json's sha256 is run again all the same (plan.RunRecord)."""
        payload: dict[str, Any] = {
            "arm": {
                "model": self.model,
                "strategy": dict(self.strategy),
                "train": self.train,
                "recipe": self.recipe,
                "overrides": dict(self.overrides),
                "model_from": self.model_from,
            },
            "evaluate": _jsonable(evaluation),
            "seed": seed,
        }
        if dtype != "float32":
            payload["dtype"] = dtype
        if ENCODING_VERSION > 1:  # a run an lmembed with other input building made is run again
            payload["encoding"] = ENCODING_VERSION
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompareSpec:
    """A pair of arms to test; ``expected`` is +1 when the claim says ``a`` scores higher, -1 lower, 0 none.
    With ``minus`` (two more arms c, d) the gap a − b is tested against the gap c − d, and ``expected`` is the
    sign the claim gives ``(a − b) − (c − d)``."""

    a: str
    b: str
    expected: int = 0
    tasks: tuple[str, ...] | None = None
    minus: tuple[str, str] | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """A checked experiment file."""

    name: str
    model: str
    arms: tuple[ArmSpec, ...]
    evaluation: EvalSpec
    seeds: tuple[int, ...] = (0,)
    compare: tuple[CompareSpec, ...] = ()
    device: str = "cpu"
    dtype: str = "float32"
    paper: str = ""
    claim: str = ""
    paper_result: str = ""
    scale: str = ""
    description: str = ""
    source: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)

    def arm(self, name: str) -> ArmSpec:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise UnknownNameError(f"no arm named {name!r}; arms: {', '.join(a.name for a in self.arms)}")

    def header(self) -> dict[str, Any]:
        """What the summary repeats about the experiment."""
        return {
            "name": self.name,
            "paper": self.paper,
            "claim": self.claim,
            "paper_result": self.paper_result,
            "scale": self.scale,
            "description": self.description,
            "model": self.model,
            "device": self.device,
            "seeds": list(self.seeds),
            "source": self.source,
        }


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {f.name: _jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- --set
def apply_settings(data: dict[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """A copy of the raw file with ``KEY=VALUE`` settings applied; KEY is a dotted path
    (``device=cuda``, ``evaluate.max_docs=1000``, ``arms.echo.strategy.max_length=256``), VALUE is YAML."""
    data = copy.deepcopy(data)
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip():
            raise ExperimentSpecError(f"--set {setting!r}: expected KEY=VALUE (KEY a dotted path such as train.steps)")
        try:
            parsed = load_yaml_with_lines(value)[0] if value.strip() else None
        except yaml.YAMLError as exc:
            raise ExperimentSpecError(f"--set {setting!r}: the value is not valid YAML ({exc})") from exc
        target: Any = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(target, dict):
                raise ExperimentSpecError(f"--set {setting!r}: {part!r} is not inside a mapping")
            target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise ExperimentSpecError(f"--set {setting!r}: {parts[-1]!r} is not inside a mapping")
        target[parts[-1]] = parsed
    return data


# ---------------------------------------------------------------------------------------------- checks
def _mapping(where: Where, path: KeyPath, value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(path, f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _positive_int(where: Where, path: KeyPath, value: Any, *, allow_none: bool = True, minimum: int = 1) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise where.error(path, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _check_layer(where: Where, path: KeyPath, value: Any) -> None:
    if isinstance(value, bool):
        raise where.error(path, f"layer {value!r} is not a layer")
    if isinstance(value, int):
        return
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return
    if isinstance(value, str):
        parts = value.split("+")
        if all(p.strip() in LAYER_NAMES or re.fullmatch(r"-?\d+", p.strip()) for p in parts):
            return
    raise where.error(path, f"layer {value!r}: use an int, a list of ints, {', '.join(LAYER_NAMES)} or 'a+b' (fused)")


def _option_path(path: KeyPath, options: Mapping[str, Any], message: str) -> KeyPath:
    """The path of the option a config error names (``steps=0 must be ...`` → ``path + ("steps",)``,
    ``data[1].weight=-2 ...`` → ``path + ("data", 1, "weight")``)."""
    key = option_key(message)
    return (*path, *key) if key and key[0] in options else path


class _Within(Where):
    """The :class:`Where` of a mapping inside this file (an arm's inline recipe at ``prefix``): its key paths are
    looked up under ``prefix``, and a location names the file, the line and ``prefix``; errors are ``error``."""

    def __init__(self, outer: Where, prefix: KeyPath, error: type[Exception]) -> None:
        super().__init__(outer.source, outer.lines, error)
        self.prefix = prefix

    def line(self, path: KeyPath) -> int | None:
        return super().line((*self.prefix, *path))

    def at(self, path: KeyPath) -> str:
        return f"{super().at(path)}: {'.'.join(str(p) for p in self.prefix)}"

    def __call__(self, path: KeyPath) -> str:
        return f"{super().at(path)}: {'.'.join(str(p) for p in (*self.prefix, *path))}"


def _check_strategy(where: Where, path: KeyPath, strategy: Mapping[str, Any]) -> None:
    check_fields(EmbeddingConfig, strategy, where, prefix=path, unknown="unknown strategy key {key!r}; known: {known}")
    plain = {k: v for k, v in strategy.items() if k != "layer"}
    try:
        EmbeddingConfig.from_dict(plain)
    except (LmembedError, TypeError, ValueError) as exc:
        raise where.error(_option_path(path, plain, str(exc)), str(exc)) from exc
    if "layer" in strategy:
        _check_layer(where, (*path, "layer"), strategy["layer"])


def _check_train(where: Where, path: KeyPath, options: Mapping[str, Any]) -> None:
    check_fields(TrainConfig, options, where, prefix=path, unknown="unknown training key {key!r}; known: {known}")
    for key in _RUN_OWNED:
        if key in options:
            raise where.error((*path, key), f"{key!r} is set by the experiment for every run; remove it here")
    try:
        config = TrainConfig.from_dict(dict(options))
    except (LmembedError, TypeError, ValueError) as exc:
        raise where.error(_option_path(path, options, str(exc)), str(exc)) from exc
    try:
        check_stage_work(config)  # the loss and its options, as the trainer builds them
    except (LmembedError, TypeError, ValueError) as exc:
        named = next((k for k in ("loss", "loss_kwargs") if k in options), None)
        raise where.error((*path, named) if named else path, str(exc)) from exc


def _task_refs(where: Where, path: KeyPath, value: Any) -> tuple[TaskRef, ...]:
    if not isinstance(value, list) or not value:
        raise where.error(path, "must be a non-empty list of task names or {path: ..., type: ...} mappings")
    refs = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item.strip():
            refs.append(TaskRef(name=item.strip()))
            continue
        if not isinstance(item, dict):
            raise where.error((*path, i), "a task is a name or a mapping with 'path'")
        check_keys(TaskFile, item, where, (*path, i), "task")
        if not item.get("path") and not item.get("name"):
            raise where.error((*path, i), "a task mapping needs 'path' (or 'name' of a known task)")
        refs.append(
            TaskRef(
                name=item.get("name"),
                path=item.get("path"),
                type=item.get("type"),
                split=str(item.get("split", "test")),
            )
        )
    labels = [ref.label for ref in refs]
    duplicates = sorted({x for x in labels if labels.count(x) > 1})
    if duplicates:
        raise where.error(path, f"task(s) listed twice: {', '.join(duplicates)}")
    return tuple(refs)


def _evaluation(where: Where, value: Any) -> EvalSpec:
    data = _mapping(where, ("evaluate",), value, "evaluate")
    check_keys(EvaluateFile, data, where, ("evaluate",), "evaluate")
    if "tasks" not in data:
        raise where.error(("evaluate",), "needs 'tasks' (names such as scifact, stsbenchmark, or paths)")
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise where.error(("evaluate", "instructions"), "name a table of task instructions (nv-embed, e5-mistral)")
    return EvalSpec(
        tasks=_task_refs(where, ("evaluate", "tasks"), data["tasks"]),
        max_docs=_positive_int(where, ("evaluate", "max_docs"), data.get("max_docs")),
        max_queries=_positive_int(where, ("evaluate", "max_queries"), data.get("max_queries")),
        max_items=_positive_int(where, ("evaluate", "max_items"), data.get("max_items"), minimum=2),
        sample_seed=_positive_int(where, ("evaluate", "sample_seed"), data.get("sample_seed", 0), minimum=0) or 0,
        batch_size=_positive_int(where, ("evaluate", "batch_size"), data.get("batch_size", 16)) or 16,
        instructions=instructions or None,
        max_length=_positive_int(where, ("evaluate", "max_length"), data.get("max_length"), minimum=8),
    )


def _seeds(where: Where, value: Any) -> tuple[int, ...]:
    if value is None:
        return (0,)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    ):
        raise where.error(("seeds",), f"must be an integer or a non-empty list of integers, got {value!r}")
    if len(set(value)) != len(value):
        raise where.error(("seeds",), "a seed is listed twice")
    for i, seed in enumerate(value):
        if not 0 <= seed <= MAX_SEED:
            raise where.error(("seeds", i), f"seed {seed} must be from 0 to {MAX_SEED}")
    return tuple(value)


def _recipe(where: Where, path: KeyPath, value: Any, base: Path) -> tuple[dict[str, Any], str | None, Recipe]:
    """A recipe (file path or inline mapping) as a checked mapping, its path if it came from a file, and the parsed
    recipe. A mistake in an inline recipe names this file's line of it.

    A relative path is taken from the current directory, else from the experiment file's folder."""
    try:
        if isinstance(value, str):
            file = Path(value)
            if not file.is_absolute() and not file.exists() and (base / file).exists():
                file = base / file
            recipe = load_recipe(file)  # checks the structure, naming the recipe file
            return load_yaml_with_lines(read_text(file))[0], str(file), recipe
    except RecipeError as exc:
        raise where.error(path, str(exc)) from exc
    if isinstance(value, dict):
        try:
            return value, None, parse_recipe(value, where=_Within(where, path, RecipeError))
        except RecipeError as exc:
            raise ExperimentSpecError(str(exc)) from exc  # it names this file, the line and the key
    raise where.error(path, "a recipe is a file path or a mapping with 'stages'")


def _check_recipe_stages(where: Where, path: KeyPath, recipe: Recipe, overrides: Mapping[str, Any]) -> None:
    """The options of every stage of an arm's recipe as its runs will set them (the arm's overrides, the
    experiment's model, device and a seed), checked before any run starts."""
    try:
        check_stages(apply_overrides(recipe, overrides))
    except RecipeError as exc:
        option = getattr(exc, "option", None)
        if option in overrides and option not in _RUN_OWNED:
            raise where.error((*path, "overrides", option), str(exc)) from exc
        if recipe.where is not None and recipe.where.source == where.source:
            raise ExperimentSpecError(str(exc)) from exc  # an inline recipe: the message names this file's line
        raise where.error((*path, "recipe"), str(exc)) from exc


def _arm(
    where: Where,
    name: Any,
    value: Any,
    shared: Mapping[str, Any],
    base: Path,
    model: str,
    strategy: Mapping[str, Any],
    device: str = "cpu",
) -> ArmSpec:
    path: KeyPath = ("arms", name)
    if not isinstance(name, str) or not _ARM_NAME.fullmatch(name):
        raise where.error(path, "an arm name is letters, digits, '.', '_', '+' or '-' (it names a folder)")
    data = _mapping(where, path, value, "an arm")
    check_keys(ArmFile, data, where, path, "arm")
    own_strategy = _mapping(where, (*path, "strategy"), data.get("strategy"), "strategy")
    merged_strategy = {**strategy, **own_strategy}
    _check_strategy(where, (*path, "strategy"), merged_strategy)
    kinds = [k for k in ("train", "recipe", "model_from") if k in data]
    if len(kinds) > 1:
        raise where.error((*path, kinds[1]), f"an arm uses one of train, recipe or model_from (this one has {kinds})")
    train = None
    if "train" in data:
        own = _mapping(where, (*path, "train"), data["train"], "train")
        train = {**shared, **own}
        _check_train(where, (*path, "train"), train)
        if not train.get("data"):
            raise where.error((*path, "train"), "a training arm needs 'data' (here or in the shared 'train')")
    recipe, recipe_path = None, None
    overrides = _mapping(where, (*path, "overrides"), data.get("overrides"), "overrides")
    if "recipe" in data:
        recipe, recipe_path, parsed = _recipe(where, (*path, "recipe"), data["recipe"], base)
        try:
            apply_overrides(parsed, {**overrides, "seed": 0})
        except RecipeError as exc:
            raise where.error((*path, "overrides"), str(exc)) from exc
        arm_model = data.get("model", model)
        run_owned = {"seed": 0, "device": device, **({"model": arm_model} if isinstance(arm_model, str) else {})}
        _check_recipe_stages(where, path, parsed, {**overrides, **run_owned})  # as execute._train_recipe sets them
    elif overrides:
        raise where.error((*path, "overrides"), "'overrides' go with 'recipe'")
    model_from = None
    if "model_from" in data:
        source = _mapping(where, (*path, "model_from"), data["model_from"], "model_from")
        check_keys(ModelFromFile, source, where, (*path, "model_from"), "model_from")
        if not isinstance(source.get("arm"), str) or not isinstance(source.get("stage"), str):
            raise where.error((*path, "model_from"), "needs 'arm' (a recipe arm) and 'stage' (one of its stages)")
        model_from = (source["arm"], source["stage"])
    arm_model = data.get("model", model)
    if not isinstance(arm_model, str) or not arm_model:
        raise where.error((*path, "model"), "must name a model")
    return ArmSpec(
        name=name,
        model=arm_model,
        strategy=merged_strategy,
        train=train,
        recipe=recipe,
        recipe_path=recipe_path,
        overrides=overrides,
        model_from=model_from,
        description=str(data.get("description") or ""),
    )


def _check_model_from(where: Where, arms: Sequence[ArmSpec]) -> None:
    by_name = {arm.name: arm for arm in arms}
    for arm in arms:
        if arm.model_from is None:
            continue
        source, stage = arm.model_from
        path: KeyPath = ("arms", arm.name, "model_from")
        if source not in by_name or by_name[source].recipe is None:
            raise where.error(path, f"arm {source!r} is not a recipe arm of this experiment")
        stages = [s.get("name") for s in by_name[source].recipe.get("stages", [])]  # type: ignore[union-attr]
        if stage not in stages:
            raise where.error(path, f"recipe arm {source!r} has no stage {stage!r}; its stages: {', '.join(stages)}")


def _comparisons(where: Where, value: Any, arms: Sequence[ArmSpec]) -> tuple[CompareSpec, ...]:
    names = [arm.name for arm in arms]
    if value is None:
        return tuple(CompareSpec(a=name, b=names[0]) for name in names[1:])
    if not isinstance(value, list):
        raise where.error(("compare",), "must be a list of {a: ARM, b: ARM, claim: better|worse|none}")
    out = []
    for i, item in enumerate(value):
        path: KeyPath = ("compare", i)
        if isinstance(item, list) and len(item) == 2:
            item = {"a": item[0], "b": item[1]}
        if not isinstance(item, dict):
            raise where.error(path, "a comparison is {a: ARM, b: ARM, claim: better|worse|none, tasks: [...]}")
        check_keys(CompareFile, item, where, path, "compare")
        for side in ("a", "b"):
            if item.get(side) not in names:
                raise where.error((*path, side), f"{item.get(side)!r} is not an arm; arms: {', '.join(names)}")
        minus = item.get("minus")
        if minus is not None:
            if not isinstance(minus, list) or len(minus) != 2:
                raise where.error((*path, "minus"), "must be two arms [c, d]: the gap a − b is tested against c − d")
            for name in minus:
                if name not in names:
                    raise where.error((*path, "minus"), f"{name!r} is not an arm; arms: {', '.join(names)}")
        claim = str(item.get("claim", "none")).lower()
        if claim not in CLAIMS:
            raise where.error((*path, "claim"), f"claim {claim!r}: use better, worse or none")
        tasks = item.get("tasks")
        if tasks is not None and (not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks)):
            raise where.error((*path, "tasks"), "must be a list of task names")
        out.append(
            CompareSpec(
                a=item["a"],
                b=item["b"],
                expected=CLAIMS[claim],
                tasks=tuple(tasks) if tasks else None,
                minus=(str(minus[0]), str(minus[1])) if minus is not None else None,
            )
        )
    return tuple(out)


def parse_spec(data: Any, source: str = "experiment", lines: Mapping[KeyPath, int] | None = None) -> ExperimentSpec:
    """Check a loaded experiment mapping (``lines`` from :func:`load_yaml_with_lines` for messages)."""
    where = Where(source, lines or {}, ExperimentSpecError)
    if not isinstance(data, dict):
        raise where.error((), "an experiment file is a mapping with 'model', 'arms' and 'evaluate'")
    check_keys(ExperimentFile, data, where, (), "top-level")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise where.error(("model",), "must name the base model (a bundled name, a folder or a Hub id)")
    device = str(data.get("device", "cpu"))
    if device not in DEVICES:
        raise where.error(("device",), f"device {device!r}: use {', '.join(DEVICES)}")
    strategy = _mapping(where, ("strategy",), data.get("strategy"), "strategy")
    _check_strategy(where, ("strategy",), strategy)
    shared_train = _mapping(where, ("train",), data.get("train"), "train")
    check_fields(
        TrainConfig, shared_train, where, prefix=("train",), unknown="unknown training key {key!r}; known: {known}"
    )
    arms_data = data.get("arms")
    if not isinstance(arms_data, dict) or not arms_data:
        raise where.error(("arms",), "must be a mapping of arm name → arm (at least one)")
    base = Path(source).parent if source else Path(".")
    arms = tuple(_arm(where, n, v, shared_train, base, model, strategy, device) for n, v in arms_data.items())
    _check_model_from(where, arms)
    evaluation = _evaluation(where, data.get("evaluate"))
    name = data.get("name") or (Path(source).stem if source else "experiment")
    if not isinstance(name, str) or not _ARM_NAME.fullmatch(name):
        raise where.error(("name",), "a name is letters, digits, '.', '_', '+' or '-'")
    return ExperimentSpec(
        name=name,
        model=model,
        arms=arms,
        evaluation=evaluation,
        seeds=_seeds(where, data.get("seeds")),
        compare=_comparisons(where, data.get("compare"), arms),
        device=device,
        dtype=str(data.get("dtype", "float32")),
        paper=str(data.get("paper") or ""),
        claim=str(data.get("claim") or ""),
        paper_result=str(data.get("paper_result") or ""),
        scale=str(data.get("scale") or ""),
        description=str(data.get("description") or ""),
        source=source,
        raw=copy.deepcopy(data),
    )


def load_spec(path: str | Path, settings: Sequence[str] = ()) -> ExperimentSpec:
    """Read and check an experiment file, with ``--set KEY=VALUE`` settings applied."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentSpecError(f"{path}: no such experiment file")
    data, lines = read_yaml_file(path, ExperimentSpecError, read_text(path))
    if settings:
        if not isinstance(data, dict):
            raise ExperimentSpecError(f"{path}: an experiment file is a mapping")
        data = apply_settings(data, settings)
    return parse_spec(data, str(path), lines)
