"""The generative side of a decoder: instruction-formatted next-token loss, attention switching, perplexity.

GRIT (:mod:`.grit`) trains one set of weights both as an embedder (bidirectional attention) and as a
generator (causal attention). This module holds what the generative half needs:

* :func:`answer_labels` tokenises ``<|user|>\\n{prompt}\\n<|assistant|>\\n{answer}<eos>`` and labels only the
  answer tokens (the prompt and padding get ``-100``), right padded;
* :func:`causal_lm_loss` is the token-level next-token cross-entropy of such a batch, read through the
  model's LM head (:func:`~lmembed.training.stages.mntp.build_lm_head`);
* :class:`AttentionSwitch` flips a shared model between causal and bidirectional attention, probing each
  mode once (with dropout off) the first time it is entered, then switching without the probe;
* :func:`perplexity` measures how well a saved model still generates: the exponential of the mean
  next-token loss over held-out texts (or answers given prompts), always with causal attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.models.attention import configure_attention, configured_mode
from lmembed.training.stages.mntp import IGNORE, build_lm_head

USER_TEMPLATE = "<|user|>\n{prompt}\n<|assistant|>\n"

__all__ = ["USER_TEMPLATE", "AttentionSwitch", "answer_labels", "causal_lm_loss", "perplexity"]


class AttentionSwitch:
    """Put a decoder into ``causal`` or ``bidirectional`` mode; each mode is verified by a probe on first use."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.verified: set[str] = set()

    def __call__(self, mode: str) -> None:
        if configured_mode(self.model) == mode and mode in self.verified:
            return
        if mode in self.verified:
            configure_attention(self.model, mode, verify=False)
            return
        training = self.model.training
        self.model.eval()  # the probe compares two rows: dropout would look like attention to later tokens
        try:
            configure_attention(self.model, mode, verify=True)
        finally:
            self.model.train(training)
        self.verified.add(mode)


def _leading_bos(tokenizer: Any) -> list[int]:
    """``[bos]`` when the tokenizer itself starts a text with it (Llama, Mistral, Gemma), else ``[]`` (SmolLM2)."""
    bos = tokenizer.bos_token_id
    first = tokenizer("a", add_special_tokens=True)["input_ids"][:1]
    return [bos] if bos is not None and first == [bos] else []


def _row_ids(tokenizer: Any, prompt: str | None, answer: str, template: str, room: int) -> tuple[list[int], int]:
    """Token ids of one formatted row and how many leading ones are prompt (never scored)."""
    head = tokenizer(template.format(prompt=prompt), add_special_tokens=False)["input_ids"] if prompt else []
    bos = _leading_bos(tokenizer)
    tail = tokenizer(answer, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        tail = [*tail, tokenizer.eos_token_id]
    ids = (bos + head + tail)[:room]
    return ids, min(len(bos) + len(head), len(ids))


def answer_labels(
    tokenizer: Any,
    prompts: Sequence[str | None],
    answers: Sequence[str],
    *,
    template: str = USER_TEMPLATE,
    max_length: int = 256,
) -> dict[str, Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (``-100`` on prompt tokens and padding), right padded.

    A ``None`` prompt scores the whole text (plain language modelling, e.g. held-out perplexity). The label of
    position ``i`` is the token at ``i`` itself (unshifted); :func:`causal_lm_loss` shifts.
    """
    if len(prompts) != len(answers):
        raise ConfigError(f"{len(prompts)} prompts for {len(answers)} answers")
    if "{prompt}" not in template:
        raise ConfigError(f"generation template {template!r} must contain '{{prompt}}'")
    rows = [_row_ids(tokenizer, p, a, template, max_length) for p, a in zip(prompts, answers, strict=True)]
    width = max(2, max(len(ids) for ids, _ in rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (ids, prompt_len) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
        labels[i, prompt_len : len(ids)] = input_ids[i, prompt_len : len(ids)]
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def token_losses(model: nn.Module, head: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Per-token next-token losses of the scored positions and their targets (the model must be causal)."""
    ids, attention, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    out = model(input_ids=ids, attention_mask=attention, use_cache=False)
    targets = labels[:, 1:]
    keep = targets != IGNORE
    if not bool(keep.any()):
        raise ConfigError("no answer token to score (every row was cut to its prompt; raise max_length)")
    logits = head(out.last_hidden_state[:, :-1][keep])
    return F.cross_entropy(logits.float(), targets[keep], reduction="none"), targets[keep]


def causal_lm_loss(model: nn.Module, head: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Mean next-token cross-entropy over the answer tokens of ``batch`` (token-level, as GritLM's default)."""
    losses, _ = token_losses(model, head, batch)
    return losses.mean()


def perplexity(
    embedder: Any,
    texts: Sequence[str],
    *,
    prompts: Sequence[str | None] | None = None,
    template: str = USER_TEMPLATE,
    batch_size: int = 16,
    max_length: int = 256,
) -> float:
    """Perplexity of ``texts`` (the answers, given ``prompts`` when set) under a decoder Embedder, run causally.

    The model is put in causal mode for the measurement and back in its previous mode afterwards.
    """
    backbone = embedder.backbone
    if not backbone.is_decoder:
        raise ConfigError("perplexity needs a decoder language model")
    model = backbone.model
    previous = configured_mode(model) or embedder.config.attention
    head = build_lm_head(model, backbone.path)
    prompts = list(prompts) if prompts is not None else [None] * len(texts)
    total, count = 0.0, 0
    switch = AttentionSwitch(model)
    switch("causal")
    try:
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = answer_labels(
                    backbone.tokenizer,
                    prompts[start : start + batch_size],
                    list(texts[start : start + batch_size]),
                    template=template,
                    max_length=max_length,
                )
                losses, _ = token_losses(model, head, {k: v.to(backbone.device) for k, v in batch.items()})
                total += float(losses.sum())
                count += losses.numel()
    finally:
        switch(previous)
    return math.exp(total / max(count, 1))
