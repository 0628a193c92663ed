"""Indexes of chunked long documents: chunk -> document rows survive save/open/add, searches return documents at
their best chunk's score, in the library and from the server's /v1/search."""

from __future__ import annotations

import numpy as np
import pytest

from lmembed.encoding.chunking import Chunking
from lmembed.index import Index
from lmembed.index.chunk_map import ChunkMap
from lmembed.index.errors import IndexFormatError

DOCS = [
    ("long", "the cat sat on the mat . a dog was in the study of language model search , the end"),
    ("short", "protein cell gene"),
    ("mid", "a dog was riding a horse in the study"),
]
QUERIES = ["cat mat", "gene cell study", "horse riding dog"]
CHUNKING = Chunking("maxp", tokens=4, overlap=1)


def _expected(emb, docs, queries):
    """Each query's documents by hand: chunk cosines, max per document, sorted."""
    chunked = emb.encode_corpus([t for _, t in docs], chunking=CHUNKING)
    scores = chunked.document_scores(emb.encode_queries(queries))
    return [[(docs[j][0], row[j]) for j in np.argsort(-row, kind="stable")] for row in scores]


def _assert_hits(hits, expected):
    for got, want in zip(hits, expected, strict=True):
        assert [h.id for h in got] == [d for d, _ in want]
        np.testing.assert_allclose([h.score for h in got], [s for _, s in want], atol=1e-5)


def test_chunked_index_returns_documents_and_survives_a_round_trip(make_embedder, tmp_path):
    emb = make_embedder("bert", pooling="mean")
    index = Index.build(emb, DOCS[:2], tmp_path / "ix", chunking=CHUNKING)
    assert index.vectors.ntotal > index.count == 2  # the long document was cut
    _assert_hits(index.search_batch(QUERIES, 5), _expected(emb, DOCS[:2], QUERIES))
    assert index.add([DOCS[2]]) == 1
    reopened = Index.open(tmp_path / "ix", emb)
    assert reopened.manifest.chunking == CHUNKING.to_dict() and reopened.count == 3
    np.testing.assert_array_equal(reopened.chunks.doc_rows, index.chunks.doc_rows)
    assert reopened.chunks.doc_rows[-1] == 2 and reopened.vectors.ntotal == len(reopened.chunks)
    hits = reopened.search_batch(QUERIES, 5)
    _assert_hits(hits, _expected(emb, DOCS, QUERIES))
    assert all(len({h.id for h in row}) == len(row) == 3 for row in hits)  # documents, each once
    assert reopened.search("cat mat", k=1)[0].text == DOCS[0][1]  # the whole document, not a chunk


def test_unchunked_index_manifest_has_no_chunking(make_embedder, tmp_path):
    emb = make_embedder("bert", pooling="mean")
    Index.build(emb, DOCS, tmp_path / "plain")
    assert "chunking" not in (tmp_path / "plain" / "manifest.json").read_text()
    assert Index.open(tmp_path / "plain", emb).chunks is None


def test_chunk_map_collapse_and_a_map_that_does_not_fit():
    chunks = ChunkMap(np.array([0, 0, 1, 2, 2]))
    scores = np.array([[0.9, 0.8, 0.7, 0.5, 0.1]], dtype=np.float32)
    rows = np.array([[1, 0, 3, 2, 4]])
    got_scores, got_rows = chunks.collapse(scores, rows, 3)
    assert got_rows.tolist() == [[0, 2, 1]]
    np.testing.assert_allclose(got_scores, [[0.9, 0.7, 0.5]])
    assert chunks.collapse(scores[:, :2], rows[:, :2], 3)[1].tolist() == [[0, -1, -1]]
    with pytest.raises(IndexFormatError, match="chunk map"):
        chunks.check(5, 4, "ix")


