"""The model side of reranker training: a :class:`~lmembed.rerank.Reranker` made trainable by the trainer.

:class:`TrainableReranker` plays the part :class:`~lmembed.training.trainable.TrainableEmbedder` plays for an
embedder, with the same surface the :class:`~lmembed.training.trainer.Trainer` uses (trainable parameters and
their state for checkpoints, ``weights_changed``, ``save``): its forward pass reads padded query–document pairs
and returns one logit per pair, computed by the reranker's own ``forward`` (so training scores pairs exactly as
``Reranker.predict`` does later: same prompt, truncation and padding). The trainer groups each row's positive and
its negatives (``logits.view(rows, 1 + negatives)``, positive first) and applies a reranker loss
(:mod:`.losses.rerank`: pointwise BCE or listwise softmax).

A decoder is trained with LoRA (peft) by default, an encoder fully; the adapters are merged when the model is
saved, so the folder is a plain checkpoint: a cross-encoder in sentence-transformers' ``CrossEncoder`` format, an
LLM reranker with its prompt, both read back by :func:`~lmembed.rerank.load_reranker`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.errors import ConfigError
from lmembed.models.families import config_says_decoder
from lmembed.rerank import Reranker, load_reranker
from lmembed.training.trainable import LoraSettings, TrainedTensors, peft_with_lora

__all__ = ["TrainableReranker", "build_trainable_reranker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KindTraining:
    """How one reranker kind trains: peft's ``task_type`` for its LoRA adapters, whether it has a score head of
    its own (a cross-encoder's new head: trained in full beside the adapters, under ``head_lr``; an LLM reranker
    reads the LM head it has), and whether it is a decoder whatever its config says."""

    peft_task_type: str
    own_head: bool
    decoder: bool


#: One entry per kind of ``lmembed.rerank.loading.KINDS`` (a test checks the two agree): the only place training
#: tells the kinds apart.
KIND_TRAINING: dict[str, KindTraining] = {
    "cross-encoder": KindTraining(peft_task_type="SEQ_CLS", own_head=True, decoder=False),
    "llm": KindTraining(peft_task_type="CAUSAL_LM", own_head=False, decoder=True),
}


def kind_training(reranker: Reranker) -> KindTraining:
    """The :data:`KIND_TRAINING` entry of ``reranker``'s kind; a kind without one cannot be trained."""
    if reranker.kind not in KIND_TRAINING:
        raise ConfigError(
            f"reranker kind {reranker.kind!r} cannot be trained: the trainable kinds are {', '.join(KIND_TRAINING)}"
        )
    return KIND_TRAINING[reranker.kind]


