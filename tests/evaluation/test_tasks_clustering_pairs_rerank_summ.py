"""Clustering, pair classification, reranking and summarization on hand cases; type detection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lmembed.evaluation.tasks import (
    ClusteringTask,
    PairClassificationTask,
    RerankingTask,
    RetrievalTask,
    SummarizationTask,
    TaskDataError,
    canonical_task_type,
    detect_task_type,
    load_task,
)
from lmembed.evaluation.tasks.clustering import ClusterSet
from lmembed.evaluation.tasks.pair_classification import best_accuracy, best_f1, pair_classification_scores
from lmembed.evaluation.tasks.reranking import RerankSample, mrr_at_k, rerank_metrics
from lmembed.evaluation.tasks.summarization import summarization_scores


class TableEncoder:
    """Fixed vectors per text; records (method, instruction, texts) per call."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = {k: np.asarray(v, dtype=np.float32) for k, v in table.items()}
        self.calls: list[tuple[str, str | None, list[str]]] = []

    def _rows(self, texts):
        return np.stack([self.table[t] for t in texts])

    def encode(self, texts, *, batch_size=32):
        self.calls.append(("encode", None, list(texts)))
        return self._rows(texts)

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        self.calls.append(("queries", instruction, list(texts)))
        return self._rows(texts)

    def encode_corpus(self, texts, *, batch_size=32):
        self.calls.append(("corpus", None, list(texts)))
        return self._rows(texts)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _angle(deg: float) -> list[float]:
    return [float(np.cos(np.deg2rad(deg))), float(np.sin(np.deg2rad(deg)))]


# ---------------------------------------------------------------- clustering


def _blob_table(n_clusters: int, per_cluster: int) -> tuple[dict[str, list[float]], list[str], list[str]]:
    rng = np.random.default_rng(0)
    table, sentences, labels = {}, [], []
    for k in range(n_clusters):
        centre = np.zeros(8)
        centre[k] = 10.0
        for i in range(per_cluster):
            text = f"topic{k} doc{i}"
            table[text] = (centre + rng.normal(scale=0.1, size=8)).tolist()
            sentences.append(text)
            labels.append(f"label{k}")
    return table, sentences, labels


def test_clustering_separable_blobs_give_v_measure_one(tmp_path):
    table, sentences, labels = _blob_table(4, 12)
    rows = [
        {"sentences": sentences, "labels": labels},
        {"sentences": sentences[:24], "labels": labels[:24]},  # a sub-set with 2 clusters
        {"sentences": sentences[:5], "labels": labels[:5]},  # one label only
    ]
    task = load_task(_write_jsonl(tmp_path / "test.jsonl", rows), name="Blobs")
    assert isinstance(task, ClusteringTask)
    assert len(task.sets) == 3
    encoder = TableEncoder(table)
    result = task.evaluate(encoder)
    assert result.scores["v_measure"] == pytest.approx(1.0)
    assert result.extra["v_measures"] == pytest.approx([1.0, 1.0, 1.0])
    assert result.main_metric == "v_measure" and result.main_score == pytest.approx(1.0)
    assert [c[0] for c in encoder.calls] == ["encode"]
    assert len(encoder.calls[0][2]) == len(set(sentences))  # each distinct sentence once


def test_clustering_scores_below_one_when_embeddings_ignore_labels(tmp_path):
    table, sentences, labels = _blob_table(3, 10)
    shuffled = list(np.random.default_rng(1).permutation(labels))
    task = ClusteringTask.from_path(
        _write_jsonl(tmp_path / "c" / "test.jsonl", [{"sentences": sentences, "labels": shuffled}])
    )
    assert task.evaluate(TableEncoder(table)).main_score < 0.5


