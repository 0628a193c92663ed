"""EncodingEngine.encode_raw with pre-built features (what the server does: it tokenises a request's texts once,
to count their tokens, and its forward pass runs on those features): the same vectors, bit for bit, as when
the engine tokenises, and no second tokenisation."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import WORDS
from lmembed import EmbeddingConfig
from lmembed.encoding.inputs import InputBuilder
from lmembed.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def texts_of(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=k)) for k in rng.integers(1, 40, size=n)]
    return [*texts, texts[0], ""]  # a repeated text (computed once) and an empty one


@pytest.mark.parametrize(
    ("family", "strategy", "instruction"),
    [
        ("bert", {"pooling": "mean"}, None),
        ("bert", {"pooling": "cls"}, "Find the passage"),
        ("llama", {"pooling": "last"}, "Find the passage"),
        ("llama", {"pooling": "mean", "echo": True, "max_length": 24}, None),
    ],
)
def test_prebuilt_features_give_the_same_vectors_bit_for_bit(make_embedder, family, strategy, instruction):
    emb = make_embedder(family, **strategy)
    engine, config = emb.engine, emb.config
    texts = texts_of(9)
    features = engine.input_builder(config).build_all(texts, instruction)
    for batch_size in (len(texts), 4):
        built = engine.encode_raw(texts, [config], instruction=instruction, batch_size=batch_size)[0]
        given = engine.encode_raw(texts, [config], instruction=instruction, batch_size=batch_size, features=features)[0]
        assert np.array_equal(built, given)


def test_prebuilt_features_are_not_tokenised_again(make_embedder, monkeypatch):
    emb = make_embedder("bert")
    texts = texts_of(5, seed=1)
    features = emb.engine.input_builder(emb.config).build_all(texts)
    calls: list[list[str]] = []
    build_all = InputBuilder.build_all

    def counted(self, batch, instruction=None):
        calls.append(list(batch))
        return build_all(self, batch, instruction)

    monkeypatch.setattr(InputBuilder, "build_all", counted)
    emb.engine.encode_raw(texts, [emb.config], features=features)
    assert calls == []
    emb.engine.encode_raw(texts, [emb.config])
    assert calls == [list(dict.fromkeys(texts))]  # the control: without features, the distinct texts once


def test_prebuilt_features_must_match_the_texts_and_one_forward_key(make_embedder):
    emb = make_embedder("llama", pooling="mean")
    texts = texts_of(3)
    features = emb.engine.input_builder(emb.config).build_all(texts)
    with pytest.raises(ConfigError, match=r"4 features for 5 texts; give one per text"):
        emb.engine.encode_raw(texts, [emb.config], features=features[:4])
    echo = EmbeddingConfig(pooling="mean", echo=True)
    with pytest.raises(ConfigError, match="the configs must share a forward key"):
        emb.engine.encode_raw(texts, [emb.config, echo], features=features)
