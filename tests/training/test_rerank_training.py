"""Reranker training through the trainer: the two reranker losses against their formulas and in the loss registry,
a tiny cross-encoder that learns to put the positive first (saved in CrossEncoder format, equal scores from
sentence-transformers), exact resumption from a checkpoint, an LLM reranker trained with LoRA whose merged folder
reloads to the same scores, a ``rerank`` recipe stage, and the options reranker training refuses."""

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
from lmembed.training.losses import ListwiseSoftmaxLoss, PointwiseBCELoss, build_loss, loss_spec
from lmembed.training.losses.factory import build_training_loss
from lmembed.training.recipes import parse_recipe, run_recipe
from lmembed.training.rows import TrainDataset, TrainExample
from lmembed.training.train_config import TrainConfig, TrainConfigError
from lmembed.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_reranker_losses_by_their_formulas_and_registered():
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
    assert float(build_loss("listwise", temperature=0.5)(logits)) == pytest.approx(tempered, rel=1e-6)
    assert float(build_loss("pointwise-bce")(logits)) == pytest.approx(bce, rel=1e-6)
    assert loss_spec("bce").reranks and not loss_spec("infonce").reranks


def examples(count: int, seed: int) -> list[TrainExample]:
    """The positive repeats the query's word; negatives never hold it."""
    rng = np.random.default_rng(seed)
    vocab = WORDS[9:]
    out = []
    for _ in range(count):
        word = str(rng.choice(vocab))
        others = [w for w in vocab if w != word]
        fillers = [" ".join(rng.choice(others, size=4)) for _ in range(5)]
        out.append(TrainExample(word, (f"{word} {fillers[0]} {word}",), tuple(fillers[1:])))
    return out


def dataset(count: int = 24, seed: int = 0) -> TrainDataset:
    rows = examples(count, seed)
    return TrainDataset("toy", rows, [d for r in rows for d in (*r.positives, *r.negatives)])


def top1(reranker, rows: list[TrainExample]) -> float:
    return float(np.mean([np.argmax(reranker.score(r.query, [*r.positives, *r.negatives])) == 0 for r in rows]))


def config(tmp_path, **options) -> TrainConfig:
    base = dict(
        reranker="cross-encoder",
        loss="listwise_softmax",
        num_negatives=3,
        batch_size=6,
        steps=40,
        lr=3e-3,
        warmup_steps=4,
        log_every=10,
        device="cpu",
        progress=False,
        output=str(tmp_path / "run"),
    )
    return TrainConfig(**{**base, **options})


def records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", ["listwise_softmax", "pointwise_bce"])
def test_cross_encoder_learns_through_the_trainer_and_saves_in_crossencoder_format(tmp_path, loss):
    from sentence_transformers import CrossEncoder

    reranker = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce", seed=4)))
    held_out = examples(20, seed=2)
    before = top1(reranker, held_out)
    result = Trainer(config(tmp_path, loss=loss), model=reranker, datasets=[dataset(24, seed=1)]).train()
    after = top1(reranker, held_out)
    assert after > before and after >= 0.8, (before, after)
    logged = records(tmp_path / "run")
    assert [r["step"] for r in logged] == [10, 20, 30, 40] and logged[-1]["loss"] < logged[0]["loss"]
    assert result.model_dir == tmp_path / "run" / "model"
    pairs = [(r.query, d) for r in held_out[:4] for d in (*r.positives, *r.negatives)]
    st = CrossEncoder(str(result.model_dir)).predict(pairs)
    np.testing.assert_allclose(load_reranker(str(result.model_dir)).predict(pairs), st, atol=1e-6)
    np.testing.assert_allclose(reranker.predict(pairs), st, atol=1e-5)


def test_reranker_training_resumes_exactly(tmp_path):
    """A run stopped after a checkpoint and resumed gives the uninterrupted run's losses (dropout's RNG included)
    and its trained scores."""
    folder = save_tiny_cross_encoder(tmp_path / "ce", seed=5)
    pairs = [(r.query, d) for r in examples(3, seed=7) for d in (*r.positives, *r.negatives)]

    def trainer(name: str, resume: bool = False) -> Trainer:
        cfg = config(tmp_path, steps=10, save_every=4, lr=1e-3, log_every=1, output=str(tmp_path / name), resume=resume)
        return Trainer(cfg, model=load_reranker(str(folder)), datasets=[dataset(24, seed=1)])

    expected = trainer("straight").train().losses
    first = trainer("resumed")
    losses = [first.train_step()["loss"] for _ in range(4)]
    first.save_checkpoint()
    first.train_step()  # a step after the checkpoint that a crash loses
    result = trainer("resumed", resume=True).train()
    assert result.start_step == 4 and result.end_step == 10
    np.testing.assert_allclose(losses + result.losses, expected, rtol=1e-6)
    logged = [r["loss"] for r in records(tmp_path / "resumed") if "loss" in r]
    np.testing.assert_allclose(logged, expected, rtol=1e-6)
    straight, resumed = (load_reranker(str(tmp_path / n / "model")).predict(pairs) for n in ("straight", "resumed"))
    np.testing.assert_allclose(resumed, straight, rtol=1e-5, atol=1e-6)


