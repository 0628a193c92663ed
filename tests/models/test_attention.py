"""Bidirectional attention really is bidirectional, causal really is causal, and nothing else passes."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.models import attention
from lmembed.models.attention import AttentionError

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text"]
A = "the cat sat on the mat"
B = "the cat sat on the rug"
NEAR = "the dog sat on the mat"
LONG = "a much longer text that forces padding of the first one and more words here"


def first_token_vectors(emb, texts, batch_size):
    return emb.encode(texts, batch_size=batch_size)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["causal", "bidirectional"])
def test_first_token_sees_later_tokens_only_when_bidirectional(make_embedder, family, attn, mode):
    emb = make_embedder(family, attn, pooling="cls", attention=mode, normalize=False)
    # Gemma 3's local layers keep a bidirectional window (3 tokens on either side here): its texts differ early
    b = NEAR if family == "gemma3_text" else B
    # batch size 1 (no padding at all) ...
    single = np.stack([emb.encode([A], batch_size=1)[0], emb.encode([b], batch_size=1)[0]])
    # ... and a padded batch, under both padding sides
    for side in ("left", "right"):
        emb.engine.padding_side = side
        padded = emb.encode([A, LONG, b], batch_size=3)[[0, 2]]
        np.testing.assert_allclose(padded, single, atol=1e-5)
    delta = np.abs(single[0] - single[1]).max()
    if mode == "bidirectional":
        assert delta > 1e-3
    else:
        assert delta < 1e-6


def test_unsupported_family_fails_loudly(tokenizer):
    from transformers import GPT2Config, GPT2Model

    from lmembed import Embedder, EmbeddingConfig

    model = GPT2Model(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tokenizer), n_positions=64))
    # refused when the strategy is set, not accepted and recorded first
    with pytest.raises(AttentionError, match="Llama"):
        Embedder.from_model(model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False)
    causal = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False)
    assert causal.backbone.is_decoder
    with pytest.raises(AttentionError, match="Llama"):
        causal.with_config(causal.config.with_options(attention="bidirectional"))
    with pytest.raises(AttentionError, match="Llama"):
        causal.encode_strategies([A], [causal.config.with_options(attention="bidirectional")])


def test_a_mask_that_stops_working_is_caught(make_embedder, monkeypatch):
    """Simulate a transformers upgrade that ignores our 4-D mask: the probe must refuse to run."""
    emb = make_embedder("llama", "sdpa", attention="bidirectional")
    monkeypatch.setattr(attention, "mask_for", lambda mode, mask, dtype, config: mask)
    monkeypatch.setattr(attention, "set_causal_flags", lambda model, causal: 0)
    for module in emb.backbone.model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = True
    with pytest.raises(AttentionError, match="first token ignores later tokens"):
        emb.encode([A])


def test_flash_attention_is_refused_for_bidirectional(make_embedder):
    emb = make_embedder("llama", "sdpa", attention="bidirectional")
    emb.backbone.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(AttentionError, match="attn_implementation"):
        attention.check_bidirectional_supported(emb.backbone.model)


def test_probe_survives_tokens_that_share_an_embedding(make_embedder):
    """Quantised checkpoints can give several token ids one embedding row; the probe must pick
    a last token whose embedding really differs (a real smollm2 failure, caught in review)."""
    import torch

    emb = make_embedder("llama", "sdpa", attention="bidirectional")
    table = emb.backbone.model.get_input_embeddings().weight
    with torch.no_grad():
        table[: int(table.shape[0] * 0.9)] = table[0].clone()
    assert attention.first_token_sensitivity(emb.backbone.model, "bidirectional") > 1e-3
    attention.verify_attention(emb.backbone.model, "bidirectional")


def test_embedders_sharing_a_model_keep_their_modes(tokenizer):
    """Two Embedders on one model object: the bidirectional one must not leave the causal one
    reading a bidirectional model (the attention mode lives on the model, not on each engine)."""
    model = tiny_model("llama", len(tokenizer))
    options = {"use_cache": False, "show_progress": False}
    causal = Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="cls", normalize=False), **options)
    bidir = Embedder.from_model(
        model, tokenizer, EmbeddingConfig(pooling="cls", normalize=False, attention="bidirectional"), **options
    )
    assert causal.backbone.is_decoder and bidir.backbone.is_decoder
    before = causal.encode([A, B], batch_size=1)
    moved = bidir.encode([A, B], batch_size=1)
    after = causal.encode([A, B], batch_size=1)
    np.testing.assert_array_equal(after, before)
    assert np.abs(before[0] - before[1]).max() < 1e-6 < np.abs(moved[0] - moved[1]).max()


def test_bidirectional_gemma3_keeps_transformers_window_on_its_local_layers(tokenizer):
    """Run bidirectionally, Gemma 3's sliding-window layers lost their window (one padding-only mask for every
    layer): texts longer than half the window got other vectors than transformers' own bidirectional Gemma 3
    (``use_bidirectional_attention``, EmbeddingGemma's convention: a symmetric window of ``w // 2 + 1``). The
    reference is transformers' model with that flag, built on the same weights; the vectors without any window
    differ, so the comparison can fail."""
    import torch
    from transformers import AutoModel, Gemma3TextConfig

    model = tiny_model("gemma3_text", len(tokenizer))
    assert "sliding_attention" in model.config.layer_types and model.config.sliding_window == 4
    texts = [LONG, A, "one two three four five six seven eight nine ten eleven twelve"]
    strategy = EmbeddingConfig(attention="bidirectional", pooling="mean", normalize=False)
    got = Embedder.from_model(model, tokenizer, strategy, use_cache=False, show_progress=False).encode(texts)

    flagged = Gemma3TextConfig(**{**model.config.to_dict(), "use_bidirectional_attention": True})
    reference = AutoModel.from_config(flagged, attn_implementation="sdpa").eval()
    reference.load_state_dict(model.state_dict())
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = ((states * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)

    wide = Gemma3TextConfig(**{**model.config.to_dict(), "sliding_window": 1024})  # longer than every text
    unwindowed = AutoModel.from_config(wide, attn_implementation="sdpa").eval()
    unwindowed.load_state_dict(model.state_dict())
    plain = Embedder.from_model(unwindowed, tokenizer, strategy, use_cache=False, show_progress=False).encode(texts)
    assert np.abs(plain - want).max() > 1e-3