def test_bootstrap_clustering_pools_the_sets_and_scores_every_run(tmp_path):
    table, sentences, labels = _blob_table(3, 10)
    rows = [{"sentences": sentences[:15], "labels": labels[:15]}, {"sentences": sentences[15:], "labels": labels[15:]}]
    path = _write_jsonl(tmp_path / "b" / "test.jsonl", rows)
    task = ClusteringTask.from_path(path, protocol="bootstrap", bootstrap_runs=3, bootstrap_size=40, max_documents=24)
    assert len(task.texts()) == 24 and set(task.texts()) <= set(sentences)
    result = task.evaluate(TableEncoder(table))
    assert result.extra["v_measures"] == pytest.approx([1.0, 1.0, 1.0])  # separable blobs, every run
    assert result.extra["protocol"] == "bootstrap" and result.main_score == pytest.approx(1.0)
    # labels that ignore the embeddings: far below one
    shuffled = [str(x) for x in np.random.default_rng(1).permutation(labels)]
    noise = ClusteringTask.from_path(
        _write_jsonl(tmp_path / "s" / "test.jsonl", [{"sentences": sentences, "labels": shuffled}]),
        protocol="bootstrap",
        bootstrap_runs=3,
        bootstrap_size=40,
    )
    assert noise.evaluate(TableEncoder(table)).main_score < 0.5


def test_bootstrap_kmeans_seed_changes_only_the_clustering(tmp_path):
    rng = np.random.default_rng(5)
    embeddings = rng.normal(size=(60, 6))  # no structure: k-means' start decides
    labels = [i % 4 for i in range(60)]
    task = ClusteringTask(
        "noise",
        [ClusterSet([f"t{i}" for i in range(60)], labels)],
        protocol="bootstrap",
        bootstrap_runs=4,
        bootstrap_size=60,
    )
    base = task.cluster_scores(embeddings)["v_measures"]
    assert task.cluster_scores(embeddings)["v_measures"] == base  # deterministic
    assert task.cluster_scores(embeddings, kmeans_seed=7)["v_measures"] != base


def test_clustering_settings_are_checked():
    sets = [ClusterSet(["a", "b"], [0, 1])]
    with pytest.raises(TaskDataError, match="protocol='fast' is unknown"):
        ClusteringTask("x", sets, protocol="fast")
    with pytest.raises(TaskDataError, match="max_documents or max_fraction"):
        ClusteringTask("x", sets, protocol="bootstrap", max_documents=1, max_fraction=0.5)


def test_clustering_rejects_mismatched_rows(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"sentences": ["a", "b"], "labels": [1]}])
    with pytest.raises(TaskDataError):
        ClusteringTask.from_path(path)


# ----------------------------------------------------- pair classification


def test_best_thresholds_hand_case():
    scores = [0.9, 0.8, 0.7, 0.6, 0.5]
    labels = [1, 0, 1, 0, 0]
    # thresholds between neighbours: acc after 1 row = (1+3)/5, after 3 rows = (2+2)/5 ...
    accuracy, threshold = best_accuracy(scores, labels, True)
    assert accuracy == pytest.approx(0.8) and threshold == pytest.approx(0.85)
    f1, precision, recall, _ = best_f1(scores, labels, True)
    # top-1: P=1, R=.5 -> .667; top-3: P=2/3, R=1 -> .8
    assert f1 == pytest.approx(0.8) and precision == pytest.approx(2 / 3) and recall == 1.0


def test_thresholds_never_split_ties():
    accuracy, _ = best_accuracy([0.5, 0.5, 0.1], [1, 0, 0], True)
    assert accuracy == pytest.approx(2 / 3)  # the only usable cut is after both tied rows


def test_pair_classification_ap_hand_case(tmp_path):
    # cosines of the pairs: 1.0 (label 1), 0.5 (label 0), 0.0 (label 1), -1 (label 0)
    table = {"q": _angle(0), "p0": _angle(0), "p1": _angle(60), "p2": _angle(90), "p3": _angle(180)}
    rows = {"sentence1": ["q"] * 4, "sentence2": ["p0", "p1", "p2", "p3"], "labels": [1, 0, 1, 0]}
    task = load_task(_write_jsonl(tmp_path / "test.jsonl", [rows]))
    assert isinstance(task, PairClassificationTask)
    result = task.evaluate(TableEncoder(table))
    # ranking 1,0,1,0 -> AP = (1/1 + 2/3) / 2
    assert result.scores["cosine_ap"] == pytest.approx((1 + 2 / 3) / 2)
    assert result.scores["max_ap"] == pytest.approx(max(v for k, v in result.scores.items() if k.endswith("_ap")))
    assert result.main_score == result.scores["max_ap"]
    assert result.main_metric == "max_ap"
    for key in ("cosine_accuracy", "cosine_f1", "dot_ap", "manhattan_ap", "euclidean_ap", "similarity_ap", "max_f1"):
        assert key in result.scores


