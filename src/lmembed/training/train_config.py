"""Settings of training runs: :class:`TrainConfig` (contrastive) and :class:`ObjectiveConfig` (stages).

:class:`TrainConfig` holds a contrastive run's settings as one dataclass that round-trips through YAML;
:class:`ObjectiveConfig` those of a pre-training stage (:mod:`lmembed.training.stages`: MNTP, SimCSE,
Anchor, AnglE pairs). Both share the model-side fields of :class:`TrainedModel` (declared as those of
:class:`lmembed.options.ModelOptions` and its LoRA group).

A TrainConfig's fields are reachable from the command line (``lmembed train``) and from a YAML file
(``--config run.yaml``); options given on the command line override the file. Defaults follow
NV-Embed's recipe where it gives one (LoRA r=16, alpha=32, dropout 0.1; 50 warm-up steps then linear
decay; datasets sampled uniformly). ``temperature=None`` keeps the loss's own default (InfoNCE: 0.02,
as in E5-mistral).

A YAML file holds the same fields; a data source is a path or a mapping of
:class:`~lmembed.training.rows.DataSource` fields::

    model: smollm2-135m
    pooling: mean
    attention: bidirectional
    data:
      - ../shared/datasets/training/nli_triplets.jsonl
      - {path: ../shared/datasets/beir/scifact, weight: 2.0, instruction: "Retrieve abstracts for the claim"}
    batch_size: 32
    steps: 500
    save_every: 100
    output: runs/smollm2
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from lmembed.errors import LmembedError
from lmembed.io import read_text
from lmembed.options import LoraOptions, ModelOptions, field_of, flag
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.schema import KeyPath, Where, check_fields, read_yaml_file
from lmembed.synthesis.eval_texts import parse_names
from lmembed.training.loss_names import NEEDS_NEGATIVES, canonical_loss_name
from lmembed.training.rows import BATCHING_MODES, MIXING_MODES, DataSource

DTYPES = ("float32", "bfloat16")
#: Training's device default (a GPU when there is one); encoding's is ``cpu`` (lmembed.options.DEFAULT_DEVICE).
TRAIN_DEVICE = "auto"
# The pre-training stages (lmembed.training.stages), by the name ObjectiveConfig.objective takes.
OBJECTIVE_NAMES = ("mntp", "simcse", "anchor", "angle", "grit")
SIMILARITY_ALIASES = {"cos": "cosine", "cosine": "cosine", "dot": "dot"}
# What TrainConfig.reranker takes: the kind of reranker trained (auto: decided by the model's folder).
RERANKER_KINDS = ("cross-encoder", "llm", "auto")


DATA_DOC = "Training JSONL file or BEIR folder; repeat to mix datasets."
RERANKER_DOC = (
    "Train the model as a reranker: cross-encoder, llm (yes/no prompt) or auto (by its folder); each row's "
    "positive and --num-negatives negatives are scored with its query (use a reranker --loss)."
)
LOSS_DOC = (
    "infonce, triplet, gte, angle, matryoshka (wraps another), matryoshka_2d (layers x dimensions); margin_mse or "
    "distill_kl distil the rows' teacher_scores; a reranker: listwise_softmax or pointwise_bce."
)
BATCHING_DOC = (
    "blended (rows of all datasets), homogeneous (one dataset per batch, drawn by size) or round_robin (one "
    "dataset per batch, the datasets in turn)."
)
DECONTAMINATE_DOC = (
    "Comma list of evaluation sets (scifact,nfcorpus): drop rows whose query or positive repeats their "
    "items (exact, n-gram, a query holding one, near-duplicate, BM25); the report goes to the output folder."
)
EVAL_DATA_DOC = "BEIR folder or dataset name for dev nDCG@10; repeatable."


class TrainConfigError(LmembedError, ValueError):
    """A training option has an invalid value."""


_LISTS = {"data": "paths or {path: ...} mappings", "eval_data": "BEIR folders or dataset names"}


def _source(index: int, item: Any) -> DataSource:
    """``data[index]`` as a :class:`DataSource`; a bad one is a :class:`TrainConfigError` naming ``data[index]``."""
    try:
        return DataSource.parse(item)
    except LmembedError as exc:
        raise TrainConfigError(f"data[{index}]: {exc}") from exc


class ObjectiveConfigError(LmembedError, ValueError):
    """A pre-training stage option is invalid."""


#: The largest seed: torch takes 64-bit seeds, and a run adds its process rank to it.
MAX_SEED = 2**63 - 1


#: More optimisation steps than any run makes (a step a millisecond: eleven days); a larger count is a mistake.
MAX_STEPS = 10**9


def check_steps(error: type[Exception], steps: Any) -> None:
    """Raise ``error`` unless ``steps`` is a whole number in ``[1, MAX_STEPS]``."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise error(f"steps={steps!r} must be a whole number from 1 to {MAX_STEPS}")


