"""``LLMReranker``: a causal LM asked whether a document meets a query; the score is the log-odds of its next
token being "yes" rather than "no" (Qwen3-Reranker's recipe, which works for any instruction-tuned LM).

Each pair becomes ``prefix + body + suffix`` with the body ``template`` filled with the instruction, the query and
the document; the body (its end: the document) is cut so the whole prompt fits ``max_length``. Prompts are padded
on the left with position ids counted from each prompt's first real token, so a pair's score does not depend on
the batch it shares (beyond float rounding). The defaults are Qwen3-Reranker's prompt; the relevance score is
``sigmoid(logit[yes] - logit[no])`` = P(yes | yes or no) (``activation="none"`` keeps the log-odds).

For a decoder read by a trained score head at its last token (RankLLaMA), use :class:`CrossEncoderReranker`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.atomic import atomic_write_text
from lmembed.errors import ConfigError, ModelLoadError
from lmembed.io import read_json
from lmembed.models.loading import (
    check_local_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from lmembed.models.weights import pretrained_safely
from lmembed.rerank.base import (
    DEFAULT_MAX_BATCH_TOKENS,
    PAIR_BATCH_SIZE,
    RERANKER_FILE,
    RERANKER_FORMAT,
    Features,
    Reranker,
)

KIND = "llm"
ACTIVATIONS = ("sigmoid", "none")


@dataclass(frozen=True)
class RelevancePrompt:
    """The prompt around a pair, and the two answer tokens compared."""

    prefix: str = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    template: str = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    suffix: str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    instruction: str = "Given a web search query, retrieve relevant passages that answer the query"
    true_token: str = "yes"
    false_token: str = "no"

    def body(self, query: str, document: str) -> str:
        return self.template.format(instruction=self.instruction, query=query, document=document)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> RelevancePrompt:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"{where}: unknown prompt field(s) {', '.join(unknown)}")
        prompt = cls(**data)
        for field in ("query", "document"):
            if "{" + field + "}" not in prompt.template:
                raise ConfigError(f"{where}: the prompt template has no {{{field}}} placeholder")
        return prompt


def token_id(tokenizer: Any, token: str, field: str) -> int:
    """The vocabulary id of ``token`` (one token, not the unknown token)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or (tokenizer.unk_token_id is not None and found == tokenizer.unk_token_id):
        raise ModelLoadError(f"{field}={token!r} is not one token of this tokenizer's vocabulary; choose another")
    return int(found)


class LLMReranker(Reranker):
    """A causal LM as a yes/no relevance judge (see the module doc)."""

    kind = KIND

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        prompt: RelevancePrompt | None = None,
        activation: str = "sigmoid",
        **kwargs: Any,
    ) -> None:
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation={activation!r} is unknown; choose one of {', '.join(ACTIVATIONS)}")
        self.prompt = prompt or RelevancePrompt()
        self.activation_name = activation
        super().__init__(
            model, tokenizer, activation=nn.Sigmoid() if activation == "sigmoid" else nn.Identity(), **kwargs
        )
        self.true_id = token_id(tokenizer, self.prompt.true_token, "true_token")
        self.false_id = token_id(tokenizer, self.prompt.false_token, "false_token")
        if self.true_id == self.false_id:
            raise ConfigError("true_token and false_token are the same token")
        bos = tokenizer.bos_token_id if getattr(tokenizer, "add_bos_token", False) else None
        self.prefix_ids = ([bos] if bos is not None else []) + self._ids(self.prompt.prefix)
        self.suffix_ids = self._ids(self.prompt.suffix)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
        if len(self.prefix_ids) + len(self.suffix_ids) >= self.max_length:
            raise ConfigError(f"max_length={self.max_length} leaves no room after the prompt's own tokens")

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_length: int | None = None,
        prompt: RelevancePrompt | dict[str, Any] | None = None,
        activation: str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        batch_size: int = PAIR_BATCH_SIZE,
        trust_remote_code: bool = False,
    ) -> LLMReranker:
        """A causal LM checkpoint (a folder this class saved keeps its prompt and options), a bundled name or a
        Hub id. ``prompt`` overrides the recorded (or default) prompt, field by field when a dict."""
        # lazy: transformers is heavy
        from transformers import AutoConfig, AutoModelForCausalLM

        path = resolve_model_path(name_or_path)
        saved = _read_saved(Path(path))
        fields = dict(saved.get("prompt") or {})
        if isinstance(prompt, RelevancePrompt):
            fields = asdict(prompt)
        elif prompt:
            fields.update(prompt)
        check_local_model(path)
        try:
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            model = pretrained_safely(
                AutoModelForCausalLM,
                path,
                config=config,
                dtype=resolve_dtype(dtype),
                trust_remote_code=trust_remote_code,
            )
        except ModelLoadError:
            raise
        except ValueError as exc:
            raise ModelLoadError(f"{name_or_path}: cannot be loaded as a causal LM ({exc})") from exc
        model.to(resolve_device(device))
        tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
        limit = getattr(model.config, "max_position_embeddings", None) or 4096
        return cls(
            model,
            tokenizer,
            name=name_or_path,
            prompt=RelevancePrompt.from_dict(fields, f"{name_or_path} prompt"),
            activation=activation or saved.get("activation", "sigmoid"),
            max_length=max_length or saved.get("max_length") or min(int(limit), 1024),
            max_batch_tokens=max_batch_tokens,
            batch_size=batch_size,
        )

    def encode_pair(self, query: str, document: str) -> Features:
        room = self.max_length - len(self.prefix_ids) - len(self.suffix_ids)
        body = self._ids(self.prompt.body(query, document))[:room]
        return {"input_ids": self.prefix_ids + body + self.suffix_ids}

    def collate(self, features: Sequence[Features]) -> dict[str, torch.Tensor]:
        """Left padding, with position ids that start at each prompt's first real token."""
        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for row, f in enumerate(features):
            n = len(f["input_ids"])
            ids[row, longest - n :] = torch.tensor(f["input_ids"], dtype=torch.long)
            mask[row, longest - n :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        device = self.device
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.model(**batch, logits_to_keep=1).logits[:, -1, :]
        return (logits[:, self.true_id] - logits[:, self.false_id]).unsqueeze(1)

    def save(self, directory: str | Path) -> Path:
        """The model, the tokenizer and ``lmembed_reranker.json`` (the prompt, activation and max length)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        meta = {
            "kind": KIND,
            "format": RERANKER_FORMAT,
            "base_model": self.name,
            "prompt": asdict(self.prompt),
            "activation": self.activation_name,
            "max_length": self.max_length,
        }
        atomic_write_text(directory / RERANKER_FILE, json.dumps(meta, indent=2))
        return directory


def _read_saved(path: Path) -> dict[str, Any]:
    file = path / RERANKER_FILE
    if not file.is_file():
        return {}
    return read_json(file, error=ModelLoadError, what="reranker record")
