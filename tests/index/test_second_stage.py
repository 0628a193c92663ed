"""Two-stage search: ``rerank_hits`` against the reranker's scores by hand, and ``lmembed search`` with
``--mode bm25|hybrid`` and ``--rerank``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import TOY_DOCS, save_tiny_cross_encoder, write_jsonl
from lmembed.cli.app import app
from lmembed.index import Index
from lmembed.index.second_stage import rerank_hits
from lmembed.rerank import load_reranker

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = TOY_DOCS


@pytest.fixture
def built(make_embedder, tmp_path):
    model_dir, folder = tmp_path / "model", tmp_path / "index"
    make_embedder("bert").save(model_dir)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"_id": f"d{i}", "text": t} for i, t in enumerate(DOCS)])
    result = CliRunner().invoke(app, ["index", "build", str(corpus), "-o", str(folder), "-m", str(model_dir)])
    assert result.exit_code == 0, result.output
    return folder, save_tiny_cross_encoder(tmp_path / "ce", seed=5)


def test_rerank_hits_orders_by_reranker_score(built):
    folder, ce = built
    index = Index.open(folder)
    index.load_embedder()
    queries = ["cat on a mat", "protein cell"]
    first = index.search_batch(queries, 6, mode="hybrid")
    reranker = load_reranker(str(ce))
    second = rerank_hits(reranker, queries, first, k=3)
    for query, hits, reranked in zip(queries, first, second, strict=True):
        scores = reranker.score(query, [h.text for h in hits])
        order = np.argsort(-scores, kind="stable")[:3]
        assert [h.id for h in reranked] == [hits[i].id for i in order]
        np.testing.assert_allclose([h.score for h in reranked], scores[order], rtol=0, atol=1e-6)
        assert [h.rank for h in reranked] == [1, 2, 3]


def test_cli_search_modes_and_rerank(built, tmp_path):
    folder, ce = built
    runner = CliRunner()
    queries = write_jsonl(tmp_path / "q.jsonl", [{"_id": "q1", "text": "cat on a mat"}, {"_id": "q2", "text": "gene"}])
    runs = {}
    for name, extra in {
        "bm25": ["--mode", "bm25"],
        "hybrid": ["--mode", "hybrid", "--fusion", "minmax"],
        "reranked": ["--mode", "hybrid", "--rerank", str(ce), "--rerank-top-k", "5"],
    }.items():
        out = tmp_path / f"{name}.jsonl"
        args = ["search", str(folder), "--queries", str(queries), "-o", str(out), "-k", "3", *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        runs[name] = [json.loads(line) for line in out.read_text().splitlines()]
    index = Index.open(folder)
    bm25 = index.search_batch(["cat on a mat", "gene"], 3, mode="bm25")
    assert [[h["id"] for h in r["hits"]] for r in runs["bm25"]] == [[h.id for h in hits] for hits in bm25]
    index.load_embedder()
    first = index.search_batch(["cat on a mat", "gene"], 5, mode="hybrid")
    by_hand = rerank_hits(load_reranker(str(ce)), ["cat on a mat", "gene"], first, 3)
    assert [[h["id"] for h in r["hits"]] for r in runs["reranked"]] == [[h.id for h in hits] for hits in by_hand]
    result = runner.invoke(app, ["search", str(folder), "cat", "--mode", "sparse"])
    assert result.exit_code == 2 and "--mode" in result.output
