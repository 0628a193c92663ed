"""The server as its users' client libraries see it, on a live server on a free 127.0.0.1 port: Cohere's ``ClientV2``
(``/v2/embed`` with every embedding type, ``/v2/rerank``), ``huggingface_hub.InferenceClient`` and plain TEI bodies
(``/embed``, ``/rerank``, ``/similarity``, ``/tokenize``, ``/decode``, ``/info``), LangChain's ``OpenAIEmbeddings``
with the settings docs/serving.md gives, a client's default model name mapped by an alias, and the 404 that points a
base URL without ``/v1`` to it. Vectors equal the in-process ``Embedder``'s, rankings the in-process reranker's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from helpers import TOY_DOCS, save_tiny_cross_encoder
from lmembed.errors import ConfigError
from lmembed.rerank import load_reranker
from lmembed.serving.app import create_app
from lmembed.serving.compat import quantise
from lmembed.serving.server import BackgroundServer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["the cat sat on the mat", "protein folding and gene expression", "a horse in the field"]


@pytest.fixture(scope="module")
def ce_folder(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce", seed=9)


@contextmanager
def serving(embedder, reranker=None, **kwargs) -> Iterator[BackgroundServer]:
    app = create_app(embedder, model_name="tiny", reranker=reranker, reranker_name="tiny-ce", **kwargs)
    with BackgroundServer(app) as server:
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not warm up"
            time.sleep(0.01)
        yield server


def test_cohere_client_v2_embeds_and_reranks_as_in_process(make_embedder, ce_folder):
    cohere = pytest.importorskip("cohere")
    emb = make_embedder("bert", query_instruction="Find: ")
    reranker = load_reranker(str(ce_folder))
    assert emb.dim % 8 == 0  # binary types pack 8 dimensions a byte
    with serving(emb, load_reranker(str(ce_folder))) as server:
        client = cohere.ClientV2(base_url=server.url, api_key="unused", timeout=30)
        types = ["float", "int8", "uint8", "binary", "ubinary"]
        docs = client.embed(model="tiny", texts=TEXTS, input_type="search_document", embedding_types=types)
        expected = emb.encode_corpus(TEXTS)
        np.testing.assert_array_equal(np.array(docs.embeddings.float_, dtype=np.float32), expected)
        for kind in types[1:]:
            assert getattr(docs.embeddings, kind) == quantise(expected, kind), kind
        queries = client.embed(model="tiny", texts=TEXTS[:1], input_type="search_query", embedding_types=["float"])
        np.testing.assert_array_equal(
            np.array(queries.embeddings.float_, dtype=np.float32), emb.encode_queries(TEXTS[:1])
        )
        assert not np.array_equal(np.array(queries.embeddings.float_), expected[:1])  # the query got its instruction
        assert docs.meta.billed_units.input_tokens > 0

        query = "cat on the mat"
        ranked = client.rerank(model="tiny-ce", query=query, documents=TOY_DOCS, top_n=3)
        scores = reranker.score(query, TOY_DOCS)
        order = np.argsort(-scores, kind="stable")[:3]
        assert [r.index for r in ranked.results] == order.tolist()
        np.testing.assert_allclose([r.relevance_score for r in ranked.results], scores[order], atol=1e-5)
        with pytest.raises(cohere.core.ApiError) as refused:
            client.embed(model="other", texts=TEXTS, input_type="search_document", embedding_types=["float"])
        assert refused.value.status_code == 400 and "--served-model-name" in str(refused.value.body)


def test_cohere_truncate_is_the_requests_own_on_either_server(make_embedder):
    """Cohere's ``truncate``: NONE refuses a text the model cannot read whole and embeds a short one, END cuts, on a
    server that cuts and on a --no-truncate one (which refuses long texts whatever the field, as TEI's flag)."""
    cohere = pytest.importorskip("cohere")
    from lmembed.serving.limits import Limits

    emb = make_embedder("bert")
    long = " ".join(["cat"] * 400)
    for truncates in (True, False):
        with serving(emb, limits=Limits(truncate=truncates)) as server:
            client = cohere.ClientV2(base_url=server.url, api_key="unused", timeout=30)

            def embed(texts, how, client=client):
                return client.embed(model="tiny", texts=texts, input_type="classification", truncate=how)

            for how in ("NONE", "END"):
                got = np.array(embed(TEXTS[:1], how).embeddings.float_, dtype=np.float32)
                np.testing.assert_array_equal(got, emb.encode(TEXTS[:1]))
            with pytest.raises(cohere.core.ApiError) as refused:
                embed([long], "NONE")
            assert refused.value.status_code == 400 and refused.value.body["param"] == "texts"
            if truncates:
                cut = np.array(embed([long], "END").embeddings.float_, dtype=np.float32)
                np.testing.assert_array_equal(cut, emb.encode([long]))
            else:
                with pytest.raises(cohere.core.ApiError, match="--no-truncate"):
                    embed([long], "END")
            with pytest.raises(cohere.core.ApiError, match="START is not served"):
                embed(TEXTS[:1], "START")


def test_quantised_types_follow_their_definitions():
    v = np.array([[0.5, -0.25, 0.0, 1.0, -1.0, 0.1, 0.2, -0.3, 0.0, 2.0, 0, 0, 0, 0, 0, -2.0]], dtype=np.float32)
    int8 = np.array(quantise(v, "int8"))
    assert int8.min() >= -127 and int8.max() == 127 and int8[0, 9] == 127 and int8[0, 15] == -127
    assert quantise(v, "uint8") == (int8 + 128).tolist()
    ubinary = np.array(quantise(v, "ubinary"))
    assert ubinary.tolist() == [[int("10010110", 2), int("01000000", 2)]]  # bit = value > 0, first dimension high
    assert quantise(v, "binary") == (ubinary - 128).tolist()
    cos = float(v[0] @ int8[0] / np.linalg.norm(v[0]) / np.linalg.norm(int8[0]))
    assert cos > 0.999


def test_tei_embed_all_gives_the_token_vectors_encode_tokens_gives(make_embedder, monkeypatch):
    """TEI's ``/embed_all``: per text, per token, the vector ``Embedder.encode_tokens`` gives (the prompt's side
    as ``prompt_name`` says); its own fields only; an answer over the cap on numbers is refused before any work."""
    emb = make_embedder("bert", query_instruction="Find: ")
    with serving(emb) as server:
        plain = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS}, timeout=30)
        assert plain.status_code == 200, plain.text
        expected = emb.encode_tokens(TEXTS)
        got = plain.json()
        assert [len(rows) for rows in got] == [len(rows) for rows in expected]
        for rows, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(np.array(rows, dtype=np.float32), want, atol=1e-5)
        one = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS[0], "prompt_name": "query"}, timeout=30)
        (query,) = emb.encode_tokens(TEXTS[:1], side="query")
        assert len(one.json()) == 1 and len(one.json()[0]) == len(query) > len(expected[0])  # the instruction's tokens
        np.testing.assert_allclose(np.array(one.json()[0], dtype=np.float32), query, atol=1e-5)
        unknown = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS, "normalize": True}, timeout=30)
        assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_field"
        assert unknown.json()["param"] == "normalize"
        monkeypatch.setattr("lmembed.serving.app.MAX_TOKEN_VALUES", emb.backbone.hidden_size * 10)
        big = httpx.post(server.url + "/embed_all", json={"inputs": TEXTS}, timeout=30)
        assert big.status_code == 413 and big.json()["code"] == "too_many_token_values"
        assert big.json()["param"] == "inputs"
        metrics = httpx.get(server.url + "/metrics").text
        assert 'endpoint="/embed_all"' in metrics


