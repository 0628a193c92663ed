"""Retrieval over chunked long documents: documents ranked by first/MaxP/mean chunk scores, in the task, the
strategy runner and ``lmembed eval --chunking``."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import write_beir
from lmembed.cli.app import app
from lmembed.encoding.chunking import ChunkedEmbeddings, Chunking
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.runner import evaluate_strategies
from lmembed.evaluation.tasks.retrieval import (
    RetrievalTask,
    chunked_search,
    score_chunked_embeddings,
    score_embeddings,
)

DOCS = [
    ("d1", "the cat sat on the mat . a dog was in the study"),
    ("d2", "a dog was riding a horse"),
    ("d3", "the man was eating food and the cat was eating food"),
    ("d4", "protein cell gene study of the model"),
]
QUERIES = [("q1", "cat mat"), ("q2", "horse riding"), ("q3", "gene cell")]
QRELS = [("q1", "d1"), ("q2", "d2"), ("q3", "d4")]


def _data() -> RetrievalData:
    return RetrievalData(
        name="toy",
        split="test",
        query_ids=[q for q, _ in QUERIES],
        query_texts=[t for _, t in QUERIES],
        corpus_ids=[d for d, _ in DOCS],
        corpus_texts=[t for _, t in DOCS],
        qrels={q: {d: 1} for q, d in QRELS},
    )


@pytest.fixture
def beir(tmp_path):
    return write_beir(tmp_path / "toy", DOCS, QUERIES, QRELS)


def _assert_same_scores(a: dict, b: dict) -> None:
    """Equal metric tables (NaN equal to NaN: MTEB's nAUC of a perfect run)."""
    assert sorted(a) == sorted(b)
    keys = [k for k in a if isinstance(a[k], float)]
    np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], atol=1e-6, equal_nan=True)


def test_chunked_search_ranks_documents_by_their_best_chunk():
    # doc 0: chunks along e1 and e2; doc 1: one chunk between; doc 2: one chunk along -e1
    vectors = np.array([[1, 0], [0, 1], [0.6, 0.8], [-1, 0]], dtype=np.float32)
    chunked = ChunkedEmbeddings(vectors, np.array([0, 0, 1, 2]), 3, "maxp")
    result = chunked_search(np.array([[1, 0], [0, 1]], dtype=np.float32), chunked, top_k=5, similarity="dot")
    assert result.indices.tolist() == [[0, 1, 2, -1, -1], [0, 1, 2, -1, -1]]
    np.testing.assert_allclose(result.scores[:, :3], [[1.0, 0.6, -1.0], [1.0, 0.8, 0.0]])
    mean = chunked_search(
        np.array([[1, 0]], dtype=np.float32),
        ChunkedEmbeddings(vectors, chunked.doc_index, 3, "mean"),
        top_k=2,
        similarity="dot",
    )
    assert mean.indices.tolist() == [[1, 0]]  # 0.6 beats the mean (1 + 0) / 2
    np.testing.assert_allclose(mean.scores, [[0.6, 0.5]])


def test_documents_that_fit_one_chunk_score_as_unchunked(make_embedder):
    emb = make_embedder("bert", pooling="mean")
    task = RetrievalTask(_data())
    q, c, _ = task.encode(emb)
    plain = score_embeddings(task.data, q, c)
    for aggregate in ("first", "maxp", "mean"):
        chunking = Chunking(aggregate, tokens=64, overlap=8)
        chunked = score_chunked_embeddings(task.data, q, emb.encode_corpus(task.data.corpus_texts, chunking=chunking))
        for qid, run in plain.run.items():
            assert list(chunked.run[qid]) == list(run)  # the same documents in the same order
            np.testing.assert_allclose(list(chunked.run[qid].values()), list(run.values()), atol=1e-5)
        _assert_same_scores(chunked.scores.scores, plain.scores.scores)
        result = task.with_chunking(chunking).evaluate(emb)
        assert result.extra["settings"]["chunking"]["aggregate"] == aggregate


def test_chunked_task_scores_the_hand_aggregated_run(make_embedder):
    emb = make_embedder("bert", pooling="mean")
    chunking = Chunking("maxp", tokens=4, overlap=1)
    task = RetrievalTask(_data()).with_chunking(chunking)
    (result,) = evaluate_strategies(emb, [task], [emb.config])
    q = emb.encode_queries(task.data.query_texts)
    chunked = emb.encode_corpus(task.data.corpus_texts, chunking=chunking)
    assert len(chunked.vectors) > len(DOCS)  # long documents were cut
    scored = score_chunked_embeddings(task.data, q, chunked)
    _assert_same_scores(result.result.scores, task.score_embeddings(q, chunked).scores)
    best = {qid: max(run, key=run.get) for qid, run in scored.run.items()}
    doc_scores = chunked.document_scores(q)
    assert best == {qid: DOCS[int(np.argmax(row))][0] for qid, row in zip(task.data.query_ids, doc_scores, strict=True)}


def test_eval_command_chunking_flags(make_embedder, beir, tmp_path):
    model = str(make_embedder("llama", pooling="mean").save(tmp_path / "tiny"))
    out = tmp_path / "results"
    args = ["eval", "--model", model, "--data", str(beir), "-o", str(out), "--no-cache"]
    result = CliRunner().invoke(app, [*args, "--chunking", "maxp", "--chunk-tokens", "4", "--chunk-overlap", "1"])
    assert result.exit_code == 0, result.output
    (saved,) = out.rglob("*.json")
    assert '"aggregate": "maxp"' in saved.read_text() or '"aggregate":"maxp"' in saved.read_text()
    bad = CliRunner().invoke(app, [*args, "--chunking", "max"])
    assert bad.exit_code == 2 and "--chunking" in bad.output
    bad = CliRunner().invoke(app, [*args, "--chunking", "mean", "--chunk-tokens", "4", "--chunk-overlap", "4"])
    assert bad.exit_code == 2 and "overlap" in bad.output


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_fewer_queries_a_block_where_chunks_are_many_give_the_same_ranking(monkeypatch, similarity):
    """A block of 256 queries was scored against every chunk and every document at once (and the chunks normalised
    again for each block); the block shrinks where the chunks are many, with the same hits."""
    from lmembed.evaluation.tasks import retrieval

    rng = np.random.default_rng(1)
    chunked = ChunkedEmbeddings(
        rng.normal(size=(90, 8)).astype(np.float32), np.repeat(np.arange(30), 3), num_docs=30, aggregate="maxp"
    )
    queries = rng.normal(size=(40, 8)).astype(np.float32)
    whole = retrieval.chunked_search(queries, chunked, top_k=5, similarity=similarity)
    monkeypatch.setattr(retrieval, "CHUNKED_BLOCK_ELEMENTS", 200)  # two queries a block
    blocked = retrieval.chunked_search(queries, chunked, top_k=5, similarity=similarity)
    np.testing.assert_array_equal(blocked.indices, whole.indices)
    np.testing.assert_allclose(blocked.scores, whole.scores, rtol=1e-6)