class TrainableReranker(TrainedTensors, nn.Module):
    """A reranker whose model (or its LoRA adapters) receives gradients; ``forward(**batch) -> Tensor[pairs]``."""

    checkpoint_kind = "the reranker"
    checkpoint_hint = "other LoRA settings, or for another model"

    def __init__(self, reranker: Reranker, *, lora: LoraSettings | None = None) -> None:
        super().__init__()
        self.reranker = reranker
        if lora is not None:
            self.model = self._with_lora(reranker, lora)
        else:
            self.model = reranker.model
            self.model.requires_grad_(True)
        reranker.model = self.model  # the reranker scores through the adapters while training
        self.train()

    @staticmethod
    def _with_lora(reranker: Reranker, settings: LoraSettings) -> nn.Module:
        from peft import LoraConfig  # lazy: peft takes seconds to import; only LoRA runs need it

        target = settings.target_modules
        config = LoraConfig(
            r=settings.r,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=target if isinstance(target, str) else list(target),
            bias="none",
            # a cross-encoder's new score head is trained in full beside the adapters (peft's modules_to_save)
            task_type=kind_training(reranker).peft_task_type,
        )
        return peft_with_lora(reranker.model, config)

    # ------------------------------------------------------------------ facts
    @property
    def device(self) -> torch.device:
        return self.reranker.device

    @property
    def uses_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def named_trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(name, p) for name, p in self.named_parameters() if p.requires_grad]

    def head_parameter_names(self) -> list[str]:
        """The trainable parameters outside the base model (a cross-encoder's score head: ``classifier``,
        ``score``), which ``head_lr`` applies to; an LLM reranker has none (it reads the LM head it has)."""
        if not kind_training(self.reranker).own_head:
            return []
        base = self.reranker.model.base_model if not self.uses_lora else self.model.get_base_model().base_model
        inside = {id(p) for p in base.parameters()}
        return [name for name, p in self.named_trainable_parameters() if id(p) not in inside]

    # ------------------------------------------------------------------ scoring with gradients
    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
        """The padded batch the reranker builds for ``pairs`` (its prompt, truncation and padding)."""
        return self.reranker.collate(self.reranker.encode_pairs(pairs))

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        """One logit per pair (float32)."""
        return self.reranker.forward(batch)[:, 0].float()

    # ------------------------------------------------------------------ state
    def weights_changed(self) -> None:
        """Nothing is cached from a reranker's weights."""

    # ------------------------------------------------------------------ saving
    def save(
        self,
        directory: str | Path,
        *,
        merge_lora: bool = True,
        in_place: bool = False,
        adapter_base: str | Path | None = None,
        full_state: dict[str, torch.Tensor] | None = None,
    ) -> Path:
        """Write the reranker's folder (LoRA merged: a reranker folder holds plain weights). ``in_place`` merges
        into this model (the end of training); otherwise a copy is merged and saved, and training can go on."""
        del adapter_base  # the trainer's signature; a reranker folder never holds an adapter
        if not merge_lora:
            raise ConfigError("a reranker is saved with its LoRA adapters merged (merge_lora: true)")
        if full_state is not None:
            raise ConfigError("a reranker is trained in one process or with DDP (not FSDP)")
        if not self.uses_lora:
            return self.reranker.save(directory)
        if in_place:
            self.model = self.model.merge_and_unload()
            self.reranker.model = self.model
            return self.reranker.save(directory)
        saved = copy.copy(self.reranker)
        saved.model = copy.deepcopy(self.model).merge_and_unload()
        return saved.save(directory)


def build_trainable_reranker(
    config: Any, reranker: Reranker | TrainableReranker | None = None, device: str | None = None
) -> TrainableReranker:
    """The trainable reranker of a run: ``reranker`` as it is, or ``config.model`` loaded as ``config.reranker``
    (``cross-encoder``, ``llm`` or ``auto``: decided by the folder) with ``config.reranker_options`` (an LLM
    reranker's ``prompt`` ...), ``max_length``, ``dtype`` and ``device``. ``config.lora=None`` means LoRA for a
    decoder, full fine-tuning for an encoder."""
    if isinstance(reranker, TrainableReranker):
        return reranker
    if reranker is None:
        options: dict[str, Any] = {"device": device or config.device, "dtype": config.dtype}
        if config.max_length is not None:
            options["max_length"] = config.max_length
        kind = None if config.reranker == "auto" else config.reranker
        reranker = load_reranker(config.model, kind=kind, **{**options, **config.reranker_options})
    elif config.max_length is not None and config.max_length != reranker.max_length:
        log.warning("max_length=%s is ignored: the reranker given uses %s", config.max_length, reranker.max_length)
    if reranker.num_labels != 1:
        raise ConfigError(
            f"{reranker.name} has {reranker.num_labels} labels; a reranker is trained with one score per pair "
            "(load it with num_labels=1)"
        )
    decoder = kind_training(reranker).decoder or bool(config_says_decoder(reranker.model.config))
    use_lora = decoder if config.lora is None else config.lora
    lora = LoraSettings(config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules)
    return TrainableReranker(reranker, lora=lora if use_lora else None)
