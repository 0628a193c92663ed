"""Distillation from teacher scores: MarginMSE and listwise KL on hand-computed tensors, rows carrying
``teacher_scores`` through reading and batching, and tiny training runs (Python API and ``lmembed train``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from conftest import build_tokenizer, tiny_decoder_config
from helpers import write_jsonl
from lmembed.training.losses import (
    ListwiseKLLoss,
    MarginMSELoss,
    MatryoshkaLoss,
    build_loss,
    reads_teacher_scores,
)
from lmembed.training.rows import (
    MixtureSampler,
    TrainDataset,
    TrainExample,
    TrainingDataError,
    load_source,
    read_jsonl_examples,
)
from lmembed.training.train_config import TrainConfig, TrainConfigError
from lmembed.training.trainer import Trainer
from test_trainer import make_config, tiny_embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# two rows, D = 2, two negatives each; dot products are easy to read off
QUERY = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
POSITIVE = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # student s(q, p): 2, 2
NEGATIVES = torch.tensor([[[0.5, 1.0], [1.0, 3.0]], [[1.0, 0.5], [2.0, 0.0]]])  # s(q, n): [0.5, 1], [1, 0]
TEACHER = torch.tensor([[3.0, 1.0, 2.0], [1.0, 0.0, 0.5]])


def test_margin_mse_is_the_mean_squared_margin_gap():
    # student margins: [1.5, 1.0], [1.0, 2.0]; teacher margins: [2.0, 1.0], [1.0, 0.5]
    expected = ((1.5 - 2.0) ** 2 + 0 + 0 + (2.0 - 0.5) ** 2) / 4
    loss = MarginMSELoss(similarity="dot")(QUERY, POSITIVE, NEGATIVES, teacher_scores=TEACHER)
    assert loss.item() == pytest.approx(expected)
    # margins only: a constant added to a row's teacher scores changes nothing
    shifted = TEACHER + torch.tensor([[10.0], [-3.0]])
    assert MarginMSELoss(similarity="dot")(QUERY, POSITIVE, NEGATIVES, teacher_scores=shifted).item() == pytest.approx(
        expected
    )


def _kl(teacher: list[float], student: list[float], t_teacher: float, t_student: float) -> float:
    def softmax(xs: list[float], t: float) -> list[float]:
        exps = [math.exp(x / t) for x in xs]
        return [e / sum(exps) for e in exps]

    p, q = softmax(teacher, t_teacher), softmax(student, t_student)
    return sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q, strict=True))


def test_listwise_kl_matches_the_definition_with_both_temperatures():
    loss = ListwiseKLLoss(temperature=0.5, teacher_temperature=2.0, similarity="dot")
    value = loss(QUERY, POSITIVE, NEGATIVES, teacher_scores=TEACHER).item()
    rows = [_kl([3, 1, 2], [2, 0.5, 1], 2.0, 0.5), _kl([1, 0, 0.5], [2, 1, 0], 2.0, 0.5)]
    assert value == pytest.approx(sum(rows) / 2, rel=1e-5)
    same = ListwiseKLLoss(temperature=0.5, similarity="dot")  # the teacher's temperature defaults to the student's
    assert same.teacher_temperature == 0.5
    matched = torch.tensor([[2.0, 0.5, 1.0], [2.0, 1.0, 0.0]])  # the teacher agrees with the student exactly
    assert same(QUERY, POSITIVE, NEGATIVES, teacher_scores=matched).item() == pytest.approx(0.0, abs=1e-6)


def test_distillation_losses_refuse_missing_or_misshapen_scores():
    loss = MarginMSELoss()
    with pytest.raises(ValueError, match="needs teacher_scores"):
        loss(QUERY, POSITIVE, NEGATIVES)
    with pytest.raises(ValueError, match=r"must be \[B=2, 1 \+ N=3\].*got \(2, 2\)"):
        loss(QUERY, POSITIVE, NEGATIVES, teacher_scores=TEACHER[:, :2])
    with pytest.raises(ValueError, match="at least one hard negative"):
        loss(QUERY, POSITIVE, None, teacher_scores=TEACHER[:, :1])


def test_registry_names_and_matryoshka_passes_teacher_scores_through():
    assert isinstance(build_loss("MarginMSE"), MarginMSELoss) and isinstance(build_loss("margin-mse"), MarginMSELoss)
    assert isinstance(build_loss("kl", temperature=0.1), ListwiseKLLoss)
    wrapped = build_loss("matryoshka", inner="margin_mse", dims=[2, 1], inner_kwargs={"similarity": "dot"})
    assert isinstance(wrapped, MatryoshkaLoss) and reads_teacher_scores(wrapped)
    assert not reads_teacher_scores(build_loss("infonce"))
    inner = MarginMSELoss(similarity="dot")
    truncated = inner(QUERY[:, :1], POSITIVE[:, :1], NEGATIVES[..., :1], teacher_scores=TEACHER)
    whole = inner(QUERY, POSITIVE, NEGATIVES, teacher_scores=TEACHER)
    assert wrapped(QUERY, POSITIVE, NEGATIVES, teacher_scores=TEACHER).item() == pytest.approx(
        (whole + truncated).item()
    )
    with pytest.raises(TrainConfigError, match="margin_mse needs num_negatives >= 1"):
        TrainConfig(loss="margin-mse", num_negatives=0)


# ---------------------------------------------------------------------------------------------- rows and batches
def test_rows_read_both_spellings_of_teacher_scores(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "query": "q1",
                "positive": "p1",
                "negatives": ["n1", "n2"],
                "teacher_scores": {"positive": 0.9, "negatives": [0.4, 0.1]},
            },
            {"query": "q2", "positive": ["p2", "p3"], "negatives": ["n3"], "teacher_scores": [0.8, 0.7, 0.2]},
            {"query": "q3", "positive": "p4"},
        ],
    )
    examples, _ = read_jsonl_examples(path)
    assert [e.teacher_scores for e in examples] == [(0.9, 0.4, 0.1), (0.8, 0.7, 0.2), None]


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ({"positive": 0.9, "negatives": [0.4]}, "1 positive and 1 negative score(s) for 1 positive(s) and 2 negative"),
        ([0.9, 0.4], "2 score(s) for 1 positive(s) + 2 negative(s)"),
        ({"negatives": [0.4, 0.1]}, "no 'positive' score"),
        ({"positive": "high", "negatives": [0.4, 0.1]}, "'teacher_scores.positive' item 0 is 'high', not a number"),
        ({"positive": 0.9, "negatives": [0.4, 0.1], "margin": 1}, "unknown key(s) margin"),
        ([0.9, float("nan"), 0.1], "'teacher_scores' item 1 is nan, not a finite number"),
        ({"positive": float("inf"), "negatives": [0.4, 0.1]}, "'teacher_scores.positive' item 0 is inf, not a finite"),
    ],
)
def test_a_row_with_wrong_teacher_scores_is_refused_naming_file_and_line(tmp_path, scores, message):
    good = {"query": "q", "positive": "p", "negatives": ["n1", "n2"], "teacher_scores": [0.9, 0.4, 0.1]}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, {**good, "teacher_scores": scores}])
    with pytest.raises(TrainingDataError) as info:
        load_source(str(path))
    assert f"{path}:2:" in str(info.value) and message in str(info.value)


def test_batches_carry_the_scores_of_the_negatives_they_drew():
    examples = [
        TrainExample(
            f"q{i}",
            (f"p{i}",),
            tuple(f"n{i}.{k}" for k in range(4)),
            teacher_scores=(i, *(i + k / 10 for k in range(4))),
        )
        for i in range(6)
    ]
    sampler = MixtureSampler([TrainDataset("a", examples, [])], batch_size=6, num_negatives=2, seed=3)
    for step in range(3):
        batch = sampler.batch(step)
        for query, negatives, scores in zip(batch.queries, batch.negatives, batch.teacher_scores, strict=True):
            i = int(query[1:])
            assert scores == [i, *(i + int(n.rsplit(".", 1)[1]) / 10 for n in negatives)]
        assert batch.shard(1, 2).teacher_scores == batch.teacher_scores[3:]
    # a negative drawn from the pool has no teacher score: the row carries none
    short = [TrainExample("q", ("p",), ("n",), teacher_scores=(1.0, 0.5)), TrainExample("r", ("s",))]
    topped = MixtureSampler([TrainDataset("b", short, ["x", "y", "z"])], batch_size=2, num_negatives=2, seed=0)
    assert topped.batch(0).teacher_scores == [None, None]


# ---------------------------------------------------------------------------------------------- training
ROWS = [
    ("the cat sat on the mat", "a cat sat on a rug", ["the dog was bad", "a great movie"], [0.9, 0.2, 0.1]),
    ("a man riding a horse", "the man is riding", ["a woman eating food", "the cell"], [0.8, 0.3, 0.0]),
    ("protein gene study", "the cell gene result", ["a great movie", "hello friend"], [0.95, 0.1, 0.05]),
    ("language model embedding", "embedding vector search", ["a horse eating food", "the dog"], [0.7, 0.2, 0.3]),
]


def _rows_file(tmp_path, rows=ROWS):
    return write_jsonl(
        tmp_path / "distill.jsonl",
        [
            {"query": q, "positive": p, "negatives": n, "teacher_scores": {"positive": s[0], "negatives": s[1:]}}
            for q, p, n, s in rows
        ],
    )


@pytest.mark.parametrize("loss", ["margin_mse", "distill_kl"])
def test_training_on_teacher_scores_lowers_the_loss(tmp_path, tokenizer, loss):
    """Every batch holds all four rows with both their negatives, so the loss is a function of the weights
    alone and falls as they learn the teacher's margins."""
    cfg = make_config(tmp_path, _rows_file(tmp_path), loss=loss, num_negatives=2, steps=12, lr=2e-2, warmup_steps=0)
    result = Trainer(cfg, model=tiny_embedder(tokenizer)).train()
    assert len(result.losses) == 12
    assert result.losses[-1] < 0.5 * result.losses[0], result.losses