def test_pair_layouts_are_equivalent(tmp_path):
    pairs = [("a", "b", 1), ("c", "d", 0), ("e", "f", 1)]
    lists = {"sentence1": [p[0] for p in pairs], "sentence2": [p[1] for p in pairs], "labels": [p[2] for p in pairs]}
    one_per_row = [{"sentence1": a, "sentence2": b, "label": y} for a, b, y in pairs]
    first = PairClassificationTask.from_path(_write_jsonl(tmp_path / "a.jsonl", [lists]))
    second = PairClassificationTask.from_path(_write_jsonl(tmp_path / "b.jsonl", one_per_row))
    assert (first.sentence1, first.sentence2, first.labels) == (second.sentence1, second.sentence2, second.labels)


def test_pair_scores_distances_are_lower_is_closer():
    e1 = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    e2 = np.array([[1.0, 0.1], [0.0, 1.0]], dtype=np.float32)
    scores = pair_classification_scores(e1, e2, [1, 0])
    assert scores["euclidean_ap"] == 1.0 and scores["manhattan_ap"] == 1.0 and scores["cosine_ap"] == 1.0


# -------------------------------------------------------------- reranking


def test_rerank_mrr_breaks_ties_as_mteb_does():
    """mteb 2 ranks tied candidates by document id, descending (``negative_…`` before ``apositive_…``); lmembed
    put the tied positive first, +0.09 to +0.28 MRR@10 on rows with one such tie. Compared with mteb's own MRR."""
    metrics = pytest.importorskip("mteb._evaluators.retrieval_metrics")
    rows = [
        ([True, False, False], [0.5, 0.5, 0.2]),  # a positive tied with a negative
        ([True, True, False, False], [0.1, 0.7, 0.7, 0.7]),  # a positive tied with two negatives
        ([True, True, False], [0.5, 0.5, 0.1]),  # two tied positives
        ([False, True, False], [0.3, 0.9, 0.1]),  # no tie
    ]
    for relevant, scores in rows:
        ordered = [s for s, r in zip(scores, relevant, strict=True) if r]
        positives = len(ordered)
        ordered += [s for s, r in zip(scores, relevant, strict=True) if not r]
        ids = [f"apositive_q_{i:05}" for i in range(positives)]  # as mteb's reranking task names them
        ids += [f"negative_q_{i:05}" for i in range(len(ordered) - positives)]
        qrels = {"q": dict.fromkeys(ids[:positives], 1)}
        run = {"q": dict(zip(ids, ordered, strict=True))}
        want = metrics.mrr(qrels, run, [10])["MRR@10"][0]  # mteb's own
        relevant_sorted = [True] * sum(relevant) + [False] * (len(relevant) - sum(relevant))
        assert mrr_at_k(relevant_sorted, np.array(ordered)) == pytest.approx(want), (relevant, scores)
    assert mrr_at_k([True, False, False], np.array([0.5, 0.5, 0.2])) == 0.5


