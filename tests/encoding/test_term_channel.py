"""The term channel (lmembed.pooling.terms): BM25's weighting of a corpus, hashed and appended to the dense vector.

The reference here is written out by hand from BM25's definition over the model's token ids, not taken from the
channel, so a wrong weighting, side or hashing shows as a different cosine."""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import numpy as np
import pytest
from safetensors.torch import save_file

from conftest import tiny_model
from helpers import reseal, unrecord
from lmembed import Embedder
from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError, ModelLoadError, UnsafeFileError
from lmembed.pooling.terms import TERMS_FILE

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the model reads the text and the text is long",
    "a cat and a dog in the park",
    "the park is green",
]
QUERIES = ["cat in the park", "long text"]


@pytest.fixture
def bert(make_embedder):
    return make_embedder("bert", pooling="mean")


def _ids(embedder: Embedder, text: str) -> list[int]:
    special = set(embedder.backbone.tokenizer.all_special_ids)
    return [t for t in embedder.backbone.tokenizer(text)["input_ids"] if t not in special]


def _reference(embedder: Embedder, k1: float = 1.2, b: float = 0.75) -> tuple[np.ndarray, np.ndarray]:
    """Each query's and document's BM25 term vector over the vocabulary, L2-normalised, computed by hand."""
    docs = [_ids(embedder, d) for d in CORPUS]
    n, avg = len(docs), sum(map(len, docs)) / len(docs)
    df = Counter(t for d in docs for t in set(d))
    idf = {t: math.log((n - f + 0.5) / (f + 0.5) + 1) for t, f in df.items()}
    vocab = len(embedder.backbone.tokenizer)

    def vector(ids: list[int], document: bool) -> np.ndarray:
        out = np.zeros(vocab)
        for t, tf in Counter(ids).items():
            if t not in idf:
                continue  # a token the corpus never holds weighs 0
            length = sum(1 for x in ids if x in idf)
            out[t] = idf[t] * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg)) if document else tf)
        norm = np.linalg.norm(out)
        return out / norm if norm else out

    q = np.stack([vector(_ids(embedder, x), False) for x in QUERIES])
    d = np.stack([vector(x, True) for x in docs])
    return q, d


def test_cosine_is_dense_plus_weighted_bm25_terms(bert):
    weight = 0.5
    fitted = bert.fit_terms(CORPUS, dims=1 << 16, weight=weight)  # buckets >> tokens: no two tokens share one here
    q, d = fitted.encode_queries(QUERIES), fitted.encode_corpus(CORPUS)
    width = bert.backbone.hidden_size + (1 << 16)
    assert q.shape == (len(QUERIES), width) and d.shape == (len(CORPUS), width)
    dense = bert.encode_queries(QUERIES) @ bert.encode_corpus(CORPUS).T
    ref_q, ref_d = _reference(bert)
    expected = (dense + weight * (ref_q @ ref_d.T)) / (1 + weight)
    np.testing.assert_allclose(q @ d.T, expected, atol=1e-5)


def test_queries_and_documents_are_weighed_differently(bert):
    fitted = bert.fit_terms(CORPUS, dims=1 << 16, weight=1.0)
    hidden = bert.backbone.hidden_size
    text = ["the text the text the cat"]  # term counts 3, 2, 1: saturated as a document, linear as a query
    as_query = fitted.encode_queries(text)[0, hidden:]
    as_document = fitted.encode_corpus(text)[0, hidden:]
    assert not np.allclose(as_query, as_document, atol=1e-4)
    unknown = fitted.encode_queries(["zebra"])  # no token of it is in the corpus (or the tokenizer): no term part
    assert np.all(unknown[0, hidden:] == 0)


def test_hashed_buckets_keep_the_ranking_close(bert):
    exact = bert.fit_terms(CORPUS, dims=1 << 16, weight=0.5)
    small = bert.fit_terms(CORPUS, dims=64, weight=0.5)
    a = exact.encode_queries(QUERIES) @ exact.encode_corpus(CORPUS).T
    c = small.encode_queries(QUERIES) @ small.encode_corpus(CORPUS).T
    assert np.abs(a - c).max() < 0.2  # a few shared buckets move a score, not the whole ranking
    assert small.config.terms.sha256 == exact.config.terms.sha256  # the same table, hashed into fewer buckets


