"""lmembed.serving: a real server on a free loopback port, spoken to with the official `openai` client and
httpx. Served vectors against Embedder.encode (bit for bit), every limit's status code and JSON error,
shared forward passes, health/metrics, search, graceful shutdown, and `lmembed serve` as a process."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from openai import OpenAI

from conftest import REPO, WORDS, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.inputs import InputBuilder
from lmembed.index import Index, IndexMismatchError
from lmembed.serving.app import create_app
from lmembed.serving.limits import Limits
from lmembed.serving.server import BackgroundServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MIXED = [
    "hello",
    "the cat sat on the mat",
    "a man was riding a horse and a woman was eating food on the rug with the dog",
    "gene",
    "the study of protein and cell and gene gave a longer result than the first one",
]


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.005)


@contextmanager
def serving(embedder: Embedder, *, ready: bool = True, **kwargs) -> Iterator[tuple[BackgroundServer, object]]:
    """A started server (warmed up unless ``ready=False``) and its app state."""
    app = create_app(embedder, model_name=kwargs.pop("model_name", "tiny"), **kwargs)
    state = app.state.lmembed
    with BackgroundServer(app) as server:
        if ready:
            wait_until(lambda: httpx.get(server.url + "/health").status_code == 200)
        yield server, state


class Gate(threading.Event):
    """Set it to let forward passes run; ``entered`` is set once a pass is waiting at the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()


@contextmanager
def gated(state) -> Iterator[Gate]:
    """Hold every forward pass until the gate is set (to line requests up deterministically)."""
    gate = Gate()
    forward = state.batcher._forward

    def held(texts, instruction, features):
        gate.entered.set()
        gate.wait(30)
        return forward(texts, instruction, features)

    state.batcher._forward = held
    try:
        yield gate
    finally:
        gate.set()
        state.batcher._forward = forward


@contextmanager
def recorded(state) -> Iterator[list[tuple[list[str], str | None]]]:
    """Record the texts and instruction of every forward pass the server runs."""
    passes: list[tuple[list[str], str | None]] = []
    forward = state.batcher._forward

    def record(texts, instruction, features):
        passes.append((list(texts), instruction))
        return forward(texts, instruction, features)

    state.batcher._forward = record
    try:
        yield passes
    finally:
        state.batcher._forward = forward


def as_in_passes(emb: Embedder, passes, texts: list[str], instruction: str | None = None) -> np.ndarray:
    """What Embedder.encode gives each text when called on the texts of the pass it was served from."""
    found = {}
    for pass_texts, pass_instruction in passes:
        if pass_instruction == instruction:
            vectors = emb.encode(pass_texts, batch_size=len(pass_texts), instruction=instruction)
            found.update(zip(pass_texts, vectors, strict=True))
    return np.stack([found[t] for t in texts])


def vectors_of(response: dict) -> np.ndarray:
    rows = sorted(response["data"], key=lambda d: d["index"])
    if isinstance(rows[0]["embedding"], str):
        return np.stack([np.frombuffer(base64.b64decode(r["embedding"]), dtype="<f4") for r in rows])
    return np.asarray([r["embedding"] for r in rows], dtype=np.float32)


def post(server: BackgroundServer, body, path: str = "/v1/embeddings", **kwargs) -> httpx.Response:
    """POST ``body`` as JSON (or as it is, when it is bytes already)."""
    payload = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(server.url + path, timeout=30, **payload, **kwargs)


def token_count(emb: Embedder, texts: list[str], instruction: str | None = None) -> int:
    builder = InputBuilder(emb.backbone.tokenizer, emb.config, is_decoder=emb.backbone.is_decoder, max_length=128)
    return sum(len(builder.build(t, instruction)) for t in texts)


def floats(result) -> np.ndarray:
    return np.asarray([d.embedding for d in result.data], dtype=np.float32)


# ---------------------------------------------------------------------------------------------- vectors
SIMILAR = ["the cat sat on the mat", "a dog was on the rug", "the man was eating food", "hello there my friend"]


