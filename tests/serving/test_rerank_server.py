"""``POST /v1/rerank`` and the hybrid/reranked ``/v1/search`` on a real server on a free 127.0.0.1 port, through
httpx: scores equal the reranker's own, Cohere/Jina's fields (top_n, return_documents, {"text"} documents), every
bad request's status and code, 413/429 limits, pairs of several requests sharing passes, the metrics, and search
by BM25, hybrid and reranked against the library."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from helpers import TOY_DOCS, save_tiny_cross_encoder
from lmembed.index import Index
from lmembed.index.second_stage import rerank_hits
from lmembed.rerank import load_reranker
from lmembed.serving.app import create_app
from lmembed.serving.limits import Limits
from lmembed.serving.server import BackgroundServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = TOY_DOCS


@pytest.fixture(scope="module")
def ce_folder(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", seed=9)


@contextmanager
def serving(embedder, reranker=None, **kwargs) -> Iterator[tuple[BackgroundServer, object]]:
    app = create_app(embedder, model_name="tiny", reranker=reranker, reranker_name="tiny-ce", **kwargs)
    with BackgroundServer(app) as server:
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not warm up"
            time.sleep(0.01)
        yield server, app.state.lmembed


def post(server, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def assert_error(response, status, code, text=""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and text in error["message"], error


def test_rerank_scores_equal_the_reranker(make_embedder, ce_folder):
    reranker = load_reranker(str(ce_folder))
    query = "cat on the mat"
    expected = reranker.score(query, DOCS)
    with serving(make_embedder("bert"), load_reranker(str(ce_folder))) as (server, _):
        body = post(server, {"query": query, "documents": DOCS}).json()
        assert body["model"] == "tiny-ce"
        order = np.argsort(-expected, kind="stable")
        assert [r["index"] for r in body["results"]] == order.tolist()
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], expected[order], atol=1e-5)
        assert all("document" not in r for r in body["results"])
        lengths = [len(f["input_ids"]) for f in reranker.encode_pairs([(query, d) for d in DOCS])]
        assert body["usage"]["total_tokens"] == sum(lengths)

        top = post(
            server, {"query": query, "documents": [{"text": d} for d in DOCS], "top_n": 3, "return_documents": True}
        )
        results = top.json()["results"]
        assert [r["index"] for r in results] == order[:3].tolist()
        assert [r["document"]["text"] for r in results] == [DOCS[i] for i in order[:3]]
        assert len(post(server, {"query": query, "documents": DOCS[:2], "top_n": 10}).json()["results"]) == 2
        cards = httpx.get(server.url + "/v1/models").json()["data"]
        assert [c["id"] for c in cards] == ["tiny", "tiny-ce"] and cards[1]["type"] == "reranker"


BAD = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b'{"query": "q", "documents": ["a"], "query": "other"}', 400, "invalid_json"),  # a field given twice
    ({"documents": ["a"]}, 400, "missing_input"),
    ({"query": 3, "documents": ["a"]}, 400, "invalid_input"),
    ({"query": "", "documents": ["a"]}, 400, "empty_input"),
    ({"query": "q"}, 400, "missing_input"),
    ({"query": "q", "documents": "a"}, 400, "invalid_input"),
    ({"query": "q", "documents": []}, 400, "empty_input"),
    ({"query": "q", "documents": ["a", 7]}, 400, "invalid_input"),
    ({"query": "q", "documents": ["a", {"txt": "b"}]}, 400, "invalid_input"),
    ({"query": "q", "documents": ["a", ""]}, 400, "empty_input"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "invalid_top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, 400, "invalid_top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, 400, "invalid_top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, 400, "invalid_return_documents"),
    ({"query": "q", "documents": ["a"], "model": "other"}, 400, "model_not_found"),
    ({"query": "q", "documents": ["a"] * 5}, 413, "too_many_inputs"),
    ({"query": "q", "documents": ["x" * 3000]}, 413, "payload_too_large"),
]


def test_every_bad_rerank_request_is_refused(make_embedder, ce_folder):
    limits = Limits(max_inputs=4, max_request_bytes=2048)
    with serving(make_embedder("bert"), load_reranker(str(ce_folder)), limits=limits) as (server, _):
        for body, status, code in BAD:
            if isinstance(body, bytes):
                response = httpx.post(server.url + "/v1/rerank", content=body, timeout=30)
            else:
                response = post(server, body)
            assert_error(response, status, code)
        assert post(server, {"query": "q", "documents": ["a"]}).status_code == 200  # still serving
        metrics = httpx.get(server.url + "/metrics").text
        assert 'lmembed_requests_total{endpoint="/v1/rerank",status="413"} 2.0' in metrics
        assert 'lmembed_errors_total{code="invalid_top_n",status="400"} 3.0' in metrics
        assert "lmembed_reranked_pairs_total" in metrics and "lmembed_rerank_batch_pairs_bucket" in metrics
    with serving(make_embedder("bert")) as (server, _):
        assert_error(post(server, {"query": "q", "documents": ["a"]}), 404, "no_reranker")
        assert_error(post(server, {"query": "q", "rerank": True}, "/v1/search"), 404, "no_index")


def test_concurrent_rerank_requests_share_passes_and_429_beyond_the_limit(make_embedder, ce_folder):
    limits = Limits(max_concurrent_requests=3)
    with serving(make_embedder("bert"), load_reranker(str(ce_folder)), limits=limits) as (server, state):
        batcher = state.rerank.batcher
        forward, gate, entered = batcher._forward, threading.Event(), threading.Event()

        def held(pairs, instruction, features):
            entered.set()
            gate.wait(30)
            return forward(pairs, instruction, features)

        batcher._forward = held
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(post, server, {"query": "cat", "documents": DOCS[:2]})
            entered.wait(30)
            waiting = [pool.submit(post, server, {"query": q, "documents": DOCS[2:]}) for q in ("gene", "horse")]
            deadline = time.monotonic() + 30
            while batcher.waiting < 12:  # both requests' pairs queued behind the held pass
                assert time.monotonic() < deadline
                time.sleep(0.005)
            assert_error(
                post(server, {"query": "one too many", "documents": ["a"]}), 429, "too_many_concurrent_requests"
            )
            passes = batcher.passes
            gate.set()
            responses = [f.result() for f in (first, *waiting)]
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert batcher.passes == passes + 2  # the held pass, then one pass for both waiting requests
        reranker = load_reranker(str(ce_folder))
        for query, response in zip(("gene", "horse"), responses[1:], strict=True):
            expected = reranker.score(query, DOCS[2:])
            got = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
            np.testing.assert_allclose([got[i] for i in range(6)], expected, atol=1e-5)


def test_search_by_bm25_hybrid_and_reranked(make_embedder, ce_folder, tmp_path):
    embedder = make_embedder("bert")
    index = Index.build(embedder, [(f"d{i}", t) for i, t in enumerate(DOCS)], tmp_path / "idx")
    queries = ["cat on a mat", "protein cell"]
    with serving(embedder, load_reranker(str(ce_folder)), index=index) as (server, _):
        for body, expected in [
            ({"mode": "bm25", "k": 3}, index.search_batch(queries, 3, mode="bm25")),
            (
                {"mode": "hybrid", "fusion": "minmax", "k": 4},
                index.search_batch(queries, 4, mode="hybrid", fusion="minmax"),
            ),
            (
                {"mode": "hybrid", "rerank": True, "rerank_top_k": 6, "k": 3},
                rerank_hits(load_reranker(str(ce_folder)), queries, index.search_batch(queries, 6, mode="hybrid"), 3),
            ),
        ]:
            data = post(server, {"query": queries, **body}, "/v1/search").json()["data"]
            for got, hits in zip(data, expected, strict=True):
                assert [h["id"] for h in got["hits"]] == [h.id for h in hits]
                np.testing.assert_allclose([h["score"] for h in got["hits"]], [h.score for h in hits], atol=1e-5)
        for body, code in [
            ({"mode": "sparse"}, "invalid_mode"),
            ({"fusion": "max"}, "invalid_fusion"),
            ({"rerank": "yes"}, "invalid_rerank"),
            ({"rerank": True, "rerank_top_k": 0}, "invalid_rerank_top_k"),
        ]:
            assert_error(post(server, {"query": "cat", **body}, "/v1/search"), 400, code)


def test_rerank_passes_are_scheduled_with_the_servers_wait_and_window_share(make_embedder, ce_folder):
    """--batch-wait-ms, --window-share and --workers reach the reranker's batcher, not only the embeddings'."""
    limits = Limits(batch_wait_s=0.02, window_share=0.5, workers=3)
    app = create_app(make_embedder("bert"), reranker=load_reranker(str(ce_folder)), limits=limits)
    state = app.state.lmembed
    for batcher in (state.batcher, state.rerank.batcher):
        assert (batcher.max_wait_s, batcher.window_share, batcher.workers) == (0.02, 0.5, 3)
