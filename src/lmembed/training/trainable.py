"""The model side of training: an :class:`~lmembed.embedder.Embedder` made trainable.

:class:`TrainableEmbedder` is an ``nn.Module`` holding the backbone transformer and, for
``latent_attention`` pooling, the pooling head. Its forward pass is the encoding engine's own
``forward_pool``, so the vectors it trains are exactly the ones ``Embedder.encode`` produces later
(same tokenisation, instruction handling, attention mode, padding and pooling).

Options:

* full fine-tuning, or LoRA adapters injected into the backbone in place (peft), so the engine keeps
  calling the very same module objects;
* bidirectional attention for decoders (set once through ``configure_attention``, which also checks
  that it took effect);
* gradient checkpointing; bfloat16 weights with autocast (adapters and the head stay float32).

:meth:`TrainableEmbedder.save` writes an ordinary Embedder directory that ``Embedder.from_pretrained``
loads with the training-time strategy: LoRA merged into the weights by default, or kept as a peft
adapter beside the base weights.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder
from lmembed.encoding.engine import collate, resolve_max_length
from lmembed.encoding.inputs import InputBuilder
from lmembed.errors import ConfigError
from lmembed.model_card import TrainingRecord
from lmembed.models.attention import configure_attention
from lmembed.pooling.layers import normalize_layer

log = logging.getLogger(__name__)

Instructions = str | Sequence[str | None] | None


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters (NV-Embed's values by default)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.1
    target_modules: str | list[str] = "all-linear"


#: How many of a model's layer names a message about LoRA targets lists.
_NAMES_SHOWN = 12


def check_lora_rank(model: nn.Module, rank: int) -> None:
    """Refuse (naming ``lora_r``) a rank above the model's hidden size, before any adapter is allocated: such a
    rank adds nothing over full fine-tuning and, large enough, asks for more memory than any machine has."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "d_model", None)
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        sizes = [min(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
        hidden = max(sizes, default=None)
    if hidden is not None and rank > hidden:
        raise ConfigError(
            f"lora_r={rank} is more than the model's hidden size ({hidden}); a LoRA rank is at most that "
            "(typically 8 to 64)"
        )


def peft_with_lora(model: nn.Module, config: Any) -> Any:
    """``peft.get_peft_model(model, config)``; LoRA targets that match no module of the model (a mistyped
    ``--lora-targets``) are a :class:`ConfigError` naming the option and listing the model's linear layers."""
    from peft import get_peft_model  # lazy: peft takes seconds to import; only LoRA runs need it

    check_lora_rank(model, config.r)
    try:
        return get_peft_model(model, config)
    except ValueError:
        target = config.target_modules
        names = [name for name, _ in model.named_modules() if name]
        if target == "all-linear" or any(_targets(target, name) for name in names):
            raise  # the targets do match: peft refused something else
        layers = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules() if _is_linear(module)})
        shown = ", ".join(layers[:_NAMES_SHOWN]) + (" ..." if len(layers) > _NAMES_SHOWN else "")
        given = target if isinstance(target, str) else ",".join(sorted(target))
        raise ConfigError(
            f"lora_target_modules (--lora-targets) {given!r} names no module of {type(model).__name__}; "
            f"its linear layers: {shown or 'none'} (or use all-linear)"
        ) from None


def _targets(target: str | Sequence[str], name: str) -> bool:
    """True when peft's LoRA target ``target`` (a regular expression, or names of modules) names module ``name``."""
    if isinstance(target, str):
        return re.fullmatch(target, name) is not None
    return any(name == key or name.endswith(f".{key}") for key in target)