def test_tei_routes_and_huggingface_hub_client(make_embedder, ce_folder):
    hub = pytest.importorskip("huggingface_hub")
    emb = make_embedder("bert", normalize=False)
    reranker = load_reranker(str(ce_folder))
    with serving(emb, load_reranker(str(ce_folder))) as server:
        client = hub.InferenceClient(model=server.url + "/embed", timeout=30)
        vectors = client.feature_extraction(TEXTS[0])
        raw = emb.encode(TEXTS[:1])
        normalised = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        np.testing.assert_allclose(vectors, normalised, atol=1e-6)  # TEI normalises by default
        assert not np.allclose(np.linalg.norm(raw), 1.0)  # so the default was not a no-op
        # TEI's root route, and normalize: false (the strategy's own vectors)
        root = hub.InferenceClient(model=server.url, timeout=30).feature_extraction(TEXTS[1], normalize=False)
        np.testing.assert_array_equal(root, emb.encode(TEXTS[1:2]))
        plain = httpx.post(server.url + "/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30)
        np.testing.assert_array_equal(np.array(plain.json(), dtype=np.float32), emb.encode(TEXTS))

        query = "gene study"
        body = {"query": query, "texts": TOY_DOCS, "return_text": True}
        ranked = httpx.post(server.url + "/rerank", json=body, timeout=30).json()
        scores = reranker.score(query, TOY_DOCS)
        order = np.argsort(-scores, kind="stable")
        assert [r["index"] for r in ranked] == order.tolist()
        assert [r["text"] for r in ranked] == [TOY_DOCS[i] for i in order]
        np.testing.assert_allclose([r["score"] for r in ranked], scores[order], atol=1e-5)
        raw = httpx.post(server.url + "/rerank", json={**body, "raw_scores": True}, timeout=30).json()
        logits = reranker.logits(reranker.encode_pairs([(query, d) for d in TOY_DOCS]))[:, 0].numpy()
        np.testing.assert_allclose([r["score"] for r in raw], logits[order], atol=1e-5)  # TEI: the logits
        refused = httpx.post(server.url + "/rerank", json={**body, "raw_scores": "yes"}, timeout=30)
        assert refused.status_code == 400
        assert refused.json()["error_type"] == "Validation"  # TEI's error shape on TEI's routes
        assert refused.json()["param"] == "raw_scores"
        # the Hub client shows the message as it shows a TEI server's (not the repr of an object)
        with pytest.raises(hub.errors.HfHubHTTPError) as wrong:
            client.feature_extraction(TEXTS[0], prompt_name="no-such-prompt")
        said = str(wrong.value)
        assert "prompt_name" in said and "{'" not in said, said

        info = httpx.get(server.url + "/info").json()
        assert info["model_id"] == "tiny" and info["max_client_batch_size"] == 2048
        assert info["reranker"]["model_id"] == "tiny-ce" and info["dimensions"] == emb.dim


def test_langchain_with_the_documented_settings_and_a_mapped_default_name(make_embedder):
    langchain_openai = pytest.importorskip("langchain_openai")
    emb = make_embedder("bert")
    with serving(emb, aliases=["text-embedding-ada-002"]) as server:
        # LangChain's default model name is text-embedding-ada-002: served here because the operator mapped it
        client = langchain_openai.OpenAIEmbeddings(
            base_url=server.url + "/v1", api_key="unused", check_embedding_ctx_length=False, max_retries=0
        )
        vectors = np.array(client.embed_documents(TEXTS), dtype=np.float32)
        np.testing.assert_array_equal(vectors, emb.encode(TEXTS))
        cards = httpx.get(server.url + "/v1/models").json()["data"]
        assert cards[0]["id"] == "tiny" and cards[0]["aliases"] == ["text-embedding-ada-002"]
        other = httpx.post(server.url + "/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"})
        assert other.status_code == 400 and "text-embedding-3-small" in other.json()["error"]["message"]
        # a base URL without /v1: the 404 says where the route is
        missing = httpx.post(server.url + "/embeddings", json={"input": "x"})
        assert missing.status_code == 404 and "use /v1/embeddings" in missing.json()["error"]["message"]