def test_llm_reranker_trains_with_lora_and_reloads_merged(tmp_path):
    from transformers import LlamaForCausalLM

    torch.manual_seed(6)
    tok = build_tokenizer()
    LlamaForCausalLM(tiny_decoder_config("llama", len(tok))).save_pretrained(tmp_path / "llm")
    tok.save_pretrained(tmp_path / "llm")
    prompt = {"prefix": "", "template": "query : {query} document : {document}", "suffix": " ?", "instruction": ""}
    cfg = config(
        tmp_path,
        model=str(tmp_path / "llm"),
        reranker="auto",
        reranker_options={"prompt": {**prompt, "true_token": "great", "false_token": "bad"}},
        steps=30,
        lr=5e-3,
        lora_r=4,
        lora_dropout=0.0,
    )
    trainer = Trainer(cfg, datasets=[dataset(24, seed=3)])
    assert trainer.model.uses_lora and trainer.model.reranker.kind == "llm"  # LoRA by default for a decoder
    trainer.train()
    reranker = trainer.model.reranker
    assert not hasattr(reranker.model, "peft_config")  # merged back into a plain model
    base = dict(LlamaForCausalLM.from_pretrained(tmp_path / "llm").named_parameters())
    changed = [n for n, p in reranker.model.named_parameters() if not torch.equal(p, base[n])]
    assert changed and all("proj" in n for n in changed)  # only the LoRA-wrapped linear layers moved
    held_out = examples(20, seed=4)
    pairs = [(r.query, d) for r in held_out[:3] for d in (*r.positives, *r.negatives)]
    again = load_reranker(str(tmp_path / "run" / "model"))
    np.testing.assert_allclose(again.predict(pairs), reranker.predict(pairs), atol=1e-5)
    assert top1(reranker, held_out) >= 0.5


def test_rerank_recipe_stage_trains_a_cross_encoder(tmp_path):
    folder = save_tiny_cross_encoder(tmp_path / "ce", seed=4)
    data = tmp_path / "rows.jsonl"
    rows = [{"query": r.query, "positive": r.positives[0], "negatives": list(r.negatives)} for r in examples(24, 1)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = parse_recipe(
        {
            "name": "toy-reranker",
            "model": str(folder),
            "output": str(tmp_path / "recipe"),
            "defaults": {"num_negatives": 3, "batch_size": 6, "device": "cpu", "progress": False},
            "stages": [
                {"name": "ce", "type": "rerank", "data": [str(data)], "loss": "listwise", "steps": 30, "lr": 3e-3}
            ],
        }
    )
    result = run_recipe(recipe)
    (stage,) = result.stages
    assert stage.type == "rerank" and stage.last_loss < stage.first_loss
    trained = load_reranker(str(stage.model_dir))
    assert trained.kind == "cross-encoder" and top1(trained, examples(20, seed=2)) >= 0.8


def test_head_lr_applies_to_the_new_score_head_only(tmp_path):
    reranker = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce")))
    trainer = Trainer(config(tmp_path, head_lr=1e-2, lr=1e-4), model=reranker, datasets=[dataset(8)])
    assert trainer.model.head_parameter_names() == ["model.classifier.weight", "model.classifier.bias"]
    lrs = {id(p): group["initial_lr"] for group in trainer.optimizer.param_groups for p in group["params"]}
    for name, param in trainer.model.named_trainable_parameters():
        assert lrs[id(param)] == (1e-2 if name.startswith("model.classifier.") else 1e-4), name
    with pytest.raises(TrainConfigError, match=r"head_lr=0\.01 must be positive, and applies to reranker training"):
        config(tmp_path, reranker=None, loss="infonce", head_lr=1e-2)


def test_what_reranker_training_refuses(tmp_path):
    reranker = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce")))
    data = [dataset(8)]
    with pytest.raises(TrainConfigError, match=r"loss='infonce' trains an embedder.*listwise_softmax"):
        Trainer(config(tmp_path, loss="infonce"), model=reranker, datasets=data)
    with pytest.raises(TrainConfigError, match="loss='listwise_softmax' scores a reranker's groups: set reranker"):
        build_training_loss(TrainConfig(loss="listwise_softmax"))
    with pytest.raises(TrainConfigError, match="the model given is a reranker: set reranker"):
        Trainer(config(tmp_path, reranker=None, loss="infonce"), model=reranker, datasets=data)
    with pytest.raises(TrainConfigError, match="reranker='colbert' is unknown"):
        config(tmp_path, reranker="colbert")
    with pytest.raises(TrainConfigError, match="pooling, grad_cache_chunk: not for reranker training"):
        config(tmp_path, pooling="mean", grad_cache_chunk=2)
    with pytest.raises(TrainConfigError, match="num_negatives >= 1"):
        config(tmp_path, num_negatives=0)
    two_labels = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce2", num_labels=2)))
    with pytest.raises(ConfigError, match="has 2 labels; a reranker is trained with one score per pair"):
        Trainer(config(tmp_path), model=two_labels, datasets=data)
    with pytest.raises(TrainConfigError, match="reranker_options apply to reranker training only"):
        config(tmp_path, reranker=None, reranker_options={"prompt": {}})