def check_at_least(error: type[Exception], minimum: int, **values: float) -> None:
    """Raise ``error`` naming the first of ``values`` that is below ``minimum``."""
    for name, value in values.items():
        if value < minimum:
            raise error(f"{name}={value} must be >= {minimum}")


def check_finite(error: type[Exception], options: Any) -> None:
    """Raise ``error`` naming the first float field of the dataclass ``options`` that is not finite (``nan``, ``inf``
    from a flag or YAML's ``.nan``/``.inf``): such a value would train to NaN weights or fail deep inside torch."""
    for f in fields(options):
        value = getattr(options, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"{f.name}={value} must be a finite number")


def check_optimisation(error: type[Exception], options: Any) -> None:
    """The optimiser's options every training loop shares (``lr``, ``weight_decay``, ``max_grad_norm``, ``seed``):
    raise ``error`` naming the first invalid one."""
    check_finite(error, options)
    if not 0 < options.lr <= MAX_LR:
        raise error(
            f"lr={options.lr} must be positive and at most {MAX_LR}: AdamW moves each weight by about lr a step, "
            "and fine-tuning takes 1e-5 to 1e-3 (a minus sign lost from an exponent, 2e5 for 2e-5, gives this)"
        )
    if options.weight_decay < 0:
        raise error(f"weight_decay={options.weight_decay} must be >= 0")
    if options.max_grad_norm is not None and options.max_grad_norm <= 0:
        raise error(f"max_grad_norm={options.max_grad_norm} must be positive (or unset: no clipping)")
    if not 0 <= options.seed <= MAX_SEED:
        raise error(f"seed={options.seed} must be from 0 to {MAX_SEED}")


#: The largest learning rate taken: AdamW's step is about ``lr`` per weight whatever the gradient's scale.
MAX_LR = 1.0

_NAMED_OPTION = re.compile(r"\s*([A-Za-z_]\w*)((?:\[\d+\]|\.[A-Za-z_]\w*)*)[=:]")


def option_key(message: str) -> KeyPath:
    """The key path of the option a config error names at its start (``lr=nan must ...`` → ``("lr",)``,
    ``data[0].weight=-2 ...`` and ``data[0].weight: ...`` → ``("data", 0, "weight")``); ``()`` when it names none."""
    named = _NAMED_OPTION.match(message)
    if named is None:
        return ()
    key: list[str | int] = [named.group(1)]
    for index, name in re.findall(r"\[(\d+)\]|\.(\w+)", named.group(2)):
        key.append(int(index) if index else name)
    return tuple(key)


@dataclass
class TrainedModel:
    """What is trained and how it is read out; shared by contrastive runs and objective stages.

    Not a second options model: every field is declared as the same field of :class:`lmembed.options.ModelOptions`
    (``pooling``, ``attention``, ``max_length``, ``dtype``, ``device``: same type, flag and help) or of its LoRA
    group :class:`lmembed.options.LoraOptions`, with training's own defaults where they differ (``device``:
    ``auto``, a GPU when there is one). Strategy fields left as ``None`` keep the model's own (a saved Embedder's
    ``lmembed.json`` or lmembed's defaults). ``lora=None`` picks LoRA for decoders and full fine-tuning for encoders.
    """

    model: str = flag("", "--model", "-m", help="Bundled name, local directory or Hub id.")
    # extraction strategy
    pooling: str | None = field_of(ModelOptions, "pooling")
    attention: str | None = field_of(ModelOptions, "attention")
    max_length: int | None = field_of(ModelOptions, "max_length")
    # model side
    lora: bool | None = field_of(LoraOptions, "lora")
    lora_r: int = field_of(LoraOptions, "lora_r")
    lora_alpha: int = field_of(LoraOptions, "lora_alpha")
    lora_dropout: float = field_of(LoraOptions, "lora_dropout")
    lora_target_modules: str | list[str] = field_of(LoraOptions, "lora_target_modules")  # noqa: RUF009 (a field)
    dtype: str = field_of(ModelOptions, "dtype", help="Weights dtype: float32 or bfloat16 (autocast).")
    device: str = field_of(ModelOptions, "device", default=TRAIN_DEVICE)

    def check_model_options(self, error: type[ValueError]) -> None:
        """Raise ``error`` naming the first invalid model-side option."""
        if self.lora_r < 1:
            raise error(f"lora_r={self.lora_r} must be >= 1")
        if self.lora_alpha <= 0:  # 0 trains nothing, < 0 the opposite way
            raise error(f"lora_alpha={self.lora_alpha} must be > 0 (the adapters' update is scaled by alpha / r)")
        if not 0 <= self.lora_dropout < 1:
            raise error(f"lora_dropout={self.lora_dropout} must be in [0, 1)")
        if self.dtype not in DTYPES:
            raise error(f"dtype={self.dtype!r} is unknown; choose one of {', '.join(DTYPES)}")