def test_save_and_load_reproduce_the_vectors(bert, tmp_path):
    fitted = bert.fit_terms(CORPUS, dims=128, weight=0.5)
    folder = fitted.save(tmp_path / "m")
    assert (folder / TERMS_FILE).is_file()
    assert not (folder / "modules.json").exists()  # sentence-transformers would read it without the channel
    loaded = Embedder.from_pretrained(str(folder), show_progress=False, cache=False)
    assert loaded.config.terms == fitted.config.terms and loaded.config.label() == "mean@-1+bidir+terms128"
    np.testing.assert_array_equal(loaded.encode_corpus(CORPUS), fitted.encode_corpus(CORPUS))
    np.testing.assert_array_equal(loaded.encode_queries(QUERIES), fitted.encode_queries(QUERIES))
    assert loaded.with_terms(None).encode_corpus(CORPUS).shape[1] == bert.backbone.hidden_size


def test_the_cache_keys_on_the_table(make_embedder, tmp_path):
    from lmembed.embedder import Embedder as E

    base = make_embedder("bert", pooling="mean")
    cached = E(base.backbone, base.config, cache_dir=tmp_path / "cache", show_progress=False)
    one = cached.fit_terms(CORPUS, dims=64, weight=0.5)
    two = cached.fit_terms(CORPUS[:3], dims=64, weight=0.5)  # another corpus: another table
    first = one.encode_corpus(CORPUS)
    np.testing.assert_array_equal(one.encode_corpus(CORPUS), first)  # read back from the cache
    assert one.config.fingerprint() != two.config.fingerprint()
    assert not np.allclose(two.encode_corpus(CORPUS), first)


def _saved(bert, tmp_path):
    folder = bert.fit_terms(CORPUS, dims=64, weight=0.5).save(tmp_path / "m")
    return folder, json.loads((folder / "lmembed.json").read_text())


def test_a_changed_table_is_refused_by_its_digest(bert, tmp_path):
    import torch

    folder, _ = _saved(bert, tmp_path)
    vocab = len(bert.backbone.tokenizer)
    save_file({"idf": torch.full((vocab,), 9.0)}, str(folder / TERMS_FILE))
    with pytest.raises(ModelLoadError, match=r"terms\.safetensors: its sha256 is not the one .*files\.terms"):
        Embedder.from_pretrained(str(folder), show_progress=False, cache=False)
    unrecord(folder)  # a folder saved before lmembed recorded its files: the strategy's own digest of the table
    with pytest.raises(UnsafeFileError, match=r"terms\.safetensors.*strategy\.terms\.sha256"):
        Embedder.from_pretrained(str(folder), show_progress=False, cache=False)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"idf": "short"}, r"terms\.safetensors: holds .* needs one tensor 'idf' of shape"),
        ({"other": "full"}, r"terms\.safetensors: holds .* needs one tensor 'idf'"),
        ({"idf": "negative"}, r"terms\.safetensors: idf holds a negative or non-finite weight"),
        ({"idf": "half"}, r"terms\.safetensors: idf is torch\.float16"),
        # finite, yet it overflowed the vectors and the refusal blamed the model's weights
        ({"idf": "huge"}, r"terms\.safetensors: idf holds 1e\+38, past any BM25 weight"),
    ],
)
def test_a_wrong_table_is_refused_by_name(bert, tmp_path, tensors, message):
    import torch

    from lmembed.pooling.terms import table_digest

    folder, meta = _saved(bert, tmp_path)
    vocab = len(bert.backbone.tokenizer)
    made = {
        "short": torch.ones(vocab - 1),
        "full": torch.ones(vocab),
        "negative": -torch.ones(vocab),
        "half": torch.ones(vocab, dtype=torch.float16),
        "huge": torch.full((vocab,), 1e38),
    }
    state = {name: made[kind] for name, kind in tensors.items()}
    save_file(state, str(folder / TERMS_FILE))
    meta["strategy"]["terms"]["sha256"] = table_digest(next(iter(state.values())))  # the digest agrees: other checks
    (folder / "lmembed.json").write_text(json.dumps(meta))
    reseal(folder)  # the folder's record made to match too
    with pytest.raises(ModelLoadError, match=message):
        Embedder.from_pretrained(str(folder), show_progress=False, cache=False)


