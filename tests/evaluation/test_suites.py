"""Suites: names, locating data, skipping absent tasks, MTEB-style aggregation, instructions."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.instructions import STS_INSTRUCTION, format_instruction, instruction_for, instruction_sides
from lmembed.evaluation.suites import SUITES, aggregate, locate, run_suite, suite_task_names
from lmembed.paths import shared_datasets_dir

SHARED = shared_datasets_dir() or Path("/nonexistent")


class HashEncoder:
    """Hashed bag of words (float32, deterministic); records instructions it was given."""

    def __init__(self, dim: int = 32) -> None:
        self.dim = dim
        self.instructions: list[str | None] = []

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            h = int(hashlib.md5(word.encode()).hexdigest(), 16)
            v[h % self.dim] += 1.0 if (h >> 7) & 1 else -1.0
        return v + 1e-3

    def encode(self, texts, *, batch_size=32):
        return np.stack([self._vec(t) for t in texts])

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        self.instructions.append(instruction)
        return self.encode(texts)

    def encode_corpus(self, texts, *, batch_size=32):
        return self.encode(texts)


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


STS_ROWS = [
    {"sentence1": "a cat sits on the mat", "sentence2": "a cat is on the mat", "score": 4.8},
    {"sentence1": "dogs run fast", "sentence2": "fast dogs run", "score": 4.5},
    {"sentence1": "the sky is blue", "sentence2": "I like green tea", "score": 0.2},
    {"sentence1": "he plays guitar", "sentence2": "he plays the guitar well", "score": 3.9},
    {"sentence1": "rain falls today", "sentence2": "stocks fell sharply", "score": 0.5},
]


def _make_root(tmp_path: Path) -> Path:
    _write(tmp_path / "sts/stsbenchmark/test.jsonl", STS_ROWS)
    _write(tmp_path / "sts/sickr/test.jsonl", STS_ROWS[::-1])
    words = ["money card transfer", "lost stolen card", "exchange rate fee"]
    for split, n in (("train", 30), ("test", 9)):
        rows = [{"text": f"{words[i % 3]} {split} {i}", "label": i % 3} for i in range(n)]
        _write(tmp_path / f"classification/banking77/{split}.jsonl", rows)
    pairs = {
        "sentence1": ["reset my phone", "bill is wrong"],
        "sentence2": ["reset phone", "nice day"],
        "labels": [1, 0],
    }
    _write(tmp_path / "pair_classification/sprint_duplicate_questions/test.jsonl", [pairs])
    return tmp_path


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    return _make_root(tmp_path)


@pytest.fixture(scope="module")
def lite_report():
    root = _make_root(Path(tempfile.mkdtemp(prefix="lmembed-suite-")))
    try:
        yield run_suite("mteb-lite", HashEncoder(), data_root=root, batch_size=8)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_suite_definitions():
    lite = suite_task_names("mteb-lite")
    assert len(lite) == 20
    types = Counter(locate(name, "/nonexistent").task_type for name in lite)
    assert types == {
        "Retrieval": 3,
        "Reranking": 2,
        "Clustering": 6,
        "PairClassification": 2,
        "Classification": 3,
        "STS": 3,
        "Summarization": 1,
    }
    assert set(SUITES["sts"]) == {"STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R"}
    assert SUITES["retrieval"] == ("SciFact", "NFCorpus", "ArguAna")
    with pytest.raises(KeyError):
        suite_task_names("nope")


def test_runner_names_absent_tasks_and_scores_the_rest(lite_report):
    report = lite_report
    scored = {r.task_name for r in report.results}
    assert scored == {"STSBenchmark", "SICK-R", "Banking77Classification", "SprintDuplicateQuestions"}
    assert set(report.missing) == set(SUITES["mteb-lite"]) - scored
    assert "SciFact" in report.missing and report.missing["SciFact"][0].endswith("corpus.jsonl")
    assert not report.failed
    assert "absent: SciFact" in report.summary()
    assert set(report.to_dict()["main_scores"]) == scored


def test_aggregation_is_mean_of_type_means(lite_report):
    report = lite_report
    by_name = {r.task_name: r.main_score for r in report.results}
    sts_mean = (by_name["STSBenchmark"] + by_name["SICK-R"]) / 2
    assert report.per_type["STS"] == pytest.approx(sts_mean)
    expected = np.mean([sts_mean, by_name["Banking77Classification"], by_name["SprintDuplicateQuestions"]])
    assert report.overall == pytest.approx(expected)
    assert report.task_mean == pytest.approx(np.mean(list(by_name.values())))


def test_aggregate_hand_values():
    def result(name, kind, score):
        return TaskResult(name, kind, "test", {"main_score": score}, "x")

    per_type, overall, task_mean = aggregate(
        [result("a", "STS", 0.8), result("b", "STS", 0.6), result("c", "Retrieval", 0.4)]
    )
    assert per_type == pytest.approx({"STS": 0.7, "Retrieval": 0.4})
    assert overall == pytest.approx(0.55)
    assert task_mean == pytest.approx(0.6)
    assert aggregate([]) == ({}, None, None)


def test_instructions_reach_symmetric_tasks(data_root):
    encoder = HashEncoder()
    names = ["STSBenchmark", "Banking77Classification"]
    report = run_suite(names, encoder, data_root=data_root, instructions="nv-embed")
    assert report.suite == "custom"
    assert STS_INSTRUCTION in encoder.instructions
    assert instruction_for("Banking77Classification") in encoder.instructions
    plain = HashEncoder()
    run_suite(["STSBenchmark"], plain, data_root=data_root)
    assert plain.instructions == []  # no instruction -> texts embedded as they are


def test_failures_are_recorded_or_raised(data_root):
    (data_root / "sts/sickr/test.jsonl").write_text('{"sentence1": "a"}\n')
    report = run_suite(["SICK-R", "STSBenchmark"], HashEncoder(), data_root=data_root)
    assert "SICK-R" in report.failed and [r.task_name for r in report.results] == ["STSBenchmark"]
    with pytest.raises(ValueError):
        run_suite(["SICK-R"], HashEncoder(), data_root=data_root, raise_errors=True)


def test_instruction_tables():
    assert instruction_for("STS12") == STS_INSTRUCTION == instruction_for("SICK-R")
    assert instruction_for("SciFact").startswith("Given a scientific claim")
    assert instruction_for("NoSuchTask") is None
    assert instruction_sides("Retrieval") == "query" and instruction_sides("Reranking") == "query"
    assert instruction_sides("STS") == "both" and instruction_sides("Clustering") == "both"
    missing = [name for name in SUITES["mteb-lite"] if instruction_for(name) is None]
    assert missing == []
    assert format_instruction("Classify it") == "Instruct: Classify it\nQuery: "
    with pytest.raises(KeyError):
        instruction_for("STS12", "no-such-set")


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data absent")
def test_shared_data_holds_the_sts_and_retrieval_suites():
    for suite in ("sts", "retrieval"):
        assert all(locate(name, SHARED).available for name in SUITES[suite])
    lite_present = {name for name in SUITES["mteb-lite"] if locate(name, SHARED).available}
    assert lite_present == {
        "SciFact",
        "ArguAna",
        "NFCorpus",
        "Banking77Classification",
        "EmotionClassification",
        "SICK-R",
        "STSBenchmark",
        "MasakhaNEWSClusteringS2S",
        "MasakhaNEWSClusteringP2P",
        "SIB200ClusteringS2S",
        "RTE3",
        "SummEval",
    }


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared data absent")
def test_sib200_is_scored_with_mteb_bootstrap_protocol_over_all_its_sentences():
    from lmembed.evaluation.suites import build_task
    from lmembed.evaluation.tasks import ClusteringTask

    task = build_task(locate("SIB200ClusteringS2S", SHARED))
    assert isinstance(task, ClusteringTask)
    assert (task.protocol, task.max_documents, task.bootstrap_runs, task.bootstrap_size) == (
        "bootstrap",
        1004,
        10,
        16384,
    )
    pooled = [s for cluster_set in task.sets for s in cluster_set.sentences]
    texts = task.texts()
    assert len(texts) == len(pooled) == 1004
    assert Counter(texts) == Counter(pooled) and texts != pooled  # every sentence once, in MTEB's shuffled order
    legacy = build_task(locate("MasakhaNEWSClusteringS2S", SHARED))
    assert legacy.protocol == "legacy"