@pytest.mark.parametrize(("family", "strategy"), [("bert", {}), ("llama", {"pooling": "last"}), ("qwen2", {})])
def test_openai_client_gets_the_vectors_of_embedder_encode(make_embedder, family, strategy):
    """A request of texts of similar lengths is one pass: Embedder.encode of the request, bit for bit. Texts of
    very different lengths go to different passes: each vector is Embedder.encode of its pass's texts, bit for
    bit, and within float rounding of Embedder.encode of the request (kernels are not batch-invariant)."""
    emb = make_embedder(family, **strategy)
    with serving(emb) as (server, state), recorded(state) as passes:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        alike = client.embeddings.create(model="tiny", input=SIMILAR, encoding_format="float")
        assert len(passes) == 1 and np.array_equal(floats(alike), emb.encode(SIMILAR))
        for options in ({}, {"encoding_format": "float"}):  # by default the client asks for base64 and decodes it
            first = len(passes)
            result = client.embeddings.create(model="tiny", input=MIXED, **options)
            assert np.array_equal(floats(result), as_in_passes(emb, passes[first:], MIXED))
            np.testing.assert_allclose(floats(result), emb.encode(MIXED), atol=1e-6)
            assert [d.index for d in result.data] == list(range(len(MIXED)))
            assert result.model == "tiny"
            assert result.usage.prompt_tokens == result.usage.total_tokens == token_count(emb, MIXED)
        raw = post(server, {"model": "tiny", "input": SIMILAR, "encoding_format": "base64"}).json()
        assert np.array_equal(vectors_of(raw), emb.encode(SIMILAR))

        short = client.embeddings.create(model="tiny", input=SIMILAR, dimensions=8, encoding_format="float")
        assert np.array_equal(floats(short), emb.with_config(emb.config.with_options(dim=8)).encode(SIMILAR))
        single = client.embeddings.create(model="tiny", input="the cat sat", encoding_format="float")
        assert np.array_equal(floats(single)[0], emb.encode(["the cat sat"])[0])
        assert [m.id for m in client.models.list().data] == ["tiny"]


@pytest.mark.parametrize(("family", "strategy"), [("bert", {}), ("llama", {"pooling": "last"})])
def test_two_workers_serve_the_vectors_of_embedder_encode(make_embedder, family, strategy):
    """Two forward workers (``--workers 2``), nine clients at once: every vector is Embedder.encode of its pass's
    texts, bit for bit (that passes run side by side is tests/serving/test_batcher.py's)."""
    emb = make_embedder(family, **strategy)
    texts = MIXED + SIMILAR[1:]  # nine different texts
    with serving(emb, limits=Limits(workers=2)) as (server, state), recorded(state) as passes:
        assert state.batcher.workers == 2
        warm = state.batcher.passes
        with ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(lambda t: post(server, {"model": "tiny", "input": [t]}), texts))
    assert [a.status_code for a in answers] == [200] * len(texts)
    served = np.stack([vectors_of(a.json())[0] for a in answers])
    assert np.array_equal(served, as_in_passes(emb, passes, texts))
    assert state.batcher.passes - warm == len(passes) >= 1


def test_a_pass_on_one_thread_of_a_worker_gives_the_bits_of_two_threads():
    """A worker's passes run on its share of torch's threads (one of two here); MiniLM's vectors are the same bits
    as on two threads, so served vectors stay those of Embedder.encode in a process that uses both."""
    import torch

    from conftest import bundled_or_skip
    from lmembed.serving.batcher import forward_workers

    emb = Embedder.from_pretrained(bundled_or_skip("minilm"), cache=False, show_progress=False)
    texts = [" ".join((WORDS * 6)[i : i + 40 + 30 * i]) for i in range(8)]  # 40 to 250 words
    torch.set_num_threads(2)  # the module's fixture restores one thread after the test
    two = emb.encode(texts, batch_size=len(texts))
    settings = forward_workers(2, "cpu")
    assert settings == {"workers": 2, "threads": 1}
    with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(settings["threads"],)) as pool:
        one, threads = pool.submit(lambda: (emb.encode(texts, batch_size=len(texts)), torch.get_num_threads())).result()
    assert threads == 1 and torch.get_num_threads() == 2
    assert np.array_equal(one, two)


