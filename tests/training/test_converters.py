"""Labelled data → training rows (NV-Embed stage 2) and task-homogeneous batching."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from conftest import shared_or_skip
from lmembed.training.converters import (
    STS_INSTRUCTION,
    beir_rows,
    classification_rows,
    clustering_rows,
    label_text,
    pair_rows,
    sts_rows,
)
from lmembed.training.rows import (
    MixtureSampler,
    RoundRobinSampler,
    TaskHomogeneousSampler,
    TrainDataset,
    TrainExample,
    parse_row,
)

MULTI = [
    {"text": f"{label} example {i}", "label_text": label}
    for label in ("card_arrival", "lost_card", "top_up")
    for i in range(4)
]
BINARY = [{"text": f"review {i}", "label_text": "positive" if i % 2 else "negative"} for i in range(6)]
STS = [
    {"sentence1": "a man plays a guitar", "sentence2": "a man is playing guitar", "score": 4.6},
    {"sentence1": "a cat sleeps", "sentence2": "a dog barks", "score": 0.4},
    {"sentence1": "kids play football", "sentence2": "children are playing soccer", "score": 4.0},
    {"sentence1": "the sun is bright", "sentence2": "a woman reads a book", "score": 0.0},
    {"sentence1": "rain falls on the city", "sentence2": "a chef cooks pasta", "score": 1.0},
]


def label_of(text: str) -> str:
    return text.split(" example ")[0]


def test_example_based_rows_pair_same_class_positive_with_other_class_negatives():
    rows = classification_rows(MULTI, instruction="Find the intent", num_negatives=3, seed=1, task="banking")
    assert len(rows) == len(MULTI)
    for row in rows:
        own = label_of(row["query"])
        assert row["positive"] != row["query"] and label_of(row["positive"]) == own
        assert len(row["negatives"]) == 3
        assert all(label_of(n) != own for n in row["negatives"])
        assert row["instruction"] == "Find the intent" and row["task"] == "banking"
        parse_row(row)  # the trainer reads it


def test_example_based_negatives_spread_over_the_other_classes():
    rows = classification_rows(MULTI, num_negatives=2, seed=0)
    for row in rows:
        assert len({label_of(n) for n in row["negatives"]}) == 2  # two other classes, one each


def test_label_based_rows_use_label_texts_as_documents():
    rows = classification_rows(MULTI, mode="label", num_negatives=5, seed=0)
    labels = {"card arrival", "lost card", "top up"}
    for row in rows:
        assert row["positive"] == label_text(label_of(row["query"]))
        assert set(row["negatives"]) == labels - {row["positive"]}  # only 2 other labels exist


def test_binary_classification_uses_labels_automatically():
    rows = classification_rows(BINARY, num_negatives=7)
    assert {r["positive"] for r in rows} == {"positive", "negative"}
    assert all(r["negatives"] == [{"positive": "negative", "negative": "positive"}[r["positive"]]] for r in rows)


def test_clustering_rows_are_example_based_and_max_rows_caps():
    data = [{"text": t["text"], "label": label_of(t["text"])} for t in MULTI]
    rows = clustering_rows(data, num_negatives=1, max_rows=9, seed=3)
    assert len(rows) <= 9
    assert all(label_of(r["positive"]) == label_of(r["query"]) for r in rows)


def test_singleton_classes_cannot_be_example_based_queries():
    data = [*MULTI, {"text": "alone", "label_text": "rare"}]
    rows = classification_rows(data, mode="example", num_negatives=1)
    assert "alone" not in {r["query"] for r in rows}
    with pytest.raises(ValueError, match="2 classes"):
        classification_rows(MULTI[:4])


def test_sts_pairs_above_threshold_become_two_symmetric_rows():
    rows = sts_rows(STS, num_negatives=2, seed=0)
    assert len(rows) == 4  # two pairs scored >= 4, both directions
    assert {(r["query"], r["positive"]) for r in rows} == {
        ("a man plays a guitar", "a man is playing guitar"),
        ("a man is playing guitar", "a man plays a guitar"),
        ("kids play football", "children are playing soccer"),
        ("children are playing soccer", "kids play football"),
    }
    for row in rows:
        assert row["instruction"] == row["document_instruction"] == STS_INSTRUCTION
        assert row["symmetric"] is True
        assert len(row["negatives"]) == 2
        assert not {row["query"], row["positive"]} & set(row["negatives"])


def test_sts_negatives_can_be_mined_with_a_teacher():
    from test_mining import BagOfWords

    data = [
        {"sentence1": "the cat sat on the mat", "sentence2": "a cat sat on the mat", "score": 5.0},
        {"sentence1": "the dog ran in the park", "sentence2": "fish swim in the sea", "score": 0.0},
        {"sentence1": "the cat ran in the park", "sentence2": "a bird can fly in the sky", "score": 1.0},
    ]
    rows = sts_rows(data, teacher=BagOfWords(), num_negatives=1, mining={"method": "naive"})
    assert rows[0]["negatives"] == ["the cat ran in the park"]  # the closest other sentence


def test_pair_and_beir_rows(tmp_path):
    pairs = pair_rows(
        [{"anchor": "q", "positive": "p", "negative": "n"}, {"anchor": "q2", "positive": "p2"}], instruction="I"
    )
    assert pairs == [
        {"query": "q", "positive": "p", "negatives": ["n"], "instruction": "I"},
        {"query": "q2", "positive": "p2", "negatives": [], "instruction": "I"},
    ]
    folder = tmp_path / "toy"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": i, "title": "T", "text": f"doc {i}"}) for i in ("a", "b", "c")) + "\n"
    )
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "1", "text": "query one"}) + "\n")
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\r\n1\ta\t1\r\n1\tb\t0\r\n1\tc\t2\r\n")
    rows = beir_rows(folder, instruction="Find docs")
    assert rows == [
        {"query": "query one", "positive": ["T doc a", "T doc c"], "instruction": "Find docs", "task": "toy"}
    ]


def test_real_banking77_converts():
    path = shared_or_skip("classification/banking77/train.jsonl")
    rows = classification_rows(path, max_rows=300, num_negatives=7, seed=0)
    assert len(rows) == 300
    assert all(len(r["negatives"]) == 7 for r in rows)


# ---------------------------------------------------------------------------------------------- batching
def _datasets() -> list[TrainDataset]:
    out = []
    for name in ("retrieval", "sts", "classes"):
        examples = [TrainExample(f"{name} q{i}", (f"{name} d{i}",)) for i in range(10)]
        out.append(TrainDataset(name, examples, [e.positives[0] for e in examples]))
    return out


def test_task_homogeneous_batches_come_from_one_dataset_each():
    sampler = TaskHomogeneousSampler(_datasets(), batch_size=4, num_negatives=1, seed=0)
    used = Counter()
    for step in range(60):
        batch = sampler.batch(step)
        assert len(set(batch.sources)) == 1
        assert all(q.startswith(batch.sources[0]) for q in batch.queries)
        assert all(len(n) == 1 and n[0].startswith(batch.sources[0]) for n in batch.negatives)
        used[batch.sources[0]] += 1
    assert set(used) == {"retrieval", "sts", "classes"}  # uniform over datasets
    assert min(used.values()) > 10


def test_task_homogeneous_batches_are_a_pure_function_of_the_step():
    first = TaskHomogeneousSampler(_datasets(), batch_size=4, seed=5)
    second = TaskHomogeneousSampler(_datasets(), batch_size=4, seed=5)
    in_order = [first.batch(s).queries for s in range(12)]
    assert second.batch(11).queries == in_order[11]  # straight to step 11
    assert second.batch(3).queries == in_order[3]


def test_task_homogeneous_sampler_walks_each_dataset_without_repeats_per_epoch():
    sampler = TaskHomogeneousSampler(_datasets(), batch_size=5, seed=1)
    seen: dict[str, list[str]] = {}
    for step in range(30):
        batch = sampler.batch(step)
        seen.setdefault(batch.sources[0], []).extend(batch.queries)
    for queries in seen.values():
        for start in range(0, len(queries) - 9, 10):
            assert len(set(queries[start : start + 10])) == 10


def test_round_robin_batches_take_the_datasets_in_turn():
    sampler = RoundRobinSampler(_datasets(), batch_size=4, seed=2)
    sources = [sampler.batch(step).sources for step in range(9)]
    assert all(len(set(batch)) == 1 for batch in sources)  # one task per batch: in-batch negatives never cross
    assert [batch[0] for batch in sources] == ["retrieval", "sts", "classes"] * 3
    # each dataset's rows continue where its previous batch stopped: the same stream as homogeneous batching
    homogeneous = TaskHomogeneousSampler(_datasets(), batch_size=4, seed=2)
    rows = [q for step in range(0, 9, 3) for q in sampler.batch(step).queries]
    walked = [q for step in range(60) if (b := homogeneous.batch(step)).sources[0] == "retrieval" for q in b.queries]
    assert rows == walked[:12]


def test_default_sampler_blends_datasets_within_a_batch():
    sampler = MixtureSampler(_datasets(), batch_size=12, seed=0)
    assert any(len(set(sampler.batch(s).sources)) > 1 for s in range(5))


def test_a_pairs_row_without_an_anchor_names_the_file_and_line(tmp_path):
    """A pairs file whose row lacks ``anchor`` ended in an internal KeyError; it is refused naming file and line."""
    from lmembed.training.rows import TrainingDataError

    source = tmp_path / "pairs.jsonl"
    source.write_text(json.dumps({"anchor": "q", "positive": "p"}) + "\n\n" + json.dumps({"positive": "p2"}) + "\n")
    with pytest.raises(TrainingDataError, match=rf"{re.escape(str(source))}:3: 'anchor' must be a text"):
        pair_rows(source)
    with pytest.raises(TrainingDataError, match=r"rows:1: 'positive' must be a text"):
        pair_rows([{"anchor": "q", "positive": 3}])
