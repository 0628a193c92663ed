"""Plain helpers shared by test files in several folders (fixtures live in conftest.py).

tests/ is on ``sys.path`` while the suite runs (pytest puts conftest.py's folder there), so any test file
imports these as ``from helpers import write_jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list) -> Path:
    """Write ``rows`` one per line: dicts as JSON, strings as they are (to plant malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def save_tiny_cross_encoder(folder: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A tiny random BERT with a sequence-classification head (and the tiny tokenizer) saved in ``folder``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from conftest import build_tokenizer

    torch.manual_seed(seed)
    tok = build_tokenizer()
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=num_labels,
    )
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