def test_a_table_outside_the_folder_or_missing_is_refused(bert, tmp_path):
    folder, _ = _saved(bert, tmp_path)
    unrecord(folder)  # past the folder's record (which refuses both too): the term channel's own checks
    outside = tmp_path / "elsewhere.safetensors"
    (folder / TERMS_FILE).rename(outside)
    with pytest.raises(ModelLoadError, match=r"lmembed\.json: strategy\.terms is set, but .*terms\.safetensors"):
        Embedder.from_pretrained(str(folder), show_progress=False, cache=False)
    os.symlink(outside, folder / TERMS_FILE)  # a link that leaves the folder is not followed: the folder is refused
    with pytest.raises(UnsafeFileError, match=r"terms\.safetensors: a link leading outside"):
        Embedder.from_pretrained(str(folder), show_progress=False, cache=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dim": 8}, "^dim=8: a term channel is weighed against the dense vector"),
        ({"normalize": False}, "^normalize=False: a term channel is weighed against the dense vector"),
        ({"similarity": "dot"}, "^similarity='dot': a term channel is weighed against the dense vector"),
        ({"terms": {"dims": 0}}, r"terms\.dims=0 is not valid"),
        ({"terms": {"bogus": 1}}, r"unknown terms option\(s\): bogus"),
        ({"terms": {"weight": float("nan")}}, r"terms\.weight=nan is not valid"),
    ],
)
def test_a_wrong_strategy_is_refused(bert, change, message):
    fitted = bert.fit_terms(CORPUS, dims=64, weight=0.5)
    data = fitted.config.to_dict()
    for key, value in change.items():
        data[key] = {**data[key], **value} if key == "terms" else value
    with pytest.raises(ConfigError, match=message):
        EmbeddingConfig.from_dict(data)


def test_a_strategy_naming_a_channel_needs_its_table(bert):
    fitted = bert.fit_terms(CORPUS, dims=64, weight=0.5)
    with pytest.raises(ConfigError, match="its fitted table was not given"):
        Embedder(bert.backbone, fitted.config, use_cache=False, show_progress=False)


def test_the_onnx_backend_appends_the_same_channel(tokenizer):
    model = tiny_model("bert", len(tokenizer))
    config = EmbeddingConfig(pooling="mean")
    torch_side = Embedder.from_model(model, tokenizer, config, use_cache=False, show_progress=False)
    onnx_side = Embedder.from_model(model, tokenizer, config, backend="onnx", threads=1, use_cache=False)
    a = torch_side.fit_terms(CORPUS, dims=256, weight=0.5)
    b = onnx_side.fit_terms(CORPUS, dims=256, weight=0.5)
    assert b.backend.name == "onnx"
    np.testing.assert_allclose(b.encode_corpus(CORPUS), a.encode_corpus(CORPUS), atol=1e-5)
    np.testing.assert_allclose(b.encode_queries(QUERIES), a.encode_queries(QUERIES), atol=1e-5)


@pytest.mark.parametrize("late", [False, True])
def test_each_chunk_gets_the_terms_of_its_own_window(bert, late):
    from lmembed.encoding.chunking import Chunking

    fitted = bert.fit_terms(CORPUS, dims=1 << 16, weight=0.5)
    hidden = bert.backbone.hidden_size
    chunks = fitted.encode_corpus(
        ["the cat sat on the mat the park is green"], chunking=Chunking(tokens=5, overlap=0, late=late)
    )
    first, second = chunks.vectors[0, hidden:], chunks.vectors[1, hidden:]
    alone = fitted.encode_corpus(["the cat sat on the"])[0, hidden:]
    assert chunks.vectors.shape[1] == hidden + (1 << 16)
    assert np.count_nonzero(first) and np.count_nonzero(second) and not np.allclose(first, second)
    np.testing.assert_allclose(first @ alone / (first @ first), 1.0, atol=0.05)  # the first window's own words


def test_a_channel_fitted_with_another_tokenizer_is_refused(bert):
    from lmembed.pooling.terms import fit_terms

    other = fit_terms([[5, 6, 7]], len(bert.backbone.tokenizer) + 10, dims=64, weight=0.5)
    with pytest.raises(ConfigError, match=r"has \d+ token ids, the model's tokenizer \d+: .*another tokenizer"):
        bert.with_terms(other)
    with pytest.raises(ConfigError, match="another tokenizer"):
        Embedder(bert.backbone, bert.config.with_options(terms=other.config), terms=other, use_cache=False)
