"""Hostile traffic on a live server on 127.0.0.1: deeply nested JSON is a 400 naming the depth limit on every route
(never a 500 RecursionError), rerank pairs and search queries count against ``--max-tokens-in-flight`` (413 for pairs
over it alone, naming the flag), ``/metrics`` needs the API key unless opened with ``public_metrics``, and
the idle server trims its heap after large requests."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from helpers import TOY_DOCS, save_tiny_cross_encoder
from lmembed.index import Index
from lmembed.rerank import load_reranker
from lmembed.serving.app import create_app
from lmembed.serving.errors import COHERE_ROUTES, TEI_ROUTES
from lmembed.serving.limits import ENDPOINTS, Limits
from lmembed.serving.schemas import MAX_JSON_DEPTH, json_depth_over
from lmembed.serving.server import BackgroundServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROUTES = [
    "/v1/embeddings",
    "/v1/search",
    "/v1/rerank",
    "/v2/embed",
    "/v2/rerank",
    "/embed",
    "/embed_all",
    "/",
    "/rerank",
    "/similarity",
    "/tokenize",
    "/decode",
]


@pytest.fixture(scope="module")
def ce_folder(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", seed=3)


@contextmanager
def serving(embedder, **kwargs) -> Iterator[tuple[BackgroundServer, object]]:
    app = create_app(embedder, model_name="tiny", reranker_name="tiny-ce", **kwargs)
    with BackgroundServer(app) as server:
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not warm up"
            time.sleep(0.01)
        yield server, app.state.lmembed


def error_of(response: httpx.Response, status: int) -> dict:
    """The refusal's message, code and param, read from the error shape of the dialect its route speaks."""
    assert response.status_code == status, response.text
    body, path = response.json(), response.request.url.path
    if path in TEI_ROUTES:
        assert set(body) <= {"error", "error_type", "code", "param"} and isinstance(body["error"], str), body
        return {**body, "message": body["error"]}
    if path in COHERE_ROUTES:
        assert set(body) <= {"message", "code", "param"}, body
        return body
    return body["error"]


def test_depth_scan_counts_brackets_outside_strings_only():
    assert json_depth_over(b"[" * 100_000)
    texts = {"query": "[[[[" * 50, "documents": ["{" * 500, 'a \\" [[[[[[[[' * 20, "\\\\" + "[" * 40]}
    assert not json_depth_over(json.dumps(texts).encode())
    nested: object = ["x"]
    for _ in range(MAX_JSON_DEPTH - 1):
        nested = [nested]
    assert not json_depth_over(json.dumps(nested).encode())
    assert json_depth_over(json.dumps([nested]).encode())
    # an escaped backslash closes the string: the brackets after it count
    assert json_depth_over(b'{"q": "\\\\", "x": ' + b"[" * 40 + b"]" * 40 + b"}")


def test_nested_json_and_endless_integers_are_a_400_on_every_route(make_embedder, ce_folder, tmp_path):
    emb = make_embedder("bert")
    Index.build(emb, [(str(i), d) for i, d in enumerate(TOY_DOCS)], tmp_path / "index", kind="flat")
    index = Index.open(tmp_path / "index")
    with serving(emb, index=index, reranker=load_reranker(str(ce_folder))) as (server, _):
        posted = {route.path for route in create_app(emb).routes if "POST" in getattr(route, "methods", ())}
        assert posted == set(ROUTES) and posted <= ENDPOINTS  # every route that reads a body, each its own metric label
        hostile = b"[" * 100_000
        for route in ROUTES:
            error = error_of(httpx.post(server.url + route, content=hostile, timeout=30), 400)
            assert error["code"] == "json_too_deep" and f"deeper than {MAX_JSON_DEPTH} levels" in error["message"]
        long_integer = b'{"input": "x", "dimensions": ' + b"1" * 5000 + b"}"  # past Python's int() digit limit
        for route in ROUTES:
            error = error_of(httpx.post(server.url + route, content=long_integer, timeout=30), 400)
            assert error["code"] == "invalid_json" and "more than 4300 digits" in error["message"], (route, error)
        metrics = httpx.get(server.url + "/metrics").text
        assert f'code="json_too_deep",status="400"}} {len(ROUTES)}.0' in metrics and "internal_error" not in metrics
        ok = httpx.post(server.url + "/v1/search", json={"query": "cat", "k": 2, "rerank": True}, timeout=30)
        assert ok.status_code == 200  # still serving


