"""2DMSE: the loss on hand-computed tensors (MRL at the last and at the drawn layer, the KL alignment term, its
temperature and its constant target), the layer draw, the registry and the trainer feeding it per-layer vectors."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import Tensor, nn

from lmembed import Embedder, EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.training.losses import InfoNCELoss, Matryoshka2DLoss, build_loss, canonical_loss_name
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class DotLoss(nn.Module):
    """A loss simple enough to compute by hand: minus the mean dot product of query and positive."""

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> Tensor:
        return -(query * positive).sum(-1).mean()


def kl_by_hand(teacher: list[float], student: list[float], temperature: float = 1.0) -> float:
    """KL(softmax(teacher / T) || softmax(student / T)), written out."""
    t = [math.exp(x / temperature) for x in teacher]
    s = [math.exp(x / temperature) for x in student]
    p = [x / sum(t) for x in t]
    q = [x / sum(s) for x in s]
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))


def two_layer_loss(**options) -> Matryoshka2DLoss:
    loss = Matryoshka2DLoss(DotLoss(), dims=[1], weights=[0.5], **options)
    assert loss.layers_to_read(2) == (1,)  # a 2-layer model: the last layer and layer 1
    return loss


# rows are [last layer | layer 1], D = 2
QUERY = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
POSITIVE = torch.tensor([[1.0, 0.0, 0.0, 1.0]])


def test_loss_value_by_hand():
    loss = two_layer_loss()
    got = loss(QUERY, POSITIVE, None)
    # MRL at the last layer: full size (not listed, weight 1) -(1·1 + 2·0) = -1, plus 0.5 · -(1·1) = -0.5
    # MRL at layer 1: -(3·0 + 4·1) = -4, plus 0.5 · -(3·0) = 0
    # alignment: query rows [1, 2] vs [3, 4] are the same distribution (KL 0); positive rows [1, 0] vs [0, 1]:
    # KL = (e - 1) / (e + 1); averaged over the 2 rows
    e = math.e
    want = -1.5 - 4.0 + (e - 1) / (e + 1) / 2
    assert got.item() == pytest.approx(want, rel=1e-6)
    assert got.item() == pytest.approx(-1.5 - 4.0 + (kl_by_hand([1, 2], [3, 4]) + kl_by_hand([1, 0], [0, 1])) / 2)


def test_weights_temperature_and_negatives_by_hand():
    loss = two_layer_loss(last_weight=2.0, shallow_weight=0.25, kl_weight=3.0, kl_temperature=2.0)
    negatives = torch.tensor([[[2.0, 0.0, 0.0, 2.0]]])  # [B=1, N=1, 2 layers x D]
    got = loss(QUERY, POSITIVE, negatives)
    rows = [([1, 2], [3, 4]), ([1, 0], [0, 1]), ([2, 0], [0, 2])]  # (last, layer 1): query, positive, negative
    kl = sum(kl_by_hand(t, s, 2.0) for t, s in rows) / 3 * 2.0**2
    want = 2.0 * -1.5 + 0.25 * -4.0 + 3.0 * kl
    assert got.item() == pytest.approx(want, rel=1e-6)
    assert two_layer_loss(kl_temperature=0.0)(QUERY, POSITIVE, negatives).item() == pytest.approx(-5.5)


def test_the_last_layer_gets_no_gradient_from_the_alignment_term():
    grads = []
    for kl_weight in (0.0, 1.0):
        positive = POSITIVE.clone().requires_grad_(True)  # its two layers disagree: the KL term is not 0
        two_layer_loss(kl_weight=kl_weight)(QUERY, positive, None).backward()
        grads.append(positive.grad)
    assert torch.equal(grads[0][:, :2], grads[1][:, :2])  # last layer: the same with and without the term
    assert not torch.equal(grads[0][:, 2:], grads[1][:, 2:])  # the shallow layer is pulled toward it


def test_one_shallow_layer_is_drawn_uniformly_and_its_block_is_used():
    loss = Matryoshka2DLoss(DotLoss(), dims=[2], kl_temperature=0.0)
    assert loss.layers_to_read(4) == (1, 2, 3)
    # D = 2; the last layer contributes -1 each time, layer l contributes -l
    query = torch.tensor([[1.0, 0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0]])
    positive = torch.tensor([[1.0, 0.0] * 4])
    torch.manual_seed(0)
    drawn = Counter()
    for _ in range(300):
        value = loss(query, positive, None).item()
        drawn[loss.last_drawn] += 1
        assert value == pytest.approx(-1.0 - loss.last_drawn)
    assert set(drawn) == {1, 2, 3} and min(drawn.values()) > 60


def test_registry_names_and_bad_configuration():
    loss = build_loss("2d-matryoshka", inner="infonce", dims=[16, 8], inner_kwargs={"temperature": 0.1})
    assert isinstance(loss, Matryoshka2DLoss) and isinstance(loss.loss, InfoNCELoss) and loss.loss.temperature == 0.1
    assert canonical_loss_name("2DMSE") == canonical_loss_name("matryoshka-2d") == "matryoshka_2d"
    with pytest.raises(ConfigError, match="dims"):
        build_loss("2dmse", dims=[0])
    with pytest.raises(ConfigError, match="below"):
        Matryoshka2DLoss(DotLoss(), dims=[2]).layers_to_read(1)
    with pytest.raises(ConfigError, match="one layer"):
        Matryoshka2DLoss(DotLoss(), dims=[2])(QUERY, POSITIVE, None)  # layers_to_read was never asked


def test_trainer_feeds_the_loss_every_layers_vectors(tmp_path, tokenizer):
    from conftest import tiny_model
    from helpers import write_jsonl

    rows = [{"query": f"the cat sat {w}", "positive": f"a cat {w}", "negatives": ["the dog"]} for w in "abcdefgh"]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    model = tiny_model("bert", len(tokenizer))  # 2 layers: the last one and layer 1
    embedder = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    config = TrainConfig(
        data=[str(data)],
        output=str(tmp_path / "run"),
        batch_size=4,
        steps=2,
        lr=1e-3,
        warmup_steps=0,
        loss="2dmse",
        loss_kwargs={"dims": [32, 16], "kl_temperature": 1.0},
        temperature=0.05,
        progress=False,
    )
    trainer = Trainer(config, model=embedder)
    assert trainer.model.extra_layers == (1,) and trainer.loss_fn.loss.temperature == 0.05
    features = trainer.model.tokenize(["the cat sat", "hello"])
    trainer.model.eval()  # no dropout: the two passes below must see the same network
    both = trainer.model(**features)
    assert both.shape == (2, 64)
    layer_one = embedder.engine.forward_pool(
        features["input_ids"],
        features["attention_mask"],
        features["pool_mask"],
        [embedder.config.with_options(layer=1)],
    )[0]
    torch.testing.assert_close(both[:, 32:], layer_one)
    trainer.model.train()
    result = trainer.train()
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    saved = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert saved.encode(["the cat sat"]).shape == (1, 32)  # the saved model reads its own strategy, one layer