def _is_linear(module: nn.Module) -> bool:
    """A layer LoRA can adapt: a linear layer (GPT-2's Conv1D is one too)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


class TrainedTensors:
    """The checkpoint side of a trainable model (an embedder or a reranker): copies of its trained tensors and
    loading them back. A subclass gives ``named_trainable_parameters``, ``weights_changed`` and, for the error
    a mismatched checkpoint gets, ``checkpoint_kind`` and ``checkpoint_hint``."""

    checkpoint_kind = "the model"
    checkpoint_hint = "other LoRA settings"

    def named_trainable_parameters(self):  # pragma: no cover - provided by the subclass
        raise NotImplementedError

    def weights_changed(self) -> None:  # pragma: no cover - provided by the subclass
        raise NotImplementedError

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the trained tensors only (LoRA adapters or the whole model, plus any new head)."""
        return {name: p.detach().cpu().clone() for name, p in self.named_trainable_parameters()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_trainable_parameters())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ConfigError(
                f"checkpoint does not match {self.checkpoint_kind}: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]} (was it written with {self.checkpoint_hint}?)"
            )
        wrong = [name for name, param in params.items() if tuple(state[name].shape) != tuple(param.shape)]
        if wrong:
            name = wrong[0]
            raise ConfigError(
                f"checkpoint does not match {self.checkpoint_kind}: {name} has shape {tuple(state[name].shape)}, "
                f"the model's is {tuple(params[name].shape)} ({len(wrong)} tensor(s) differ; was it written with "
                f"{self.checkpoint_hint}?)"
            )
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(state[name].to(device=param.device, dtype=param.dtype))
        self.weights_changed()


