"""GRIT: generative representational instruction tuning (Muennighoff et al., 2024, GritLM).

One decoder is trained both to embed and to generate, and the input format tells it which job it is doing:

* **embedding**: ``<|user|>\\n{instruction}\\n<|embed|>\\n{text}`` for queries and ``<|embed|>\\n{text}`` for
  documents, **bidirectional** attention, mean pooling over the text tokens only (the instruction and format
  tokens are kept out of the mean), InfoNCE with in-batch (and hard) negatives;
* **generation**: ``<|user|>\\n{prompt}\\n<|assistant|>\\n{answer}<eos>``, **causal** attention, next-token loss
  on the answer tokens only.

Both passes run on the same weights (LoRA adapters included); between them the attention mode of the shared
model is switched (:class:`~lmembed.training.stages.generative.AttentionSwitch`), so the embedding pass never
sees a causal mask and the generative pass never sees future tokens. The stage either sums the two losses every
step (``mode: sum``, GritLM's ``loss = loss_emb + loss_gen_factor * loss_gen``) or alternates them, one per
step (``mode: alternate``).

Data: the stage's ``data`` are the embedding rows (trainer data sources: query, instruction, positives,
negatives); ``generative_data`` are trainer data sources too, read as (prompt = query, answer = first positive).
On construction the model's strategy is given GritLM's embedding format, so the saved model embeds the way it
was trained (``Embedder.from_pretrained`` reads it back).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lmembed.errors import ConfigError
from lmembed.training.losses import InfoNCELoss
from lmembed.training.rows import DataSource, TrainExample, load_source
from lmembed.training.stages.batches import BatchStream
from lmembed.training.stages.generative import USER_TEMPLATE, AttentionSwitch, answer_labels, causal_lm_loss
from lmembed.training.stages.mntp import build_lm_head

log = logging.getLogger(__name__)

EMBED_TEMPLATE = "<|user|>\n{instruction}\n<|embed|>\n"
EMBED_PREFIX = "<|embed|>\n"
MODES = ("sum", "alternate")

__all__ = ["EMBED_PREFIX", "EMBED_TEMPLATE", "GritObjective", "read_generative_pairs"]


def read_generative_pairs(sources: Sequence[Any]) -> list[tuple[str, str]]:
    """(prompt, answer) pairs from trainer data sources: each row's query and first positive."""
    pairs = []
    for spec in sources:
        pairs += [(ex.query, ex.positives[0]) for ex in load_source(DataSource.parse(spec)).examples]
    return pairs


class GritObjective:
    """GRIT on a :class:`~lmembed.training.trainable.TrainableEmbedder` whose backbone is a decoder.

    Args:
        generative_data: trainer data sources of (prompt, answer) rows for the generative loss.
        mode: ``sum`` (both losses every step) or ``alternate`` (embedding on even steps, generation on odd).
        generative_weight: factor on the generative loss (0 trains embedding only: the ablation).
        temperature: InfoNCE temperature (GritLM trains with 0.02; 0.05 suits short CPU runs).
        generation_template: how a prompt is wrapped before its answer.
        max_generation_length: generative rows are cut to this many tokens.
        grit_format: give the strategy GritLM's embedding format (False keeps the model's own).
        seed: order of the generative rows.
    """

    data_kind = "examples"

    def __init__(
        self,
        model: Any,
        *,
        generative_data: Sequence[Any] = (),
        mode: str = "sum",
        generative_weight: float = 1.0,
        temperature: float = 0.05,
        generation_template: str = USER_TEMPLATE,
        max_generation_length: int = 128,
        grit_format: bool = True,
        seed: int = 0,
    ) -> None:
        backbone = model.embedder.backbone
        if not backbone.is_decoder:
            raise ConfigError("GRIT trains a decoder LM to embed and to generate; this model is an encoder")
        if mode not in MODES:
            raise ConfigError(f"GRIT mode {mode!r} is unknown; choose one of {', '.join(MODES)}")
        if generative_weight < 0:
            raise ConfigError(f"generative_weight={generative_weight} must be >= 0")
        if generative_weight > 0 and not generative_data:
            raise ConfigError("GRIT needs generative_data (prompt/answer rows), or generative_weight: 0")
        if model.config.attention != "bidirectional":
            log.warning("GRIT embeds with %s attention: GritLM embeds bidirectionally", model.config.attention)
        self.model = model
        if grit_format:
            self._use_grit_format()
        self.mode = mode
        self.weight = float(generative_weight)
        self.template = generation_template
        self.max_generation_length = max_generation_length
        self.criterion = InfoNCELoss(temperature=temperature, similarity="cosine", in_batch_negatives=True)
        self.head = build_lm_head(model.model, backbone.path)
        self.switch = AttentionSwitch(model.model)
        pairs = read_generative_pairs(generative_data) if self.weight > 0 else []
        self.generative = BatchStream(pairs, 1, seed) if pairs else None
        self.calls = 0

    def _use_grit_format(self) -> None:
        embedder = self.model.embedder
        embedder.config = embedder.config.with_options(instruction_template=EMBED_TEMPLATE, plain_prefix=EMBED_PREFIX)
        self.model._builder = None  # the input builder reads the strategy

    # ------------------------------------------------------------------ the two passes
    def embedding_loss(self, examples: Sequence[TrainExample]) -> Tensor:
        """InfoNCE of instructed queries against their positives (and first hard negatives), bidirectionally."""
        self.switch(self.model.config.attention)
        queries = self.model.embed([ex.query for ex in examples], [ex.instruction for ex in examples])
        positives = self.model.embed([ex.positives[0] for ex in examples])
        negatives = None
        if all(ex.negatives for ex in examples):
            negatives = self.model.embed([ex.negatives[0] for ex in examples]).unsqueeze(1)
        return self.criterion(queries, positives, negatives)

    def generative_loss(self, pairs: Sequence[tuple[str, str]]) -> Tensor:
        """Next-token loss on the answers of ``pairs`` (prompts unscored), causally."""
        self.switch("causal")
        batch = answer_labels(
            self.model.embedder.backbone.tokenizer,
            [p for p, _ in pairs],
            [a for _, a in pairs],
            template=self.template,
            max_length=self.max_generation_length,
        )
        device = self.model.device
        with self.model._autocast():
            return causal_lm_loss(self.model.model, self.head, {k: v.to(device) for k, v in batch.items()})

    def _pairs(self, step: int, size: int) -> list[tuple[str, str]]:
        """The ``size`` generative pairs of call ``step`` (a seeded order, fresh each epoch)."""
        assert self.generative is not None
        return [self.generative.batch(step * size + i)[0] for i in range(size)]

    def loss(self, examples: list[TrainExample]) -> tuple[Tensor, dict[str, float]]:
        step = self.calls
        self.calls += 1
        self.model.train()
        do_embed = self.mode == "sum" or self.generative is None or step % 2 == 0
        do_generate = self.generative is not None and (self.mode == "sum" or step % 2 == 1)
        metrics: dict[str, float] = {}
        total = torch.zeros((), device=self.model.device)
        if do_embed:
            emb = self.embedding_loss(examples)
            total = total + emb
            metrics["loss_embedding"] = float(emb.detach())
        if do_generate:
            gen = self.generative_loss(self._pairs(step, len(examples)))
            total = total + self.weight * gen
            metrics["loss_generative"] = float(gen.detach())
        self.switch(self.model.config.attention)  # leave the model as its strategy says
        return total, metrics
