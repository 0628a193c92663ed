"""GradCache must reproduce the loss and parameter gradients of an uncached step."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from lmembed.training.gradcache import GradCache, RngSnapshot, split_features
from lmembed.training.losses import AnglELoss, GTELoss, InfoNCELoss, MatryoshkaLoss

BATCH, CHUNK, SEQ = 16, 4, 10


def _model() -> torch.nn.Module:
    """A tiny BERT with dropout (BERT's default 0.1 on hidden states and attention)."""
    model = tiny_model("bert", 100)
    assert model.config.hidden_dropout_prob > 0 and model.config.attention_probs_dropout_prob > 0
    return model


def _features(seed: int, rows: int = BATCH) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, 100, (rows, SEQ), generator=gen)
    lengths = torch.randint(3, SEQ + 1, (rows,), generator=gen)
    attention_mask = (torch.arange(SEQ).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask}


def _embedder(model: torch.nn.Module):
    def embed(features: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = model(**features).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1)

    return embed


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _reference_step(model, loss_fn, groups, chunked: bool):
    """Plain autograd over the whole batch; ``chunked`` embeds in GradCache's chunk order (same dropout)."""
    embed = _embedder(model)
    embeddings = []
    for group in groups:
        parts = split_features(group, CHUNK) if chunked else [group]
        embeddings.append(torch.cat([embed(part) for part in parts]))
    loss = loss_fn(embeddings)
    loss.backward()
    return loss.detach()


def _retrieval_loss(loss):
    def loss_fn(embeddings):
        query, positive, negative = embeddings
        return loss(query, positive, negative.reshape(BATCH, -1, negative.size(-1)))

    return loss_fn


def _assert_same_grads(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == actual.keys() and expected
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("loss", [InfoNCELoss(), GTELoss(), MatryoshkaLoss(InfoNCELoss(), dims=[32, 16, 8])])
def test_gradcache_matches_full_batch_with_dropout(loss):
    model = _model().train()
    groups = [_features(1), _features(2), _features(3, rows=2 * BATCH)]  # 2 hard negatives per query

    torch.manual_seed(123)
    expected_loss = _reference_step(model, _retrieval_loss(loss), groups, chunked=True)
    expected = _grads(model)
    model.zero_grad()

    torch.manual_seed(123)
    cache = GradCache(_embedder(model), loss, chunk_size=CHUNK)
    actual_loss = cache(*groups)
    assert actual_loss.requires_grad is False
    assert actual_loss.item() == pytest.approx(expected_loss.item(), abs=1e-5)
    _assert_same_grads(expected, _grads(model))


def test_gradcache_matches_single_forward_without_dropout():
    model = _model().eval()
    loss = InfoNCELoss(symmetric=True)
    groups = [_features(4), _features(5), _features(6)]
    expected_loss = _reference_step(model, _retrieval_loss(loss), groups, chunked=False)
    expected = _grads(model)
    model.zero_grad()
    actual_loss = GradCache(_embedder(model), loss, chunk_size=CHUNK)(*groups)
    assert actual_loss.item() == pytest.approx(expected_loss.item(), abs=1e-5)
    _assert_same_grads(expected, _grads(model))


def test_gradcache_run_handles_pair_losses():
    model = _model().train()
    scores = torch.tensor([1.0, 0.0] * (BATCH // 2))
    loss = AnglELoss()
    groups = [_features(7), _features(8)]

    def loss_fn(embeddings):
        return loss(embeddings[0], embeddings[1], scores)

    torch.manual_seed(5)
    expected_loss = _reference_step(model, loss_fn, groups, chunked=True)
    expected = _grads(model)
    model.zero_grad()
    torch.manual_seed(5)
    actual_loss = GradCache(_embedder(model), chunk_size=CHUNK).run(groups, loss_fn)
    assert actual_loss.item() == pytest.approx(expected_loss.item(), abs=1e-5)
    _assert_same_grads(expected, _grads(model))


def test_gradcache_without_negatives_and_uneven_chunks():
    model = _model().eval()
    loss = InfoNCELoss()
    groups = [_features(9, rows=10), _features(10, rows=10)]

    def loss_fn(embeddings):
        return loss(embeddings[0], embeddings[1], None)

    expected_loss = _reference_step(model, loss_fn, groups, chunked=False)
    expected = _grads(model)
    model.zero_grad()
    actual_loss = GradCache(_embedder(model), loss, chunk_size=CHUNK)(groups[0], groups[1], None)
    assert actual_loss.item() == pytest.approx(expected_loss.item(), abs=1e-5)
    _assert_same_grads(expected, _grads(model))


def test_no_sync_wraps_all_but_the_last_backward():
    model = _model().eval()
    entered = []

    class Recorder:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    cache = GradCache(_embedder(model), InfoNCELoss(), chunk_size=CHUNK, no_sync=Recorder)
    cache(_features(11), _features(12))
    assert len(entered) == 2 * BATCH // CHUNK - 1


def test_split_features_and_rng_snapshot():
    features = {**_features(13, rows=6), "flag": True}
    parts = split_features(features, 4)
    assert [p["input_ids"].shape[0] for p in parts] == [4, 2] and parts[1]["flag"] is True
    snapshot = RngSnapshot()
    first = torch.rand(3)
    state_before = torch.get_rng_state()
    with snapshot.replay():
        assert torch.equal(torch.rand(3), first)
    assert torch.equal(torch.get_rng_state(), state_before)  # the outer stream is left where it was