def test_the_server_runs_the_embedders_own_backend(tokenizer, tmp_path, monkeypatch):
    """``serve --precision int8``: the server's passes run the Embedder's int8 ONNX backend, so a served vector is
    Embedder.encode's, bit for bit (the server used to build a torch float32 engine of its own, and served the
    float32 model's vectors under the int8 model's name)."""
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))  # the exported graph goes here
    model = tiny_model("bert", len(tokenizer))
    kwargs = {"use_cache": False, "show_progress": False}
    int8 = Embedder.from_model(model, tokenizer, precision="int8", threads=1, **kwargs)
    int8.calibrate([" ".join(WORDS[i : i + 8]) for i in range(24)])
    with serving(int8) as (server, state):
        assert state.engine.backend is int8.backend and state.batcher.workers == 1  # ORT has threads of its own
        served = vectors_of(post(server, {"model": "tiny", "input": SIMILAR}).json())
    assert np.array_equal(served, int8.encode(SIMILAR))
    float32 = Embedder.from_model(model, tokenizer, **kwargs).encode(SIMILAR)
    assert not np.array_equal(served, float32)  # what the server gave before (on this tiny model: within 1e-4)


def test_queries_get_their_instruction_and_documents_none(make_embedder):
    emb = make_embedder("llama", pooling="last", query_instruction="Given a question, find the answer")
    with serving(emb) as (server, _):
        queries = post(server, {"model": "tiny", "input": SIMILAR, "input_type": "query"}).json()
        assert np.array_equal(vectors_of(queries), emb.encode_queries(SIMILAR))
        custom = post(server, {"input": SIMILAR, "input_type": "query", "instruction": "Retrieve a passage"}).json()
        assert np.array_equal(vectors_of(custom), emb.encode_queries(SIMILAR, instruction="Retrieve a passage"))
        assert custom["usage"]["prompt_tokens"] == token_count(emb, SIMILAR, "Retrieve a passage")
        documents = post(server, {"input": SIMILAR, "input_type": "document"}).json()
        assert np.array_equal(vectors_of(documents), emb.encode_corpus(SIMILAR))
        plain = post(server, {"input": SIMILAR}).json()
        assert np.array_equal(vectors_of(plain), emb.encode(SIMILAR))
        assert not np.array_equal(vectors_of(queries), vectors_of(documents))


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_callers_share_forward_passes_and_keep_their_vectors(make_embedder, family):
    """Requests lined up behind a held pass share the next one (one per instruction). Each served vector is
    the vector Embedder.encode gives for the texts of that pass, bit for bit; against each text encoded alone
    it differs by float rounding at most (CPU matmul kernels are not batch-invariant)."""
    emb = make_embedder(family, pooling="last" if family == "llama" else "mean")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS[9:], size=n)) for n in rng.integers(10, 13, size=24)]
    requests = [texts[i : i + 3] for i in range(0, 12, 3)]  # 4 document requests of 3 texts
    queries = [texts[i : i + 4] for i in range(12, 24, 4)]  # 3 query requests of 4 texts
    with (
        serving(emb) as (server, state),
        recorded(state) as passes,
        gated(state) as gate,
        ThreadPoolExecutor(8) as pool,
    ):
        blocker = pool.submit(post, server, {"input": ["warm the gate"]})
        wait_until(gate.entered.is_set)  # the blocker's pass is running (held)
        futures = [pool.submit(post, server, {"input": r}) for r in requests]
        futures += [
            pool.submit(post, server, {"input": q, "input_type": "query", "instruction": "Find"}) for q in queries
        ]
        wait_until(lambda: state.batcher.waiting == 24)
        gate.set()
        results = [f.result() for f in futures]
        assert blocker.result().status_code == 200
    assert all(r.status_code == 200 for r in results)
    shared = passes[1:]  # after the blocker's: one pass per instruction, holding every request of it
    assert sorted((sorted(t), i) for t, i in shared) == sorted(
        [(sorted(texts[:12]), None), (sorted(texts[12:]), "Find")]
    )
    for sent, result in zip(requests + queries, results, strict=True):
        instruction = None if sent in requests else "Find"
        served = vectors_of(result.json())
        assert np.array_equal(served, as_in_passes(emb, shared, sent, instruction))
        alone = np.stack([emb.encode([t], instruction=instruction)[0] for t in sent])
        np.testing.assert_allclose(served, alone, atol=1e-5)


