"""Pre-training objectives (MNTP, SimCSE, Anchor stage I, AnglE pairs) on tiny random models."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.training.stages import (
    OBJECTIVES,
    BatchStream,
    ObjectiveConfig,
    ObjectiveConfigError,
    build_objective,
    load_items,
    run_objective,
    train_steps,
)
from lmembed.training.stages.anchor import build_prefix_inputs, combine_losses
from lmembed.training.stages.mntp import (
    IGNORE,
    TiedLMHead,
    mask_tokens,
    maskable_positions,
    mntp_loss,
    mntp_targets,
)
from lmembed.training.stages.simcse import has_active_dropout, set_attention_dropout
from lmembed.training.train_config import OBJECTIVE_NAMES
from lmembed.training.trainable import TrainableEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TEXTS = [
    "the cat sat on the mat",
    "a dog was eating food",
    "the man is riding a horse",
    "protein gene cell study result",
    "language model embedding vector search",
    "hello there friend",
    "the woman sat on a rug",
    "great movie, bad food",
]
PAIRS = list(zip(TEXTS[:4], TEXTS[4:], strict=True))


def trainable(tokenizer, **strategy) -> TrainableEmbedder:
    model = tiny_model("llama", len(tokenizer))
    embedder = Embedder.from_model(model, tokenizer, EmbeddingConfig(**strategy), use_cache=False, show_progress=False)
    return TrainableEmbedder(embedder, lora=None)


def quick_config(**changes) -> ObjectiveConfig:
    return ObjectiveConfig(**{"steps": 12, "batch_size": 8, "lr": 3e-3, "warmup_steps": 0, **changes})


# ---------------------------------------------------------------------------------------------- MNTP
def test_mntp_predicts_each_masked_token_from_the_previous_position():
    labels = torch.full((2, 5), IGNORE)
    labels[0, 2] = 7
    labels[1, 4] = 9
    rows, sources, targets = mntp_targets(labels)
    assert rows.tolist() == [0, 1]
    assert sources.tolist() == [1, 3]
    assert targets.tolist() == [7, 9]


def test_mntp_loss_reads_the_output_one_position_to_the_left():
    vocab = 6
    tokens = torch.tensor([[0, 3, 5, 1]])
    labels = torch.full_like(tokens, IGNORE)
    labels[0, 1:] = tokens[0, 1:]  # every token after the first is masked
    head = torch.nn.Identity()  # hidden states already are logits over the vocabulary

    def one_hot_logits(ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(ids, vocab).float() * 50.0

    next_token = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # position i "knows" token i + 1
    assert mntp_loss(one_hot_logits(next_token), labels, head) < 1e-6
    assert mntp_loss(one_hot_logits(tokens), labels, head) > 10.0  # same position: wrong


def test_mntp_loss_rejects_a_mask_at_position_zero():
    labels = torch.full((1, 3), IGNORE)
    labels[0, 0] = 1
    with pytest.raises(ValueError, match="position 0"):
        mntp_targets(labels)


def test_mask_tokens_only_hides_candidates_and_labels_them():
    ids = torch.arange(40).reshape(2, 20) % 17 + 3
    attention = torch.ones_like(ids)
    attention[1, 15:] = 0
    special = torch.zeros_like(ids)
    special[:, 0] = 1
    candidates = maskable_positions(attention, special)
    assert not candidates[:, 0].any() and not candidates[1, 15:].any()
    generator = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(ids, candidates, mask_id=1, vocab_size=20, probability=0.5, generator=generator)
    hidden = labels != IGNORE
    assert hidden.any()
    assert not (hidden & ~candidates).any()
    assert torch.equal(labels[hidden], ids[hidden])
    assert torch.equal(masked[~hidden], ids[~hidden])
    assert (masked[hidden] == 1).float().mean() > 0.5  # mostly the mask token


def test_mask_tokens_hides_at_least_one_token():
    ids = torch.tensor([[5, 6, 7]])
    candidates = torch.tensor([[False, True, True]])
    _, labels = mask_tokens(ids, candidates, mask_id=1, vocab_size=10, probability=1e-9)
    assert int((labels != IGNORE).sum()) == 1


def _fixed_mask_loss(objective, texts) -> float:
    objective.generator.manual_seed(123)
    with torch.no_grad():
        return float(objective.loss(texts)[0])


def test_mntp_loss_decreases(tokenizer):
    model = trainable(tokenizer, pooling="mean", attention="bidirectional")
    objective = build_objective("mntp", model, mask_probability=0.3)
    assert isinstance(objective.head, TiedLMHead)  # a headless tiny model: tied to the embeddings
    before = _fixed_mask_loss(objective, TEXTS)
    train_steps(objective, BatchStream(TEXTS, 8), quick_config(objective="mntp"))
    assert _fixed_mask_loss(objective, TEXTS) < before - 0.3


# ---------------------------------------------------------------------------------------------- SimCSE
def test_simcse_needs_dropout_and_sets_it(tokenizer):
    model = trainable(tokenizer, pooling="mean")
    assert not has_active_dropout(model)  # Llama ships with dropout 0
    with pytest.raises(ValueError, match="dropout"):
        build_objective("simcse", model, dropout=None)
    assert set_attention_dropout(model.model, 0.2) == 2  # one attention module per layer
    assert has_active_dropout(model)


def test_simcse_views_differ_and_loss_decreases(tokenizer):
    model = trainable(tokenizer, pooling="mean")
    objective = build_objective("simcse", model, dropout=0.3, temperature=0.05)
    model.train()
    first, second = objective.embed_views(TEXTS)
    assert first.shape == second.shape == (len(TEXTS), 32)
    assert not torch.allclose(first, second)

    def loss_at_seed() -> float:
        torch.manual_seed(7)
        with torch.no_grad():
            return float(objective.loss(TEXTS)[0])

    before = loss_at_seed()
    train_steps(objective, BatchStream(TEXTS, 8), quick_config(objective="simcse"))
    assert loss_at_seed() < 0.5 * before


# ---------------------------------------------------------------------------------------------- Anchor
def test_anchor_prefix_inputs_shapes_and_labels():
    embeddings = torch.nn.Embedding(10, 4)
    prefix = torch.randn(2, 4)
    ids = torch.tensor([[5, 6, 3], [7, 3, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    inputs, attention, labels = build_prefix_inputs(prefix, ids, mask, embeddings)
    assert inputs.shape == (2, 4, 4)
    assert torch.equal(inputs[:, 0], prefix)  # the embedding is the one-position prefix
    assert torch.equal(inputs[:, 1:], embeddings(ids))
    assert attention.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    # the prefix predicts the first token; each token predicts the next; nothing after the last
    assert labels.tolist() == [[5, 6, 3, IGNORE], [7, 3, IGNORE, IGNORE]]


def test_anchor_prefix_rejects_a_batch_mismatch():
    with pytest.raises(ValueError, match="prefix"):
        build_prefix_inputs(
            torch.randn(3, 4), torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2), torch.nn.Embedding(5, 4)
        )


def test_anchor_alpha_weighting():
    q2d, d2q = torch.tensor(2.0), torch.tensor(10.0)
    assert float(combine_losses(q2d, d2q)) == pytest.approx(0.2 * 2 + 0.8 * 10)
    assert float(combine_losses(q2d, d2q, 1.0)) == pytest.approx(2.0)
    assert float(combine_losses(q2d, d2q, 0.0)) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        combine_losses(q2d, d2q, 1.5)


def test_anchor_needs_causal_attention(tokenizer):
    with pytest.raises(ValueError, match="causal"):
        build_objective("anchor", trainable(tokenizer, pooling="last", attention="bidirectional"))


def test_anchor_loss_combines_directions_and_decreases(tokenizer):
    model = trainable(tokenizer, pooling="last")
    objective = build_objective("anchor", model, alpha=0.2, max_target_length=16)
    total, parts = objective.loss(PAIRS)
    assert float(total.detach()) == pytest.approx(0.2 * parts["loss_q2d"] + 0.8 * parts["loss_d2q"], rel=1e-5)
    total.backward()  # gradients reach the embedding pass through the prefix
    layer0 = model.model.layers[0].self_attn.q_proj.weight
    assert layer0.grad is not None and layer0.grad.abs().sum() > 0
    model.zero_grad()
    with torch.no_grad():
        before = float(objective.loss(PAIRS)[0])
    train_steps(objective, BatchStream(PAIRS, 4), quick_config(objective="anchor", batch_size=4))
    with torch.no_grad():
        assert float(objective.loss(PAIRS)[0]) < before - 0.3


# ---------------------------------------------------------------------------------------------- AnglE, runner
def test_angle_pair_objective_decreases(tokenizer):
    model = trainable(tokenizer, pooling="mean")
    objective = build_objective("angle", model)
    batch = [(a, b, float(i % 5)) for i, (a, b) in enumerate(zip(TEXTS, TEXTS[::-1], strict=True))]
    with torch.no_grad():
        before = float(objective.loss(batch)[0])
    train_steps(objective, BatchStream(batch, 8), quick_config(objective="angle"))
    with torch.no_grad():
        assert float(objective.loss(batch)[0]) < before


def test_batch_stream_is_deterministic_and_covers_every_item():
    stream = BatchStream(list(range(10)), 5, seed=3)
    assert sorted(stream.batch(0) + stream.batch(1)) == list(range(10))
    assert BatchStream(list(range(10)), 5, seed=3).batch(3) == stream.batch(3)


def test_unknown_objective_is_rejected():
    with pytest.raises(ObjectiveConfigError, match="unknown"):
        ObjectiveConfig(objective="nope")


def test_every_stage_name_the_config_accepts_is_registered():
    assert set(OBJECTIVES) == set(OBJECTIVE_NAMES)
    for name in OBJECTIVE_NAMES:
        assert ObjectiveConfig(objective=name).objective == name


def test_load_items_from_rows_and_text_file(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"query": "q1", "positive": ["d1", "d2"]}\n{"query": "q2", "positive": "d1"}\n')
    text = tmp_path / "texts.txt"
    text.write_text("one\n\ntwo\n")
    assert load_items("texts", [str(rows)]) == ["q1", "d1", "d2", "q2"]
    assert load_items("pairs", [str(rows)]) == [("q1", "d1"), ("q2", "d1")]
    assert load_items("texts", [str(text)]) == ["one", "two"]


def test_scored_pairs_are_read_as_sts_rows_naming_file_and_line(tmp_path):
    """AnglE's scored pairs were read with str() and float(): query/positive rows ended in a KeyError, a list was
    trained on as the text "['x', 'y']" and a score "NaN" poisoned the loss."""
    from lmembed.evaluation.tasks._common import TaskDataError

    rows = tmp_path / "pairs.jsonl"
    good = '{"sentence1": "a", "sentence2": "b", "score": 4}\n'
    rows.write_text(good + '{"sentence1": "c", "sentence2": "d", "score": 1.5}\n')
    assert load_items("scored_pairs", [str(rows)]) == [("a", "b", 4.0), ("c", "d", 1.5)]
    for bad, message in (
        ('{"query": "q", "positive": "p"}', "missing field 'sentence1'"),
        ('{"sentence1": 5, "sentence2": "b", "score": 1}', "field 'sentence1' must be a string, got a number"),
        ('{"sentence1": "a", "sentence2": ["x", "y"], "score": 1}', "field 'sentence2' must be a string, got an array"),
        ('{"sentence1": "a", "sentence2": "b", "score": "NaN"}', "field 'score' must be a finite number"),
    ):
        rows.write_text(good + bad + "\n")
        with pytest.raises(TaskDataError, match=f"{rows}:2: {re.escape(message)}"):
            load_items("scored_pairs", [str(rows)])


def test_run_objective_saves_a_loadable_embedder(tokenizer, tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("\n".join(TEXTS))
    model = tiny_model("llama", len(tokenizer))
    embedder = Embedder.from_model(
        model, tokenizer, EmbeddingConfig(pooling="mean", attention="bidirectional"), use_cache=False
    )
    config = ObjectiveConfig(
        objective="mntp", data=[str(data)], output=str(tmp_path / "out"), steps=2, batch_size=4, lora=True, lora_r=4
    )
    result = run_objective(config, embedder=embedder)
    assert len(result.losses) == 2
    assert (result.output / "metrics.jsonl").read_text().count("\n") == 2
    assert (result.output / "loss_curve.png").stat().st_size > 0
    loaded = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert loaded.config.attention == "bidirectional"
    assert loaded.encode(["the cat"]).shape == (1, 32)


def test_mntp_hides_tokens_with_the_tokenizers_own_mask_token_as_llm2vec_does():
    """LLM2Vec's run_mntp.py keeps a tokenizer's own mask token and falls back to ``_`` only without one; lmembed
    preferred ``_`` always, so Gemma 3 was masked with ``_`` (236779) instead of its ``<mask>`` (4)."""
    from lmembed.training.stages.mntp import mask_token_id

    class Tok:
        def __init__(self, mask_id, underscore_ids):
            self.mask_token_id, self.unk_token_id, self.pad_token_id = mask_id, None, 0
            self.underscore_ids = underscore_ids

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": self.underscore_ids}

    assert mask_token_id(Tok(4, [236779])) == 4  # the tokenizer's own mask token
    assert mask_token_id(Tok(None, [79])) == 79  # none: "_" (mask_token_type: blank)
    assert mask_token_id(Tok(None, [5, 6])) == 0  # "_" is not one token: pad
