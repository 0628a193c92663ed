"""STS task: MTEB's metrics on hand-checkable data, loading, and the instruction convention."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from lmembed.evaluation.tasks import STSTask, load_task
from lmembed.evaluation.tasks.sts import sts_scores
from lmembed.paths import shared_datasets_dir
from lmembed.task_registry import TASKS

SHARED = shared_datasets_dir() or Path("/nonexistent")


class TableEncoder:
    """Looks every text up in a fixed table; records how it was called."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = {text: np.asarray(vec, dtype=np.float32) for text, vec in table.items()}
        self.calls: list[tuple[str, str | None, list[str]]] = []

    def _rows(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])

    def encode(self, texts, *, batch_size=32):
        self.calls.append(("encode", None, list(texts)))
        return self._rows(list(texts))

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        self.calls.append(("queries", instruction, list(texts)))
        return self._rows(list(texts))

    def encode_corpus(self, texts, *, batch_size=32):
        self.calls.append(("corpus", None, list(texts)))
        return self._rows(list(texts))


def _angle(deg: float) -> list[float]:
    rad = np.deg2rad(deg)
    return [float(np.cos(rad)), float(np.sin(rad))]


# Pair i: "a{i}" at angle 0, "b{i}" at the given angle, so cos = cos(angle).
ANGLES = [80.0, 60.0, 40.0, 10.0]
GOLD = [1.0, 2.0, 4.0, 3.0]
TABLE = {**{f"a{i}": _angle(0) for i in range(4)}, **{f"b{i}": _angle(a) for i, a in enumerate(ANGLES)}}


def _task(**kwargs) -> STSTask:
    return STSTask("Toy", [f"a{i}" for i in range(4)], [f"b{i}" for i in range(4)], GOLD, **kwargs)


def test_cosine_correlations_match_hand_computation():
    cosines = np.cos(np.deg2rad(ANGLES))
    result = _task().evaluate(TableEncoder(TABLE))
    # cosines rank 1,2,3,4 while gold ranks 1,2,4,3 -> rho = 1 - 6*2/(4*15) = 0.8
    assert result.scores["cosine_spearman"] == pytest.approx(0.8)
    assert result.scores["cosine_pearson"] == pytest.approx(pearsonr(GOLD, cosines)[0], abs=1e-6)
    assert result.main_score == pytest.approx(0.8)
    assert result.main_metric == "cosine_spearman"
    assert result.task_type == "STS"


def test_all_mteb_keys_present_and_distance_variants_are_negated():
    result = _task().evaluate(TableEncoder(TABLE))
    for key in (
        "cosine_pearson",
        "cosine_spearman",
        "manhattan_pearson",
        "manhattan_spearman",
        "euclidean_pearson",
        "euclidean_spearman",
        "pearson",
        "spearman",
        "main_score",
    ):
        assert key in result.scores
    # unit vectors: euclidean distance is monotone in cosine, so after negation ranks agree
    assert result.scores["euclidean_spearman"] == pytest.approx(result.scores["cosine_spearman"])
    assert result.scores["dot_spearman"] == pytest.approx(result.scores["cosine_spearman"])


def test_gold_rescaling_changes_nothing():
    emb1 = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)
    emb2 = np.random.default_rng(1).normal(size=(20, 8)).astype(np.float32)
    gold = np.random.default_rng(2).uniform(0, 5, size=20)
    a = sts_scores(emb1, emb2, gold)
    b = sts_scores(emb1, emb2, gold, min_score=1.0, max_score=4.0)
    for key in a:
        assert a[key] == pytest.approx(b[key])
    assert a["cosine_spearman"] == pytest.approx(
        spearmanr(
            gold, [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(emb1, emb2, strict=True)]
        )[0]
    )


def test_no_instruction_uses_plain_encode_once_for_distinct_texts():
    encoder = TableEncoder(TABLE)
    task = STSTask("Toy", ["a0", "a0", "a1"], ["b0", "b1", "b2"], [1.0, 2.0, 3.0])
    task.evaluate(encoder)
    assert [c[0] for c in encoder.calls] == ["encode"]
    assert sorted(encoder.calls[0][2]) == ["a0", "a1", "b0", "b1", "b2"]


def test_instruction_goes_on_both_sides():
    encoder = TableEncoder(TABLE)
    _task(instruction="Retrieve semantically similar text.").evaluate(encoder)
    assert encoder.calls and all(kind == "queries" for kind, _, _ in encoder.calls)
    seen = {text for _, _, texts in encoder.calls for text in texts}
    assert seen == set(TABLE)
    assert {inst for _, inst, _ in encoder.calls} == {"Retrieve semantically similar text."}


def test_encoder_without_plain_encode_falls_back_to_corpus():
    class NoPlain(TableEncoder):
        encode = None  # type: ignore[assignment]

    encoder = NoPlain(TABLE)
    _task().evaluate(encoder)
    assert [c[0] for c in encoder.calls] == ["corpus"]


def test_from_path_reads_jsonl(tmp_path):
    rows = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": g, "extra": 1} for i, g in enumerate(GOLD)]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(tmp_path, name="Toy")
    assert isinstance(task, STSTask)
    assert task.scores == GOLD
    assert task.evaluate(TableEncoder(TABLE)).main_score == pytest.approx(0.8)


def test_known_table_points_at_shared_copies():
    for name in ("STSBenchmark", "SICK-R", "STS12", "STS16"):
        assert TASKS[name].task_type == "STS" and TASKS[name].path.startswith("sts/")


@pytest.mark.skipif(not (SHARED / "sts/sickr/test.jsonl").is_file(), reason="shared data absent")
def test_shared_sts_files_have_mteb_sizes():
    sick = STSTask.from_path(SHARED / "sts/sickr", name="SICK-R")
    stsb = STSTask.from_path(SHARED / "sts/stsbenchmark", name="STSBenchmark")
    assert len(sick.scores) == 9927  # all of SICK, as MTEB uses it
    assert len(stsb.scores) == 1379
