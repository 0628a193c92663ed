"""Synthetic passkey/needle retrieval (deterministic, no download) and the max_length grid."""

from __future__ import annotations

import numpy as np
import pytest

from lmembed.errors import ConfigError
from lmembed.evaluation.long_synthetic import length_grid, needle_retrieval, passkey_retrieval
from lmembed.evaluation.tasks.retrieval import RetrievalTask


@pytest.mark.parametrize("build", [passkey_retrieval, needle_retrieval])
def test_synthetic_tasks_are_deterministic_and_answerable(build):
    data = build(num_docs=6, words=120, seed=3)
    assert build(num_docs=6, words=120, seed=3) == data
    assert build(num_docs=6, words=120, seed=4).corpus_texts != data.corpus_texts
    assert len(data.corpus_texts) == len(data.query_texts) == 6 and len(set(data.corpus_texts)) == 6
    for i, (query, doc) in enumerate(zip(data.query_texts, data.corpus_texts, strict=True)):
        assert data.qrels[f"q{i}"] == {f"d{i}": 1}
        assert 110 <= len(doc.split()) <= 140
        key_words = query.split()[-1].rstrip("?") if build is passkey_retrieval else query.split()[4]
        holders = [j for j, d in enumerate(data.corpus_texts) if key_words in d]
        assert holders == [i]  # the answer is in its own document only


def test_passkey_sentence_carries_the_key():
    data = passkey_retrieval(num_docs=2, words=50, seed=0)
    doc = data.corpus_texts[0]
    name = data.query_texts[0].removeprefix("What is the pass key of ").rstrip("?")
    key = doc.split(f"The pass key of {name} is ")[1].split(".")[0]
    assert key.isdigit() and len(key) == 5 and f"{key} is {name}'s pass key" in doc


def test_bad_sizes_are_config_errors():
    with pytest.raises(ConfigError, match="num_docs"):
        needle_retrieval(num_docs=0)
    with pytest.raises(ConfigError, match="words"):
        passkey_retrieval(words=3)


def test_length_grid_reads_each_max_length(make_embedder):
    emb = make_embedder("bert", pooling="mean")
    task = RetrievalTask(passkey_retrieval(num_docs=4, words=60, seed=1))
    grid = length_grid(emb, task, [16, 64])
    assert [length for length, _ in grid] == [16, 64]
    for length, result in grid:
        assert result.extra["max_length"] == length
        short = task.evaluate(emb.with_config(emb.config.with_options(max_length=length)))
        np.testing.assert_allclose(result.scores["ndcg_at_10"], short.scores["ndcg_at_10"])


def test_concatenated_documents_carry_their_judgments():
    from lmembed.evaluation.long_synthetic import concatenate_documents
    from lmembed.evaluation.retrieval_data import RetrievalData

    data = RetrievalData(
        name="toy",
        split="test",
        corpus_ids=["a", "b", "c", "d", "e"],
        corpus_texts=["A", "B", "C", "D", "E"],
        query_ids=["q1", "q2"],
        query_texts=["x", "y"],
        qrels={"q1": {"a": 1, "b": 2}, "q2": {"e": 1}},
    )
    long = concatenate_documents(data, per_doc=2, seed=7)
    assert long == concatenate_documents(data, per_doc=2, seed=7) and long.name == "toy[x2]"
    assert long.corpus_ids == ["cat0", "cat1", "cat2"]
    assert sorted(len(t.split("\n\n")) for t in long.corpus_texts) == [1, 2, 2]
    group = {
        doc: cid for cid, text in zip(long.corpus_ids, long.corpus_texts, strict=True) for doc in text.split("\n\n")
    }
    assert sorted(group) == ["A", "B", "C", "D", "E"]
    expected_q1: dict[str, int] = {}
    for doc, grade in (("A", 1), ("B", 2)):
        expected_q1[group[doc]] = max(expected_q1.get(group[doc], 0), grade)
    assert long.qrels == {"q1": expected_q1, "q2": {group["E"]: 1}}
    with pytest.raises(ConfigError, match="per_doc"):
        concatenate_documents(data, per_doc=0)


def test_long_task_names_resolve_to_their_tasks(tmp_path):
    from helpers import write_beir
    from lmembed.evaluation.long_synthetic import concatenate_documents, parse_long_task
    from lmembed.evaluation.retrieval_data import load_beir
    from lmembed.evaluation.suites import resolve_task

    assert resolve_task("passkey:5x60").data == passkey_retrieval(num_docs=5, words=60)
    assert resolve_task("needle:3x40").data == needle_retrieval(num_docs=3, words=40)
    docs = [(f"d{i}", f"text {i}") for i in range(5)]
    beir = write_beir(tmp_path / "toy", docs, [("q1", "x"), ("q2", "y")], [("q1", "d1"), ("q2", "d4")])
    task = resolve_task(f"concat:{beir}:2")
    assert isinstance(task, RetrievalTask) and task.name == "toy[x2]"
    expected = concatenate_documents(load_beir(beir, "test"), 2)
    assert task.data.corpus_texts == expected.corpus_texts and task.data.qrels == expected.qrels
    assert task.dataset_revision.endswith("+x2") and task.mteb_dataset_revision is None
    assert parse_long_task("concat:a:b:3").source == "a:b"  # the last ':' splits off K
    for bad in ("passkey:24", "needle:ax600", "concat:scifact", "concat::4"):
        with pytest.raises(ConfigError, match="expected"):
            resolve_task(bad)
