"""Anchor embeddings, stage I: bidirectional reconstruction (EBQ2D + EBD2Q).

Before contrastive training, the model learns to *regenerate the other side of a relevant pair from an
embedding*. For a (query, document) pair:

* the query is embedded with the model itself (causal attention, last-token/EOS pooling): ``e_q``;
* ``e_q`` is placed as a single prefix position in front of the document's token embeddings, and the
  same language model, with its next-token head, is trained by teacher forcing to produce the
  document (EBQ2D, embedding-based query-to-document);
* symmetrically, the document's embedding ``e_d`` must regenerate the query (EBD2Q).

The stage-I loss is ``alpha * L_Q2D + (1 - alpha) * L_D2Q`` with ``alpha = 0.2`` as in the paper.
Gradients flow through the prefix back into the embedding pass, which is what teaches the embedding
to carry information about relevant counterparts. Stage II is ordinary contrastive training.

Layout of one decoded sequence (``T`` target tokens, right padded, EOS appended)::

    inputs:   [ e_q ] [ E(d_1) ] ... [ E(d_T) ]
    predicts:   d_1     d_2    ...    (none)

so the output at position ``t`` (0-based) is scored against target token ``t + 1`` of the text, i.e.
the prefix predicts the first token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lmembed.errors import ConfigError
from lmembed.models.attention import mask_for
from lmembed.training.stages.mntp import IGNORE, build_lm_head

DEFAULT_ALPHA = 0.2


def combine_losses(q2d: Tensor, d2q: Tensor, alpha: float = DEFAULT_ALPHA) -> Tensor:
    """``alpha * L_Q2D + (1 - alpha) * L_D2Q``."""
    if not 0 <= alpha <= 1:
        raise ConfigError(f"alpha={alpha} must be in [0, 1]")
    return alpha * q2d + (1 - alpha) * d2q


def build_prefix_inputs(
    prefix: Tensor, target_ids: Tensor, target_mask: Tensor, embeddings: torch.nn.Module
) -> tuple[Tensor, Tensor, Tensor]:
    """Decoder inputs for generating ``target_ids`` from a one-position ``prefix``.

    Args:
        prefix: ``[B, H]`` embeddings (one per text) placed at position 0.
        target_ids: ``[B, T]`` right-padded token ids of the texts to generate.
        target_mask: ``[B, T]``, 1 on real tokens.
        embeddings: the model's input embedding module.

    Returns ``(inputs_embeds [B, 1+T, H], attention_mask [B, 1+T], labels [B, 1+T])`` where
    ``labels[:, t]`` is the token the output at position ``t`` must predict (``-100`` where none).
    """
    if prefix.dim() != 2 or prefix.size(0) != target_ids.size(0):
        raise ValueError(f"prefix must be [B, H] with B={target_ids.size(0)}, got {tuple(prefix.shape)}")
    tokens = embeddings(target_ids)
    inputs = torch.cat([prefix.to(tokens.dtype).unsqueeze(1), tokens], dim=1)
    ones = torch.ones_like(target_mask[:, :1])
    attention = torch.cat([ones, target_mask], dim=1)
    labels = torch.full_like(attention, IGNORE)
    labels[:, :-1] = torch.where(target_mask.bool(), target_ids, torch.full_like(target_ids, IGNORE))
    return inputs, attention, labels


class AnchorObjective:
    """EBQ2D/EBD2Q reconstruction on a :class:`~lmembed.training.trainable.TrainableEmbedder`.

    The model's strategy should be causal attention with ``last`` pooling (the paper's setup); the
    decoding pass is always causal.

    Args:
        alpha: weight of the query-to-document direction.
        max_target_length: generated texts are cut to this many tokens (EOS included).
    """

    data_kind = "pairs"

    def __init__(self, model: Any, *, alpha: float = DEFAULT_ALPHA, max_target_length: int = 128) -> None:
        backbone = model.embedder.backbone
        if not backbone.is_decoder:
            raise ConfigError("anchor reconstruction needs a decoder LM (it generates text)")
        if model.config.attention != "causal":
            raise ConfigError("anchor reconstruction decodes with causal attention; use attention: causal")
        combine_losses(torch.zeros(()), torch.zeros(()), alpha)  # validates alpha
        self.model = model
        self.alpha = alpha
        self.max_target_length = max_target_length
        self.tokenizer = backbone.tokenizer
        self.head = build_lm_head(backbone.model, backbone.path)

    def target_tokens(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Right-padded ids (EOS appended when the tokenizer has one) and their mask."""
        eos = self.tokenizer.eos_token_id
        room = self.max_target_length - (1 if eos is not None else 0)
        rows = [self.tokenizer(t, add_special_tokens=False)["input_ids"][:room] for t in texts]
        if eos is not None:
            rows = [[*r, eos] for r in rows]
        width = max(1, max(len(r) for r in rows))
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        device = self.model.device
        return ids.to(device), mask.to(device)

    def reconstruction_loss(self, prefix: Tensor, texts: list[str]) -> Tensor:
        """Teacher-forced cross-entropy of generating ``texts`` from the prefix embeddings."""
        backbone = self.model.embedder.backbone
        ids, mask = self.target_tokens(texts)
        inputs, attention, labels = build_prefix_inputs(prefix, ids, mask, backbone.model.get_input_embeddings())
        positions = torch.arange(inputs.size(1), device=inputs.device).expand(inputs.size(0), -1)
        out = backbone.model(
            inputs_embeds=inputs,
            attention_mask=mask_for("causal", attention, backbone.dtype, backbone.model.config),
            position_ids=positions,
            use_cache=False,
        )
        keep = labels != IGNORE
        logits = self.head(out.last_hidden_state[keep])
        return F.cross_entropy(logits.float(), labels[keep])

    def loss(self, pairs: list[tuple[str, str]]) -> tuple[Tensor, dict[str, float]]:
        queries = [q for q, _ in pairs]
        documents = [d for _, d in pairs]
        query_vectors = self.model.embed(queries)
        document_vectors = self.model.embed(documents)
        q2d = self.reconstruction_loss(query_vectors, documents)
        d2q = self.reconstruction_loss(document_vectors, queries)
        total = combine_losses(q2d, d2q, self.alpha)
        return total, {"loss_q2d": float(q2d.detach()), "loss_d2q": float(d2q.detach())}
