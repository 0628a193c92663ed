"""Reranker training: the two reranker losses against their formulas, a tiny cross-encoder that learns to put the
positive first (saved in CrossEncoder format, equal scores from sentence-transformers), and an LLM reranker
trained with LoRA whose merged, saved folder reloads to the same scores."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import WORDS, build_tokenizer, tiny_decoder_config
from helpers import save_tiny_cross_encoder
from lmembed.errors import ConfigError
from lmembed.rerank import load_reranker
from lmembed.training.losses import ListwiseSoftmaxLoss, PointwiseBCELoss
from lmembed.training.reranker import RerankRow, RerankTrainConfig, train_reranker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_reranker_losses_by_their_formulas():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]])
    rows = [[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]]

    def log_sigmoid(x: float) -> float:
        return -math.log1p(math.exp(-x))

    bce = -np.mean([log_sigmoid(v) if j == 0 else log_sigmoid(-v) for row in rows for j, v in enumerate(row)])
    assert float(PointwiseBCELoss()(logits)) == pytest.approx(bce, rel=1e-6)
    softmax = -np.mean([row[0] - math.log(sum(math.exp(v) for v in row)) for row in rows])
    assert float(ListwiseSoftmaxLoss()(logits)) == pytest.approx(softmax, rel=1e-6)
    tempered = float(ListwiseSoftmaxLoss(temperature=0.5)(logits))
    assert tempered == pytest.approx(float(ListwiseSoftmaxLoss()(logits * 2)), rel=1e-6)
    with pytest.raises(ValueError, match="at least one negative"):
        ListwiseSoftmaxLoss()(logits[:, :1])


def rows(count: int = 24, seed: int = 0) -> list[RerankRow]:
    """The positive repeats the query's word; negatives never hold it."""
    rng = np.random.default_rng(seed)
    vocab = WORDS[9:]
    out = []
    for _ in range(count):
        word = str(rng.choice(vocab))
        others = [w for w in vocab if w != word]
        fillers = [" ".join(rng.choice(others, size=4)) for _ in range(5)]
        out.append(RerankRow(word, f"{word} {fillers[0]} {word}", fillers[1:]))
    return out


def top1(reranker, data) -> float:
    return float(np.mean([np.argmax(reranker.score(r.query, [r.positive, *r.negatives])) == 0 for r in data]))


@pytest.mark.parametrize("loss", ["listwise_softmax", "pointwise_bce"])
def test_cross_encoder_learns_and_saves_in_crossencoder_format(tmp_path, loss):
    from sentence_transformers import CrossEncoder

    reranker = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce", seed=4)))
    train, held_out = rows(24, seed=1), rows(20, seed=2)
    before = top1(reranker, held_out)
    config = RerankTrainConfig(steps=40, batch_size=6, negatives=3, lr=3e-3, warmup_steps=4, loss=loss, log_every=10)
    train_reranker(reranker, train, config, tmp_path / "run")
    after = top1(reranker, held_out)
    assert after > before and after >= 0.8, (before, after)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30, 40] and records[-1]["loss"] < records[0]["loss"]
    pairs = [(r.query, d) for r in held_out[:4] for d in (r.positive, *r.negatives)]
    st = CrossEncoder(str(tmp_path / "run" / "model")).predict(pairs)
    np.testing.assert_allclose(load_reranker(str(tmp_path / "run" / "model")).predict(pairs), st, atol=1e-6)
    np.testing.assert_allclose(reranker.predict(pairs), st, atol=1e-5)


def test_llm_reranker_trains_with_lora_and_reloads_merged(tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(6)
    tok = build_tokenizer()
    LlamaForCausalLM(tiny_decoder_config("llama", len(tok))).save_pretrained(tmp_path / "llm")
    tok.save_pretrained(tmp_path / "llm")
    prompt = {"prefix": "", "template": "query : {query} document : {document}", "suffix": " ?", "instruction": ""}
    reranker = load_reranker(str(tmp_path / "llm"), prompt={**prompt, "true_token": "great", "false_token": "bad"})
    base = {n: p.detach().clone() for n, p in reranker.model.named_parameters()}
    config = RerankTrainConfig(steps=30, batch_size=6, lr=5e-3, warmup_steps=3, lora=True, lora_r=4, log_every=10)
    train_reranker(reranker, rows(24, seed=3), config, tmp_path / "run")
    assert not hasattr(reranker.model, "peft_config")  # merged back into a plain model
    changed = [n for n, p in reranker.model.named_parameters() if not torch.equal(p, base[n])]
    assert changed and all("proj" in n for n in changed)  # only the LoRA-wrapped linear layers moved
    held_out = rows(20, seed=4)
    pairs = [(r.query, d) for r in held_out[:3] for d in (r.positive, *r.negatives)]
    again = load_reranker(str(tmp_path / "run" / "model"))
    np.testing.assert_allclose(again.predict(pairs), reranker.predict(pairs), atol=1e-5)
    assert top1(reranker, held_out) >= 0.5


def test_bad_training_options():
    with pytest.raises(ConfigError, match="loss='infonce'"):
        RerankTrainConfig(loss="infonce")
    with pytest.raises(ConfigError, match="negatives=0"):
        RerankTrainConfig(negatives=0)
