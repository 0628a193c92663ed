"""Two-stage evaluation: on a subset of a small BEIR folder, the reranked scores equal reranking by hand (the first
stage's candidates in trec_eval's order, the reranker's scores, pytrec_eval); BM25 and hybrid first stages; MTEB's
reranking task scored with a reranker; and ``lmembed eval --first-stage/--rerank``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pytrec_eval
from typer.testing import CliRunner

from conftest import WORDS
from helpers import random_beir, save_tiny_cross_encoder
from lmembed.cli.app import app
from lmembed.evaluation.metrics import trec_order
from lmembed.evaluation.tasks.reranking import RerankingTask, RerankSample, rerank_metrics
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.evaluation.two_stage import bm25_run, dense_run, evaluate_two_stage, first_stage_run
from lmembed.lexical.fusion import fuse
from lmembed.rerank import load_reranker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def beir(tmp_path):
    return random_beir(tmp_path / "tiny-beir", WORDS[9:], docs=40, queries=8, relevant=3, seed=7)


@pytest.fixture
def reranker(tmp_path):
    return load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce", seed=11)))


def ndcg10_by_hand(qrels, run) -> float:
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"})
    return float(np.mean([v["ndcg_cut_10"] for v in evaluator.evaluate(run).values()]))


def test_two_stage_on_a_subset_equals_reranking_by_hand(beir, make_embedder, reranker):
    task = RetrievalTask.from_path(beir).subsample(max_docs=30, max_queries=6, policy="relevant-first")
    encoder = make_embedder("bert")
    staged = evaluate_two_stage(task, first_stage="dense", encoder=encoder, reranker=reranker, rerank_top_k=5)
    assert staged.first.scores["ndcg_at_10"] == task.evaluate(encoder).scores["ndcg_at_10"]  # plain dense eval

    data = task.data
    q = encoder.encode_queries(data.query_texts)
    c = encoder.encode_corpus(data.corpus_texts)
    cosine = q @ c.T  # normalised vectors
    run = {}
    for i, qid in enumerate(data.query_ids):
        first = {data.corpus_ids[j]: float(cosine[i, j]) for j in range(len(data.corpus_ids))}
        top = trec_order(first)[:5]
        texts = [data.corpus_texts[data.corpus_ids.index(d)] for d in top]
        run[qid] = dict(zip(top, reranker.score(data.query_texts[i], texts).tolist(), strict=True))
    assert staged.reranked.scores["ndcg_at_10"] == pytest.approx(ndcg10_by_hand(data.qrels, run), abs=1e-5)
    assert staged.reranked.extra["pairs"] == 5 * len(data.query_ids)
    assert staged.reranked.model_name.endswith(f"» {reranker.name}")


def test_bm25_and_hybrid_first_stages(beir, make_embedder):
    task = RetrievalTask.from_path(beir)
    encoder = make_embedder("bert")
    lexical = bm25_run(task)
    dense = dense_run(task, encoder)
    hybrid = first_stage_run(task, "hybrid", encoder=encoder, fusion="rrf")
    for qid in task.data.query_ids:
        assert hybrid[qid] == dict(fuse([dense[qid], lexical[qid]], "rrf")[: task.top_k])
    staged = evaluate_two_stage(task, first_stage="bm25")
    assert staged.reranked is None and staged.first.model_name == "bm25"
    assert staged.first.scores["ndcg_at_10"] == pytest.approx(ndcg10_by_hand(task.data.qrels, lexical), abs=1e-5)


def test_reranking_task_scored_by_a_reranker(reranker):
    samples = [
        RerankSample("the cat", ["the cat sat on the mat", "a cat"], ["gene study", "protein", "the movie"]),
        RerankSample(["dog", "horse riding"], ["a man riding a horse"], ["cell", "great movie"]),
        RerankSample("no negatives", ["x"], []),  # skipped, as MTEB does
    ]
    result = RerankingTask("tiny-rerank", samples).evaluate_reranker(reranker)
    by_hand = [
        rerank_metrics(
            [True, True, False, False, False], reranker.score("the cat", [*samples[0].positive, *samples[0].negative])
        ),
        rerank_metrics(
            [True, False, False],
            np.maximum(*(reranker.score(q, [*samples[1].positive, *samples[1].negative]) for q in samples[1].query)),
        ),
    ]
    assert result.scores["map"] == pytest.approx(np.mean([r["ap"] for r in by_hand]), abs=1e-9)
    assert result.scores["mrr_at_10"] == pytest.approx(np.mean([r["mrr"] for r in by_hand]), abs=1e-9)
    assert result.extra["skipped"] == 1 and result.model_name == reranker.name


def test_cli_eval_in_stages(beir, make_embedder, tmp_path):
    model_dir = tmp_path / "model"
    make_embedder("bert").save(model_dir)
    ce = save_tiny_cross_encoder(tmp_path / "ce2", seed=3)
    out = tmp_path / "results"
    args = ["eval", "-m", str(model_dir), "-d", str(beir), "--first-stage", "hybrid", "--rerank", str(ce)]
    result = CliRunner().invoke(app, [*args, "--rerank-top-k", "7", "-o", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "gain" in result.output and "(rrf)" in result.output
    files = sorted(out.rglob("*.json"))
    names = {json.loads(f.read_text()).get("task_name") for f in files if f.name != "model_meta.json"}
    assert len(files) >= 2 and names
    bad = CliRunner().invoke(app, ["eval", "-d", str(beir), "--first-stage", "sparse", "-o", str(out)])
    assert bad.exit_code == 2 and "--first-stage" in bad.output
