"""What every task type declares through the ``Task`` protocol, checked against what it does: the texts it
says it embeds are exactly the encoder calls ``evaluate`` makes; its per-item values rebuild its main score;
``shrink`` keeps the same items of every field and renames the task."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import average_precision_score

from lmembed.evaluation.base import ShrinkLimits, Task
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.tasks import (
    ClassificationTask,
    ClusteringTask,
    PairClassificationTask,
    RerankingTask,
    RetrievalTask,
    STSTask,
    SummarizationTask,
)
from lmembed.evaluation.tasks.clustering import ClusterSet
from lmembed.evaluation.tasks.reranking import RerankSample
from lmembed.evaluation.tasks.summarization import SummarizationSample

WORDS = [f"w{i}" for i in range(60)]


class RandomEncoder:
    """A fixed random vector per text; records (texts, method, instruction) per call."""

    def __init__(self, plain: bool = True) -> None:
        self.rng = np.random.default_rng(0)
        self.table: dict[str, np.ndarray] = {}
        self.calls: list[tuple[list[str], str, str | None]] = []
        if not plain:
            self.encode = None  # type: ignore[assignment]

    def _rows(self, texts, method: str, instruction: str | None) -> np.ndarray:
        self.calls.append((list(texts), method, instruction))
        for text in texts:
            self.table.setdefault(text, self.rng.normal(size=8).astype(np.float32))
        return np.stack([self.table[t] for t in texts])

    def encode(self, texts, batch_size=32):
        return self._rows(texts, "encode", None)

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        return self._rows(texts, "encode_queries", instruction)

    def encode_corpus(self, texts, *, batch_size=32):
        return self._rows(texts, "encode_corpus", None)


def _method(role: str, instruction: str | None, plain: bool) -> str:
    """The encoder method a declared role means (symmetric texts: tasks/_common.py's convention)."""
    if role == "query" or (role == "text" and instruction):
        return "encode_queries"
    return "encode" if role == "text" and plain else "encode_corpus"


def _sentences(rng: np.random.Generator, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)]


def _tasks() -> dict[str, Task]:
    rng = np.random.default_rng(3)
    first, second = _sentences(rng, 30), _sentences(rng, 30)
    second[4] = first[2]  # a text on both sides is embedded once
    docs, queries = _sentences(rng, 25), _sentences(rng, 6)
    qrels = {f"q{i}": {f"d{(4 * i) % 25}": 1, f"d{(4 * i + 9) % 25}": 2} for i in range(6)}
    retrieval = RetrievalData(
        "R", "test", [f"d{i}" for i in range(25)], docs, [f"q{i}" for i in range(6)], queries, qrels
    )
    summaries = [
        SummarizationSample("t", _sentences(rng, 2), _sentences(rng, 5), [float(x) for x in rng.integers(1, 6, 5)])
        for _ in range(8)
    ]
    rerank = [RerankSample(q, _sentences(rng, 2), _sentences(rng, 3)) for q in _sentences(rng, 5)]
    rerank.append(RerankSample(_sentences(rng, 2), _sentences(rng, 1), _sentences(rng, 2)))
    labels = [int(x) for x in rng.integers(0, 3, 40)]
    return {
        "retrieval": RetrievalTask(retrieval),
        "sts": STSTask("S", first, second, [float(x) for x in rng.uniform(0, 5, 30)]),
        "pairs": PairClassificationTask("P", first, second, [int(x) for x in rng.integers(0, 2, 30)]),
        "classification": ClassificationTask(
            "C", _sentences(rng, 40), labels, _sentences(rng, 12), [int(x) for x in rng.integers(0, 3, 12)]
        ),
        "clustering": ClusteringTask(
            "K", [ClusterSet(_sentences(rng, 12), [int(x) for x in rng.integers(0, 3, 12)]) for _ in range(3)]
        ),
        "bootstrap": ClusteringTask(
            "B",
            [ClusterSet(_sentences(rng, 20), [int(x) for x in rng.integers(0, 3, 20)]) for _ in range(2)],
            protocol="bootstrap",
            max_documents=30,
            bootstrap_size=16,
            bootstrap_runs=3,
        ),
        "summarization": SummarizationTask("Z", summaries),
        "reranking": RerankingTask("RR", rerank),
    }


@pytest.mark.parametrize("kind", list(_tasks()))
@pytest.mark.parametrize("instruction", [None, "Represent it"])
@pytest.mark.parametrize("plain", [True, False])
def test_declared_texts_are_the_calls_evaluate_makes(kind: str, instruction: str | None, plain: bool):
    task = _tasks()[kind].with_instruction(instruction)
    encoder = RandomEncoder(plain)
    task.evaluate(encoder)
    declared = [(c.texts, _method(c.role, c.instruction, plain), c.instruction) for c in task.embedded_texts()]
    assert declared == encoder.calls and declared


def test_items_rebuild_the_main_scores():
    tasks, encoder = _tasks(), RandomEncoder()
    results = {kind: task.evaluate(encoder) for kind, task in tasks.items()}
    sts = results["sts"].items
    assert sts.statistic == "spearman" and sts.reference == tasks["sts"].scores and len(sts.ids) == 30
    assert spearmanr(sts.values, sts.reference)[0] == pytest.approx(results["sts"].scores["cosine_spearman"])
    pairs = results["pairs"].items
    assert pairs.statistic == "ap" and pairs.reference == [float(x) for x in tasks["pairs"].labels]
    assert average_precision_score(pairs.reference, pairs.values) == pytest.approx(results["pairs"].scores["cosine_ap"])
    for kind, metric in (("clustering", "v_measure"), ("bootstrap", "v_measure"), ("summarization", "cosine_spearman")):
        items = results[kind].items
        assert items.statistic == "mean" and np.mean(items.values) == pytest.approx(results[kind].scores[metric]), kind
    assert len(results["bootstrap"].items.values) == 3 and len(results["clustering"].items.values) == 3
    retrieval = results["retrieval"].items
    assert retrieval.ids == sorted(tasks["retrieval"].data.query_ids)
    assert np.mean(retrieval.values) == pytest.approx(results["retrieval"].scores["ndcg_at_10"], abs=1e-5)
    assert results["classification"].items is None and results["reranking"].items is None


def test_shrink_keeps_the_same_items_of_every_field():
    tasks = _tasks()
    limits = ShrinkLimits(max_items=7, max_docs=12, max_queries=4, seed=5)
    sts = tasks["sts"].shrink(limits)
    assert sts.name == "S[7 items]" and len(sts.sentence1) == len(sts.sentence2) == len(sts.scores) == 7
    original = tasks["sts"]
    picked = [original.sentence1.index(s) for s in sts.sentence1]
    assert [original.scores[i] for i in picked] == sts.scores
    assert tasks["sts"].shrink(ShrinkLimits(max_items=7, seed=5)) == sts  # seeded: the same items every time
    assert tasks["classification"].shrink(limits).test_texts != tasks["classification"].test_texts
    assert len(tasks["classification"].shrink(limits).train_texts) == 40  # the probe's train split is kept
    assert [len(s.sentences) for s in tasks["clustering"].shrink(limits).sets] == [7, 7, 7]
    assert tasks["clustering"].shrink(limits).name == "K[7 per set]"
    retrieval = tasks["retrieval"].shrink(limits)
    assert retrieval.name == "R[12 docs, 4 queries]" and len(retrieval.data.corpus_ids) == 12
    for kind, task in tasks.items():
        assert task.shrink(ShrinkLimits()) is task, kind  # no limit: the task itself