def test_rerank_metrics_hand_case():
    relevant = [True, False, True, False]
    scores = np.array([0.2, 0.9, 0.8, 0.1])
    # ranking: neg, pos, pos, neg -> AP = (1/2 + 2/3) / 2, MRR = 1/2
    metrics = rerank_metrics(relevant, scores)
    assert metrics["ap"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert metrics["mrr"] == pytest.approx(0.5)
    assert mrr_at_k([False] * 10 + [True], np.linspace(1, 0, 11), k=10) == 0.0


def test_reranking_task_end_to_end(tmp_path):
    table = {"q1": _angle(0), "q2": _angle(90), **{f"d{a}": _angle(a) for a in (0, 30, 60, 90, 120)}}
    rows = [
        {"query": "q1", "positive": ["d30"], "negative": ["d0", "d90"]},  # d0 beats d30: AP .5, MRR .5
        {"query": "q2", "positive": ["d90", "d60"], "negative": ["d0"]},  # both on top: AP 1, MRR 1
        {"query": "q1", "positive": ["d0"], "negative": []},  # skipped, as in MTEB
    ]
    task = load_task(_write_jsonl(tmp_path / "rr" / "test.jsonl", rows), name="Toy")
    assert isinstance(task, RerankingTask)
    encoder = TableEncoder(table)
    result = task.__class__(task.name, task.samples, instruction="Find it").evaluate(encoder)
    assert result.scores["map"] == pytest.approx(0.75)
    assert result.scores["mrr"] == pytest.approx(0.75)
    assert result.scores["map_at_1000"] == result.scores["map"]
    assert result.scores["mrr_at_10"] == result.scores["mrr"]
    assert result.main_score == pytest.approx(0.75) and result.extra["skipped"] == 1
    kinds = {(kind, inst) for kind, inst, _ in encoder.calls}
    assert kinds == {("queries", "Find it"), ("corpus", None)}  # instruction on queries only


def test_reranking_query_lists_take_best_subquery():
    table = {"qa": _angle(0), "qb": _angle(90), "pos": _angle(85), "neg": _angle(20)}
    task = RerankingTask("L", [RerankSample(["qa", "qb"], ["pos"], ["neg"])])
    assert task.evaluate(TableEncoder(table)).scores["map"] == 1.0


# ---------------------------------------------------------- summarization


def test_summarization_hand_case(tmp_path):
    # human summary at 0 degrees; machine summaries at 10/40/80 degrees -> cosines decrease
    table = {"h": _angle(0), "m10": _angle(10), "m40": _angle(40), "m80": _angle(80), "h2": _angle(180)}
    rows = [
        {
            "text": "t1",
            "human_summaries": ["h", "h2"],
            "machine_summaries": ["m10", "m40", "m80"],
            "relevance": [5, 3, 1],
        },
        {"text": "t2", "human_summaries": ["h"], "machine_summaries": ["m10", "m40", "m80"], "relevance": [1, 2, 3]},
        {"text": "t3", "human_summaries": ["h"], "machine_summaries": ["m10", "m40"], "relevance": [2, 2]},  # skipped
    ]
    task = load_task(_write_jsonl(tmp_path / "summ" / "test.jsonl", rows))
    assert isinstance(task, SummarizationTask)
    result = task.evaluate(TableEncoder(table))
    assert result.scores["cosine_spearman"] == pytest.approx(0.0)  # mean of +1 and -1
    assert result.main_score == result.scores["cosine_spearman"]
    assert result.scores["dot_spearman"] == pytest.approx(0.0)


def test_summarization_legacy_pvalue_bug():
    gold = [[0.0, 0.5, 1.0, 0.2]]
    cos = np.array([0.1, 0.5, 0.9, 0.3])
    fixed = summarization_scores([(gold[0], cos, cos)])
    legacy = summarization_scores([(gold[0], cos, cos)], legacy_pvalue_bug=True)
    assert fixed["cosine_spearman"] == pytest.approx(1.0)
    assert legacy["cosine_spearman"] == pytest.approx(0.5)  # (rho + p-value) / 2 with p = 0


# ------------------------------------------------------------- detection


def test_detect_task_type_from_files(tmp_path):
    cases = {
        "sts": [{"sentence1": "a", "sentence2": "b", "score": 3.0}],
        "pairs": [{"sentence1": ["a"], "sentence2": ["b"], "labels": [1]}],
        "clus": [{"sentences": ["a"], "labels": [0]}],
        "rr": [{"query": "q", "positive": ["a"], "negative": ["b"]}],
        "summ": [{"text": "t", "human_summaries": ["h"], "machine_summaries": ["m"], "relevance": [1]}],
    }
    expected = {
        "sts": "STS",
        "pairs": "PairClassification",
        "clus": "Clustering",
        "rr": "Reranking",
        "summ": "Summarization",
    }
    for folder, rows in cases.items():
        _write_jsonl(tmp_path / folder / "test.jsonl", rows)
        assert detect_task_type(tmp_path / folder) == expected[folder]
    cls = tmp_path / "cls"
    _write_jsonl(cls / "test.jsonl", [{"text": "a", "label": 0}])
    with pytest.raises(TaskDataError, match=r"train\.jsonl"):
        detect_task_type(cls)
    _write_jsonl(cls / "train.jsonl", [{"text": "a", "label": 0}])
    assert detect_task_type(cls) == "Classification"
    assert detect_task_type(cls / "test.jsonl") == "Classification"
    beir = tmp_path / "beir"
    _write_jsonl(beir / "corpus.jsonl", [{"_id": "d", "text": "x"}])
    _write_jsonl(beir / "queries.jsonl", [{"_id": "q", "text": "y"}])
    assert detect_task_type(beir) == "Retrieval"


def test_explicit_task_type_and_aliases(tmp_path):
    _write_jsonl(tmp_path / "dev.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 1.0}])
    task = load_task(tmp_path, task_type="sts", split="dev")
    assert task.split == "dev"
    assert canonical_task_type("pair-classification") == "PairClassification"
    with pytest.raises(KeyError):
        canonical_task_type("bitext")


def test_load_task_binds_a_retrieval_instruction_to_the_queries(tmp_path):
    _write_jsonl(tmp_path / "corpus.jsonl", [{"_id": "d1", "title": "", "text": "d1"}, {"_id": "d2", "text": "d2"}])
    _write_jsonl(tmp_path / "queries.jsonl", [{"_id": "q1", "text": "q1"}])
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    task = load_task(tmp_path, name="Tiny", instruction="Find it")
    assert isinstance(task, RetrievalTask) and task.instruction == "Find it"
    assert (task.name, task.task_type, task.split) == ("Tiny", "Retrieval", "test")
    encoder = TableEncoder({"q1": _angle(0), "d1": _angle(10), "d2": _angle(80)})
    result = task.evaluate(encoder, batch_size=4)
    assert result.main_score == pytest.approx(1.0)
    assert ("queries", "Find it", ["q1"]) in encoder.calls


@pytest.mark.parametrize(
    "labels",
    [
        [[0], [1], [-1], [2], [1], [0], [-1], [2]] * 4,  # an integer -1: mteb drops those documents
        [["a", "x"], ["b"], ["a", "y"], ["b", "z"], ["c"], ["a", "x"], ["c", "z"], ["b"]] * 4,  # uneven string paths
    ],
)
def test_bootstrap_levels_are_those_mteb_scores(labels):
    """mteb writes a missing level as -1 and leaves out every label equal to -1 after numpy's conversion: an
    integer -1 label is dropped (lmembed clustered it: 0.989 vs 0.968), and a string path's missing level becomes
    the cluster "-1". The V-measures are mteb's own function's, run for run."""
    import random

    from mteb.abstasks.clustering import _evaluate_clustering_bootstrapped

    from lmembed.evaluation.tasks.clustering import bootstrap_v_measures

    embeddings = np.random.default_rng(3).normal(size=(len(labels), 6)).astype(np.float32)
    ours = bootstrap_v_measures(embeddings, labels, rng=random.Random(7), runs=3, size=12, seed=42)
    theirs, _ = _evaluate_clustering_bootstrapped(
        embeddings,
        labels,
        n_clusters=3,
        cluster_size=12,
        kmean_batch_size=512,
        max_depth=None,
        rng_state=random.Random(7),
        seed=42,
    )
    assert ours.keys() == theirs["v_measure"].keys()
    for level, values in ours.items():
        assert values == pytest.approx(theirs["v_measure"][level], abs=1e-12), level