def test_served_model_name_takes_several_names():
    from lmembed.cli.serve import served_names

    assert served_names(None, "minilm") == ["minilm"]
    assert served_names(["mine,text-embedding-ada-002", "text-embedding-3-small", "mine"], "m") == [
        "mine",
        "text-embedding-ada-002",
        "text-embedding-3-small",
    ]


def test_a_term_channel_model_keeps_its_width_and_its_sides_in_every_dialect(make_embedder):
    """A model with a term channel cannot be shortened nor left unnormalised (the channel is weighed against the
    dense part in the cosine): a smaller ``dimensions`` / ``output_dimension``, or TEI's ``normalize: false``, is a
    400 naming the field, in each dialect, before any work; the full width asks for nothing. Queries and documents
    are weighed apart (idf vs BM25) through each dialect's side field."""
    openai = pytest.importorskip("openai")
    cohere = pytest.importorskip("cohere")
    corpus = ["the cat sat on the mat", "a dog ran in the park", "the cat and the dog"]
    emb = make_embedder("bert", pooling="mean").fit_terms(corpus, dims=64)
    text = ["cat cat dog"]  # a repeated token: BM25's saturation weighs it apart from a query's idf
    assert not np.array_equal(emb.encode_queries(text), emb.encode_corpus(text))
    with serving(emb) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30)
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="tiny", input=text, dimensions=8)
        error = refused.value.body
        assert error["param"] == "dimensions" and error["code"] == "invalid_dimensions", error
        assert "term channel" in error["message"] and str(emb.dim) in error["message"]
        whole = client.embeddings.create(model="tiny", input=text, dimensions=emb.dim)
        np.testing.assert_array_equal(np.array([whole.data[0].embedding], dtype=np.float32), emb.encode(text))

        co = cohere.ClientV2(base_url=server.url, api_key="unused", timeout=30)
        with pytest.raises(cohere.core.ApiError) as refused:
            co.embed(model="tiny", texts=text, input_type="search_query", embedding_types=["float"], output_dimension=8)
        assert refused.value.status_code == 400 and refused.value.body["param"] == "output_dimension"
        assert "output_dimension" in refused.value.body["message"]  # Cohere's error shape: {"message": ...}
        for input_type, expected in (
            ("search_query", emb.encode_queries(text)),
            ("search_document", emb.encode_corpus(text)),
        ):
            got = co.embed(model="tiny", texts=text, input_type=input_type, embedding_types=["float"])
            np.testing.assert_array_equal(np.array(got.embeddings.float_, dtype=np.float32), expected)

        tei = httpx.post(server.url + "/embed", json={"inputs": text, "dimensions": 8}, timeout=30)
        assert tei.status_code == 400 and tei.json()["param"] == "dimensions"
        assert tei.json()["error_type"] == "Validation"
        for route in ("/embed", "/"):  # nor left unnormalised: a 400 naming the field (was a 500, internal error)
            tei = httpx.post(server.url + route, json={"inputs": text, "normalize": False}, timeout=30)
            assert tei.status_code == 400 and tei.json()["param"] == "normalize", tei.text
            assert tei.json()["code"] == "invalid_normalize" and "term channel" in tei.json()["error"]
        assert "internal_error" not in httpx.get(server.url + "/metrics").text
        tei = httpx.post(server.url + "/embed", json={"inputs": text, "prompt_name": "query"}, timeout=30)
        np.testing.assert_array_equal(np.array(tei.json(), dtype=np.float32), emb.encode_queries(text))


