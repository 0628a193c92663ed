"""``CrossEncoderReranker``: a model with a sequence-classification head reads ``query [SEP] document`` and its
logits are the relevance score.

Any ``AutoModelForSequenceClassification`` works: an encoder (BERT, MiniLM, XLM-R ...) reads the pair as the
tokenizer joins it, and a decoder (Llama, Qwen ...) is scored at its last real token, as RankLLaMA/RepLLaMA's
reranker is. A backbone without a head (e.g. the bundled ``minilm``) gets a fresh one-label head (unless
``num_labels`` says otherwise), to be trained.

It reads and writes sentence-transformers' ``CrossEncoder`` folder format, with its conventions: the
activation recorded in ``config_sentence_transformers.json`` (``activation_fn``; or, from sentence-transformers
< 5, in ``config.json``), else ``Sigmoid`` for one label and ``Identity`` for several; pairs truncated
``longest_first`` to the tokenizer's ``model_max_length`` capped at the model's ``max_position_embeddings``. So
``CrossEncoder(folder).predict(pairs)`` and this class's :meth:`predict` give equal scores, either way round.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.atomic import atomic_write_text
from lmembed.errors import ModelLoadError
from lmembed.io import read_json
from lmembed.models.loading import (
    check_local_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from lmembed.models.weights import check_size_value, pretrained_safely
from lmembed.rerank.base import (
    DEFAULT_MAX_BATCH_TOKENS,
    PAIR_BATCH_SIZE,
    RERANKER_FILE,
    RERANKER_FORMAT,
    Features,
    Reranker,
)

log = logging.getLogger(__name__)

ST_CONFIG_FILE = "config_sentence_transformers.json"
ST_TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
KIND = "cross-encoder"
#: the modules of a sequence-classification head across architectures (BERT's classifier, DistilBERT's
#: pre_classifier, a decoder's score): a backbone without a head gets them new, so their tensors may be missing
NEW_HEAD_MODULES = ("classifier", "pre_classifier", "score")


def activation_name(activation: nn.Module) -> str:
    """The dotted path sentence-transformers records (``torch.nn.modules.activation.Sigmoid``)."""
    return f"{type(activation).__module__}.{type(activation).__qualname__}"


#: The activations a CrossEncoder folder may record (``activation_fn``): a closed list of torch classes, each
#: under its full and its short path. Nothing else a file names is imported or called.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    f"{prefix}.{cls.__name__}": cls
    for cls in (nn.Identity, nn.Sigmoid, nn.Tanh, nn.ReLU, nn.GELU, nn.SiLU, nn.Softmax, nn.LogSigmoid)
    for prefix in (cls.__module__, "torch.nn")
}


def resolve_activation(path: str | None, num_labels: int, where: str) -> nn.Module:
    """The activation a dotted path names, from the closed list :data:`ACTIVATIONS`; another ``torch.`` path is
    refused, and a path outside torch (custom code, which sentence-transformers runs only with
    ``trust_remote_code``) falls back to the default, with a warning."""
    if path and not isinstance(path, str):
        raise ModelLoadError(f"{where}: activation_fn must be a dotted class path, got {path!r:.80}")
    if path and path in ACTIVATIONS:
        return ACTIVATIONS[path]()
    if path and path.startswith("torch."):
        known = ", ".join(sorted({f"torch.nn.{cls.__name__}" for cls in ACTIVATIONS.values()}))
        raise ModelLoadError(f"{where}: activation_fn={path!r} is not an activation lmembed builds; known: {known}")
    if path:
        log.warning("%s: activation_fn %r is not a torch class; using the default activation", where, path)
    return nn.Sigmoid() if num_labels == 1 else nn.Identity()


def recorded_activation(path: Path, config: Any) -> tuple[str | None, str]:
    """The activation path a saved folder records, and the file that records it."""
    st_file = path / ST_CONFIG_FILE
    if st_file.is_file():
        recorded = read_json(st_file, error=ModelLoadError, what="cross-encoder config").get("activation_fn")
        if recorded:
            return recorded, str(st_file)
    legacy = getattr(config, "sentence_transformers", None)
    if isinstance(legacy, dict) and legacy.get("activation_fn"):
        return legacy["activation_fn"], str(path / "config.json")
    old = getattr(config, "sbert_ce_default_activation_function", None)
    return old, str(path / "config.json")


def default_max_length(tokenizer: Any, config: Any) -> int:
    """sentence-transformers' rule: the tokenizer's ``model_max_length`` capped at ``max_position_embeddings``."""
    limits = [int(tokenizer.model_max_length)] if tokenizer.model_max_length else []
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    return min(limits) if limits else 512


def identity_pooler(model: nn.Module, where: str) -> None:
    """Set the pooler's square dense layer to the identity (bias 0): the head then reads ``tanh`` of [CLS]."""
    pooler = getattr(getattr(model, "base_model", None), "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not isinstance(dense, nn.Linear) or dense.in_features != dense.out_features:
        raise ModelLoadError(f"{where}: reset_pooler needs a BERT-style pooler (a square dense layer under the head)")
    with torch.no_grad():
        dense.weight.copy_(torch.eye(dense.in_features, dtype=dense.weight.dtype))
        if dense.bias is not None:
            dense.bias.zero_()


class CrossEncoderReranker(Reranker):
    """A sequence-classification model as a reranker (see the module doc)."""

    kind = KIND

    def __init__(self, model: nn.Module, tokenizer: Any, **kwargs: Any) -> None:
        if tokenizer.pad_token is None:  # decoders: pad with the end-of-text token
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # a decoder's head finds the last real token by it
        kwargs.setdefault("max_length", default_max_length(tokenizer, model.config))
        if kwargs.get("activation") is None:
            kwargs["activation"] = resolve_activation(None, int(model.config.num_labels), "model")
        super().__init__(model, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_length: int | None = None,
        num_labels: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        batch_size: int = PAIR_BATCH_SIZE,
        trust_remote_code: bool = False,
        reset_pooler: bool = False,
    ) -> CrossEncoderReranker:
        """A CrossEncoder folder (or any transformers checkpoint: a bare backbone gets a new head), a bundled
        name or a Hub id. ``reset_pooler`` sets a BERT-style pooler (the dense layer under the head) to the identity
        before training: an embedding checkpoint's pooler was never trained for [CLS] (minilm's answers ~0.05 per
        dimension whatever the pair), so a new head reads almost nothing and learns too slowly."""
        # lazy: transformers is heavy
        from transformers import AutoConfig, AutoModelForSequenceClassification

        path = resolve_model_path(name_or_path)
        check_local_model(path)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        has_head = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
        if num_labels is not None:
            config.num_labels = check_size_value(num_labels, "num_labels", "the num_labels option")
        elif not has_head:
            config.num_labels = 1  # a reranker's new head gives one relevance score (transformers' default is 2)
        else:  # the head's labels as transformers read them (len(id2label) when config.json lists labels)
            check_size_value(config.num_labels, "num_labels", Path(path) / "config.json")
        if not has_head:
            log.warning("%s has no sequence-classification head: a new, untrained one is added", name_or_path)
        recorded, where = recorded_activation(Path(path), config) if Path(path).is_dir() else (None, path)
        activation = resolve_activation(recorded, int(config.num_labels), where)  # before any weight is read
        try:
            model = pretrained_safely(
                AutoModelForSequenceClassification,
                path,
                config=config,
                dtype=resolve_dtype(dtype),
                trust_remote_code=trust_remote_code,
                unread=() if has_head else NEW_HEAD_MODULES + (("pooler",) if reset_pooler else ()),
            )
        except ModelLoadError:
            raise
        except ValueError as exc:
            raise ModelLoadError(f"{name_or_path}: not loadable as a sequence-classification model ({exc})") from exc
        if reset_pooler:
            identity_pooler(model, name_or_path)
        model.to(resolve_device(device))
        tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
        return cls(
            model,
            tokenizer,
            name=name_or_path,
            max_length=max_length or default_max_length(tokenizer, config),
            max_batch_tokens=max_batch_tokens,
            batch_size=batch_size,
            activation=activation,
        )

    @property
    def num_labels(self) -> int:
        return int(self.model.config.num_labels)

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[Features]:
        encoded = self.tokenizer(
            [q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first", max_length=self.max_length
        )
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded]
        return [{k: encoded[k][i] for k in keys} for i in range(len(pairs))]

    def encode_pair(self, query: str, document: str) -> Features:
        return self.encode_pairs([(query, document)])[0]

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**batch).logits

    def save(self, directory: str | Path) -> Path:
        """The model, the tokenizer (its ``model_max_length`` set to ``max_length``) and sentence-transformers'
        CrossEncoder files, so ``CrossEncoder(directory)`` loads the same scorer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        activation = activation_name(self.activation)
        self.model.config.sentence_transformers = {"activation_fn": activation}  # sentence-transformers < 5
        self.model.save_pretrained(directory)
        self.tokenizer.model_max_length = self.max_length
        self.tokenizer.save_pretrained(directory)
        files = {
            ST_CONFIG_FILE: {"activation_fn": activation, "model_type": "CrossEncoder", "prompts": {}},
            "modules.json": [{"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER}],
            "sentence_bert_config.json": {
                "transformer_task": "sequence-classification",
                "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                "module_output_name": "scores",
            },
            RERANKER_FILE: {"kind": KIND, "format": RERANKER_FORMAT, "base_model": self.name},
        }
        for name, content in files.items():
            atomic_write_text(directory / name, json.dumps(content, indent=2))
        return directory