def test_rerank_pairs_and_search_queries_count_against_the_token_budget(make_embedder, ce_folder, tmp_path):
    emb = make_embedder("bert")
    docs = [(str(i), " ".join(["protein gene cell study"] * 8) + f" {i}") for i in range(40)]
    Index.build(emb, docs, tmp_path / "index", kind="flat")
    limits = Limits(max_tokens_in_flight=400)
    kwargs = {"index": Index.open(tmp_path / "index"), "reranker": load_reranker(str(ce_folder)), "limits": limits}
    with serving(emb, **kwargs) as (server, state):
        long_docs = [doc for _, doc in docs]
        for route, body in [
            ("/v1/rerank", {"query": "gene", "documents": long_docs}),
            ("/v2/rerank", {"query": "gene", "documents": long_docs}),
            ("/rerank", {"query": "gene", "texts": long_docs}),
            ("/v1/search", {"query": "gene", "k": 2, "rerank": True, "rerank_top_k": 40}),
        ]:
            error = error_of(httpx.post(server.url + route, json=body, timeout=30), 413)
            assert error["code"] == "too_many_tokens", route
            assert "limit of 400 tokens in flight (--max-tokens-in-flight)" in error["message"], route
        assert state.admission.in_flight == 0  # every refusal released what it held
        # texts to embed (and search queries) are bounded by --max-inputs: over the limit, alone, they still pass
        assert httpx.post(server.url + "/v1/embeddings", json={"input": long_docs}, timeout=30).status_code == 200
        small = {"query": "gene", "documents": long_docs[:3]}
        assert httpx.post(server.url + "/v1/rerank", json=small, timeout=30).status_code == 200
        reranked = {"query": "gene", "k": 2, "rerank": True, "rerank_top_k": 3}
        assert httpx.post(server.url + "/v1/search", json=reranked, timeout=30).status_code == 200


def test_metrics_need_the_api_key_unless_opened(make_embedder):
    emb = make_embedder("bert")
    with serving(emb, limits=Limits(api_key="s3cret")) as (server, _):
        error = error_of(httpx.get(server.url + "/metrics"), 401)
        assert error["code"] == "invalid_api_key"
        assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
        scraped = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer s3cret"})
        assert scraped.status_code == 200 and 'lmembed_requests_total{endpoint="/metrics",status="401"} 2.0' in (
            scraped.text
        )
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key
        assert httpx.post(server.url + "/embed", json={"inputs": "x"}).status_code == 401  # nor do TEI routes skip it
    with serving(emb, limits=Limits(api_key="s3cret", public_metrics=True)) as (server, _):
        assert httpx.get(server.url + "/metrics").status_code == 200
        assert httpx.post(server.url + "/v2/embed", json={"texts": ["x"]}).status_code == 401
    with serving(emb) as (server, _):
        assert httpx.get(server.url + "/metrics").status_code == 200  # no key: open, as before


def test_the_idle_server_trims_its_heap_after_large_requests(make_embedder):
    emb = make_embedder("bert")
    with serving(emb) as (server, state):
        trimmer = state.trimmer
        if not trimmer.available:
            pytest.skip("no malloc_trim in this C library")
        trimmer.threshold, trimmer.min_interval_s = 100, 0.0
        before = trimmer.trims
        assert httpx.post(server.url + "/v1/embeddings", json={"input": ["a cat"]}).status_code == 200
        time.sleep(0.2)
        assert trimmer.trims == before  # a few tokens: no trim
        texts = [" ".join(["protein gene cell"] * 20)] * 8
        assert httpx.post(server.url + "/v1/embeddings", json={"input": texts}).status_code == 200
        deadline = time.monotonic() + 10
        while trimmer.trims == before:
            assert time.monotonic() < deadline, "no trim after a large request"
            time.sleep(0.01)


def test_a_long_query_is_cut_to_what_a_pair_keeps_with_the_same_features(ce_folder):
    from prometheus_client import CollectorRegistry

    from lmembed.serving.rerank import RerankService

    reranker = load_reranker(str(ce_folder))
    service = RerankService(reranker, "ce", max_batch_tokens=4096, registry=CollectorRegistry())
    try:
        query = "protein folding, gene expression in the cell " * 2000
        cut = service.bounded_query(query)
        assert len(cut) < len(query) // 10
        pairs = [(query, doc) for doc in TOY_DOCS]
        assert service._encode(pairs) == reranker.encode_pairs(pairs)
        assert service.bounded_query("short query") == "short query"
    finally:
        service.executor.shutdown()