def trim_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop columns that are padding in every row (a chunk of a batch is often narrower than the batch)."""
    used = attention_mask.bool().any(dim=0)
    if bool(used.all()):
        return input_ids, attention_mask, pool_mask
    columns = used.nonzero().squeeze(1)
    span = slice(int(columns[0]), int(columns[-1]) + 1)
    return input_ids[:, span], attention_mask[:, span], pool_mask[:, span]


def length_buckets(lengths: torch.Tensor, min_rows: int = 8) -> list[torch.Tensor]:
    """Row indices grouped by sequence length (powers of two), so a group pads to at most twice its
    shortest row; groups smaller than ``min_rows`` are merged into the next longer one."""
    keys = torch.ceil(torch.log2(lengths.clamp(min=1).float())).long()
    groups: list[torch.Tensor] = []
    pending: torch.Tensor | None = None
    for key in sorted(set(keys.tolist())):
        rows = (keys == key).nonzero().squeeze(1)
        rows = rows if pending is None else torch.cat([pending, rows])
        if len(rows) < min_rows:
            pending = rows
            continue
        groups.append(rows)
        pending = None
    if pending is not None:
        if groups:
            groups[-1] = torch.cat([groups[-1], pending])
        else:
            groups.append(pending)
    return groups


def _expand_instructions(texts: Sequence[str], instructions: Instructions) -> list[str | None]:
    if instructions is None or isinstance(instructions, str):
        return [instructions] * len(texts)
    items = list(instructions)
    if len(items) != len(texts):
        raise ValueError(f"{len(items)} instructions for {len(texts)} texts")
    return items


class TrainableEmbedder(TrainedTensors, nn.Module):
    """An Embedder whose backbone (or LoRA adapters) and pooling head receive gradients.

    ``forward(input_ids, attention_mask, pool_mask)`` returns raw (un-normalised) float32 vectors
    ``[rows, hidden]``; use :meth:`tokenize` to build its inputs or :meth:`embed` for both steps.
    """

    checkpoint_kind = "the model"
    checkpoint_hint = "other LoRA or pooling settings"

    def __init__(
        self,
        embedder: Embedder,
        *,
        lora: LoraSettings | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.embedder = embedder
        #: the strategy a save writes, where training changed it (``Trainer.trained_strategy``); else ``config``
        self.saved_strategy: EmbeddingConfig | None = None
        self.model = embedder.backbone.model
        self.head = embedder.pooling_head
        self._peft: list[Any] = []  # a list keeps peft's wrapper out of this module's children
        self.lora_settings = lora
        if embedder.backbone.is_decoder:
            configure_attention(self.model, self.config.attention, verify=True)
        if lora is not None:
            self._inject_lora(lora)
        else:
            for param in self.model.parameters():
                param.requires_grad_(True)
        if self.head is not None:
            self.head.float().requires_grad_(True)
        if gradient_checkpointing:
            self._enable_checkpointing()
        self._builder: InputBuilder | None = None
        #: Tokens a text is cut to while training (``None``: the model's own window, which it keeps for use).
        self.train_max_length: int | None = None
        self.extra_layers: tuple[int, ...] = ()
        self.train()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        lora: LoraSettings | bool | None = None,
        gradient_checkpointing: bool = False,
        dtype: str = "float32",
        device: str = "cpu",
        **strategy: Any,
    ) -> TrainableEmbedder:
        """Load a model by name or path; ``strategy`` options (pooling, attention, ...) as in
        ``Embedder.from_pretrained``. ``lora=None`` means LoRA for decoders, full fine-tuning for encoders."""
        options = {k: v for k, v in strategy.items() if v is not None}
        embedder = Embedder.from_pretrained(
            name_or_path, dtype=dtype, device=device, cache=False, show_progress=False, **options
        )
        return cls(embedder, lora=resolve_lora(lora, embedder), gradient_checkpointing=gradient_checkpointing)

    def _inject_lora(self, settings: LoraSettings) -> None:
        from peft import LoraConfig  # lazy: peft takes seconds to import; only LoRA runs need it

        target = settings.target_modules
        config = LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=target if isinstance(target, str) else list(target),
            bias="none",
        )
        peft_model = peft_with_lora(self.model, config)  # injects into self.model in place
        if peft_model.base_model.model is not self.model:
            raise RuntimeError("peft did not inject LoRA in place; the encoding engine would bypass the adapters")
        self._peft.append(peft_model)

    def _enable_checkpointing(self) -> None:
        """Recompute layer activations in backward (non-reentrant: works with frozen inputs and LoRA)."""
        options = {"use_reentrant": False}
        if hasattr(self.model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
        elif hasattr(self.model, "gradient_checkpointing_enable"):
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        else:
            raise ConfigError(f"{type(self.model).__name__} does not support gradient checkpointing")

    # ------------------------------------------------------------------ facts
    @property
    def config(self) -> EmbeddingConfig:
        return self.embedder.config

    @property
    def device(self) -> torch.device:
        return self.embedder.backbone.device

    @property
    def uses_lora(self) -> bool:
        return bool(self._peft)

    @property
    def hidden_size(self) -> int:
        return self.embedder.backbone.hidden_size

    @property
    def top_layer(self) -> int:
        """The deepest layer the strategy reads (0 = the embeddings, ``num_layers`` = the last)."""
        num_layers = self.embedder.backbone.num_layers
        return max(normalize_layer(x, num_layers) for x in self.config.layers)

    def read_layers(self, layers: Sequence[int]) -> None:
        """From now on :meth:`forward` returns, beside each text's vector, its vectors pooled at ``layers`` (the
        strategy with only the layer changed), concatenated along the last axis: ``[rows, (1 + K) · hidden]``.
        One forward pass serves them all (a layerwise loss, e.g. 2DMSE, reads them)."""
        self.extra_layers = tuple(int(x) for x in layers)

    def named_trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(name, p) for name, p in self.named_parameters() if p.requires_grad]

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    # ------------------------------------------------------------------ encoding with gradients
    def _input_builder(self) -> InputBuilder:
        if self._builder is None:
            backbone = self.embedder.backbone
            self._builder = InputBuilder(
                backbone.tokenizer,
                self.config,
                is_decoder=backbone.is_decoder,
                max_length=self.train_max_length or resolve_max_length(backbone, self.config.max_length),
            )
        return self._builder

    def tokenize(self, texts: Sequence[str], instructions: Instructions = None) -> dict[str, torch.Tensor]:
        """Token ids, attention mask and pooling mask for ``texts``, padded as the engine pads them."""
        builder = self._input_builder()
        features = [builder.build(t, i) for t, i in zip(texts, _expand_instructions(texts, instructions), strict=True)]
        engine = self.embedder.engine
        ids, attn, pool = collate(features, engine.pad_id, engine.padding_side, self.device)
        return {"input_ids": ids, "attention_mask": attn, "pool_mask": pool}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
        """Pooled vectors of a padded batch, in row order.

        Rows of very different lengths (short queries next to long documents) are run in length buckets
        so that little compute goes to padding; it stays one call of this module (what DDP needs).
        """
        groups = length_buckets(attention_mask.sum(dim=1))
        if len(groups) == 1:
            return self._forward_rows(input_ids, attention_mask, pool_mask)
        parts = [self._forward_rows(input_ids[g], attention_mask[g], pool_mask[g]) for g in groups]
        order = torch.cat(groups)
        return torch.cat(parts)[torch.argsort(order)]

    def _forward_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor
    ) -> torch.Tensor:
        input_ids, attention_mask, pool_mask = trim_padding(input_ids, attention_mask, pool_mask)
        configs = [self.config, *(self.config.with_options(layer=x) for x in self.extra_layers)]
        with self._autocast():
            pooled = self.embedder.engine.forward_pool(input_ids, attention_mask, pool_mask, configs)
        return torch.cat([p.float() for p in pooled], dim=-1)

    def embed(self, texts: Sequence[str], instruction: Instructions = None) -> torch.Tensor:
        """Raw vectors of ``texts`` with gradients (instructions are applied and left out of pooling)."""
        return self(**self.tokenize(texts, instruction))

    def _autocast(self):
        dtype = self.embedder.backbone.dtype
        if dtype in (torch.bfloat16, torch.float16):
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return nullcontext()

    # ------------------------------------------------------------------ state
    def weights_changed(self) -> None:
        """Call after every update: the embedding cache must never serve vectors of older weights."""
        self.embedder.backbone.invalidate_fingerprint()

    # ------------------------------------------------------------------ saving
    def save(
        self,
        directory: str | Path,
        *,
        merge_lora: bool = True,
        in_place: bool = False,
        adapter_base: str | Path | None = None,
        full_state: dict[str, torch.Tensor] | None = None,
        training: TrainingRecord | None = None,
        name: str | None = None,
    ) -> Path:
        """Write an Embedder directory that ``Embedder.from_pretrained(directory)`` loads (its card tells of
        ``training`` when given, and calls the model ``name``: see :meth:`Embedder.save`).

        With LoRA, ``merge_lora=True`` folds the adapters into the weights; ``False`` stores the
        base weights plus a peft adapter (``adapter_config.json``) that transformers applies on load.
        ``in_place=True`` merges into this model instead of a copy (for the end of training: saves
        memory, but the adapters are gone afterwards). The folder is self-contained and may be moved:
        the base weights sit beside the adapter, and both lmembed and transformers load them from the
        folder itself. The adapter's ``base_model_name_or_path`` (read by tools that load the adapter
        alone) records ``directory``, or ``adapter_base`` when given. ``full_state`` (this module's state dict
        with whole tensors, as gathered from a model sharded with FSDP; full fine-tuning only) is written
        instead of the live parameters.
        """
        directory = Path(directory)
        self.weights_changed()
        if full_state is not None:
            if self.uses_lora:
                raise ValueError("full_state is for full fine-tuning; a LoRA model saves its own adapters")
            backbone = {k.removeprefix("model."): v for k, v in full_state.items() if k.startswith("model.")}
            head = {k.removeprefix("head."): v for k, v in full_state.items() if k.startswith("head.")}
            return self._clone_embedder(self.model).save(
                directory, backbone_state=backbone, head_state=head or None, training=training, name=name
            )
        if not self.uses_lora:
            return self._clone_embedder(self.model).save(directory, training=training, name=name)
        peft_model = self._peft[0]
        if merge_lora and in_place:
            clean = peft_model.merge_and_unload()
            self._peft.clear()
            return self._clone_embedder(clean).save(directory, training=training, name=name)
        duplicate = copy.deepcopy(peft_model)
        clean = duplicate.merge_and_unload() if merge_lora else duplicate.unload()
        if merge_lora:
            return self._clone_embedder(clean).save(directory, training=training, name=name)
        base = Path(adapter_base or directory)
        return self._clone_embedder(clean).save(
            directory, extra=partial(self._save_adapter, peft_model, base=base), training=training, name=name
        )

    def _clone_embedder(self, model: nn.Module) -> Embedder:
        backbone = dataclasses.replace(self.embedder.backbone, model=model, _fingerprint=None)
        terms = self.embedder.engine.terms  # a term channel is fitted, not trained: it is saved as it came
        strategy = self.saved_strategy or self.config
        clone = Embedder(backbone, strategy, pooling_head=self.head, terms=terms, use_cache=False, show_progress=False)
        # what the model was made from, for the saved card: its base model, and the published family it was read as
        clone.base_model, clone.published = self.embedder.base_model, self.embedder.published
        return clone

    @staticmethod
    def _save_adapter(peft_model: Any, directory: Path, *, base: Path) -> None:
        """Write the adapter next to the base weights (``directory``: the folder being saved), recording ``base``
        as where those live."""
        config = peft_model.peft_config["default"]
        previous = config.base_model_name_or_path
        config.base_model_name_or_path = str(base.resolve())
        scratch = Path(tempfile.mkdtemp(prefix=".adapter-", dir=directory))
        try:
            peft_model.save_pretrained(scratch)
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                (scratch / name).replace(directory / name)
        finally:
            config.base_model_name_or_path = previous
            shutil.rmtree(scratch, ignore_errors=True)


def resolve_lora(lora: LoraSettings | bool | None, embedder: Embedder) -> LoraSettings | None:
    """``True``/``False``/``None`` (auto: decoders only) to concrete settings or ``None``."""
    if isinstance(lora, LoraSettings):
        return lora
    wanted = embedder.backbone.is_decoder if lora is None else lora
    return LoraSettings() if wanted else None


def _check_no_lora_options(config: Any) -> None:
    """A model fully fine-tuned takes no LoRA option: one set away from its default would change nothing."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    names = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge_lora")
    changed = [n for n in names if n in defaults and getattr(config, n) != defaults[n]]
    if changed:
        why = "lora is false" if config.lora is False else "an encoder is fully fine-tuned by default"
        said = ", ".join("keep_adapter" if n == "merge_lora" else f"{n}={getattr(config, n)!r}" for n in changed)
        raise ConfigError(f"{said}: LoRA options, but no adapters are trained ({why}; set lora: true to train them)")