def test_grad_cache_passes_teacher_scores(tmp_path, tokenizer):
    data = _rows_file(tmp_path)
    plain = Trainer(make_config(tmp_path, data, loss="margin_mse", num_negatives=2), model=tiny_embedder(tokenizer))
    cached = Trainer(
        make_config(tmp_path, data, loss="margin_mse", num_negatives=2, grad_cache_chunk=2, output=str(tmp_path / "c")),
        model=tiny_embedder(tokenizer),
    )
    assert cached.train_step()["loss"] == pytest.approx(plain.train_step()["loss"], rel=1e-4)


def test_rows_without_teacher_scores_are_refused_before_training(tmp_path, tokenizer):
    rows = write_jsonl(tmp_path / "plain.jsonl", [{"query": q, "positive": p, "negatives": n} for q, p, n, _ in ROWS])
    with pytest.raises(TrainingDataError, match=r"loss=margin_mse distils .* row 1 of plain .* has no teacher_scores"):
        Trainer(make_config(tmp_path, rows, loss="margin_mse", num_negatives=2), model=tiny_embedder(tokenizer))
    with pytest.raises(TrainingDataError, match=r"has 2 scored negative.*fewer than num_negatives=3"):
        Trainer(
            make_config(tmp_path, _rows_file(tmp_path), loss="distill_kl", num_negatives=3),
            model=tiny_embedder(tokenizer),
        )


def test_lmembed_train_loss_margin_mse(tmp_path):
    """The command line: a saved tiny Llama, rows with teacher scores, ``--loss margin_mse``."""
    from transformers import LlamaModel

    from lmembed.cli.app import app

    folder = tmp_path / "tiny"
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    LlamaModel(tiny_decoder_config("llama", len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "run"
    args = ["train", "--model", str(folder), "--data", str(_rows_file(tmp_path)), "--loss", "margin_mse"]
    args += [
        "--num-negatives",
        "2",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--output",
        str(out),
        "--no-lora",
        "--no-progress",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] > 0 for r in records)
    assert (out / "model").is_dir()