def test_a_cut_query_stays_the_longer_side_of_a_pair_with_a_long_document(tmp_path):
    """Cut to ``max_length + 8`` tokens, a long query became shorter than a long document, and truncation (longest
    first, the longer side losing tokens first and keeping the odd one of an odd budget) gave that token to the
    document: served scores 0.004 off the in-process reranker's. The cut keeps the query longer than its longest
    document now. A BERT template ([CLS] q [SEP] d [SEP]) makes the budget odd (max_length - 3)."""
    from prometheus_client import CollectorRegistry
    from transformers import AutoTokenizer, BertForSequenceClassification

    from conftest import bundled_or_skip, tiny_bert_config
    from lmembed.models.bundled import resolve_bundled
    from lmembed.serving.rerank import RerankService

    tokenizer = AutoTokenizer.from_pretrained(resolve_bundled(bundled_or_skip("minilm")))  # WordPiece, BERT template
    folder = tmp_path / "ce"
    BertForSequenceClassification(tiny_bert_config(len(tokenizer), num_labels=1)).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    reranker = load_reranker(str(folder))
    assert (reranker.max_length - 3) % 2 == 1
    service = RerankService(reranker, "ce", max_batch_tokens=8192, registry=CollectorRegistry())
    try:
        query = "protein folding, gene expression in the cell " * 400
        pairs = [(query, " ".join(["gene cell protein"] * n)) for n in (60, 90, 400)]
        assert service._encode(pairs) == reranker.encode_pairs(pairs)
    finally:
        service.executor.shutdown()


#: a field that takes one of a few names, with values that are not one: each ended in a 500 (a list or an object:
#: unhashable) or was taken for the default (false, 0, "") before
NOT_A_CHOICE = [
    ("/v2/embed", {"texts": ["x"]}, "input_type", [["search_query"], {}, [], 0]),
    ("/v2/embed", {"texts": ["x"]}, "embedding_types", [False, 0, "", {}, [], [1], [["float"]], ["float", None]]),
    ("/v2/embed", {"texts": ["x"]}, "truncate", [[], {}, 1, "START"]),
    ("/v2/embed", {"texts": ["x"]}, "priority", [["a"], {"a": 1}, "high", -5, 1.5, True]),  # Cohere: an integer
    ("/embed", {"inputs": "x"}, "prompt_name", [["query"], {}, 1, ""]),
    ("/embed_all", {"inputs": "x"}, "prompt_name", [["query"], {}, 1, ""]),
    ("/embed_all", {"inputs": "x"}, "truncate", [[], {}, 1, "yes"]),
    ("/", {"inputs": "x"}, "prompt_name", [["query"]]),
]


def test_a_field_of_names_takes_exactly_one_of_them_in_every_dialect(make_embedder, tmp_path):
    emb = make_embedder("bert")
    Index.build(emb, [(str(i), d) for i, d in enumerate(TOY_DOCS)], tmp_path / "index", kind="flat")
    with serving(emb, index=Index.open(tmp_path / "index")) as (server, _):
        for route, body, field, values in NOT_A_CHOICE:
            for value in values:
                response = httpx.post(server.url + route, json={**body, field: value}, timeout=30)
                error = error_of(response, 400)
                assert error["param"] == field, (route, field, value, error)
        for body, param in (
            ({"query": "cat", "k": 2, "top_k": 3}, "top_k"),
            ({"query": "cat", "input": "dog"}, "input"),
            ({"query": "cat", "top_k": "x"}, "top_k"),
            ({"query": "cat", "top_k": -1}, "top_k"),
        ):
            assert error_of(httpx.post(server.url + "/v1/search", json=body, timeout=30), 400)["param"] == param
        ok = httpx.post(server.url + "/v1/search", json={"query": "cat", "top_k": 2}, timeout=30)
        assert ok.status_code == 200 and len(ok.json()["data"][0]["hits"]) == 2, ok.json()
        for route, body in (
            ("/v2/embed", {"texts": ["x"], "truncate": None}),
            ("/v2/embed", {"texts": ["x"], "priority": 3}),
            ("/embed", {"inputs": "x"}),
        ):
            assert httpx.post(server.url + route, json=body, timeout=30).status_code == 200
        assert "internal_error" not in httpx.get(server.url + "/metrics").text