def build_trainable(
    config: Any, embedder: Embedder | TrainableEmbedder | None = None, device: str | None = None
) -> TrainableEmbedder:
    """The trainable model of a training run or objective stage.

    ``config`` is a :class:`~lmembed.training.train_config.TrainConfig` or an objective config: what is
    read is ``model``, the strategy (``pooling``, ``attention``, ``max_length``), ``dtype``, ``device``
    (unless ``device`` is given), the LoRA settings and ``gradient_checkpointing`` (if it has one).
    The given ``embedder`` is used as it is (strategy options that disagree with it are reported).
    """
    if embedder is not None:
        given = embedder.config
        for option in ("pooling", "attention", "max_length"):
            wanted = getattr(config, option)
            if wanted is not None and wanted != getattr(given, option):
                log.warning(
                    "%s=%r is ignored: the model given to the trainer uses %r", option, wanted, getattr(given, option)
                )
    if isinstance(embedder, TrainableEmbedder):
        return embedder
    if embedder is None:
        strategy = {"pooling": config.pooling, "attention": config.attention, "max_length": config.max_length}
        embedder = Embedder.from_pretrained(
            config.model,
            dtype=config.dtype,
            device=device or config.device,
            cache=False,
            show_progress=False,
            **{k: v for k, v in strategy.items() if v is not None},
        )
    use_lora = embedder.backbone.is_decoder if config.lora is None else config.lora
    if not use_lora:
        _check_no_lora_options(config)
    lora = (
        LoraSettings(config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
        if use_lora
        else None
    )
    checkpointing = getattr(config, "gradient_checkpointing", False)
    return TrainableEmbedder(embedder, lora=lora, gradient_checkpointing=checkpointing)
