"""Retrieval as a task type like the others (from_path, instruction field) and its subsampler."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lmembed import task_registry
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.tasks import TASK_TYPES, build_task, load_task
from lmembed.evaluation.tasks.retrieval import RetrievalTask, subsample_retrieval


def _data() -> RetrievalData:
    return RetrievalData(
        name="x",
        split="test",
        corpus_ids=[f"d{i}" for i in range(20)],
        corpus_texts=[f"text {i}" for i in range(20)],
        query_ids=["q0", "q1", "q2"],
        query_texts=["a", "b", "c"],
        qrels={"q0": {"d1": 2, "d2": 1, "d3": 1}, "q1": {"d5": 1}, "q2": {"d19": 0}},
    )


def _beir(folder: Path) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": d}) + "\n" for d in ("a0", "a1", "a2")))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": q}) + "\n" for q in ("a0", "a1")))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\na0\ta1\t1\na1\ta0\t1\n")
    return folder


def test_retrieval_is_a_task_type_like_the_others(tmp_path):
    folder = _beir(tmp_path / "arguana")
    assert TASK_TYPES["Retrieval"] is RetrievalTask
    plain = load_task(folder, instruction="Find it")
    assert isinstance(plain, RetrievalTask) and plain.name == "arguana" and plain.instruction == "Find it"
    assert plain.with_instruction(None).instruction is None and plain.instruction == "Find it"
    known = build_task(task_registry.get("ArguAna"), folder)
    assert isinstance(known, RetrievalTask)
    assert (known.name, known.ignore_identical_ids) == ("ArguAna", True)
    assert known.mteb_dataset_revision == task_registry.get("ArguAna").settings["mteb_dataset_revision"]


def test_relevant_first_keeps_relevant_documents_first():
    data = _data()
    small = subsample_retrieval(data, max_docs=3)
    assert small.corpus_ids == ["d1", "d2", "d5"]  # best judgment of each query first, round-robin
    assert small.qrels == {"q0": {"d1": 2, "d2": 1}, "q1": {"d5": 1}} and small.query_ids == ["q0", "q1"]
    assert small.name == "x" and small.missing_docs == []
    # the exact draws of training's dev-evaluation subsampler (NumPy default_rng)
    padded = subsample_retrieval(data, max_docs=10, seed=1)
    assert padded.corpus_ids == ["d0", "d1", "d2", "d3", "d5", "d6", "d9", "d10", "d13", "d17"]
    assert subsample_retrieval(data, max_queries=1, seed=0).query_ids == ["q1"]
    assert subsample_retrieval(data, 2, 4, 7).corpus_ids == ["d1", "d2", "d3", "d5"]


def test_all_judged_keeps_every_judged_document_and_names_the_copy():
    task = RetrievalTask(_data(), name="Toy", ignore_identical_ids=True, mteb_dataset_revision="abc")
    sub = task.subsample(max_docs=8)
    # the exact draws of the main job's reduced corpus (Python random.Random(seed).shuffle)
    assert sub.data.corpus_ids == ["d1", "d2", "d3", "d4", "d5", "d13", "d14", "d19"]
    assert task.subsample(max_docs=8, seed=3).data.corpus_ids == ["d1", "d2", "d3", "d5", "d10", "d14", "d16", "d19"]
    assert sub.name == sub.data.name == "Toy[8 docs]"
    assert sub.data.query_ids == task.data.query_ids and sub.data.qrels == task.data.qrels
    assert sub.ignore_identical_ids and sub.mteb_dataset_revision is None
    assert sub.dataset_revision == task.dataset_revision
    assert task.subsample(max_docs=2).data.corpus_ids == ["d1", "d2", "d3", "d5", "d19"]  # judged beat the limit
    assert task.name == "Toy" and len(task.data.corpus_ids) == 20  # the original is untouched
    with pytest.raises(ValueError, match="max_queries"):
        task.subsample(max_docs=5, max_queries=1)


def test_subsampled_task_with_queries_dropped_says_so():
    task = RetrievalTask(_data(), name="Toy")
    sub = task.subsample(max_docs=3, policy="relevant-first")
    assert sub.name == "Toy[3 docs, 2 queries]"


def test_instruction_reaches_the_queries_only():
    calls = []

    class Recorder:
        def encode_queries(self, texts, *, instruction=None, batch_size=32):
            calls.append(("queries", instruction))
            return np.eye(20, dtype=np.float32)[: len(texts)]

        def encode_corpus(self, texts, *, batch_size=32):
            calls.append(("corpus", None))
            return np.eye(20, dtype=np.float32)[: len(texts)]

    result = RetrievalTask(_data(), instruction="Find it").evaluate(Recorder())
    assert calls == [("queries", "Find it"), ("corpus", None)] and result.extra["instruction"] == "Find it"