@dataclass
class TrainConfig(TrainedModel):
    """Everything that defines a training run (see ``lmembed train --help`` for the flags).

    The model-side fields come from :class:`TrainedModel`. ``batch_size`` is the global batch: under
    several processes each one embeds an equal share and in-batch negatives are gathered from all of
    them. ``num_negatives`` hard negatives are attached to every query (topped up with random texts of
    the same dataset when a row has fewer).

    ``reranker`` (``cross-encoder``, ``llm`` or ``auto``) trains the model as a reranker instead of an embedder
    (:mod:`lmembed.training.reranker`): each row's positive and ``num_negatives`` negatives are scored as pairs
    with its query and a reranker loss (``listwise_softmax`` or ``pointwise_bce``) is applied to each group;
    ``reranker_options`` go to the reranker's loader (an LLM reranker's ``prompt``, ``activation`` ...);
    ``head_lr`` is the learning rate of a cross-encoder's score head (a new head starts from random weights and
    learns slowly at the backbone's rate).
    """

    data: list[DataSource] = flag([], "--data", help=DATA_DOC, cli_type=list[str] | None)  # noqa: RUF009 (a field)
    output: str = flag("runs/train", "--output", "-o", help="Output folder.")
    reranker: str | None = flag(None, "--reranker", help=RERANKER_DOC)
    reranker_options: dict[str, Any] = field(default_factory=dict)
    head_lr: float | None = None  # a reranker's new score head (cross-encoder); default: lr
    merge_lora: bool = flag(
        True, "--merge-lora/--keep-adapter", help="Save with LoRA merged, or keep the adapter (--keep-adapter)."
    )
    gradient_checkpointing: bool = flag(
        False, "--gradient-checkpointing", help="Recompute activations in backward to save memory."
    )
    # objective
    loss: str = flag("infonce", "--loss", help=LOSS_DOC)
    temperature: float | None = flag(None, "--temperature", help="Temperature (default: the loss's own, InfoNCE 0.02).")
    similarity: str = flag("cosine", "--similarity", help="cos (cosine) or dot.")
    in_batch_negatives: bool = True
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    num_negatives: int = flag(1, "--num-negatives", help="Hard negatives per query.")
    # optimisation
    batch_size: int = flag(32, "--batch-size", help="Global batch size.")
    grad_cache_chunk: int | None = flag(None, "--grad-cache-chunk", help="Use GradCache with chunks of this many rows.")
    steps: int = flag(1000, "--steps", help="Optimisation steps.")
    lr: float = flag(2e-5, "--lr", help="Peak learning rate.")
    weight_decay: float = flag(0.01, "--weight-decay", help="AdamW weight decay.")
    warmup_steps: int = flag(50, "--warmup-steps", help="Linear warm-up steps.")
    max_grad_norm: float | None = flag(1.0, "--max-grad-norm", help="Gradient clipping norm.")
    seed: int = flag(42, "--seed", help="Random seed.")
    # data
    mixing: str = "uniform"
    # rows of several datasets per batch, or "homogeneous": one dataset per batch (SFR), drawn with the mixture
    # weights; "round_robin": one dataset per batch, the datasets in turn (equal steps per dataset)
    batching: str = flag("blended", "--batching", help=BATCHING_DOC)
    skip_invalid: bool = flag(False, "--skip-invalid", help="Skip (and count) invalid rows instead of stopping.")
    decontaminate_against: list[str] = flag(  # noqa: RUF009 (a field: evaluation sets training must not repeat)
        [], "--decontaminate-against", help=DECONTAMINATE_DOC, cli_type=str | None
    )
    # logging, evaluation, checkpoints
    log_every: int = 1
    save_every: int = flag(0, "--save-every", help="Checkpoint every N steps (0: off).")
    keep_checkpoints: int = 2
    eval_data: list[str] = flag([], "--eval-data", help=EVAL_DATA_DOC, cli_type=list[str] | None)  # noqa: RUF009
    eval_split: str = flag("test", "--eval-split", help="Split of the dev sets.")
    eval_every: int = flag(0, "--eval-every", help="Evaluate every N steps (0: off).")
    eval_max_queries: int | None = flag(None, "--eval-max-queries", help="Evaluate on at most N queries.")
    eval_max_docs: int | None = flag(None, "--eval-max-docs", help="Shrink dev corpora to N documents.")
    eval_batch_size: int = ENCODE_BATCH_SIZE
    resume: bool = flag(False, "--resume", help="Continue from the newest checkpoint in --output.")
    progress: bool = flag(True, "--progress/--no-progress", help="Show a progress bar.")

    def __post_init__(self) -> None:
        for name in ("data", "eval_data"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, list):
                raise TrainConfigError(f"{name}={value!r} must be a list of {_LISTS[name]}")
        self.data = [_source(i, item) for i, item in enumerate(self.data or [])]
        self.eval_data = [str(p) for p in (self.eval_data or [])]
        self.decontaminate_against = parse_names(self.decontaminate_against)
        self.similarity = SIMILARITY_ALIASES.get(self.similarity, self.similarity)
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise :class:`TrainConfigError` on the first invalid option, naming it."""
        for name in ("loss_kwargs", "reranker_options"):
            if not isinstance(getattr(self, name), dict):
                raise TrainConfigError(f"{name}={getattr(self, name)!r} must be a mapping of option names to values")
        check_at_least(
            TrainConfigError,
            1,
            batch_size=self.batch_size,
            steps=self.steps,
            log_every=self.log_every,
            eval_batch_size=self.eval_batch_size,
        )
        check_steps(TrainConfigError, self.steps)
        for name in ("eval_max_queries", "eval_max_docs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrainConfigError(f"{name}={value} must be >= 1 (or unset: all)")
        self.check_model_options(TrainConfigError)
        check_optimisation(TrainConfigError, self)
        for i, source in enumerate(self.data):
            weight = source.weight
            if weight is not None and (not math.isfinite(weight) or weight < 0):
                raise TrainConfigError(f"data[{i}].weight={weight} must be a finite number >= 0")
        check_at_least(
            TrainConfigError,
            0,
            warmup_steps=self.warmup_steps,
            save_every=self.save_every,
            eval_every=self.eval_every,
            num_negatives=self.num_negatives,
            keep_checkpoints=self.keep_checkpoints,
        )
        if self.eval_every and not self.eval_data:
            raise TrainConfigError(f"eval_every={self.eval_every} evaluates on eval_data, which is not given")
        if self.head_lr is not None and (self.head_lr <= 0 or self.reranker is None):
            raise TrainConfigError(f"head_lr={self.head_lr} must be positive, and applies to reranker training only")
        if self.temperature is not None and self.temperature <= 0:
            raise TrainConfigError(f"temperature={self.temperature} must be positive")
        if self.grad_cache_chunk is not None and self.grad_cache_chunk < 1:
            raise TrainConfigError(f"grad_cache_chunk={self.grad_cache_chunk} must be >= 1 (or unset)")
        if self.similarity not in ("cosine", "dot"):
            raise TrainConfigError(f"similarity={self.similarity!r} is unknown; choose cosine (cos) or dot")
        if self.mixing not in MIXING_MODES:
            raise TrainConfigError(f"mixing={self.mixing!r} is unknown; choose one of {', '.join(MIXING_MODES)}")
        if self.batching not in BATCHING_MODES:
            raise TrainConfigError(f"batching={self.batching!r} is unknown; choose {' or '.join(BATCHING_MODES)}")
        inner = self.loss_kwargs.get("inner") if isinstance(self.loss_kwargs, dict) else None
        for name in (self.loss, inner if isinstance(inner, str) else None):
            if name and canonical_loss_name(name) in NEEDS_NEGATIVES and self.num_negatives < 1:
                raise TrainConfigError(f"loss={canonical_loss_name(name)} needs num_negatives >= 1")
        if self.reranker is not None:
            self._validate_reranker()
        elif self.reranker_options:
            raise TrainConfigError("reranker_options apply to reranker training only (set reranker)")

    def _validate_reranker(self) -> None:
        """What reranker training needs, and the embedder-only options it refuses."""
        if self.reranker not in RERANKER_KINDS:
            raise TrainConfigError(f"reranker={self.reranker!r} is unknown; choose one of {', '.join(RERANKER_KINDS)}")
        if self.num_negatives < 1:
            raise TrainConfigError("reranker training needs num_negatives >= 1 (each group: a positive and negatives)")
        embedder_only = {
            "pooling": self.pooling is not None,
            "attention": self.attention is not None,
            "grad_cache_chunk": self.grad_cache_chunk is not None,
            "eval_data": bool(self.eval_data),
            "merge_lora": not self.merge_lora,
        }
        if refused := [name for name, given in embedder_only.items() if given]:
            raise TrainConfigError(
                f"{', '.join(refused)}: not for reranker training (a reranker folder holds merged weights; "
                "evaluate it with lmembed eval --rerank)"
            )

    def check_ready(self, *, model_given: bool = False, data_given: bool = False) -> None:
        """The checks that only apply when a run starts (a model and data must be named, unless given ready)."""
        if not self.model and not model_given:
            raise TrainConfigError("no model given (--model NAME_OR_PATH or 'model:' in the YAML file)")
        if not self.data and not data_given:
            raise TrainConfigError("no training data given (--data FILE, repeatable, or 'data:' in the YAML file)")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = [s.to_dict() for s in value] if f.name == "data" else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: Where | None = None) -> TrainConfig:
        """A checked config from a mapping; ``where`` (a file and its lines) is named in errors of the schema."""
        check_fields(cls, data, where or Where("", error=TrainConfigError), unknown="unknown training option")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        path = Path(path)
        data, lines = read_yaml_file(path, TrainConfigError, read_text(path))
        if not isinstance(data, dict):
            if data is not None:
                raise TrainConfigError(f"{path}: expected a mapping of options at the top level")
            data = {}
        where = Where(str(path), lines, TrainConfigError)
        check_fields(cls, data, where, unknown="unknown training option")
        try:
            return cls(**data)
        except (TrainConfigError, TypeError, ValueError) as exc:
            key = option_key(str(exc))
            raise TrainConfigError(f"{where.at(key) if key else path}: {exc}") from exc

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def updated(self, **changes: Any) -> TrainConfig:
        """A validated copy with some options changed; ``None`` values are ignored."""
        data = self.to_dict()
        data.update({k: v for k, v in changes.items() if v is not None})
        return TrainConfig.from_dict(data)


@dataclass
class ObjectiveConfig(TrainedModel):
    """Settings of one pre-training stage; ``objective`` names it (one of :data:`OBJECTIVE_NAMES`).

    The model-side fields come from :class:`TrainedModel`. ``options`` go to the stage's constructor
    (``mask_probability``, ``temperature``, ``dropout``, ``alpha``, ``max_target_length`` ...).
    ``lora=None`` means LoRA for decoders, full fine-tuning for encoders (the Anchor paper trains
    stage I with all parameters: set ``lora: false``).
    """

    device: str = "cpu"
    objective: str = "mntp"
    data: list[Any] = field(default_factory=list)
    output: str = "runs/objective"
    steps: int = 100
    batch_size: int = 16
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float | None = 1.0
    seed: int = 42
    max_texts: int | None = None
    log_every: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.objective = self.objective.strip().lower()
        if self.objective not in OBJECTIVE_NAMES:
            known = ", ".join(OBJECTIVE_NAMES)
            raise ObjectiveConfigError(f"objective {self.objective!r} is unknown; choose one of {known}")
        check_at_least(ObjectiveConfigError, 1, steps=self.steps, batch_size=self.batch_size, log_every=self.log_every)
        check_steps(ObjectiveConfigError, self.steps)
        check_optimisation(ObjectiveConfigError, self)
        check_at_least(ObjectiveConfigError, 0, warmup_steps=self.warmup_steps)
        if self.max_texts is not None and self.max_texts < 1:
            raise ObjectiveConfigError(f"max_texts={self.max_texts} must be >= 1 (or unset: all)")
        if not isinstance(self.options, dict):
            raise ObjectiveConfigError(f"options={self.options!r} must be a mapping of option names to values")
        self.check_model_options(ObjectiveConfigError)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ObjectiveConfig:
        check_fields(cls, data, Where("", error=ObjectiveConfigError), unknown="unknown objective option")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
