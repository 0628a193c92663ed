"""Masked next-token prediction (MNTP), LLM2Vec's first training step (BehnamGhader et al., 2024).

Once a decoder's causal mask is removed, its states have to learn to use the right-hand context. MNTP
does this with a masked-language-modelling task shaped like the model's pre-training: a fraction of
the tokens is hidden (BERT-style: 80% replaced by a mask token, 10% by a random token, 10% left), and
each hidden token at position ``i`` is predicted from the model's output at position ``i - 1`` — the
position whose output the language-model head was trained to read the next token from. Positions 0
(nothing precedes them), padding and special tokens are never hidden.

Decoders have no mask token; like LLM2Vec we use ``_`` when the tokenizer knows it as a single token,
else the tokenizer's mask, unknown or padding token.

The language-model head comes from :func:`build_lm_head`: the checkpoint's own ``lm_head.weight`` when
it has an untied one, else the input embedding matrix (tied weights, as in SmolLM2 and Gemma). The
head is never trained on its own: with tied weights it follows the embeddings.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from lmembed.errors import ConfigError
from lmembed.models.attention import mask_for
from lmembed.models.weights import shard_files

log = logging.getLogger(__name__)

IGNORE = -100


# ---------------------------------------------------------------------------------------------- LM head
class TiedLMHead(nn.Module):
    """Output projection that reuses the input embedding matrix (no weights of its own)."""

    def __init__(self, embeddings: nn.Embedding) -> None:
        super().__init__()
        self._embeddings = [embeddings]  # a list keeps the shared module out of this one's children

    @property
    def weight(self) -> Tensor:
        return self._embeddings[0].weight

    def forward(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.weight.to(hidden.dtype))


def _checkpoint_head(path: str) -> Tensor | None:
    """The ``lm_head.weight`` tensor stored in a local safetensors checkpoint, if there is one."""
    folder = Path(path) if path else None
    if folder is None or not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    files = [folder / "model.safetensors"]
    if index.exists():
        shard = shard_files(folder, index).get("lm_head.weight")
        files = [shard] if shard else []
    for file in files:
        if file.exists():
            with safe_open(str(file), framework="pt") as handle:
                if "lm_head.weight" in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                    return handle.get_tensor("lm_head.weight")
    return None


def build_lm_head(model: nn.Module, path: str = "") -> nn.Module:
    """A frozen next-token head for a bare decoder backbone (``AutoModel``, no head).

    Uses the checkpoint's untied ``lm_head.weight`` when the config says embeddings are untied and the
    checkpoint at ``path`` has one; otherwise ties the head to the input embeddings.
    """
    embeddings = model.get_input_embeddings()
    tied = bool(getattr(model.config, "tie_word_embeddings", True))
    weight = None if tied else _checkpoint_head(path)
    if weight is None:
        if not tied:
            log.info("no separate lm_head weight found at %r: tying the head to the input embeddings", path)
        return TiedLMHead(embeddings)
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight.data.copy_(weight)
    param = embeddings.weight
    return head.to(device=param.device, dtype=param.dtype).requires_grad_(False)


# ---------------------------------------------------------------------------------------------- masking
def mask_token_id(tokenizer: Any) -> int:
    """The id used to hide tokens, as LLM2Vec's ``run_mntp.py`` chooses it: the tokenizer's own mask token when it
    has one (Gemma 3's ``<mask>``), else ``_`` if it is one token (its default ``mask_token_type: blank``), else
    unk / pad / 0."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    ids = tokenizer("_", add_special_tokens=False)["input_ids"]
    if len(ids) == 1 and ids[0] != tokenizer.unk_token_id:
        return int(ids[0])
    for candidate in (tokenizer.unk_token_id, tokenizer.pad_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def maskable_positions(attention_mask: Tensor, special_mask: Tensor) -> Tensor:
    """Boolean ``[B, T]``: real, non-special tokens that have a real token right before them."""
    real = attention_mask.bool() & ~special_mask.bool()
    has_previous = torch.zeros_like(real)
    has_previous[:, 1:] = attention_mask[:, :-1].bool()
    return real & has_previous


def mask_tokens(
    input_ids: Tensor,
    candidates: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.2,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Hide a ``probability`` share of the candidate tokens; returns ``(masked ids, labels)``.

    ``labels`` holds the original id at hidden positions and ``-100`` elsewhere (unshifted: the label
    of position ``i`` is the token at ``i``). At least one token per batch is hidden.
    """
    draw = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    chosen = candidates & (draw < probability)
    if not bool(chosen.any()) and bool(candidates.any()):
        first = candidates.flatten().nonzero()[0]
        chosen.view(-1)[first] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    masked = input_ids.clone()
    masked[chosen & (action < 0.8)] = mask_id
    swap = chosen & (action >= 0.8) & (action < 0.9)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator, device=input_ids.device)
    masked[swap] = random_ids[swap]
    return masked, labels


def mntp_targets(labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Where each hidden token is predicted from: ``(rows, source positions, target ids)``.

    The token hidden at position ``i`` of row ``b`` is predicted from the output at ``(b, i - 1)``.
    """
    rows, positions = (labels != IGNORE).nonzero(as_tuple=True)
    if bool((positions == 0).any()):
        raise ValueError("a token at position 0 cannot be predicted from a previous position")
    return rows, positions - 1, labels[rows, positions]


def mntp_loss(hidden: Tensor, labels: Tensor, head: nn.Module) -> Tensor:
    """Cross-entropy of the hidden tokens, each read from the previous position's output."""
    rows, sources, targets = mntp_targets(labels)
    logits = head(hidden[rows, sources])
    return F.cross_entropy(logits.float(), targets)


# ---------------------------------------------------------------------------------------------- objective
class MNTPObjective:
    """MNTP on a :class:`~lmembed.training.trainable.TrainableEmbedder` (its backbone, LoRA included).

    ``attention`` is taken from the model's strategy: LLM2Vec runs MNTP with bidirectional attention.
    """

    data_kind = "texts"

    def __init__(
        self,
        model: Any,
        *,
        mask_probability: float = 0.2,
        max_length: int | None = None,
        seed: int = 0,
    ) -> None:
        backbone = model.embedder.backbone
        if not backbone.is_decoder:
            raise ConfigError("MNTP is for decoder LMs; train an encoder with its own MLM objective instead")
        if not 0 < mask_probability < 1:
            raise ConfigError(f"mask_probability={mask_probability} must be in (0, 1)")
        self.model = model
        self.tokenizer = backbone.tokenizer
        self.head = build_lm_head(backbone.model, backbone.path)
        self.mask_id = mask_token_id(self.tokenizer)
        self.probability = mask_probability
        self.max_length = max_length or min(model.config.max_length, 512)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        if model.config.attention != "bidirectional":
            log.warning("MNTP with %s attention: LLM2Vec trains it bidirectionally", model.config.attention)

    def tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        enc = self.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=True,
            max_length=self.max_length,
            padding=True,
            padding_side="right",
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        return dict(enc)

    def forward_hidden(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Final hidden states of the backbone under the strategy's attention mode."""
        backbone = self.model.embedder.backbone
        mode = self.model.config.attention
        positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        out = backbone.model(
            input_ids=input_ids,
            attention_mask=mask_for(mode, attention_mask, backbone.dtype, backbone.model.config),
            position_ids=positions,
            use_cache=False,
        )
        return out.last_hidden_state

    def loss(self, texts: list[str]) -> tuple[Tensor, dict[str, float]]:
        enc = self.tokenize(texts)
        device = self.model.device
        ids, attention = enc["input_ids"], enc["attention_mask"]
        candidates = maskable_positions(attention, enc["special_tokens_mask"])
        masked, labels = mask_tokens(
            ids,
            candidates,
            mask_id=self.mask_id,
            vocab_size=len(self.tokenizer),
            probability=self.probability,
            generator=self.generator,
        )
        hidden = self.forward_hidden(masked.to(device), attention.to(device))
        value = mntp_loss(hidden, labels.to(device), self.head)
        return value, {"masked_tokens": float((labels != IGNORE).sum())}