def test_reading_routes_answer_head_and_one_model_card_by_name(make_embedder, ce_folder):
    openai = pytest.importorskip("openai")
    emb = make_embedder("bert")
    with serving(emb, reranker=load_reranker(str(ce_folder)), aliases=("text-embedding-3-small",)) as (server, _):
        for path in ("/health", "/info", "/metrics", "/v1/models", "/v1/models/tiny"):
            got = httpx.head(server.url + path, timeout=30)
            assert got.status_code == 200 and got.content == b"", path
        assert httpx.get(server.url + "/v1/models/tiny").json()["dimensions"] == emb.dim
        assert httpx.get(server.url + "/v1/models/tiny-ce").json()["type"] == "reranker"
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve("text-embedding-3-small").id == "tiny"  # an alias answers with the card
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-4")
        assert missing.value.body["code"] == "model_not_found" and "tiny" in missing.value.body["message"]
        refused = httpx.post(server.url + "/health", timeout=30)
        assert refused.status_code == 405 and set(refused.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_a_sparse_query_is_refused_instead_of_tokenised_with_every_document(ce_folder):
    """A 3.5 MB run of one character is a single BERT token: no cut shortens it, so each pair tokenised all of it
    again (1.3 s a document; one such request held the reranker's tokenizer for 22 s at 16 documents)."""
    from prometheus_client import CollectorRegistry

    from lmembed.serving.errors import ApiError
    from lmembed.serving.rerank import SPARSE_QUERY_CHARS, RerankService

    reranker = load_reranker(str(ce_folder))
    service = RerankService(reranker, "ce", max_batch_tokens=4096, registry=CollectorRegistry())
    try:
        keep = reranker.max_length + 8
        sparse = "1" * (keep * SPARSE_QUERY_CHARS + 1)
        with pytest.raises(ApiError) as refused:
            service._encode([(sparse, doc) for doc in TOY_DOCS])
        assert refused.value.status == 400 and refused.value.code == "query_too_sparse"
        assert refused.value.param == "query" and f"{len(sparse)} characters" in refused.value.message
        just_under = "1" * (keep * SPARSE_QUERY_CHARS)
        assert service.bounded_query(just_under) == just_under
    finally:
        service.executor.shutdown()


def test_copies_of_one_document_tie_and_keep_their_order_across_passes(make_embedder, ce_folder):
    """Copies split over passes of different shapes were scored a rounding apart (a MiniLM cross-encoder: 0.36095947
    and 0.36095950), so ties broke out of order: a pair is now scored once however often a request gives it."""
    documents = ["protein folding in the cell"] * 60

    def pairs_scored() -> float:
        metrics = httpx.get(server.url + "/metrics").text
        return float(re.search(r"^lmembed_reranked_pairs_total (\S+)$", metrics, re.M).group(1))

    limits = Limits(max_batch_tokens=64)
    with serving(make_embedder("bert"), reranker=load_reranker(str(ce_folder)), limits=limits) as (server, _):
        for route, body in [
            ("/v1/rerank", {"query": "protein", "documents": documents}),
            ("/v2/rerank", {"query": "protein", "documents": documents}),
            ("/rerank", {"query": "protein", "texts": documents}),
        ]:
            before = pairs_scored()
            answer = httpx.post(server.url + route, json=body, timeout=60).json()
            assert pairs_scored() - before == 1, route
            results = answer if isinstance(answer, list) else answer["results"]
            scores = {r.get("relevance_score", r.get("score")) for r in results}
            assert len(scores) == 1, (route, scores)
            assert [r["index"] for r in results] == list(range(60)), route


def test_a_client_that_hangs_up_mid_body_is_a_499_and_search_counts_its_tokens(make_embedder, tmp_path):
    import socket

    emb = make_embedder("bert")
    Index.build(emb, [(str(i), doc) for i, doc in enumerate(TOY_DOCS)], tmp_path / "index", kind="flat")
    with serving(emb, index=Index.open(tmp_path / "index")) as (server, _):
        host, port = server.url.removeprefix("http://").split(":")
        body = b'{"input": ["hello world", "' + b"x" * 500 + b'"]}'
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body[:40])
            time.sleep(0.2)
        searched = httpx.post(server.url + "/v1/search", json={"query": "protein folding", "k": 2}, timeout=30)
        tokens = searched.json()["usage"]["prompt_tokens"]
        deadline = time.monotonic() + 10
        while 'status="499"' not in (metrics := httpx.get(server.url + "/metrics").text):
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
    assert 'lmembed_requests_total{endpoint="/v1/embeddings",status="499"} 1.0' in metrics
    assert 'status="500"' not in metrics
    assert tokens > 0 and f"lmembed_prompt_tokens_total {tokens}.0" in metrics, [
        line for line in metrics.splitlines() if "prompt_tokens_total " in line
    ]


def test_every_route_has_its_own_metric_label_and_every_label_a_route(make_embedder):
    """Route paths are written in the app's decorators and again in ``limits.ENDPOINTS`` (the metric labels) and the
    dialect sets of ``errors``: a route added in one place only would be counted as "other" or answer in the wrong
    error shape."""
    app = create_app(make_embedder("bert"))
    fastapi_own = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    routed = {route.path for route in app.routes if getattr(route, "methods", None) and "{" not in route.path}
    routed -= fastapi_own  # its schema and documentation pages
    assert routed == set(ENDPOINTS), routed ^ set(ENDPOINTS)
    assert routed >= TEI_ROUTES | COHERE_ROUTES