def test_server_search_returns_documents_of_a_chunked_index(make_embedder, tmp_path):
    from fastapi.testclient import TestClient

    from lmembed.serving.app import create_app

    emb = make_embedder("bert", pooling="mean")
    Index.build(emb, DOCS, tmp_path / "ix", chunking=CHUNKING)
    index = Index.open(tmp_path / "ix", emb)
    with TestClient(create_app(emb, model_name="tiny", index=index)) as client:
        response = client.post("/v1/search", json={"query": QUERIES, "k": 3})
    assert response.status_code == 200, response.text
    for result, want in zip(response.json()["data"], _expected(emb, DOCS, QUERIES), strict=True):
        assert [h["id"] for h in result["hits"]] == [d for d, _ in want]


def test_a_damaged_chunk_map_is_refused_on_open(make_embedder, tmp_path):
    emb = make_embedder("bert", pooling="mean")
    index = Index.build(emb, DOCS, tmp_path / "ix", chunking=CHUNKING)
    chunk_file = tmp_path / "ix" / index.manifest.files["chunks"]
    np.save(chunk_file, np.zeros(len(index.chunks), dtype=np.int64))
    with pytest.raises(IndexFormatError, match="chunks"):
        Index.open(tmp_path / "ix", emb)
    with pytest.raises(IndexFormatError, match="chunk map"):
        Index.open(tmp_path / "ix", emb, verify=False)


def test_cli_index_build_with_chunking(make_embedder, tmp_path):
    import json

    from typer.testing import CliRunner

    from lmembed.cli.app import app

    model_dir, folder, corpus = tmp_path / "model", tmp_path / "index", tmp_path / "corpus.jsonl"
    make_embedder("bert", pooling="mean").save(model_dir)
    corpus.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in DOCS))
    args = ["index", "build", str(corpus), "-o", str(folder), "--model", str(model_dir), "--no-cache"]
    result = CliRunner().invoke(app, [*args, "--chunking", "maxp", "--chunk-tokens", "4", "--chunk-overlap", "1"])
    assert result.exit_code == 0, result.output
    index = Index.open(folder)
    assert index.manifest.chunking == CHUNKING.to_dict() and index.count == 3 and index.vectors.ntotal > 3
    shown = CliRunner().invoke(app, ["index", "info", str(folder)], terminal_width=200).output
    assert "aggregate=maxp, tokens=4, overlap=1" in shown, shown  # what the chunks are (was "-": parameters only)
    refused = CliRunner().invoke(app, [*args, "--overwrite", "--chunking", "mean"])
    assert refused.exit_code == 2 and "maxp" in refused.output


def test_a_document_whose_chunks_fill_the_fetch_still_leaves_room_for_k_documents(make_embedder):
    """The search fetched 8 × k chunks: one long document whose chunks all outrank the rest filled that window,
    and k=20 returned one document. A query short of k documents is searched again deeper."""
    emb = make_embedder("bert", pooling="mean")
    long_doc = ("long", " ".join(["cat mat"] * 200))  # hundreds of 4-token chunks, all alike
    docs = [long_doc, *[(f"d{i}", f"protein gene {i} study") for i in range(30)]]
    index = Index.build(emb, docs, chunking=CHUNKING)
    assert len(index.chunks) > 8 * 20
    for k in (1, 5, 20):
        hits = index.search("cat mat", k=k)
        assert len(hits) == k and len({h.id for h in hits}) == k and hits[0].id == "long"
    everything = index.search("cat mat", k=100)
    assert len(everything) == len(docs)  # every document, once
    (want,) = _expected(emb, docs, ["cat mat"])  # each document at its best chunk (ties may come in either order)
    np.testing.assert_allclose([h.score for h in everything], [s for _, s in want], atol=1e-5)


def test_an_index_refuses_mean_chunk_scores_it_would_not_give(make_embedder):
    """``Chunking("mean")`` was accepted by Index.build, recorded in the manifest, and searched by the best chunk."""
    from lmembed.errors import ConfigError

    with pytest.raises(ConfigError, match="an index scores a document by its best chunk; use maxp or first"):
        Index.build(make_embedder("bert"), DOCS, chunking=Chunking("mean", tokens=4, overlap=1))
