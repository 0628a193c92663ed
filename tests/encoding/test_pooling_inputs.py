"""Pooling, instructions, echo and layer selection: each strategy does what it claims."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmembed import EmbeddingConfig, config
from lmembed.encoding.inputs import InputBuilder
from lmembed.pooling import poolers
from lmembed.pooling.layers import LayerSelectionError, normalize_layer

TEXT = "the cat sat on the mat"
OTHERS = ["hello", "a much longer text that forces padding of the first one and more words here"]
POOLINGS = list(config.POOLINGS)  # every registered pooling (the README says each is tested)


@pytest.mark.parametrize("family", ["llama", "bert"])
@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("instruction", [None, "retrieve a document"])
@pytest.mark.parametrize("echo", [False, True])
def test_same_vector_alone_and_in_padded_batch_left_and_right(make_embedder, family, pooling, instruction, echo):
    emb = make_embedder(family, pooling=pooling, echo=echo, attention="causal")
    alone = emb.encode([TEXT], batch_size=1, instruction=instruction)[0]
    for side in ("left", "right"):
        emb.engine.padding_side = side
        batch = emb.encode([OTHERS[0], TEXT, OTHERS[1]], batch_size=3, instruction=instruction)
        np.testing.assert_allclose(batch[1], alone, atol=2e-5, err_msg=f"padding side {side}")


def test_instruction_tokens_attend_but_are_not_pooled(tokenizer):
    cfg = EmbeddingConfig(pooling="mean")
    builder = InputBuilder(tokenizer, cfg, is_decoder=True, max_length=64)
    plain = builder.build(TEXT)
    inst = builder.build(TEXT, instruction="retrieve a document")
    assert sum(inst.pool_mask) == sum(plain.pool_mask) == len(TEXT.split())
    assert len(inst) > len(plain)
    pooled_ids = [i for i, m in zip(inst.input_ids, inst.pool_mask, strict=True) if m]
    assert pooled_ids == plain.input_ids


def test_echo_pools_only_the_second_copy(tokenizer):
    builder = InputBuilder(tokenizer, EmbeddingConfig(pooling="mean", echo=True), is_decoder=True, max_length=64)
    feat = builder.build(TEXT)
    words = len(TEXT.split())
    assert sum(feat.pool_mask) == words
    assert feat.pool_mask[-words:] == [1] * words
    # the first copy is present, unpooled
    assert feat.input_ids.count(tokenizer.convert_tokens_to_ids("cat")) == 2


def test_last_pooling_appends_eos_on_decoders_only(tokenizer):
    dec = InputBuilder(tokenizer, EmbeddingConfig(pooling="last"), is_decoder=True, max_length=64).build(TEXT)
    enc = InputBuilder(tokenizer, EmbeddingConfig(pooling="last"), is_decoder=False, max_length=64).build(TEXT)
    assert dec.input_ids[-1] == tokenizer.eos_token_id and dec.pool_mask[-1] == 1
    assert enc.input_ids[-1] != tokenizer.eos_token_id


def test_truncation_keeps_instruction_and_cuts_text(tokenizer):
    builder = InputBuilder(tokenizer, EmbeddingConfig(pooling="last"), is_decoder=True, max_length=12)
    feat = builder.build(" ".join(["cat"] * 50), instruction="retrieve a document")
    assert len(feat) == 12
    assert feat.input_ids[-1] == tokenizer.eos_token_id
    prefix = InputBuilder(tokenizer, EmbeddingConfig(), is_decoder=True, max_length=64).build(
        "x", instruction="retrieve a document"
    )
    kept_prefix = len(prefix) - 1  # every instruction token survives; only the text was cut
    assert feat.pool_mask[:kept_prefix] == [0] * kept_prefix
    assert sum(feat.pool_mask) == 12 - kept_prefix


def test_poolers_by_hand():
    hidden = torch.arange(12, dtype=torch.float32).view(1, 4, 3)
    mask = torch.tensor([[0, 1, 1, 0]])
    assert torch.equal(poolers.cls_pool(hidden, mask), hidden[:, 1])
    assert torch.equal(poolers.last_pool(hidden, mask), hidden[:, 2])
    assert torch.allclose(poolers.mean_pool(hidden, mask), (hidden[:, 1] + hidden[:, 2]) / 2)
    assert torch.allclose(poolers.weighted_mean_pool(hidden, mask), (hidden[:, 1] + 2 * hidden[:, 2]) / 3)
    with pytest.raises(ValueError, match="no poolable tokens"):
        poolers.mean_pool(hidden, torch.zeros_like(mask))


def test_layer_selection_and_fusion(make_embedder):
    emb = make_embedder("llama", pooling="mean", normalize=False)
    cfgs = [emb.config.with_options(layer=x) for x in (0, 1, 2, -1, (1, 2))]
    l0, l1, l2, last, fused = emb.encode_strategies([TEXT], cfgs)
    np.testing.assert_allclose(l2, last)
    np.testing.assert_allclose(fused, (l1 + l2) / 2, atol=1e-6)
    assert not np.allclose(l0, l1)
    with pytest.raises(LayerSelectionError, match="out of range"):
        normalize_layer(5, 2)


def test_final_norm_options(make_embedder):
    emb = make_embedder("llama", pooling="mean", normalize=False)
    base = emb.config
    default, raw, normed_mid, mid = emb.encode_strategies(
        [TEXT],
        [
            base.with_options(layer=-1),
            base.with_options(layer=-1, final_norm=False),
            base.with_options(layer=1, final_norm=True),
            base.with_options(layer=1),
        ],
    )
    assert not np.allclose(default, raw)  # the default last layer is after the final norm
    assert not np.allclose(normed_mid, mid)
    model = emb.backbone.model
    with torch.no_grad():
        ids = torch.tensor([emb.backbone.tokenizer(TEXT)["input_ids"]])
        states = model(input_ids=ids, output_hidden_states=True).hidden_states
        normed = model.norm(states[1])
    np.testing.assert_allclose(mid[0], states[1][0].mean(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(normed_mid[0], normed[0].mean(0).numpy(), atol=1e-5)


def test_matryoshka_truncation_then_normalisation(make_embedder):
    emb = make_embedder("bert", pooling="mean", dim=8)
    vec = emb.encode([TEXT])
    assert vec.shape == (1, 8) and vec.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, rtol=1e-5)
    full = emb.with_config(emb.config.with_options(dim=None, normalize=False)).encode([TEXT])
    np.testing.assert_allclose(vec[0], full[0, :8] / np.linalg.norm(full[0, :8]), rtol=1e-5)


def test_fresh_latent_attention_head_separates_texts(make_embedder):
    """A new head must not map every text to one vector (training would start at chance)."""
    emb = make_embedder("llama", pooling="latent_attention")
    vecs = emb.encode(["the cat sat on the mat", "protein cell gene study", "stock"])
    sims = vecs @ vecs.T
    assert sims[0, 1] < 0.99 and sims[0, 2] < 0.99


@pytest.mark.parametrize("instruction", [None, "Given a question, find the passage"])
def test_inputs_match_the_tokenizer_call_whatever_state_the_backend_was_left_in(tokenizer, instruction):
    """The builder reads the Rust encodings directly (no per-text conversion by the wrapper) and sets the backend's
    truncation and padding itself: a caller's earlier ``tokenizer(..., truncation=True, max_length=3,
    padding="max_length")`` changes nothing, and the features are those the wrapper's own call gives."""
    config = EmbeddingConfig(pooling="mean", attention="bidirectional")
    texts = ["the cat sat on the mat", "hello", "a man riding a horse on the mat in the first movie " * 4, ""]
    fresh = InputBuilder(tokenizer, config, is_decoder=True, max_length=16).build_all(texts, instruction)
    builder = InputBuilder(tokenizer, config, is_decoder=True, max_length=16)
    for build in (
        lambda: builder.build_all(texts, instruction),
        lambda: [builder.build(t, instruction) for t in texts],
    ):
        tokenizer(texts, truncation=True, max_length=3, padding="max_length")  # leaves truncation and padding set
        assert build() == fresh
    if instruction is None:  # nothing wraps the text: ids are the wrapper's plain truncated call, all pooled
        ids = tokenizer(texts[:3], truncation=True, max_length=16)["input_ids"]
        assert [f.input_ids for f in fresh[:3]] == ids and all(set(f.pool_mask) == {1} for f in fresh[:3])
    assert len(fresh[2]) == 16  # the long text was cut to max_length
    # and the wrapper, called after the builder, still pads and truncates as it is asked to
    again = tokenizer(texts, truncation=True, max_length=3, padding="max_length")["input_ids"]
    assert {len(ids) for ids in again} == {3}
