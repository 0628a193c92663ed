"""Position interpolation: after scaling by f, position f*p is rotated exactly as p was; unsupported models refuse."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from lmembed.encoding.engine import resolve_max_length
from lmembed.errors import ConfigError
from lmembed.models.context import interpolate_positions
from lmembed.models.loading import backbone_from_model


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_linear_interpolation_rotates_position_2p_as_p_was(tokenizer, family):
    backbone = backbone_from_model(tiny_model(family, len(tokenizer)), tokenizer)
    x = torch.zeros(1, 1, 8)
    positions = torch.tensor([[0, 1, 5, 37, 63]])
    cos_before, sin_before = backbone.model.rotary_emb(x, positions)
    fingerprint = backbone.fingerprint()
    interpolate_positions(backbone, 2.0)
    cos_after, sin_after = backbone.model.rotary_emb(x, positions * 2)
    torch.testing.assert_close(cos_after, cos_before)
    torch.testing.assert_close(sin_after, sin_before)
    assert backbone.model.config.max_position_embeddings == 256
    assert backbone.fingerprint() != fingerprint  # the cache never mixes the two readings
    ids = torch.tensor([list(range(4, 24)) * 8])  # 160 tokens: past the trained 128
    assert backbone.model(input_ids=ids).last_hidden_state.shape == (1, 160, 32)


def test_embedder_reads_longer_texts_after_interpolation(make_embedder):
    emb = make_embedder("llama", pooling="mean")
    text = " ".join(["the cat sat on the mat"] * 30)  # 180 tokens
    assert resolve_max_length(emb.backbone, 256) == 128  # the trained window caps the length read
    interpolate_positions(emb.backbone, 2.0)
    assert resolve_max_length(emb.backbone, 256) == 256
    longer = emb.with_config(emb.config.with_options(max_length=256))
    assert longer.encode([text]).shape == (1, 32)


@pytest.mark.parametrize(
    ("family", "said"),
    [
        ("bert", "bert has no rotary position embedding"),
        # Gemma 3 has RoPE, one per attention kind: refused for the real reason, with the families supported
        ("gemma3_text", "a rotary embedding per attention kind .* supports llama, mistral, qwen2, qwen3 only"),
    ],
)
def test_unsupported_models_refuse(tokenizer, family, said):
    backbone = backbone_from_model(tiny_model(family, len(tokenizer)), tokenizer)
    with pytest.raises(ConfigError, match=said):
        interpolate_positions(backbone, 2.0)


def test_factor_must_exceed_one(tokenizer):
    backbone = backbone_from_model(tiny_model("llama", len(tokenizer)), tokenizer)
    with pytest.raises(ConfigError, match="factor"):
        interpolate_positions(backbone, 1.0)
