"""Retrieval metrics at the paper's 20 cut-offs and MTEB's nAUC (abstention) metrics: known answers,
MTEB's own numbers, and the keys and values that existed before staying as they were."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from lmembed.evaluation.metrics import (
    ABSTENTION_RATES,
    K_VALUES,
    MTEB_K_VALUES,
    NAUC_METRICS,
    abstention_curve,
    confidence_scores,
    cutoff_auc,
    evaluate_run,
    nauc_scores,
    normalised_auc,
)


def _random_run(seed: int, queries: int = 40, docs: int = 200, hits: int = 120):
    rng = np.random.default_rng(seed)
    qrels = {
        f"q{i}": {f"d{j}": int(rng.integers(0, 3)) for j in rng.choice(docs, 5, replace=False)} for i in range(queries)
    }
    run = {q: {f"d{j}": round(float(rng.random()), 3) for j in rng.choice(docs, hits, replace=False)} for q in qrels}
    return qrels, run


def test_twenty_cutoffs_include_mtebs_and_the_papers():
    assert len(K_VALUES) == 20 and len(set(K_VALUES)) == 20 and list(K_VALUES) == sorted(K_VALUES)
    assert set(MTEB_K_VALUES) <= set(K_VALUES)
    assert {1, 2, 3, 5, 10, 20, 30, 100} <= set(K_VALUES)  # the ones the paper names
    assert K_VALUES[-1] == 1000  # the retrieval depth
    s = evaluate_run({"q": {"a": 1}}, {"q": {"a": 1.0, "b": 0.5}}).scores
    for prefix in ("ndcg", "map", "recall", "precision", "mrr", "hit_rate"):
        assert all(f"{prefix}_at_{k}" in s for k in K_VALUES)
    for metric in NAUC_METRICS:
        assert all(f"nauc_{metric}_at_{k}_{c}" in s for k in K_VALUES for c in ("max", "std", "diff1"))


def test_existing_keys_and_values_are_unchanged():
    qrels, run = _random_run(3)
    before = evaluate_run(qrels, run, MTEB_K_VALUES, nauc=False).scores  # what a result held before
    # the cut-off curve areas are newer than those keys, and an area depends on the cut-offs it is drawn over
    before = {k: v for k, v in before.items() if not k.startswith("cutoff_auc_")}
    now = evaluate_run(qrels, run).scores
    assert set(before) < set(now)
    assert {k: now[k] for k in before} == before
    assert now["main_score"] == now["ndcg_at_10"] == before["main_score"]


def test_confidence_scores_by_hand():
    assert confidence_scores([0.2, 0.9, 0.5]) == {
        "max": 0.9,
        "std": pytest.approx(np.std([0.2, 0.9, 0.5])),
        "diff1": pytest.approx(0.4),
    }
    assert confidence_scores([0.7]) == {"max": 0.7, "std": 0.0, "diff1": 0.0}
    assert confidence_scores([]) == {"max": 0.0, "std": 0.0, "diff1": 0.0}


def test_nauc_known_answers():
    metric = np.array([0.1, 0.4, 0.6, 0.9, 0.2, 0.8, 0.3, 0.5, 0.7, 1.0])
    # a confidence that orders the queries exactly as the metric does is the oracle: 1
    assert normalised_auc(metric * 3 + 1, metric) == pytest.approx(1.0)
    # one confidence for every query drops a random share: the curve stays flat, 0
    assert normalised_auc(np.ones(10), metric) == pytest.approx(0.0)
    # the reverse order drops the best queries first: -1 here, since the curves mirror each other
    assert normalised_auc(-metric, metric) == pytest.approx(-1.0)
    # every query scoring the same leaves nothing to normalise by
    assert math.isnan(normalised_auc(np.arange(10.0), np.full(10, 0.5)))


def test_abstention_curve_by_hand():
    confidence = np.array([0.1, 0.2, 0.3, 0.4])
    metric = np.array([0.0, 1.0, 0.0, 1.0])
    curve = abstention_curve(confidence, metric, (0.0, 0.25, 0.5, 0.75))
    # drop 0, 1, 2, 3 of the least confident queries
    assert curve.tolist() == pytest.approx([0.5, 2 / 3, 0.5, 1.0])
    # a tie between the two least confident counts with their mean (0.5), whichever comes first
    tied = abstention_curve(np.array([0.1, 0.1, 0.3, 0.4]), metric, (0.25,))
    assert tied[0] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert len(ABSTENTION_RATES) == 10 and ABSTENTION_RATES[0] == 0.0 and ABSTENTION_RATES[-1] == pytest.approx(0.9)


def test_nauc_does_not_depend_on_query_order():
    qrels, run = _random_run(5)
    per_query = evaluate_run(qrels, run, nauc=False).per_query
    keys = list(per_query)
    random.Random(0).shuffle(keys)
    shuffled = {q: per_query[q] for q in keys}
    a, b = nauc_scores(run, per_query), nauc_scores(run, shuffled)
    assert a.keys() == b.keys()
    assert all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == pytest.approx(b[k], abs=1e-12) for k in a)


def test_identical_to_mtebs_nauc():
    retrieval_metrics = pytest.importorskip("mteb._evaluators.retrieval_metrics")
    qrels, run = _random_run(1, queries=60, docs=300, hits=200)
    ours = evaluate_run(qrels, run).scores
    theirs = retrieval_metrics.calculate_retrieval_scores(run, qrels, list(K_VALUES))
    flat = retrieval_metrics.make_score_dict(
        ndcg=theirs.ndcg,
        _map=theirs.map,
        recall=theirs.recall,
        precision=theirs.precision,
        mrr=theirs.mrr,
        naucs=theirs.naucs,
        naucs_mrr=theirs.naucs_mrr,
        hit_rate=theirs.hit_rate,
        task_scores={},
    )
    nauc_keys = [k for k in flat if k.startswith("nauc_")]
    assert len(nauc_keys) == 3 * len(NAUC_METRICS) * len(K_VALUES)
    for key in nauc_keys:
        assert ours[key] == pytest.approx(flat[key], abs=1e-12, nan_ok=True), key
    shared = [k for k in ours if k in flat]
    assert len(shared) == 6 * len(K_VALUES) + len(nauc_keys)


def test_identical_ids_are_dropped_before_confidences():
    qrels = {"q": {"a": 1}, "r": {"b": 1}}
    run = {"q": {"q": 0.99, "a": 0.5, "c": 0.1}, "r": {"b": 0.9, "c": 0.8}}
    plain = evaluate_run(qrels, run, (1,), ignore_identical_ids=True)
    expected = nauc_scores({"q": {"a": 0.5, "c": 0.1}, "r": {"b": 0.9, "c": 0.8}}, plain.per_query, (1, 10))
    assert {k: v for k, v in plain.scores.items() if k.startswith("nauc_")} == pytest.approx(expected, nan_ok=True)


def test_cutoff_auc_of_a_hand_made_run():
    """One relevant document at rank 3: hit rate is 0 below k = 3 and 1 from there on, nDCG 0 then 1/log2(4);
    the areas against log k are worked out by hand."""
    ks = list(K_VALUES)
    s = evaluate_run({"q": {"a": 1}}, {"q": {"b": 0.9, "c": 0.8, "a": 0.7, "d": 0.1}}, ks).scores
    span = math.log(1000)
    expected_hit = (0.5 * (math.log(3) - math.log(2)) + (math.log(1000) - math.log(3))) / span
    assert s["cutoff_auc_hit_rate"] == pytest.approx(expected_hit, abs=1e-5)
    assert s["cutoff_auc_ndcg"] == pytest.approx(0.5 * expected_hit, abs=1e-5)
    assert s["cutoff_auc_mrr"] == pytest.approx(expected_hit / 3, abs=1e-12)
    assert cutoff_auc([1.0] * len(ks), ks) == pytest.approx(1.0)
    assert cutoff_auc([0.0] * len(ks), ks) == 0.0


def test_cutoff_auc_is_the_mean_of_the_per_query_areas_and_needs_two_cutoffs():
    qrels, run = _random_run(3)
    result = evaluate_run(qrels, run, round_digits=None)
    per_query = [row["cutoff_auc_ndcg"] for row in result.per_query.values()]
    assert result.scores["cutoff_auc_ndcg"] == pytest.approx(sum(per_query) / len(per_query), abs=1e-12)
    assert 0.0 < result.scores["cutoff_auc_ndcg"] < 1.0
    assert "cutoff_auc_ndcg" not in evaluate_run(qrels, run, [10]).scores  # one cut-off: no curve
    with pytest.raises(ValueError, match="two cut-offs"):
        cutoff_auc([0.5], [10])


def test_report_draws_the_cutoff_curves(tmp_path):
    from lmembed.evaluation.base import TaskResult
    from lmembed.evaluation.cutoff_curves import cutoff_curves
    from lmembed.evaluation.report import render_report
    from lmembed.evaluation.results import write_result

    qrels, run = _random_run(4)
    scores = evaluate_run(qrels, run).scores
    result = TaskResult("Toy", "Retrieval", "test", scores, "ndcg_at_10", model_name="m", strategy={"pooling": "mean"})
    write_result(result, tmp_path / "results")
    report = render_report(tmp_path / "results", tmp_path / "out")
    assert report.files["cutoffs"].stat().st_size > 0
    (curve,) = cutoff_curves([result])["Toy"].values()
    assert curve[0] == sorted(K_VALUES) and curve[1] == [scores[f"ndcg_at_{k}"] for k in sorted(K_VALUES)]