def test_tei_similarity_tokenize_and_decode(make_embedder, tokenizer):
    """TEI's other routes: ``/similarity`` through the Hub client's ``sentence_similarity`` (at ``/similarity`` and at
    the root), ``/tokenize`` giving the ids the model reads with each token's span, ``/decode`` as the tokenizer
    decodes; on a byte-level BPE tokenizer (spans and spaces), and on a decoder whose end token lmembed appends."""
    hub = pytest.importorskip("huggingface_hub")
    from family_builders import bpe_tokenizer
    from lmembed.serving.limits import Limits

    bpe = bpe_tokenizer()
    emb = make_embedder("llama", tok=bpe, pooling="mean", query_instruction="Find: ")
    source, others = "Hello there, friend!", ["A longer text.", "hello  there", TEXTS[0]]
    with serving(emb, limits=Limits(max_tokens_in_flight=96)) as server:
        for url in (server.url + "/similarity", server.url):
            got = hub.InferenceClient(model=url, timeout=30).sentence_similarity(source, other_sentences=others)
            unit = emb.encode([source, *others])
            unit /= np.linalg.norm(unit, axis=1, keepdims=True)
            np.testing.assert_allclose(got, unit[1:] @ unit[0], atol=1e-6)
        body = {"inputs": {"source_sentence": source, "sentences": others}, "prompt_name": "query"}
        as_queries = httpx.post(server.url + "/similarity", json=body, timeout=30).json()
        unit = emb.encode_queries([source, *others])
        unit /= np.linalg.norm(unit, axis=1, keepdims=True)
        np.testing.assert_allclose(as_queries, unit[1:] @ unit[0], atol=1e-6)
        assert not np.allclose(as_queries, got, atol=1e-4)  # the prompt was applied
        wrong = httpx.post(server.url + "/similarity", json={"inputs": {"source_sentence": source}}, timeout=30)
        assert wrong.status_code == 400 and wrong.json()["param"] == "inputs.sentences"
        ignored = httpx.post(server.url + "/similarity", json={**body, "dimensions": 4}, timeout=30)
        assert ignored.status_code == 400 and ignored.json()["code"] == "unknown_field"  # refused, not ignored

        texts = [source, "hello  there,friend"]
        split = httpx.post(server.url + "/tokenize", json={"inputs": texts}, timeout=30).json()
        for text, tokens in zip(texts, split, strict=True):
            assert [t["id"] for t in tokens] == bpe(text)["input_ids"]
            assert [t["special"] for t in tokens] == [True] + [False] * (len(tokens) - 2) + [True]  # <s> ... </s>
            words = tokens[1:-1]
            assert all(t["text"] == text[t["start"] : t["stop"]] for t in words)
            assert "".join(text[t["start"] : t["stop"]] for t in words).replace(" ", "") == text.replace(" ", "")
            decoded = httpx.post(server.url + "/decode", json={"ids": [t["id"] for t in tokens]}, timeout=30).json()
            assert decoded == [bpe.decode([t["id"] for t in tokens], skip_special_tokens=True)]
        accented = "ünï 日本 ok"  # spans count UTF-8 bytes, as TEI's: a client slices the encoded text with them
        (tokens,) = httpx.post(server.url + "/tokenize", json={"inputs": accented}, timeout=30).json()
        raw = accented.encode()
        assert all(raw[t["start"] : t["stop"]].decode() == t["text"] for t in tokens if not t["special"])
        assert max(t["stop"] for t in tokens if not t["special"]) == len(raw) > len(accented)
        for empty, where in (([], "'ids'"), ([[5, 6], []], "'ids[1]'")):
            refused = httpx.post(server.url + "/decode", json={"ids": empty}, timeout=30)
            assert refused.status_code == 400 and f"{where} is an empty list" in refused.json()["error"]
        bare = httpx.post(server.url + "/tokenize", json={"inputs": source, "add_special_tokens": False}).json()
        assert [t["id"] for t in bare[0]] == bpe(source, add_special_tokens=False)["input_ids"]
        refused = httpx.post(server.url + "/decode", json={"ids": [[5, 6], [7, len(bpe)]]}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error_type"] == "Validation"
        assert f"'ids[1][1]' is {len(bpe)}" in refused.json()["error"]
        long = httpx.post(server.url + "/tokenize", json={"inputs": " ".join(["friend"] * 200)}, timeout=30)
        assert long.status_code == 413 and long.json()["code"] == "too_many_tokens"

    # a decoder read at its last token: the model reads an end token its tokenizer does not add
    last = make_embedder("llama", tok=tokenizer, pooling="last")
    with serving(last, limits=Limits(max_inputs=3)) as server:
        (tokens,) = httpx.post(server.url + "/tokenize", json={"inputs": TEXTS[0]}, timeout=30).json()
        (read,) = last.engine.input_builder(last.config).build_all([TEXTS[0]], None)
        assert [t["id"] for t in tokens] == read.input_ids and read.input_ids[-1] == tokenizer.eos_token_id
        end = {"id": tokenizer.eos_token_id, "text": "[EOS]", "special": True, "start": None, "stop": None}
        assert tokens[-1] == end
        # an unknown word is text the tokenizer could not name, not a token it added: not special, with its span
        (tokens,) = httpx.post(server.url + "/tokenize", json={"inputs": "the zzzunknown cat"}, timeout=30).json()
        unknown = {"id": tokenizer.unk_token_id, "text": "zzzunknown", "special": False, "start": 4, "stop": 14}
        assert tokens[1] == unknown
        # the source and its sentences count against --max-inputs together, and the message says so
        body = {"inputs": {"source_sentence": "the cat", "sentences": ["a", "b", "c"]}}
        over = httpx.post(server.url + "/similarity", json=body, timeout=30)
        said = over.json()["error"]
        assert over.status_code == 413 and "'inputs' has 4 texts (the source and its sentences); the limit is 3" in said
        # a text far over the token bound is refused from a prefix, not tokenised whole
        huge = httpx.post(server.url + "/tokenize", json={"inputs": "the " * 300_000}, timeout=30)
        assert huge.status_code == 413 and huge.json()["code"] == "too_many_tokens"


def test_rerank_routes_give_their_dialects_scores_whatever_activation_the_folder_records(make_embedder, tmp_path):
    """A cross-encoder that records no activation (Identity, as cross-encoder/ms-marco-* do) gave its raw logits on
    every route: Cohere ``relevance_score`` values of 2.45 and -11.5, and TEI's scores without TEI's sigmoid. TEI
    answers the sigmoid of the logits unless ``raw_scores`` (then the logits), Cohere (v1 and v2) the sigmoid: the
    same order as the reranker's own scores, on each dialect's scale."""
    import json

    cohere = pytest.importorskip("cohere")
    folder = save_tiny_cross_encoder(tmp_path / "ce-identity", seed=11)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "torch.nn.modules.linear.Identity"})
    )
    reranker = load_reranker(str(folder))
    query = "gene study"
    logits = reranker.logits(reranker.encode_pairs([(query, d) for d in TOY_DOCS]))[:, 0].numpy()
    np.testing.assert_allclose(reranker.score(query, TOY_DOCS), logits, atol=1e-6)  # Identity: raw in process
    logits = logits * 25  # a wide range, as ms-marco's logits have
    with torch_scaled(reranker, 25.0), serving(make_embedder("bert"), reranker) as server:
        order = np.argsort(-logits, kind="stable").tolist()
        sigmoid = 1 / (1 + np.exp(-logits.astype(np.float64)))
        tei = httpx.post(server.url + "/rerank", json={"query": query, "texts": TOY_DOCS}, timeout=30).json()
        assert [r["index"] for r in tei] == order
        np.testing.assert_allclose([r["score"] for r in tei], sigmoid[order], rtol=1e-5)
        raw = httpx.post(server.url + "/rerank", json={"query": query, "texts": TOY_DOCS, "raw_scores": True}).json()
        np.testing.assert_allclose([r["score"] for r in raw], logits[order], rtol=1e-5, atol=1e-5)
        client = cohere.ClientV2(base_url=server.url, api_key="unused", timeout=30)
        ranked = client.rerank(model="tiny-ce", query=query, documents=TOY_DOCS)
        assert [r.index for r in ranked.results] == order
        assert all(0 < r.relevance_score < 1 for r in ranked.results)
        np.testing.assert_allclose([r.relevance_score for r in ranked.results], sigmoid[order], rtol=1e-5)
        v1 = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": TOY_DOCS}, timeout=30).json()
        np.testing.assert_allclose([r["relevance_score"] for r in v1["results"]], sigmoid[order], rtol=1e-5)


