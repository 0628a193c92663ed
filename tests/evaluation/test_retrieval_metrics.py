"""Retrieval metrics: hand-checked values, MTEB's MRR and averaging, and real-data parity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval

from lmembed import task_registry
from lmembed.evaluation.metrics import (
    K_VALUES,
    drop_identical_ids,
    evaluate_run,
    mrr_at_k,
    trec_order,
)
from lmembed.evaluation.tasks import build_task
from lmembed.evaluation.tasks.retrieval import RetrievalTask, score_embeddings
from lmembed.paths import shared_datasets_dir


def test_hand_checked_single_query() -> None:
    # Ranking: a (relevant), b, c (relevant), d; a third relevant doc "z" is never retrieved.
    qrels = {"q": {"a": 1, "c": 1, "z": 1}}
    run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}}
    s = evaluate_run(qrels, run, k_values=(1, 3, 10)).scores
    ideal3 = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert s["ndcg_at_1"] == 1.0
    assert s["ndcg_at_3"] == round((1 + 1 / math.log2(4)) / ideal3, 5)
    assert s["map_at_3"] == round((1 / 1 + 2 / 3) / 3, 5)
    assert s["recall_at_1"] == round(1 / 3, 5) and s["recall_at_3"] == round(2 / 3, 5)
    assert s["precision_at_1"] == 1.0 and s["precision_at_3"] == round(2 / 3, 5)
    assert s["precision_at_10"] == 0.2  # trec_eval divides by k, not by the number retrieved
    assert s["mrr_at_1"] == 1.0 and s["hit_rate_at_1"] == 1.0
    assert s["main_score"] == s["ndcg_at_10"]


def test_graded_relevance_and_mrr_average() -> None:
    qrels = {"q1": {"a": 2, "b": 1}, "q2": {"x": 1}}
    run = {"q1": {"b": 0.9, "a": 0.5}, "q2": {"y": 0.9, "z": 0.8, "x": 0.1}}
    s = evaluate_run(qrels, run, k_values=(1, 3)).scores
    # q1: dcg = 1 + 2/log2(3) against ideal 2 + 1/log2(3) (trec_eval's gain is the grade itself)
    q1 = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    q2 = 1 / 2  # rank 3: 1/log2(4)
    assert s["ndcg_at_3"] == round((q1 + q2) / 2, 5)
    assert s["mrr_at_1"] == 0.5  # q1 hit at rank 1, q2 misses
    assert s["mrr_at_3"] == (1 + 1 / 3) / 2  # MRR is not rounded, as in MTEB


def test_mrr_ties_follow_trec_eval_order() -> None:
    docs = {"a": 0.5, "c": 0.5, "b": 0.9}
    assert trec_order(docs) == ["b", "c", "a"]  # equal scores: larger doc id first
    assert mrr_at_k(docs, {"a": 1}, (1, 3)) == {1: 0.0, 3: 1 / 3}
    assert mrr_at_k(docs, {"c": 1, "a": 1}, (1, 3)) == {1: 0.0, 3: 0.5}
    assert mrr_at_k(docs, {"a": 0}, (3,)) == {3: 0.0}  # grade 0 is not relevant


def test_mrr_equals_recip_rank_of_cut_runs() -> None:
    rng = np.random.default_rng(0)
    qrels = {f"q{i}": {f"d{j}": int(rng.integers(0, 3)) for j in rng.choice(60, 4, replace=False)} for i in range(40)}
    run = {q: {f"d{j}": float(rng.integers(0, 20)) / 20 for j in rng.choice(60, 40, replace=False)} for q in qrels}
    ours = evaluate_run(qrels, run).per_query
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"})
    for k in (1, 3, 10, 20):
        cut = {q: {d: docs[d] for d in trec_order(docs)[:k]} for q, docs in run.items()}
        expected = evaluator.evaluate(cut)
        for q in qrels:
            assert ours[q][f"mrr_at_{k}"] == pytest.approx(expected[q]["recip_rank"], abs=1e-12)


def test_query_selection_and_empty_runs() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    run = {"q1": {"a": 1.0}, "q2": {}, "q-unjudged": {"a": 1.0}}  # q3 missing from the run
    result = evaluate_run(qrels, run, k_values=(1,))
    assert set(result.per_query) == {"q1", "q2"}
    assert result.scores["ndcg_at_1"] == 0.5 and result.scores["mrr_at_1"] == 0.5


def test_rounding_matches_mteb() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"a": 1}, "q3": {"a": 1}}
    run = {"q1": {"b": 1.0, "a": 0.5}, "q2": {"a": 1.0}, "q3": {"b": 1.0, "c": 0.9, "a": 0.5}}
    s = evaluate_run(qrels, run).scores
    assert s["mrr_at_10"] == (1 / 2 + 1 + 1 / 3) / 3  # unrounded
    assert s["precision_at_3"] == round(1 / 3, 5)  # rounded to 5 decimals
    raw = evaluate_run(qrels, run, round_digits=None).scores
    assert raw["precision_at_3"] == pytest.approx(1 / 3)


def test_ignore_identical_ids() -> None:
    qrels = {"q": {"a": 1}}
    run = {"q": {"q": 0.99, "a": 0.5}}
    assert drop_identical_ids(run) == {"q": {"a": 0.5}}
    assert evaluate_run(qrels, run, k_values=(1,)).scores["ndcg_at_1"] == 0.0
    assert evaluate_run(qrels, run, k_values=(1,), ignore_identical_ids=True).scores["ndcg_at_1"] == 1.0
    assert run == {"q": {"q": 0.99, "a": 0.5}}  # the caller's run is not modified


def test_keys_cover_mteb_metric_names() -> None:
    s = evaluate_run({"q": {"a": 1}}, {"q": {"a": 1.0}}).scores
    for prefix in ("ndcg", "map", "recall", "precision", "mrr", "hit_rate"):
        for k in K_VALUES:
            assert f"{prefix}_at_{k}" in s


def test_identical_to_mtebs_own_computation() -> None:
    retrieval_metrics = pytest.importorskip("mteb._evaluators.retrieval_metrics")
    rng = np.random.default_rng(1)
    qrels = {f"q{i}": {f"d{j}": int(rng.integers(0, 3)) for j in rng.choice(300, 5, replace=False)} for i in range(60)}
    run = {q: {f"d{j}": round(float(rng.random()), 2) for j in rng.choice(300, 200, replace=False)} for q in qrels}
    ours = evaluate_run(qrels, run).scores
    theirs = retrieval_metrics.calculate_retrieval_scores(run, qrels, list(K_VALUES))
    flat = retrieval_metrics.make_score_dict(
        ndcg=theirs.ndcg,
        _map=theirs.map,
        recall=theirs.recall,
        precision=theirs.precision,
        mrr=theirs.mrr,
        naucs={},
        naucs_mrr={},
        hit_rate=theirs.hit_rate,
        task_scores={},
    )
    shared = [k for k in ours if k in flat]
    assert len(shared) == 6 * len(K_VALUES)
    assert {k: ours[k] for k in shared} == {k: flat[k] for k in shared}


class HashedBagOfWords:
    """A cheap deterministic encoder: hashed, L2-normalised word counts."""

    model_name = "test/hashed-bow"

    def __init__(self, dim: int = 512) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.vectorizer = HashingVectorizer(n_features=dim, alternate_sign=False, norm="l2")

    def _encode(self, texts: list[str]) -> np.ndarray:
        return self.vectorizer.transform(texts).toarray().astype(np.float32)

    def encode_queries(self, texts, *, instruction=None, batch_size=32):
        return self._encode([f"{instruction} {t}" if instruction else t for t in texts])

    def encode_corpus(self, texts, *, batch_size=32):
        return self._encode(list(texts))


def _shared_beir(name: str):
    shared = shared_datasets_dir()
    if shared is None or not (shared / "beir" / name).is_dir():
        pytest.skip(f"../shared/datasets/beir/{name} is not available in this checkout")
    return shared / "beir" / name


def test_real_scifact_matches_direct_pytrec_eval() -> None:
    task = build_task(task_registry.get("SciFact"), _shared_beir("scifact"))
    assert isinstance(task, RetrievalTask)
    encoder = HashedBagOfWords()
    q, c, _ = task.encode(encoder)
    scored = score_embeddings(task.data, q, c)
    assert len(task.data.query_ids) == 300 and len(task.data.corpus_ids) == 5183
    assert all(len(docs) == 1000 for docs in scored.run.values())

    measures = {"ndcg_cut.10", "map_cut.10", "recall.100", "P.10"}
    per_query = pytrec_eval.RelevanceEvaluator(task.data.qrels, measures).evaluate(scored.run)
    assert len(per_query) == 300

    def mean(key: str) -> float:
        return round(sum(v[key] for v in per_query.values()) / len(per_query), 5)

    s = scored.scores.scores
    assert s["ndcg_at_10"] == mean("ndcg_cut_10")
    assert s["map_at_10"] == mean("map_cut_10")
    assert s["recall_at_100"] == mean("recall_100")
    assert s["precision_at_10"] == mean("P_10")
    assert 0.2 < s["ndcg_at_10"] < 0.6  # a bag of words is a weak but real retriever here

    result = task.score_embeddings(q, c, model_name=encoder.model_name)
    assert result.task_name == "SciFact" and result.task_type == "Retrieval" and result.split == "test"
    assert result.scores == s
    assert result.main_score == s["ndcg_at_10"]
    assert result.model_name == "test/hashed-bow"
    assert result.extra["data"]["num_documents"] == 5183


def test_evaluate_encodes_with_instruction_and_times_stages(tmp_path) -> None:
    from lmembed.evaluation.retrieval_data import RetrievalData

    class Recorder(HashedBagOfWords):
        def encode_queries(self, texts, *, instruction=None, batch_size=32):
            self.seen = (list(texts), instruction, batch_size)
            return super().encode_queries(texts, instruction=instruction, batch_size=batch_size)

    data = RetrievalData(
        "Toy", "test", ["d1", "d2"], ["cats purr", "dogs bark"], ["q1"], ["do cats purr"], {"q1": {"d1": 1}}
    )
    encoder = Recorder(dim=64)
    result = RetrievalTask(data, instruction="Find the passage:").evaluate(encoder, batch_size=7)
    assert encoder.seen == (["do cats purr"], "Find the passage:", 7)
    assert result.main_score == 1.0 and result.extra["instruction"] == "Find the passage:"
    timings = result.extra["timings"]
    for key in ("encode_s", "encode_queries_s", "encode_corpus_s", "search_s", "metrics_s"):
        assert timings[key] >= 0
    assert result.evaluation_time >= timings["encode_s"] + timings["search_s"]


def test_task_settings_follow_mteb() -> None:
    assert task_registry.get("arguana").ignore_identical_ids is True
    assert task_registry.get("SciFact").ignore_identical_ids is False
    assert task_registry.get("nfcorpus").name == "NFCorpus"
    with pytest.raises(KeyError, match="unknown task"):
        task_registry.get("no-such-task")
    msmarco = task_registry.get("msmarco")  # known (type, split, instruction) without local data
    assert (msmarco.task_type, msmarco.split, msmarco.path) == ("Retrieval", "dev", None)


def test_every_retrieval_task_drops_self_hits_where_mteb_does() -> None:
    """Only ArguAna dropped self-hits; mteb's QuoraRetrieval (every query is also a document under its own id: a
    non-relevant self-hit at rank 1, nDCG@10 0.63 instead of 1.0 on a Quora-shaped set), FiQA2018, FEVER and MSMARCO
    set ``ignore_identical_ids`` too. Each registry task's flag is read from mteb's own task class."""
    mteb = pytest.importorskip("mteb")
    checked = []
    for spec in task_registry.TASKS.values():
        if spec.task_type != "Retrieval":
            continue
        try:
            task = mteb.get_task(spec.name)
        except Exception:
            continue
        assert spec.ignore_identical_ids == bool(getattr(task, "ignore_identical_ids", False)), spec.name
        checked.append(spec.name)
    assert {"ArguAna", "QuoraRetrieval", "FiQA2018", "FEVER", "MSMARCO", "SciFact", "NFCorpus"} <= set(checked)


def test_arguana_style_task_drops_self_hits(tmp_path) -> None:
    from lmembed.evaluation.retrieval_data import RetrievalData

    ids = [f"a{i}" for i in range(6)]
    data = RetrievalData(
        name="Toy",
        split="test",
        corpus_ids=ids,
        corpus_texts=ids,
        query_ids=["a0", "a1"],
        query_texts=["a0", "a1"],
        qrels={"a0": {"a1": 1}, "a1": {"a0": 1}},
    )
    emb = np.eye(6, dtype=np.float32)
    emb[1, 0] = emb[0, 1] = 0.5  # a0 and a1 are each other's nearest non-self neighbour
    task = RetrievalTask(data, ignore_identical_ids=True, top_k=3)
    result = task.score_embeddings(emb[:2], emb)
    assert result.scores["ndcg_at_1"] == 1.0
    plain = RetrievalTask(data, ignore_identical_ids=False, top_k=3).score_embeddings(emb[:2], emb)
    assert plain.scores["ndcg_at_1"] == 0.0
    # MTEB removes the self hit after the top-k search; BEIR's search skipped it before.
    after = score_embeddings(data, emb[:2], emb, top_k=3, ignore_identical_ids=True)
    before = score_embeddings(data, emb[:2], emb, top_k=3, ignore_identical_ids=True, exclude_before_top_k=True)
    assert all(len(d) == 3 for d in after.run.values())  # self hit still in the raw run
    assert all(q not in d and len(d) == 3 for q, d in before.run.items())
    assert after.scores.scores["ndcg_at_1"] == before.scores.scores["ndcg_at_1"] == 1.0


def test_wrong_embedding_shapes_are_rejected() -> None:
    from lmembed.evaluation.retrieval_data import RetrievalData

    data = RetrievalData("T", "test", ["d"], ["d"], ["q"], ["q"], {"q": {"d": 1}})
    with pytest.raises(ValueError, match="query embeddings"):
        score_embeddings(data, np.ones((2, 3)), np.ones((1, 3)))
