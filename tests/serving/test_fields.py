"""Request fields on a live server on 127.0.0.1, in every dialect: a field a route does not take is a 400
``unknown_field`` naming it (a misspelt ``top_n`` must not answer every document without a word), while every field
of the dialect's official API is accepted; a refusal names the field at fault (TEI's ``texts``, the similarity
request's ``inputs.source_sentence``, the request's ``instruction``); a compressed body is a 415."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

from helpers import TOY_DOCS, save_tiny_cross_encoder
from lmembed.index import Index
from lmembed.rerank import load_reranker
from lmembed.serving.limits import Limits
from test_hostile import ROUTES, error_of, serving

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a valid body of every route that reads one, with every field its dialect's API defines (or lmembed adds)
FULL_BODIES = {
    "/v1/embeddings": {
        "input": ["cat"],
        "model": "tiny",
        "encoding_format": "float",
        "dimensions": 8,
        "user": "u",
        "input_type": "query",
        "instruction": "Find",
    },
    "/v1/search": {
        "query": "cat",
        "k": 2,
        "model": "tiny",
        "instruction": "Find",
        "mode": "hybrid",
        "fusion": "rrf",
        "rerank": True,
        "rerank_top_k": 3,
    },
    "/v1/rerank": {
        "model": "tiny-ce",
        "query": "cat",
        "documents": ["a cat", "a dog"],
        "top_n": 1,
        "return_documents": True,
    },
    "/v2/embed": {
        "texts": ["cat"],
        "model": "tiny",
        "input_type": "search_query",
        "embedding_types": ["float"],
        "output_dimension": 8,
        "truncate": "END",
        "max_tokens": 100_000,
        "priority": 0,
    },
    "/v2/rerank": {
        "model": "tiny-ce",
        "query": "cat",
        "documents": ["a cat", "a dog"],
        "top_n": 1,
        "return_documents": True,
        "max_tokens_per_doc": 100_000,
        "priority": 0,
    },
    "/embed": {
        "inputs": ["cat"],
        "normalize": True,
        "truncate": True,
        "truncation_direction": "Right",
        "prompt_name": "query",
        "dimensions": 8,
        "encoding_format": "float",
    },
    "/embed_all": {"inputs": ["cat"], "truncate": True, "truncation_direction": "Right", "prompt_name": "query"},
    "/": {"inputs": "cat", "normalize": False},
    "/rerank": {
        "query": "cat",
        "texts": ["a cat", "a dog"],
        "truncate": True,
        "raw_scores": False,
        "return_text": True,
        "truncation_direction": "Right",
    },
    "/similarity": {
        "inputs": {"source_sentence": "cat", "sentences": ["a cat"]},
        "prompt_name": "query",
        "truncate": True,
        "truncation_direction": "Right",
        "parameters": {},
    },
    "/tokenize": {"inputs": ["cat"], "add_special_tokens": True},
    "/decode": {"ids": [1, 2], "skip_special_tokens": True},
}


@pytest.fixture(scope="module")
def ce_folder(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", seed=3)


@pytest.fixture
def index(make_embedder, tmp_path):
    emb = make_embedder("bert")
    Index.build(emb, [(str(i), d) for i, d in enumerate(TOY_DOCS)], tmp_path / "index", kind="flat")
    return emb, Index.open(tmp_path / "index")


def test_every_route_takes_its_dialects_fields_and_refuses_another_by_name(index, ce_folder):
    emb, idx = index
    assert set(FULL_BODIES) == set(ROUTES)
    with serving(emb, index=idx, reranker=load_reranker(str(ce_folder))) as (server, _):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for route, body in FULL_BODIES.items():
                assert client.post(route, json=body).status_code == 200, (route, client.post(route, json=body).text)
                error = error_of(client.post(route, json={**body, "foo": 1}), 400)
                assert (error["code"], error["param"]) == ("unknown_field", "foo"), (route, error)
                assert "'foo' is not a field of" in error["message"], (route, error)
            for route, body, wrong in (
                ("/v1/rerank", {"query": "cat", "documents": ["a", "b"], "top_k": 1}, "top_k"),  # Jina's top_n misspelt
                ("/v1/search", {"query": "cat", "kk": 1}, "kk"),
                ("/v2/rerank", {"query": "cat", "documents": ["a", "b"], "topn": 1}, "topn"),
                ("/rerank", {"query": "cat", "texts": ["a", "b"], "return_texts": True}, "return_texts"),
                ("/tokenize", {"inputs": "cat", "add_special_token": False}, "add_special_token"),
                ("/decode", {"ids": [1], "skip_special": False}, "skip_special"),
            ):
                error = error_of(client.post(route, json=body), 400)
                assert (error["code"], error["param"]) == ("unknown_field", wrong), (route, error)
        assert "internal_error" not in httpx.get(server.url + "/metrics").text


def test_tei_rerank_refusals_name_texts(make_embedder, ce_folder):
    limits = Limits(max_inputs=4)
    with serving(make_embedder("bert"), reranker=load_reranker(str(ce_folder)), limits=limits) as (server, _):
        for texts, status, param, words in (
            ([], 400, "texts", "'texts' is an empty list"),
            (["a", 5], 400, "texts", "'texts[1]' is int"),
            (["a", ""], 400, "texts", "'texts[1]' is an empty string"),
            ("a", 400, "texts", "'texts' must be a list"),
            (["a"] * 5, 413, "texts", "'texts' has 5 items"),
        ):
            response = httpx.post(server.url + "/rerank", json={"query": "q", "texts": texts}, timeout=30)
            error = error_of(response, status)
            assert error["param"] == param and words in error["message"], error
            assert "documents" not in error["message"], error


def test_a_refusal_names_the_field_at_fault_not_the_texts(index):
    emb, idx = index
    long = "word " * 3000
    with serving(emb, index=idx, limits=Limits(truncate=False)) as (server, _):
        post = httpx.Client(base_url=server.url, timeout=60).post
        for inputs, name, param in (
            ({"source_sentence": long, "sentences": ["a"]}, "inputs.source_sentence", "inputs.source_sentence"),
            ({"source_sentence": "a", "sentences": ["b", long]}, "inputs.sentences[1]", "inputs.sentences"),
        ):
            for route in ("/similarity", "/"):
                error = error_of(post(route, json={"inputs": inputs}), 400)
                assert (error["code"], error["param"]) == ("input_too_long", param), (route, error)
                assert error["message"].startswith(f"'{name}' is "), error
        error = error_of(post("/v1/embeddings", json={"input": ["a", long]}), 400)
        assert (error["code"], error["param"]) == ("input_too_long", "input") and "'input[1]'" in error["message"]


def test_an_instruction_that_leaves_no_room_is_named(index):
    emb, idx = index
    long = "word " * 3000
    with serving(emb, index=idx) as (server, _):
        post = httpx.Client(base_url=server.url, timeout=60).post
        for route, body in (
            ("/v1/embeddings", {"input": ["a"], "input_type": "query", "instruction": long}),
            ("/v1/embeddings", {"input": ["a"], "instruction": long}),
            ("/v1/search", {"query": "a", "instruction": long}),
        ):
            error = error_of(post(route, json=body), 400)
            assert (error["code"], error["param"]) == ("instruction_too_long", "instruction"), (route, error)
            assert error["message"].startswith("'instruction' is too long"), error


def test_a_compressed_body_is_a_415_naming_content_encoding(make_embedder):
    body = json.dumps({"input": ["cat"]}).encode()
    with serving(make_embedder("bert")) as (server, _):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for route, payload in (("/v1/embeddings", body), ("/embed", json.dumps({"inputs": "cat"}).encode())):
                for coding in ("gzip", "br", "deflate, gzip"):
                    sent = gzip.compress(payload) if coding == "gzip" else payload
                    headers = {"content-type": "application/json", "content-encoding": coding}
                    error = error_of(client.post(route, content=sent, headers=headers), 415)
                    assert (error["code"], error["param"]) == ("unsupported_content_encoding", "content-encoding")
                    assert "content-encoding" in error["message"] and coding in error["message"], error
            # the connection stays usable, and identity is no encoding
            plain = {"content-type": "application/json", "content-encoding": "identity"}
            assert client.post("/v1/embeddings", content=body, headers=plain).status_code == 200
        assert "invalid_json" not in httpx.get(server.url + "/metrics").text