@contextmanager
def torch_scaled(reranker, factor: float) -> Iterator[None]:
    """The reranker's classifier scaled by ``factor`` (its logits too): scores far outside (0, 1)."""
    import torch

    head = reranker.model.classifier
    with torch.no_grad():
        head.weight.mul_(factor)
        head.bias.mul_(factor)
    try:
        yield
    finally:
        with torch.no_grad():
            head.weight.div_(factor)
            head.bias.div_(factor)


def test_responses_are_gzipped_for_clients_that_accept_it(make_embedder):
    """Embeddings as JSON floats are large and compress well; a client that accepts gzip gets them compressed (the
    official clients and httpx send ``Accept-Encoding: gzip``), one that does not gets them plain, and
    ``gzip_min_bytes=0`` never compresses."""
    from lmembed.serving.limits import Limits

    emb = make_embedder("bert")
    body = {"model": "tiny", "input": TEXTS * 20}
    expected = emb.encode(TEXTS * 20)
    for limits, compressed in ((Limits(), True), (Limits(gzip_min_bytes=0), False)):
        with serving(emb, limits=limits) as server:
            got = httpx.post(server.url + "/v1/embeddings", json=body, headers={"accept-encoding": "gzip"})
            assert got.status_code == 200
            assert (got.headers.get("content-encoding") == "gzip") is compressed
            if compressed:
                assert int(got.headers["content-length"]) < len(got.content) / 1.5  # sent size vs decoded size
            vectors = np.array([row["embedding"] for row in got.json()["data"]], dtype=np.float32)
            np.testing.assert_array_equal(vectors, expected)
            plain = httpx.post(server.url + "/v1/embeddings", json=body, headers={"accept-encoding": "identity"})
            assert "content-encoding" not in plain.headers and plain.json() == got.json()
    with pytest.raises(ConfigError, match="gzip_min_bytes"):
        Limits(gzip_min_bytes=-1)