@pytest.mark.parametrize("truncate", [True, False])
def test_a_requests_texts_are_tokenised_once(make_embedder, monkeypatch, truncate):
    """The features built to count a request's tokens are what its forward pass runs on: each text goes
    through the input builder once (twice with --no-truncate, whose over-length check reads it untruncated),
    and the vectors are still Embedder.encode's of the pass."""
    emb = make_embedder("bert")
    texts = MIXED[:3]
    calls: list[tuple[str, ...]] = []
    build_all, build = InputBuilder.build_all, InputBuilder.build

    def counted_all(self, batch, instruction=None):
        calls.append(tuple(batch))
        return build_all(self, batch, instruction)

    def counted(self, text, instruction=None):
        calls.append((text,))
        return build(self, text, instruction)

    with serving(emb, limits=Limits(truncate=truncate)) as (server, state), recorded(state) as passes:
        monkeypatch.setattr(InputBuilder, "build_all", counted_all)
        monkeypatch.setattr(InputBuilder, "build", counted)
        response = post(server, {"input": texts})
        monkeypatch.undo()
    assert response.status_code == 200
    assert calls == [tuple(texts)] * (1 if truncate else 2)
    assert response.json()["usage"]["prompt_tokens"] == token_count(emb, texts)
    assert np.array_equal(vectors_of(response.json()), as_in_passes(emb, passes, texts))


