"""Training data: JSONL and BEIR reading, validation messages, deterministic resumable mixing, config."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conftest import shared_or_skip
from helpers import write_jsonl
from lmembed.training.rows import (
    DataSource,
    MixtureSampler,
    TrainDataset,
    TrainExample,
    TrainingDataError,
    load_source,
    load_sources,
    mixture_weights,
    read_beir,
    read_jsonl_examples,
)
from lmembed.training.train_config import TrainConfig, TrainConfigError


def make_beir(folder: Path) -> Path:
    """A tiny BEIR folder: CRLF qrels with a header, one judgment of score 0."""
    (folder / "qrels").mkdir(parents=True)
    docs = [
        {"_id": "d1", "title": "Cats", "text": "the cat sat on the mat"},
        {"_id": "d2", "title": "", "text": "a dog was bad"},
        {"_id": "d3", "title": "Horses", "text": "a man riding a horse"},
    ]
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "cat mat"}, {"_id": "q2", "text": "horse riding"}])
    qrels = "query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\nq1\td2\t0\r\nq2\td3\t2\r\n"
    (folder / "qrels" / "train.tsv").write_text(qrels)
    return folder


def dataset(name: str, size: int, negatives: int = 0) -> TrainDataset:
    examples = [
        TrainExample(f"{name} q{i}", (f"{name} p{i}",), tuple(f"{name} n{i}.{k}" for k in range(negatives)))
        for i in range(size)
    ]
    pool = [t for e in examples for t in (*e.positives, *e.negatives)]
    return TrainDataset(name, examples, pool)


# ---------------------------------------------------------------------------------------------- JSONL
def test_jsonl_accepts_other_tools_spellings(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"query": "q1", "positive": "p1", "negatives": ["n1", "n2"], "instruction": "find", "task": "t"},
            {"anchor": "q2", "pos": ["p2a", "p2b"], "negative": "n3"},
            {"anchor": "q3", "positive": "p3", "neg": ["n4"]},
            "",
            {"question": "q4", "positives": ["p4"]},
        ],
    )
    examples, skipped = read_jsonl_examples(path)
    assert skipped == 0
    assert examples[0] == TrainExample("q1", ("p1",), ("n1", "n2"), "find", "t")
    assert examples[1] == TrainExample("q2", ("p2a", "p2b"), ("n3",))
    assert examples[2].negatives == ("n4",)
    assert examples[3] == TrainExample("q4", ("p4",))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"positive": "p"}, "missing the query"),
        ({"query": "q"}, "missing the positive"),
        ({"query": "  ", "positive": "p"}, "'query' is empty"),
        ({"query": "q", "positive": ""}, "'positive' has an empty text"),
        ({"query": "q", "positive": "p", "negatives": ["n", ""]}, "'negatives' has an empty text (item 1)"),
        ({"query": "q", "positive": 3}, "must be a string or a list"),
        # two names of one field: which was meant cannot be told (the first in a fixed order won without a word)
        ({"query": "q", "anchor": "a", "positive": "p"}, "fields 'query' and 'anchor' both give the query"),
        ({"query": "q", "positive": "p", "negatives": ["n"], "negative": "m"}, "'negatives' and 'negative' both"),
        ("{not json", "invalid JSON"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"query": "ok", "positive": "fine"}, row])
    with pytest.raises(TrainingDataError) as info:
        read_jsonl_examples(path)
    assert f"{path}:2:" in str(info.value)
    assert message in str(info.value)


def test_jsonl_skip_invalid_counts(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"query": "q", "positive": "p"}, {"query": "q"}, {"query": "", "pos": "x"}]
    )
    examples, skipped = read_jsonl_examples(path, skip_invalid=True)
    assert len(examples) == 1 and skipped == 2
    assert load_source(DataSource(str(path)), skip_invalid=True).skipped == 2


def test_source_instruction_is_a_default(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"query": "q", "positive": "p"}, {"query": "r", "pos": "s", "instruction": "own"}]
    )
    ds = load_source(DataSource(str(path), instruction="shared"))
    assert [e.instruction for e in ds.examples] == ["shared", "own"]
    assert set(ds.documents) == {"p", "s"}


# ---------------------------------------------------------------------------------------------- BEIR
def test_beir_qrels_become_examples(tmp_path):
    folder = make_beir(tmp_path / "beir")
    examples, documents, skipped = read_beir(folder, "train")
    assert skipped == 0 and len(documents) == 3
    assert examples[0] == TrainExample("cat mat", ("Cats the cat sat on the mat",), ("a dog was bad",))
    assert examples[1].positives == ("Horses a man riding a horse",)
    assert load_source(str(folder)).name == "beir"


def test_beir_unknown_document_names_qrels_line(tmp_path):
    folder = make_beir(tmp_path / "beir")
    with (folder / "qrels" / "train.tsv").open("a") as handle:
        handle.write("q2\tmissing\t1\r\n")
    with pytest.raises(TrainingDataError, match=r"train\.tsv:5: document id 'missing'"):
        read_beir(folder, "train")
    examples, _, skipped = read_beir(folder, "train", skip_invalid=True)
    assert skipped == 1 and len(examples) == 2
    with pytest.raises(TrainingDataError, match=r"no qrels/dev\.tsv"):
        read_beir(folder, "dev")


def test_real_training_files():
    nli = load_source(str(shared_or_skip("training/nli_triplets.jsonl")))
    assert len(nli) == 6543 and all(len(e.negatives) == 1 for e in nli.examples[:50])
    scifact = load_source(str(shared_or_skip("beir/scifact")))
    assert len(scifact) == 809  # every train query has a relevant document
    assert sum(len(e.positives) for e in scifact.examples) == 919


# ---------------------------------------------------------------------------------------------- sampling
def test_batches_are_a_function_of_seed_and_step():
    data = [dataset("a", 7, negatives=2), dataset("b", 30)]
    first = MixtureSampler(data, batch_size=5, num_negatives=2, seed=3)
    in_order = [first.batch(s) for s in range(12)]
    fresh = MixtureSampler(data, batch_size=5, num_negatives=2, seed=3)
    assert fresh.batch(9) == in_order[9]  # resuming at a step needs nothing but the step number
    assert fresh.batch(4) == in_order[4]  # going back works too
    assert fresh.batch(10) == in_order[10]
    other = MixtureSampler(data, batch_size=5, num_negatives=2, seed=4)
    assert [other.batch(s).queries for s in range(3)] != [b.queries for b in in_order[:3]]


def test_each_epoch_visits_every_example_once():
    sampler = MixtureSampler([dataset("a", 10)], batch_size=5, seed=0)
    seen = [q for s in range(4) for q in sampler.batch(s).queries]
    assert sorted(seen[:10]) == sorted(f"a q{i}" for i in range(10))
    assert sorted(seen[10:]) == sorted(seen[:10]) and seen[10:] != seen[:10]


@pytest.mark.parametrize(("mixing", "expected_a"), [("uniform", 0.5), ("proportional", 10 / 210)])
def test_mixing_weights(mixing, expected_a):
    data = [dataset("a", 10), dataset("b", 200)]
    sampler = MixtureSampler(data, batch_size=50, seed=1, mixing=mixing)
    counts = Counter(src for s in range(40) for src in sampler.batch(s).sources)
    assert counts["a"] / 2000 == pytest.approx(expected_a, abs=0.04)


def test_explicit_weights_and_validation():
    data = [dataset("a", 3), dataset("b", 3)]
    data[0].weight, data[1].weight = 3.0, 1.0
    assert mixture_weights(data).tolist() == [0.75, 0.25]
    with pytest.raises(ValueError, match="mixing"):
        mixture_weights(data, "random")


def test_negatives_are_topped_up_without_own_positive():
    data = [dataset("a", 6, negatives=1)]
    sampler = MixtureSampler(data, batch_size=6, num_negatives=3, seed=0)
    batch = sampler.batch(0)
    assert batch.num_negatives == 3 and len(batch.flat_negatives) == 18
    for query, positive, negatives in zip(batch.queries, batch.positives, batch.negatives, strict=True):
        assert f"{query.replace('q', 'n')}.0" in negatives  # the row's own hard negative is kept
        assert positive not in negatives


def test_shard_splits_rows_for_processes():
    batch = MixtureSampler([dataset("a", 8, negatives=1)], batch_size=4, num_negatives=1, seed=0).batch(0)
    parts = [batch.shard(r, 2) for r in range(2)]
    assert parts[0].queries + parts[1].queries == batch.queries
    assert parts[1].negatives == batch.negatives[2:]
    with pytest.raises(ValueError, match="evenly"):
        batch.shard(0, 3)


def test_duplicate_source_names_are_made_unique(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"query": "q", "positive": "p"}])
    assert [d.name for d in load_sources([str(path), str(path)])] == ["d", "d#2"]


# ---------------------------------------------------------------------------------------------- config
def test_config_yaml_round_trip_and_cli_override(tmp_path):
    from lmembed.cli.train import build_config

    cfg = TrainConfig(model="minilm", data=["a.jsonl", {"path": "b", "weight": 2.0}], similarity="cos", steps=7)
    path = tmp_path / "run.yaml"
    path.write_text(cfg.to_yaml())
    loaded = TrainConfig.from_yaml(path)
    assert loaded == cfg and loaded.similarity == "cosine" and loaded.data[1].weight == 2.0
    options = dict.fromkeys(("data", "weight", "instruction", "lora_targets"))
    merged = build_config(path, {**options, "steps": 3, "lora_targets": "q_proj,v_proj", "batch_size": None})
    assert merged.steps == 3 and merged.batch_size == cfg.batch_size
    assert merged.lora_target_modules == ["q_proj", "v_proj"] and len(merged.data) == 2
    replaced = build_config(path, {**options, "data": ["x.jsonl", "y.jsonl"], "weight": [1.0, 3.0]})
    assert [(d.path, d.weight) for d in replaced.data] == [("x.jsonl", 1.0), ("y.jsonl", 3.0)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"similarity": "l2"}, "similarity"),
        ({"loss": "triplet", "num_negatives": 0}, "num_negatives"),
        ({"dtype": "int8"}, "dtype"),
        ({"bogus": 1}, "unknown training option"),
    ],
)
def test_config_errors(options, message):
    with pytest.raises(TrainConfigError, match=message):
        TrainConfig.from_dict(options)


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: -1\n")
    with pytest.raises(TrainConfigError, match=r"run\.yaml:1: steps=-1"):
        TrainConfig.from_yaml(path)


def test_mistyped_yaml_values_name_the_option():
    """A YAML value of the wrong plain type is refused naming the option (not a TypeError from a comparison
    later); paths and nulls where allowed pass, and fields of other types are left to their class."""
    from lmembed.training.rows import DataSource, TrainingDataError
    from lmembed.training.train_config import TrainConfig, TrainConfigError

    with pytest.raises(TrainConfigError, match=r"steps: expected int, got 'many'; lr: expected float, got '2e-5'"):
        TrainConfig.from_dict({"steps": "many", "lr": "2e-5"})
    with pytest.raises(TrainConfigError, match=r"resume: expected bool, got 'no'"):
        TrainConfig.from_dict({"resume": "no"})
    with pytest.raises(TrainConfigError, match=r"batch_size: expected int, got True"):
        TrainConfig.from_dict({"batch_size": True})
    with pytest.raises(TrainingDataError, match=r"data source d.jsonl: weight: expected float or null, got 'x'"):
        DataSource.parse({"path": "d.jsonl", "weight": "x"})
    assert TrainConfig.from_dict({"lr": 1, "temperature": None, "output": Path("runs/x")}).lr == 1
