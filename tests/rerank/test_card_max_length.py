"""A published reranker's default maximum length is its model card's, not its tokenizer's (bge-reranker-v2-m3's
tokenizer says 8192, its card's FlagReranker cuts at 512)."""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import build_tokenizer, tiny_bert_config
from lmembed.models.presets import reranker_max_length
from lmembed.rerank.loading import load_reranker


def save_cross_encoder(folder: Path) -> Path:
    """A tiny BERT cross-encoder whose tokenizer and positions allow more than the card's 512 tokens."""
    from transformers import BertForSequenceClassification

    tok = build_tokenizer()
    tok.model_max_length = 8192
    torch.manual_seed(0)
    config = tiny_bert_config(len(tok), num_hidden_layers=1, max_position_embeddings=1024, num_labels=1)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_published_reranker_defaults_to_its_cards_max_length(tmp_path):
    m3 = save_cross_encoder(tmp_path / "hub" / "models--BAAI--bge-reranker-v2-m3" / "snapshots" / "abc")
    other = save_cross_encoder(tmp_path / "my-reranker")
    assert load_reranker(str(m3)).max_length == 512
    assert load_reranker(str(m3), max_length=64).max_length == 64  # the caller's wins
    assert load_reranker(str(other)).max_length == 1024  # no card: the tokenizer's limit capped at the positions
    assert reranker_max_length("Qwen/Qwen3-Reranker-4B") == 8192
    assert reranker_max_length("BAAI/bge-reranker-base") is None