def test_many_concurrent_clients(make_embedder):
    """A bounded load on loopback: 24 clients x 6 requests, all answered, in far fewer passes than requests,
    every vector the one Embedder.encode gives on its pass."""
    emb = make_embedder("bert")
    rng = np.random.default_rng(1)
    bodies = [{"input": [" ".join(rng.choice(WORDS, size=rng.integers(2, 30))) for _ in range(3)]} for _ in range(144)]
    with (
        serving(emb) as (server, state),
        recorded(state) as passes,
        httpx.Client(base_url=server.url, timeout=30) as client,
        ThreadPoolExecutor(24) as pool,
    ):
        responses = list(pool.map(lambda body: client.post("/v1/embeddings", json=body), bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies)
    assert len(passes) < len(bodies)
    seen = Counter(t for texts, _ in passes for t in texts)
    checked = [(b["input"], r) for b, r in zip(bodies, responses, strict=True) if all(seen[t] == 1 for t in b["input"])]
    for texts, response in checked[:30]:  # (a text sent twice may have been served from two different passes)
        containing = [p for p in passes if set(texts) & set(p[0])]
        assert np.array_equal(vectors_of(response.json()), as_in_passes(emb, containing, texts))
    assert len(checked) >= 30


# ---------------------------------------------------------------------------------------------- limits
def assert_error(response: httpx.Response, status: int, code: str, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == code, error
    assert words in error["message"], error["message"]


BAD_REQUESTS = [
    ({"input": ""}, "empty_input", "'input[0]' is an empty string"),
    ({"input": []}, "empty_input", "empty list"),
    ({"input": ["ok", ""]}, "empty_input", "'input[1]' is an empty string"),
    ({"input": ["ok", 3]}, "invalid_input", "'input[1]' must be a string, got int"),
    ({"input": ["ok", None]}, "invalid_input", "'input[1]' must be a string, got NoneType"),
    ({"input": {"text": "x"}}, "invalid_input", "must be a string or a list of strings"),
    ({"input": [101, 2023, 102]}, "token_ids_unsupported", "token ids"),
    ({"input": [[101, 2023], [102]]}, "token_ids_unsupported", "token ids"),
    (b'{"input": "\\ud800 lone surrogate"}', "invalid_input", "lone surrogate"),  # JSON-escaped, as sent
    ({}, "missing_input", "'input' is required"),
    ({"input": "x", "model": "gpt-4"}, "model_not_found", "model 'gpt-4' is not served here"),
    ({"input": "x", "dimensions": 0}, "invalid_dimensions", "from 1 to 32"),
    ({"input": "x", "dimensions": 33}, "invalid_dimensions", "from 1 to 32"),
    ({"input": "x", "dimensions": "8"}, "invalid_dimensions", "got '8'"),
    ({"input": "x", "dimensions": 8.5}, "invalid_dimensions", "got 8.5"),
    ({"input": "x", "dimensions": True}, "invalid_dimensions", "got True"),
    ({"input": "x", "encoding_format": "int8"}, "invalid_encoding_format", "one of 'float', 'base64'"),
    ({"input": "x", "input_type": "passage"}, "invalid_input_type", "one of 'query', 'document'"),
    # not a choice: these were taken for the default (false, 0, "") or ended in a 500 (a list, an object)
    *(({"input": "x", "encoding_format": v}, "invalid_encoding_format", f"got {v!r}") for v in (False, 0, "", [], {})),
    *(({"input": "x", "input_type": v}, "invalid_input_type", f"got {v!r}") for v in (["query"], {"a": 1}, 0)),
    ({"input": "x", "input_type": "document", "instruction": "Find"}, "instruction_not_allowed", "without"),
    ({"input": "x", "instruction": 3}, "invalid_instruction", "'instruction' must be a string"),
    (b'{"input": "x", "instruction": "\\udfff"}', "invalid_instruction", "lone surrogate"),
    ({"input": "x", "user": 3}, "invalid_user", "'user' must be a string"),
]


def test_every_limit_has_its_status_and_json_error(make_embedder):
    emb = make_embedder("bert")
    limits = Limits(max_inputs=4, max_request_bytes=2000, max_top_k=5)
    with serving(emb, limits=limits) as (server, _):
        for body, code, words in BAD_REQUESTS:
            assert_error(post(server, body), 400, code, words)
        assert_error(post(server, {"input": ["a"] * 5}), 413, "too_many_inputs", "has 5 items; the limit is 4")
        assert_error(post(server, {"input": "word " * 500}), 413, "payload_too_large", "larger than the limit of 2000")

        def chunks():  # no Content-Length: the limit is enforced while the body is read
            yield b'{"input": ["'
            for _ in range(30):
                yield b"word " * 20
            yield b'"]}'

        streamed = httpx.post(server.url + "/v1/embeddings", content=chunks(), timeout=30)
        assert_error(streamed, 413, "payload_too_large", "2000 bytes")
        bad_json = httpx.post(server.url + "/v1/embeddings", content=b"{not json", timeout=30)
        assert_error(bad_json, 400, "invalid_json", "not valid JSON")
        assert_error(post(server, [1, 2]), 400, "invalid_json", "must be a JSON object")
        assert_error(post(server, {"query": "x"}, "/v1/search"), 404, "no_index", "no index is loaded")
        assert_error(httpx.get(server.url + "/v1/nothing"), 404, "not_found", "Not Found")
        not_allowed = httpx.get(server.url + "/v1/embeddings")
        assert_error(not_allowed, 405, "method_not_allowed", "Not Allowed")
        assert not_allowed.headers["allow"] == "POST"  # RFC 9110 15.5.6: a 405 says what the route takes
        metrics = httpx.get(server.url + "/metrics").text
    assert 'lmembed_errors_total{code="too_many_inputs",status="413"} 1.0' in metrics
    assert 'lmembed_errors_total{code="payload_too_large",status="413"} 2.0' in metrics
    assert 'lmembed_requests_total{endpoint="/v1/embeddings",status="400"}' in metrics


def test_long_texts_are_truncated_or_refused(make_embedder):
    emb = make_embedder("bert")  # reads at most 128 tokens
    long_text = " ".join(["word"] * 300)
    with serving(emb) as (server, state), recorded(state) as passes:
        response = post(server, {"input": [long_text, "short"]})
        assert response.status_code == 200
        assert response.json()["usage"]["prompt_tokens"] == 128 + 1
        assert np.array_equal(vectors_of(response.json()), as_in_passes(emb, passes, [long_text, "short"]))
        assert np.array_equal(vectors_of(response.json())[0], emb.encode([long_text])[0])  # alone in its pass
    with serving(emb, limits=Limits(truncate=False)) as (server, _):
        assert_error(post(server, {"input": ["short", long_text]}), 400, "input_too_long", "'input[1]' is 300 tokens")
        assert post(server, {"input": [" ".join(["word"] * 128)]}).status_code == 200


def test_tei_fields_are_obeyed_and_unknown_fields_refused(make_embedder):
    """TEI's truncate: false was accepted and the text cut; normalize: false still gave unit vectors; a misspelt
    field ('dimension', 'output_dimensions') was dropped and the answer kept every dimension."""
    emb = make_embedder("bert")  # reads at most 128 tokens; normalises
    long_text = " ".join(["word"] * 300)
    with serving(emb) as (server, _):
        refused = post(server, {"inputs": ["short", long_text], "truncate": False}, "/embed")
        assert refused.status_code == 400 and refused.json()["code"] == "input_too_long", refused.text
        assert (
            "'inputs[1]' is 300 tokens long" in refused.json()["error"] and "truncate: false" in refused.json()["error"]
        )
        assert post(server, {"inputs": [long_text], "truncate": True}, "/embed").status_code == 200
        raw = np.array(post(server, {"inputs": ["a cat"], "normalize": False}, "/embed").json())
        normed = np.array(post(server, {"inputs": ["a cat"]}, "/embed").json())
        assert not np.isclose(np.linalg.norm(raw), 1.0) and np.isclose(np.linalg.norm(normed), 1.0)
        np.testing.assert_allclose(raw / np.linalg.norm(raw), normed, atol=1e-6)
        for path, body, field in (
            ("/v1/embeddings", {"input": "x", "dimension": 8}, "dimension"),
            ("/v2/embed", {"texts": ["x"], "output_dimensions": 8}, "output_dimensions"),
            ("/embed", {"inputs": "x", "dimension": 8}, "dimension"),
        ):
            answer = post(server, body, path)
            assert answer.status_code == 400, answer.text
            assert field in answer.text and "unknown_field" in answer.text and "is not a field of" in answer.text


def test_api_key(make_embedder):
    with serving(make_embedder("bert"), limits=Limits(api_key="s3cret")) as (server, _):
        assert_error(post(server, {"input": "x"}), 401, "invalid_api_key", "missing API key")
        wrong = post(server, {"input": "x"}, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, "invalid_api_key", "invalid API key")
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert post(server, {"input": "x"}, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for given in ("bearer s3cret", "BEARER s3cret", "Bearer  s3cret"):  # the scheme's name in any case
            assert post(server, {"input": "x"}, headers={"Authorization": given}).status_code == 200, given
        for given in ("Basic s3cret", "Bearer S3CRET", "s3cret", "Bearers3cret", "Bearer"):  # the key exactly
            assert post(server, {"input": "x"}, headers={"Authorization": given}).status_code == 401, given
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key
        client = OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert len(client.embeddings.create(model="tiny", input=["a", "b"]).data) == 2


def test_over_the_concurrency_limit_is_refused_at_once(make_embedder):
    with serving(make_embedder("bert"), limits=Limits(max_concurrent_requests=2)) as (server, state):
        with gated(state) as gate, ThreadPoolExecutor(4) as pool:
            held = [pool.submit(post, server, {"input": [f"text {i}"]}) for i in range(2)]
            wait_until(lambda: state.metrics.in_flight._value.get() == 2)
            start = time.monotonic()
            refused = post(server, {"input": "one too many"})
            assert time.monotonic() - start < 2.0  # answered at once, not queued
            assert_error(refused, 429, "too_many_concurrent_requests", "handling 2 requests already")
            assert refused.headers["retry-after"] == "1"
            assert httpx.get(server.url + "/health").status_code == 200  # exempt, even when saturated
            gate.set()
            assert [f.result().status_code for f in held] == [200, 200]
        assert post(server, {"input": "room again"}).status_code == 200


def test_a_caller_that_hangs_up_takes_no_forward_pass(make_embedder):
    with serving(make_embedder("bert")) as (server, state), gated(state) as gate, ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(post, server, {"input": ["held"]})
        wait_until(gate.entered.is_set)
        passes = state.batcher.passes
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/embeddings", json={"input": MIXED}, timeout=0.5)
        wait_until(lambda: 'code="client_closed_request",status="499"} 1.0' in httpx.get(server.url + "/metrics").text)
        gate.set()
        assert blocker.result().status_code == 200
        assert post(server, {"input": "after"}).status_code == 200
        assert state.batcher.passes == passes + 2  # the held pass and the last request's: none for the caller gone
        assert state.batcher.waiting == 0


# ---------------------------------------------------------------------------------------------- lifecycle
def test_health_waits_for_warm_up_and_metrics_report(make_embedder):
    emb = make_embedder("bert")
    app = create_app(emb, model_name="tiny")
    state = app.state.lmembed
    with gated(state) as gate, BackgroundServer(app) as server:
        health = httpx.get(server.url + "/health")
        assert (health.status_code, health.json()) == (503, {"status": "starting"})
        gate.set()
        wait_until(lambda: httpx.get(server.url + "/health").status_code == 200)
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        with recorded(state) as passes:
            assert post(server, {"input": MIXED}).status_code == 200
        metrics = httpx.get(server.url + "/metrics").text
    for line in (
        'lmembed_requests_total{endpoint="/v1/embeddings",status="200"} 1.0',
        "lmembed_embedded_texts_total 6.0",  # the warm-up text and the request's five
        f"lmembed_prompt_tokens_total {token_count(emb, MIXED)}.0",
        f"lmembed_batch_texts_count {1 + len(passes)}.0",
        "lmembed_queue_depth 0.0",
        "lmembed_requests_in_flight 0.0",
    ):
        assert line in metrics, line
    assert 'lmembed_request_latency_seconds_bucket{endpoint="/v1/embeddings",le="+Inf"} 1.0' in metrics
    assert "lmembed_batch_tokens_bucket" in metrics and "lmembed_forward_seconds_count" in metrics


def test_graceful_shutdown_finishes_requests_in_flight(make_embedder):
    emb = make_embedder("llama")
    app = create_app(emb, model_name="tiny")
    server = BackgroundServer(app).start()
    wait_until(lambda: httpx.get(server.url + "/health").status_code == 200)
    state = app.state.lmembed
    with recorded(state) as passes, gated(state) as gate, ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(post, server, {"input": MIXED})
        wait_until(gate.entered.is_set)
        stopping = pool.submit(server.stop)
        wait_until(lambda: server.server.should_exit)
        time.sleep(0.2)
        assert not stopping.done()  # waits for the request in flight
        gate.set()
        response = in_flight.result(timeout=30)
        stopping.result(timeout=30)
    assert response.status_code == 200
    assert np.array_equal(vectors_of(response.json()), as_in_passes(emb, passes, MIXED))
    assert not server.thread.is_alive() and state.status == "shutting_down"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


# ---------------------------------------------------------------------------------------------- search
def test_search_endpoint(make_embedder, tokenizer, tmp_path):
    emb = make_embedder("bert")
    rng = np.random.default_rng(3)
    docs = [(f"doc{i}", " ".join(rng.choice(WORDS, size=rng.integers(3, 12)))) for i in range(40)]
    index = Index.build(emb, docs, tmp_path / "index", kind="flat")
    queries = ["the cat sat on the mat", "protein gene study"]
    with serving(emb, index=Index.open(tmp_path / "index"), limits=Limits(max_top_k=10)) as (server, _):
        response = post(server, {"query": queries, "k": 4, "model": "tiny"}, "/v1/search")
        assert response.status_code == 200, response.text
        body = response.json()
        for result, query, expected in zip(body["data"], queries, index.search_batch(queries, 4), strict=True):
            assert result["query"] == query
            assert [(h["id"], h["score"], h["text"], h["rank"]) for h in result["hits"]] == [
                (h.id, h.score, h.text, h.rank) for h in expected
            ]
        assert body["usage"]["prompt_tokens"] == token_count(emb, queries)
        assert len(post(server, {"query": "gene"}, "/v1/search").json()["data"][0]["hits"]) == 10
        assert_error(post(server, {"query": "gene", "k": 11}, "/v1/search"), 400, "invalid_k", "from 1 to 10")
        assert_error(post(server, {"query": []}, "/v1/search"), 400, "empty_input", "'query' is an empty list")
        models = httpx.get(server.url + "/v1/models").json()["data"][0]
        assert models["index"] == {"kind": "flat", "documents": 40, "generation": 1} and models["dimensions"] == 32
    other = Embedder.from_model(tiny_model("bert", len(tokenizer), seed=5), tokenizer, EmbeddingConfig())
    with pytest.raises(IndexMismatchError, match="weights"):
        create_app(other, index=index)


def test_the_server_searches_what_index_add_wrote_and_keeps_its_generation_when_the_folder_breaks(
    make_embedder, tmp_path, caplog
):
    """`lmembed index add` while the server runs: the next searches find the new documents without a restart, with
    the checks a start makes; a folder that changed into something it cannot search is said and the loaded
    generation stays searched."""
    emb = make_embedder("bert")
    folder = tmp_path / "index"
    Index.build(emb, [("a", "the cat sat on the mat"), ("b", "protein gene study")], folder)

    def ids(server, query: str = "cell growth") -> list[str]:
        response = post(server, {"query": query, "k": 5}, "/v1/search")
        assert response.status_code == 200, response.text
        return [h["id"] for h in response.json()["data"][0]["hits"]]

    def generation(server) -> dict:
        return httpx.get(server.url + "/v1/models").json()["data"][0]["index"]

    with serving(emb, index=Index.open(folder), index_poll_s=0.05) as (server, state):
        assert sorted(ids(server)) == ["a", "b"]
        Index.open(folder, emb).add([("c", "cell growth and division")])  # what `lmembed index add` does
        time.sleep(0.06)
        ids(server)  # this search looks at the folder and starts opening generation 2
        asyncio_wait(server, state)
        assert sorted(ids(server)) == ["a", "b", "c"] and generation(server)["generation"] == 2

        Index.open(folder, emb).add([("d", "a dog ran home")])
        damaged = next(folder.glob("g000003.docs.*"))
        damaged.write_bytes(damaged.read_bytes().replace(b"dog", b"cat"))  # not what the manifest's sha256 says
        time.sleep(0.06)
        with caplog.at_level("WARNING", logger="lmembed.serving.followed_index"):
            ids(server)
            asyncio_wait(server, state)
        assert sorted(ids(server)) == ["a", "b", "c"]  # generation 2 is still searched
        card = generation(server)
        assert card["generation"] == 2 and "g000003.docs" in card["not_searched"]
        assert any("still searching generation 2" in r.getMessage() for r in caplog.records)
    other = create_app(emb, index=Index.open(folder, verify=False), index_poll_s=0)
    assert other.state.lmembed.index.every_s == 0


def asyncio_wait(server: BackgroundServer, state) -> None:
    """Until the server's followed index has ended what it began (it runs on the server's event loop)."""
    wait_until(lambda: not state.index.opening, timeout=60)


# ---------------------------------------------------------------------------------------------- the command
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_lmembed_serve_command(make_embedder, tmp_path):
    """`lmembed serve DIR --index ... --api-key ...` as a process: ready, serving, and a graceful exit on SIGTERM."""
    model_dir = tmp_path / "model"
    emb = make_embedder("bert")
    emb.save(model_dir)
    saved = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    Index.build(saved, [("a", "the cat sat"), ("b", "protein gene study")], tmp_path / "index")
    port = free_port()
    command = [sys.executable, "-m", "lmembed.cli", "serve", str(model_dir), "--index", str(tmp_path / "index")]
    command += ["--port", str(port), "--api-key", "k", "--served-model-name", "mine", "--log-level", "info"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stdout.read()
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout=240)  # imports torch, transformers, FastAPI: slow on a busy machine
        headers = {"Authorization": "Bearer k"}
        response = httpx.post(url + "/v1/embeddings", json={"model": "mine", "input": ["the cat sat"]}, headers=headers)
        assert np.array_equal(vectors_of(response.json()), saved.encode(["the cat sat"]))
        hits = httpx.post(url + "/v1/search", json={"query": "cat", "k": 1}, headers=headers).json()
        assert hits["data"][0]["hits"][0]["id"] == "a"
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status still says SIGTERM
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output, output


def test_serve_reads_the_index_model_as_built_and_refuses_a_conflicting_option_in_one_line(
    make_embedder, tmp_path, monkeypatch
):
    """Without strategy options, `serve MODEL --index` serves the model as the index was built (here at dim 16), as
    `search` reads it (it refused the index); an option that contradicts the index is still refused in one line."""
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    model_dir = tmp_path / "model"
    emb = make_embedder("bert")
    emb.save(model_dir)
    Index.build(emb, ["the cat sat"], tmp_path / "index", dim=16)
    served = {}
    monkeypatch.setattr("lmembed.serving.server.run", lambda app, **_: served.setdefault("app", app))
    result = CliRunner().invoke(app, ["serve", str(model_dir), "--index", str(tmp_path / "index")])
    assert result.exit_code == 0, result.output
    assert served["app"].state.lmembed.embedder.dim == 16 and served["app"].state.lmembed.config.dim == 16
    argv = ["serve", str(model_dir), "--index", str(tmp_path / "index"), "--pooling", "cls"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "was built with another model or strategy" in result.output and "Traceback" not in result.output
    assert json.loads((tmp_path / "index" / "manifest.json").read_text())["strategy"]["dim"] == 16


def test_the_serve_command_defaults_are_the_servers():
    """A default written in the command (kept torch- and FastAPI-free for --help) equals the server's own."""
    import inspect
    from dataclasses import fields

    from lmembed.cli.serve import serve
    from lmembed.serving.followed_index import DEFAULT_POLL_S

    params = inspect.signature(serve).parameters
    limits = {f.name: f.default for f in fields(Limits)}
    same = [name for name in params if name in limits]
    assert len(same) >= 8, same
    assert {name: params[name].default for name in same} == {name: limits[name] for name in same}
    assert params["batch_wait_ms"].default / 1000 == limits["batch_wait_s"]
    assert params["index_poll"].default == DEFAULT_POLL_S
