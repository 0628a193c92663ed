"""``Reranker``: what every reranker does with its model once it can turn a pair into token ids and a batch
into scores.

A subclass supplies :meth:`Reranker.encode_pair` (a query–document pair → the model's inputs, truncated
to ``max_length``), :meth:`Reranker.forward` (a padded batch → one row of logits per pair) and
:meth:`Reranker.save`. This class tokenises every pair once, groups pairs into forward passes by a token budget
(:func:`~lmembed.rerank.batching.token_batches`), applies the activation and puts the scores back in input
order. :meth:`predict` returns what sentence-transformers' ``CrossEncoder.predict`` returns (``(n,)`` for a
one-label model, ``(n, num_labels)`` otherwise); :meth:`score` and :meth:`rank` need one score per pair.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmembed.encoding.inputs import check_encodable, validate_texts
from lmembed.errors import ConfigError, InputError
from lmembed.io import whole_number
from lmembed.rerank.batching import token_batches

log = logging.getLogger(__name__)

#: Padded tokens (pairs x longest) per forward pass, and pairs per pass, unless told otherwise.
DEFAULT_MAX_BATCH_TOKENS = 16384
PAIR_BATCH_SIZE = 64
#: The file in which lmembed records what kind of reranker a folder holds, and its options.
RERANKER_FILE = "lmembed_reranker.json"
#: The format of :data:`RERANKER_FILE` this lmembed writes and reads.
RERANKER_FORMAT = 1

Features = dict[str, list[int]]


@dataclass(frozen=True)
class Ranked:
    """One document of a ranking: its position in the list given, its score, and (if asked) its text."""

    index: int
    score: float
    document: str | None = None


def check_pairs(pairs: Any) -> list[tuple[str, str]]:
    """A list of ``(query, document)`` string pairs, or an :class:`InputError` naming the bad item."""
    if isinstance(pairs, tuple) and len(pairs) == 2 and all(isinstance(x, str) for x in pairs):
        raise InputError("pairs must be a list of (query, document) pairs, not a single pair (wrap it in a list)")
    if pairs is None or isinstance(pairs, str | bytes | bytearray | Mapping | set | frozenset):
        raise InputError(f"pairs must be a list of (query, document) pairs, got {type(pairs).__name__}")
    try:
        items = list(pairs)
    except TypeError:
        raise InputError(f"pairs must be a list of (query, document) pairs, got {type(pairs).__name__}") from None
    checked = []
    for i, pair in enumerate(items):
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise InputError(f"pairs[{i}] is {pair!r:.60}; every item must be a (query, document) pair of strings")
        check_encodable(pair[0], f"pairs[{i}] query")
        check_encodable(pair[1], f"pairs[{i}] document")
        checked.append((pair[0], pair[1]))
    return checked


class Reranker:
    """A model that scores query–document pairs (see the module doc)."""

    kind = "reranker"

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        name: str = "in-memory",
        max_length: int = 512,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        batch_size: int = PAIR_BATCH_SIZE,
        activation: nn.Module | None = None,
    ) -> None:
        if max_length < 2:
            raise ConfigError(f"max_length={max_length} must be at least 2")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_length = max_length
        self.max_batch_tokens = max_batch_tokens
        self.batch_size = batch_size
        self.activation = activation if activation is not None else nn.Identity()

    # ------------------------------------------------------------------ what a subclass supplies
    def encode_pair(self, query: str, document: str) -> Features:
        raise NotImplementedError

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Features]:
        """Every pair's inputs (a subclass may tokenise them all in one call)."""
        return [self.encode_pair(q, d) for q, d in pairs]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits ``(batch, num_labels)`` of a padded batch (gradients flow when called in train mode)."""
        raise NotImplementedError

    def collate(self, features: Sequence[Features]) -> dict[str, torch.Tensor]:
        """Pad a batch (on the tokenizer's padding side) into tensors on the model's device."""
        batch = self.tokenizer.pad(list(features), padding=True, return_tensors="pt")
        return {key: value.to(self.device) for key, value in batch.items()}

    def save(self, directory: str | Path) -> Path:
        raise NotImplementedError

    # ------------------------------------------------------------------ facts
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def num_labels(self) -> int:
        return 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, max_length={self.max_length})"

    # ------------------------------------------------------------------ scoring
    def logits(self, features: Sequence[Features]) -> torch.Tensor:
        """Logits of already-encoded pairs, batched by the token budget, in input order (no gradient)."""
        lengths = [len(f["input_ids"]) for f in features]
        out = torch.empty((len(features), self.num_labels), dtype=torch.float32)
        with torch.inference_mode():
            for positions in token_batches(lengths, self.max_batch_tokens, self.batch_size):
                logits = self.forward(self.collate([features[i] for i in positions]))
                out[positions] = logits.float().cpu()
        return out

    def predict(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """Activated scores, as ``CrossEncoder.predict``: ``(n,)`` for one label, ``(n, num_labels)`` otherwise."""
        pairs = check_pairs(pairs)
        if not pairs:
            return np.zeros((0,) if self.num_labels == 1 else (0, self.num_labels), dtype=np.float32)
        unique: dict[tuple[str, str], int] = {}  # a pair given twice is scored once: copies tie exactly
        where = [unique.setdefault(pair, len(unique)) for pair in pairs]
        with torch.inference_mode():
            scores = self.activation(self.logits(self.encode_pairs(list(unique))))
        scores = scores.numpy().astype(np.float32)[where]
        return scores[:, 0] if self.num_labels == 1 else scores

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """One relevance score per pair (higher is more relevant)."""
        if self.num_labels != 1:
            raise ConfigError(
                f"{self.name} has {self.num_labels} labels; ranking needs a model with one relevance score per pair"
            )
        return self.predict(pairs)

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """Scores of ``documents`` for one query."""
        if not isinstance(query, str):
            raise InputError(f"query must be a str, got {type(query).__name__}")
        documents = validate_texts(documents, "documents")
        return self.score_pairs([(query, d) for d in documents])

    def rank(
        self, query: str, documents: Sequence[str], top_k: int | None = None, *, return_documents: bool = False
    ) -> list[Ranked]:
        """``documents`` by descending score (ties keep the given order), the first ``top_k`` of them."""
        documents = validate_texts(documents, "documents")
        if top_k is not None:  # None: all of them
            top_k = whole_number(top_k, "top_k")
        scores = self.score(query, documents)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_k]
        return [Ranked(i, float(scores[i]), documents[i] if return_documents else None) for i in order]
