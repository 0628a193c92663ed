"""The mteb adapter: mteb 2.x scores an lmembed encoder exactly as lmembed's own tasks do.

Small local mteb tasks are defined here with mteb's own abstract classes and inline data (no
downloads); one ``mteb.evaluate`` run scores them all, and each is compared with the lmembed task
built from the same data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

mteb = pytest.importorskip("mteb")

from datasets import Dataset, DatasetDict  # noqa: E402
from mteb.abstasks.classification import AbsTaskClassification  # noqa: E402
from mteb.abstasks.clustering import AbsTaskClustering  # noqa: E402
from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy  # noqa: E402
from mteb.abstasks.pair_classification import AbsTaskPairClassification  # noqa: E402
from mteb.abstasks.retrieval import AbsTaskRetrieval  # noqa: E402
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData  # noqa: E402
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402
from mteb.abstasks.text.summarization import AbsTaskSummarization  # noqa: E402
from mteb.types import PromptType  # noqa: E402

from lmembed.evaluation.mteb_adapter import MTEBEncoder, evaluate_with_mteb  # noqa: E402
from lmembed.evaluation.tasks import (  # noqa: E402
    ClassificationTask,
    ClusteringTask,
    PairClassificationTask,
    RerankingTask,
    RetrievalTask,
    STSTask,
    SummarizationTask,
)
from lmembed.evaluation.tasks.clustering import ClusterSet  # noqa: E402
from lmembed.evaluation.tasks.reranking import RerankSample  # noqa: E402
from lmembed.evaluation.tasks.summarization import SummarizationSample  # noqa: E402

TOL = 1e-6
RANKING_TOL = 1e-5  # mteb rounds retrieval-style metrics to 5 decimals


class HashEncoder:
    """Hashed bag of words in float32; a query instruction is hashed in as extra words."""

    def __init__(self, dim: int = 48) -> None:
        self.dim = dim
        self.log: list[tuple[str, str | None]] = []

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            h = int(hashlib.md5(word.encode()).hexdigest(), 16)
            v[h % self.dim] += 1.0 + (h >> 12) % 3
        # a small text-specific jitter, so that no two different texts tie exactly
        seed = int(hashlib.md5(text.encode()).hexdigest()[:8], 16)
        return v + np.random.default_rng(seed).uniform(0.0, 0.05, size=self.dim).astype(np.float32)

    def encode(self, texts, *, batch_size=32):
        self.log.append(("encode", None))
        return np.stack([self._vec(t) for t in texts])

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        self.log.append(("queries", instruction))
        prefix = f"{instruction} " if instruction else ""
        return np.stack([self._vec(prefix + t) for t in texts])

    def encode_corpus(self, texts, *, batch_size=32):
        self.log.append(("corpus", None))
        return np.stack([self._vec(t) for t in texts])


WORDS = [
    "apple",
    "banana",
    "cherry",
    "delta",
    "echo",
    "fox",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
]


def _sentence(seed: int, n: int = 6) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=n))


# ----------------------------------------------------------------- data

STS_S1 = [_sentence(i) for i in range(30)]
STS_S2 = [_sentence(i + 100) if i % 3 else STS_S1[i] + " kilo" for i in range(30)]
STS_GOLD = [float(np.random.default_rng(i).uniform(0, 5)) for i in range(30)]

CLS_TOPICS = [["apple", "banana", "cherry"], ["delta", "echo", "fox"], ["golf", "hotel", "india"]]


def _topic_text(label: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join([*rng.choice(CLS_TOPICS[label], size=3), *rng.choice(WORDS, size=2)])


CLS_TRAIN = [(_topic_text(i % 3, i), i % 3) for i in range(45)]
CLS_TEST = [(_topic_text(i % 3, 1000 + i), i % 3) for i in range(21)]

PAIR_S1 = [_sentence(200 + i) for i in range(24)]
PAIR_S2 = [PAIR_S1[i] + " mike" if i % 2 else _sentence(300 + i) for i in range(24)]
PAIR_LABELS = [i % 2 for i in range(24)]

CLUSTER_SETS = [
    {
        "sentences": [_topic_text(i % 3, 500 + i) for i in range(18)],
        "labels": [i % 3 for i in range(18)],
    },
    {
        "sentences": [_topic_text(i % 2, 600 + i) for i in range(12)],
        "labels": [i % 2 for i in range(12)],
    },
]

# the bootstrap protocol's data: one pool; the topic-1 texts carry a second level (hierarchical labels)
FAST_SENTENCES = [_topic_text(i % 3, 700 + i) for i in range(40)]
FAST_LABELS = [[i % 3, i % 2] if i % 3 == 1 else [i % 3] for i in range(40)]

SUMM_ROWS = [
    {
        "text": f"text {k}",
        "human_summaries": [_sentence(700 + 10 * k + j) for j in range(2)],
        "machine_summaries": [_sentence(800 + 10 * k + j) for j in range(5)],
        "relevance": [float(x) for x in np.random.default_rng(k).integers(1, 6, size=5)],
    }
    for k in range(6)
]

RERANK_ROWS = [
    {
        "query": _sentence(900 + k, 4),
        "positive": [_sentence(950 + 10 * k + j) for j in range(2)],
        "negative": [_sentence(1000 + 10 * k + j) for j in range(6)],
    }
    for k in range(6)
]

GENERAL: dict[str, Any] = {
    "description": "A tiny inline task for lmembed's adapter tests.",
    "reference": "https://github.com/embeddings-benchmark/mteb",
    "dataset": {"path": "NA", "revision": "NA"},
    "category": "t2t",
    "eval_splits": ["test"],
    "eval_langs": ["eng-Latn"],
    "date": ("2022-12-22", "2022-12-22"),
    "dialect": ["Written"],
    "domains": [],
    "task_subtypes": [],
    "license": "cc-by-4.0",
    "annotations_creators": "derived",
    "modalities": ["text"],
    "sample_creation": "found",
    "bibtex_citation": "",
}


def _test_split(columns: dict[str, list]) -> DatasetDict:
    return DatasetDict({"test": Dataset.from_dict(columns)})


class TinySTS(AbsTaskSTS):
    metadata = TaskMetadata(type="STS", name="TinySTS", main_score="cosine_spearman", **GENERAL)
    min_score, max_score = 0, 5

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = _test_split({"sentence1": STS_S1, "sentence2": STS_S2, "score": STS_GOLD})
        self.data_loaded = True


class TinyClassification(AbsTaskClassification):
    metadata = TaskMetadata(type="Classification", name="TinyClassification", main_score="accuracy", **GENERAL)
    samples_per_label = 4
    n_experiments = 3

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = DatasetDict(
            {
                "train": Dataset.from_dict({"text": [t for t, _ in CLS_TRAIN], "label": [y for _, y in CLS_TRAIN]}),
                "test": Dataset.from_dict({"text": [t for t, _ in CLS_TEST], "label": [y for _, y in CLS_TEST]}),
            }
        )
        self.data_loaded = True


class TinyPairs(AbsTaskPairClassification):
    metadata = TaskMetadata(type="PairClassification", name="TinyPairs", main_score="max_ap", **GENERAL)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = _test_split({"sentence1": PAIR_S1, "sentence2": PAIR_S2, "labels": PAIR_LABELS})
        self.data_loaded = True


class TinyClustering(AbsTaskClusteringLegacy):
    metadata = TaskMetadata(type="Clustering", name="TinyClustering", main_score="v_measure", **GENERAL)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = DatasetDict({"test": Dataset.from_list(CLUSTER_SETS)})
        self.data_loaded = True


class TinyClusteringFast(AbsTaskClustering):
    """mteb 2.x's bootstrapped clustering, at a size that runs in a moment."""

    metadata = TaskMetadata(type="Clustering", name="TinyClusteringFast", main_score="v_measure", **GENERAL)
    max_fraction_of_documents_to_embed = None
    max_document_to_embed = 30
    max_documents_per_cluster = 50
    n_clusters = 4

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = _test_split({"sentences": FAST_SENTENCES, "labels": FAST_LABELS})
        self.data_loaded = True


