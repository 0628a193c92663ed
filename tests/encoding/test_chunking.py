"""Long documents: token windows with overlap, chunk -> document scores, and late chunking, on tiny models
against hand-computed references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmembed.encoding.chunking import (
    ChunkedEmbeddings,
    Chunking,
    aggregate_chunk_scores,
    split_documents,
    token_windows,
)
from lmembed.errors import ConfigError

LONG = "the cat sat on the mat . a dog was in the study of language model search , the end"
SHORT = "the cat sat"


def test_token_windows_overlap_and_last_window_ends_at_the_end():
    assert token_windows(10, 4, 1) == [(0, 4), (3, 7), (6, 10)]
    assert token_windows(11, 4, 1) == [(0, 4), (3, 7), (6, 10), (9, 11)]
    assert token_windows(8, 4, 0) == [(0, 4), (4, 8)]
    assert token_windows(3, 4, 2) == [(0, 3)]
    assert token_windows(0, 4, 2) == [(0, 0)]


@pytest.mark.parametrize("kwargs", [{"aggregate": "max"}, {"tokens": 0}, {"tokens": 4, "overlap": 4}, {"overlap": -1}])
def test_bad_chunking_is_a_config_error(kwargs):
    with pytest.raises(ConfigError):
        Chunking(**kwargs)


def test_split_documents_windows_are_exact_on_token_ids(tokenizer):
    chunking = Chunking("maxp", tokens=5, overlap=2)
    chunks = split_documents(tokenizer, [LONG, SHORT, ""], chunking)
    ids = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    n = len(ids)
    expected = token_windows(n, 5, 2)
    assert chunks.windows[: len(expected)] == expected
    for text, (start, end) in zip(chunks.texts, expected, strict=False):
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids[start:end]
    assert chunks.texts[0] == "the cat sat on the"
    assert chunks.texts[1] == "on the mat . a"  # two tokens shared with the first window
    assert chunks.texts[len(expected) :] == [SHORT, ""]
    assert chunks.doc_index.tolist() == [0] * len(expected) + [1, 2]
    first = split_documents(tokenizer, [LONG, SHORT], Chunking("first", tokens=5, overlap=2))
    assert first.texts == ["the cat sat on the", SHORT]


def test_aggregate_first_maxp_mean_by_hand():
    scores = np.array([[0.1, 0.9, 0.2, 0.5], [0.4, -0.2, 0.0, 0.3]], dtype=np.float32)
    doc_index = np.array([0, 0, 0, 1])
    np.testing.assert_allclose(aggregate_chunk_scores(scores, doc_index, 2, "first"), [[0.1, 0.5], [0.4, 0.3]])
    np.testing.assert_allclose(aggregate_chunk_scores(scores, doc_index, 2, "maxp"), [[0.9, 0.5], [0.4, 0.3]])
    np.testing.assert_allclose(
        aggregate_chunk_scores(scores, doc_index, 2, "mean"), [[0.4, 0.5], [0.2 / 3, 0.3]], rtol=1e-6
    )
    with pytest.raises(ValueError):
        aggregate_chunk_scores(scores, np.array([0, 0, 2, 2]), 3, "maxp")  # document 1 has no chunk


@pytest.mark.parametrize("aggregate", ["first", "maxp", "mean"])
def test_encode_corpus_chunked_equals_chunks_encoded_by_hand(make_embedder, tokenizer, aggregate):
    emb = make_embedder("bert", pooling="mean")
    chunking = Chunking(aggregate, tokens=6, overlap=2)
    got = emb.encode_corpus([LONG, SHORT], chunking=chunking)
    assert isinstance(got, ChunkedEmbeddings)
    ids = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    windows = token_windows(len(ids), 6, 2)[: 1 if aggregate == "first" else None]
    words = LONG.split()  # the word-level tokenizer: one token per word
    texts = [" ".join(words[a:b]) for a, b in windows] + [SHORT]
    np.testing.assert_allclose(got.vectors, emb.encode_corpus(texts), atol=1e-6)
    queries = emb.encode_queries(["a cat on a mat", "language model"])
    chunk_scores = queries @ got.vectors.T  # unit vectors: cosine
    w = len(windows)
    reduce = {"first": lambda s: s[:, 0], "maxp": lambda s: s.max(1), "mean": lambda s: s.mean(1)}[aggregate]
    expected = np.stack([reduce(chunk_scores[:, :w]), chunk_scores[:, w]], axis=1)
    np.testing.assert_allclose(got.document_scores(queries), expected, atol=1e-5)


def test_no_chunking_is_todays_truncation(make_embedder):
    emb = make_embedder("bert", pooling="mean")
    np.testing.assert_array_equal(emb.encode_corpus([LONG, SHORT]), emb.encode_corpus([LONG, SHORT], chunking=None))


def test_chunk_larger_than_max_length_is_refused(make_embedder):
    emb = make_embedder("bert", pooling="mean", max_length=16)
    with pytest.raises(ConfigError, match="max_length"):
        emb.encode_corpus([LONG], chunking=Chunking(tokens=32, overlap=0))


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_late_chunking_pools_spans_of_one_forward_pass(make_embedder, tokenizer, family):
    emb = make_embedder(family, pooling="mean", attention="causal")
    chunking = Chunking("maxp", tokens=5, overlap=1, late=True)
    got = emb.encode_corpus([SHORT, LONG], chunking=chunking)
    reference, rows = [], []
    for row, doc in enumerate([SHORT, LONG]):
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            states = emb.backbone.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        for a, b in token_windows(len(ids), 5, 1):
            vec = states[a:b].mean(0).numpy()
            reference.append(vec / np.linalg.norm(vec))
            rows.append(row)
    assert got.doc_index.tolist() == rows
    np.testing.assert_allclose(got.vectors, np.stack(reference), atol=1e-5)
    # the whole document attends: a late chunk differs from the same window encoded alone
    apart = emb.encode_corpus([SHORT, LONG], chunking=Chunking("maxp", tokens=5, overlap=1))
    assert apart.doc_index.tolist() == rows
    assert not np.allclose(got.vectors[2], apart.vectors[2], atol=1e-4)


def test_late_chunking_in_a_padded_batch_matches_alone(make_embedder):
    emb = make_embedder("llama", pooling="mean", attention="causal")
    chunking = Chunking("mean", tokens=4, overlap=0, late=True)
    together = emb.encode_corpus([SHORT, LONG], chunking=chunking, batch_size=2)
    alone = emb.encode_corpus([LONG], chunking=chunking, batch_size=1)
    np.testing.assert_allclose(together.vectors[together.doc_index == 1], alone.vectors, atol=2e-5)


def test_the_default_window_fits_the_bundled_encoder_and_a_larger_one_is_refused():
    """The defaults run on minilm (256 tokens read, 2 of them special), as the docs' example does; a window that
    would be cut at max_length is refused naming both."""
    from lmembed import Embedder
    from lmembed.encoding.chunking import DEFAULT_CHUNK_TOKENS, Chunking

    emb = Embedder.from_pretrained("minilm", cache=False, show_progress=False)
    long = " ".join(["protein folding in cells"] * 120)
    chunked = emb.encode_corpus([long, "short"], chunking=Chunking("maxp"))
    assert chunked.vectors.shape[0] > 2 and Chunking().tokens == DEFAULT_CHUNK_TOKENS
    with pytest.raises(ConfigError, match=r"chunk tokens=256 \(\+2 special\) exceed the strategy's max_length=256"):
        emb.encode_corpus([long], chunking=Chunking("maxp", tokens=256))
