"""Training a :class:`~lmembed.rerank.Reranker` on mined negatives: rows ``(query, positive, negatives)``, each step a
batch of groups scored by the reranker (positive first) and a reranker loss (:mod:`.losses.rerank`: pointwise BCE
or listwise softmax), through the trainers' one optimisation step (:class:`~lmembed.training.optim.OptimisationStep`:
AdamW, warm-up then linear decay, clipping, ``metrics.jsonl``).

A decoder can be trained with LoRA (``lora=True``; peft): the adapters are merged when training ends, so the saved
folder is a plain checkpoint (a cross-encoder in sentence-transformers' CrossEncoder format, an LLM reranker with
its prompt), loaded back by :func:`~lmembed.rerank.load_reranker`.

Rows come from the same sources as contrastive training (e.g. ``lmembed mine``'s output: ``query``, ``positive``,
``negatives``); a row with fewer negatives than asked is topped up by cycling its own.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmembed.errors import ConfigError
from lmembed.rerank.base import Reranker
from lmembed.training.losses.rerank import ListwiseSoftmaxLoss, PointwiseBCELoss
from lmembed.training.metrics_log import MetricsLog
from lmembed.training.optim import OptimisationStep

log = logging.getLogger(__name__)

RERANK_LOSSES = {"listwise_softmax": ListwiseSoftmaxLoss, "pointwise_bce": PointwiseBCELoss}


@dataclass(frozen=True)
class RerankRow:
    query: str
    positive: str
    negatives: Sequence[str]


@dataclass
class RerankTrainConfig:
    """How a reranker is trained (the names the contrastive trainer uses for the same things)."""

    steps: int = 200
    batch_size: int = 8  # groups (queries) per step
    negatives: int = 3  # per group
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_steps: int = 20
    max_grad_norm: float | None = 1.0
    loss: str = "listwise_softmax"
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    lora: bool = False
    lora_r: int = 8
    lora_alpha: int = 16
    seed: int = 0
    log_every: int = 10

    def __post_init__(self) -> None:
        self.loss = self.loss.replace("-", "_").lower()
        if self.loss not in RERANK_LOSSES:
            raise ConfigError(f"loss={self.loss!r} is not a reranker loss; choose one of {', '.join(RERANK_LOSSES)}")
        for name in ("steps", "batch_size", "negatives"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")


class _Trainable:
    """What :class:`OptimisationStep` asks of a model: its trainable parameters and a weights-changed hook."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def named_trainable_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def weights_changed(self) -> None:
        """Nothing is cached from the weights."""


def _with_lora(reranker: Reranker, config: RerankTrainConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model  # lazy: only LoRA runs need peft

    task = "SEQ_CLS" if reranker.kind == "cross-encoder" else "CAUSAL_LM"
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, target_modules="all-linear", task_type=task)
    return get_peft_model(reranker.model, lora)


def _groups(rows: Sequence[RerankRow], config: RerankTrainConfig, rng: random.Random, step: int) -> list[RerankRow]:
    start = ((step - 1) * config.batch_size) % len(rows)
    picked = [rows[(start + i) % len(rows)] for i in range(config.batch_size)]
    out = []
    for row in picked:
        negatives = list(row.negatives)
        rng.shuffle(negatives)
        out.append(RerankRow(row.query, row.positive, [negatives[i % len(negatives)] for i in range(config.negatives)]))
    return out


def train_reranker(
    reranker: Reranker, rows: Sequence[RerankRow], config: RerankTrainConfig, output: str | Path | None = None
) -> Reranker:
    """Train ``reranker`` in place on ``rows`` (see the module doc); with ``output``, write ``metrics.jsonl`` there
    and save the trained reranker to ``output/model``."""
    rows = [r for r in rows if r.negatives]
    if not rows:
        raise ConfigError("no training row has a negative; mine negatives first")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    rows = list(rows)
    rng.shuffle(rows)
    model = _with_lora(reranker, config) if config.lora else reranker.model
    reranker.model = model
    trainable = _Trainable(model)
    folder = Path(output) if output is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(folder / "metrics.jsonl" if folder else Path("metrics.jsonl"), enabled=folder is not None)
    step = OptimisationStep.for_config(trainable, config, metrics, ConfigError)
    loss_fn = RERANK_LOSSES[config.loss](**config.loss_kwargs)
    width = 1 + config.negatives
    model.train()
    try:
        for number in range(1, config.steps + 1):
            groups = _groups(rows, config, rng, number)
            pairs = [(g.query, doc) for g in groups for doc in (g.positive, *g.negatives)]

            def forward_backward(pairs: list[tuple[str, str]] = pairs) -> tuple[torch.Tensor, dict[str, float]]:
                logits = reranker.forward(reranker.collate(reranker.encode_pairs(pairs)))[:, 0]
                loss = loss_fn(logits.view(-1, width))
                loss.backward()
                return loss.detach(), {}

            record = step(number, forward_backward, rows=len(groups))
            if number % config.log_every == 0:
                log.info("step %d/%d loss %.4f", number, config.steps, record["loss"])
    finally:
        model.eval()
    if config.lora:
        reranker.model = model.merge_and_unload().eval()
    if folder is not None:
        reranker.save(folder / "model")
    return reranker