class TinySummarization(AbsTaskSummarization):
    metadata = TaskMetadata(type="Summarization", name="TinySumm", main_score="cosine_spearman", **GENERAL)
    min_score, max_score = 0, 5

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = DatasetDict({"test": Dataset.from_list(SUMM_ROWS)})
        self.data_loaded = True


class TinyReranking(AbsTaskRetrieval):
    """mteb 2.x runs reranking as retrieval restricted to each query's candidates."""

    metadata = TaskMetadata(type="Reranking", name="TinyReranking", main_score="map_at_1000", **GENERAL)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        corpus, queries, qrels, top = [], [], {}, {}
        for k, row in enumerate(RERANK_ROWS):
            qid = f"q{k}"
            queries.append({"id": qid, "text": row["query"]})
            docs = [(f"{qid}-p{j}", d, 1) for j, d in enumerate(row["positive"])]
            docs += [(f"{qid}-n{j}", d, 0) for j, d in enumerate(row["negative"])]
            corpus += [{"id": did, "text": text, "title": ""} for did, text, _ in docs]
            qrels[qid] = {did: rel for did, _, rel in docs}
            top[qid] = [did for did, _, _ in docs]
        split = RetrievalSplitData(
            corpus=Dataset.from_list(corpus), queries=Dataset.from_list(queries), relevant_docs=qrels, top_ranked=top
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


class TinyRetrieval(AbsTaskRetrieval):
    metadata = TaskMetadata(type="Retrieval", name="TinyRetrieval", main_score="ndcg_at_10", **GENERAL)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        corpus, queries, qrels = _retrieval_rows()
        split = RetrievalSplitData(
            corpus=Dataset.from_list([{"id": d["_id"], "text": d["text"], "title": d["title"]} for d in corpus]),
            queries=Dataset.from_list([{"id": q["_id"], "text": q["text"]} for q in queries]),
            relevant_docs=qrels,
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


def _retrieval_rows() -> tuple[list[dict], list[dict], dict[str, dict[str, int]]]:
    corpus = [{"_id": f"d{i}", "title": _sentence(1100 + i, 2), "text": _sentence(1200 + i)} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": _sentence(1200 + 3 * i, 4)} for i in range(8)]
    qrels = {f"q{i}": {f"d{3 * i}": 1, f"d{(3 * i + 7) % 40}": 2} for i in range(8)}
    return corpus, queries, qrels


# --------------------------------------------------------------- running


@pytest.fixture(scope="module")
def mteb_scores() -> dict[str, dict[str, float]]:
    tasks = [
        TinySTS(),
        TinyClassification(),
        TinyPairs(),
        TinyClustering(),
        TinyClusteringFast(),
        TinySummarization(),
        TinyReranking(),
    ]
    result = evaluate_with_mteb(HashEncoder(), tasks, batch_size=16)
    return {r.task_name: r.scores["test"][0] for r in result.task_results}


def _close(mteb_value: float, ours: float, tol: float = TOL) -> None:
    assert abs(float(mteb_value) - float(ours)) <= tol, (mteb_value, ours)


def test_sts_matches(mteb_scores):
    ours = STSTask("TinySTS", STS_S1, STS_S2, STS_GOLD).evaluate(HashEncoder()).scores
    theirs = mteb_scores["TinySTS"]
    for key in ("main_score", "cosine_spearman", "cosine_pearson", "manhattan_spearman", "euclidean_pearson"):
        _close(theirs[key], ours[key])


def test_classification_matches(mteb_scores):
    task = ClassificationTask(
        "TinyClassification",
        [t for t, _ in CLS_TRAIN],
        [y for _, y in CLS_TRAIN],
        [t for t, _ in CLS_TEST],
        [y for _, y in CLS_TEST],
        samples_per_label=4,
        n_experiments=3,
    )
    ours = task.evaluate(HashEncoder()).scores
    theirs = mteb_scores["TinyClassification"]
    for key in ("main_score", "accuracy", "f1", "f1_weighted", "precision", "recall"):
        _close(theirs[key], ours[key])


def test_pair_classification_matches(mteb_scores):
    ours = PairClassificationTask("TinyPairs", PAIR_S1, PAIR_S2, PAIR_LABELS).evaluate(HashEncoder()).scores
    theirs = mteb_scores["TinyPairs"]
    for key in ("main_score", "max_ap", "cosine_ap", "cosine_f1", "cosine_accuracy", "dot_ap", "manhattan_f1"):
        _close(theirs[key], ours[key])


def test_clustering_matches(mteb_scores, tmp_path: Path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CLUSTER_SETS))
    ours = ClusteringTask.from_path(path, name="TinyClustering").evaluate(HashEncoder()).scores
    _close(mteb_scores["TinyClustering"]["v_measure"], ours["v_measure"])
    _close(mteb_scores["TinyClustering"]["main_score"], ours["main_score"])


def test_bootstrap_clustering_matches_mteb_run_by_run(mteb_scores):
    task = ClusteringTask(
        "TinyClusteringFast",
        [ClusterSet(FAST_SENTENCES, FAST_LABELS)],
        protocol="bootstrap",
        max_documents=30,
        bootstrap_size=50,
        bootstrap_runs=4,
    )
    result = task.evaluate(HashEncoder())
    theirs = mteb_scores["TinyClusteringFast"]
    _close(theirs["v_measure"], result.scores["v_measure"])
    by_level = result.extra["v_measures_by_level"]
    assert sorted(by_level) == sorted(theirs["v_measures"]) == ["Level 0", "Level 1"]
    for level, runs in theirs["v_measures"].items():
        assert len(by_level[level]) == 4
        for mine, their in zip(by_level[level], runs, strict=True):
            _close(their, mine)


def test_summarization_matches(mteb_scores):
    task = SummarizationTask(
        "TinySumm",
        [
            SummarizationSample(r["text"], r["human_summaries"], r["machine_summaries"], r["relevance"])
            for r in SUMM_ROWS
        ],
    )
    ours = task.evaluate(HashEncoder()).scores
    for key in ("main_score", "cosine_spearman", "cosine_pearson", "dot_spearman"):
        _close(mteb_scores["TinySumm"][key], ours[key])


def test_reranking_matches_mteb2_retrieval_style(mteb_scores):
    task = RerankingTask("TinyReranking", [RerankSample(r["query"], r["positive"], r["negative"]) for r in RERANK_ROWS])
    ours = task.evaluate(HashEncoder()).scores
    theirs = mteb_scores["TinyReranking"]
    _close(theirs["map_at_1000"], ours["map_at_1000"], RANKING_TOL)
    _close(theirs["mrr_at_10"], ours["mrr_at_10"], RANKING_TOL)


def test_retrieval_matches_lmembed_retrieval_task(tmp_path: Path):
    corpus, queries, qrels = _retrieval_rows()
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (tmp_path / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, docs in qrels.items() for d, s in docs.items()]
    (tmp_path / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    ours = RetrievalTask.from_path(tmp_path, name="TinyRetrieval").evaluate(HashEncoder()).scores
    theirs = evaluate_with_mteb(HashEncoder(), [TinyRetrieval()]).task_results[0].scores["test"][0]
    for key in ("ndcg_at_10", "map_at_10", "recall_at_10", "mrr_at_10"):
        _close(theirs[key], ours[key], RANKING_TOL)


# --------------------------------------------------------- routing rules


def _loader(texts: list[str]) -> list[dict[str, list[str]]]:
    return [{"text": texts[:2]}, {"text": texts[2:]}]


def test_prompt_types_route_to_the_right_methods():
    encoder = HashEncoder()
    model = MTEBEncoder(encoder, instructions="nv-embed", model_name="lmembed/test")
    meta = TinyReranking.metadata.model_copy(update={"name": "SciFact"})
    texts = ["a b", "c d", "e f"]
    q = model.encode(
        _loader(texts), task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=PromptType.query
    )
    d = model.encode(
        _loader(texts), task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=PromptType.document
    )
    assert q.shape == d.shape == (3, encoder.dim) and q.dtype == np.float32
    assert encoder.log == [
        ("queries", "Given a scientific claim, retrieve documents that support or refute the claim"),
        ("corpus", None),
    ]


def test_symmetric_tasks_get_the_instruction_on_every_text_or_none():
    encoder = HashEncoder()
    meta = TinySTS.metadata.model_copy(update={"name": "STSBenchmark"})
    MTEBEncoder(encoder, instructions="nv-embed").encode(
        _loader(["x", "y", "z"]), task_metadata=meta, hf_split="test", hf_subset="default"
    )
    MTEBEncoder(encoder).encode(_loader(["x", "y", "z"]), task_metadata=meta, hf_split="test", hf_subset="default")
    assert encoder.log == [("queries", "Retrieve semantically similar text."), ("encode", None)]


def test_task_metadata_prompt_fallback():
    encoder = HashEncoder()
    meta = TinySTS.metadata.model_copy(update={"prompt": "Find similar sentences"})
    MTEBEncoder(encoder, use_task_prompts=True).encode(
        _loader(["x"]), task_metadata=meta, hf_split="test", hf_subset="default"
    )
    assert encoder.log == [("queries", "Find similar sentences")]


def test_adapter_satisfies_mteb_encoder_protocol():
    from mteb.models.models_protocols import EncoderProtocol

    model = MTEBEncoder(HashEncoder(), model_name="lmembed/test", revision="abc")
    assert isinstance(model, EncoderProtocol)
    assert model.mteb_model_meta.name == "lmembed/test"
    assert model.mteb_model_meta.revision == "abc"
