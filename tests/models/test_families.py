"""Every decoder architecture the installed transformers ships, built tiny: lmembed must tell decoders from
encoders by the model itself, either run bidirectional attention through a tested path or refuse it, refuse
clearly what it cannot run, and give identical vectors after ``save()`` + ``from_pretrained()``.

The loop covers every model type in transformers' causal-LM mapping. A representative subset (the five
bidirectional families, the decoders the original bug report named, older GPT-style families, a mixture of
experts, state-space models, encoders and models that must be refused) runs by default; the rest runs
with ``-m slow``. Model types that cannot be built tiny at all are listed in :data:`CANNOT_BUILD` with the
reason, and skipped with that reason (``pytest -rs`` prints them).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModel, BartConfig, BertConfig, Gemma3Config, Gemma3TextConfig
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from lmembed import Embedder, EmbeddingConfig
from lmembed.models.attention import BIDIRECTIONAL_FAMILIES, AttentionError
from lmembed.models.families import CAUSAL_TOLERANCE, check_runnable, detect_kind
from lmembed.models.loading import ModelLoadError

TEXTS = ["the cat sat on the mat", "a dog"]
PAIR = ["the cat sat on the mat", "the cat sat on the rug"]  # differ only in the last word
MAX_TINY_PARAMS = 3_000_000

# Sizes set wherever a config has the field (hidden 32, 2 layers, 4 heads, small experts, state sizes ...).
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "d_head": 8,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
    # mixtures of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "shared_expert_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "moe_topk": 2,
    "zero_expert_num": 2,
    "ffn_hidden_size": 64,
    "expert_ffn_hidden_size": 32,
    "num_dense_layers": 1,
    # latent / indexed attention
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "index_head_dim": 8,
    "index_n_heads": 2,
    "index_topk": 4,
    "rotary_dim": 4,
    # state-space and recurrent layers
    "state_size": 8,
    "expand": 1,
    "n_groups": 1,
    "time_step_rank": 8,
    "mamba_d_state": 8,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "mamba_n_groups": 1,
    "mamba_dt_rank": 8,
    "mamba_d_ssm": 64,
    "mamba_headdim": 16,
    "mamba_ngroups": 1,
    "n_mamba_heads": 4,
    "attention_hidden_size": 64,
    "attention_head_dim": 16,
    "lru_width": 32,
    # per-layer inputs, shared KV layers, extra embeddings
    "num_kv_shared_layers": 0,
    "vocab_size_per_layer_input": 64,
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 8,
    "pronunciation_embed_dim": 16,
    "pronunciation_vocab_size": 16,
    "shape_embed_dim": 16,
    "shape_vocab_size": 16,
    # encoder-decoder models (refused, but built small)
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}
# Families whose config needs more than the shared sizes to validate at this scale.
FAMILY_OPTIONS: dict[str, dict] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "zaya": {"num_experts_per_tok": 1},
    "mamba2": {"num_heads": 4, "head_dim": 8},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
    "dots3_note_text": {"per_layer_config": {}, "head_dim": 16},
    "mimo_v2_flash": {"num_key_value_heads": 2},
    "reformer": {
        "axial_pos_shape": [8, 16],
        "axial_pos_embds_dim": [16, 16],
        "attention_head_size": 8,
        "attn_layers": ["local", "local"],
        "local_attn_chunk_length": 8,
        "feed_forward_size": 64,
    },
}
# Per-layer type lists: keep one layer of each kind (e.g. one linear-attention and one full-attention layer).
LAYER_LISTS = ("layer_types", "block_types", "layers_block_type", "attn_layers", "mlp_layer_types")

# Model types that cannot be built tiny here, and why. Keep this short: anything not listed must build.
CANNOT_BUILD = {
    "cohere_compass_text": "its default config has no rope parameters for its own layer types (KeyError)",
    "dbrx": "its default config does not build a model (DbrxAttentionConfig has no rope_theta)",
    "emu3": "its default config does not build a model (no vq/text sub-config defaults)",
    "gemma3n": "its vision tower needs the timm package",
    "gemma4_assistant": "its default config does not validate (hidden_size_per_layer_input)",
    "musicgen": "its default config does not build a model (no dropout attribute)",
    "musicgen_melody": "its default config does not build a model (no dropout attribute)",
    "qwen4_exp": "its default config leaves the indexer sizes unset (None // None)",
    "qwen4_exp_text": "its default config leaves the indexer sizes unset (None // None)",
    "zamba": "its shared-transformer weight tying does not resolve with fewer layers",
    "git": "its vision tower keeps its full size (85M parameters), too big for the default CPU run",
    "phi4_multimodal": "its vision and audio towers keep their full size (870M parameters)",
}
# Model types transformers has no base model (AutoModel) for: lmembed cannot load them at all.
NO_BASE_MODEL = {"trocr", "gemma4_unified_assistant"}
# Model types lmembed must refuse, with a fragment of the message (encoder-decoder and composite
# multimodal models are recognised from their configs and need no entry).
REFUSED = {
    "cpmant": "takes no attention_mask",
    "xlstm": "takes no attention_mask",
    "xmod": "test forward pass",  # needs a language id set on the model first
    "deepseek_v4": "hidden states",  # hyper-connection streams: (batch, tokens, streams, hidden)
    "hy_v4": "hidden states",
    "gemma3n_text": "hidden states",  # AltUp streams in front of the batch dimension
    "longcat_flash": "hidden states",  # two sub-layers per layer
    "dory": "hidden states",  # recurrent depth: input, looped and output blocks, more states than layers
    # encoders outside families.ENCODER_FAMILIES (not checked against sentence-transformers: test_family_matrix)
    "reformer": "not checked against sentence-transformers",
    "roc_bert": "not checked against sentence-transformers",
    "xlm": "not checked against sentence-transformers",
    "xlnet": "not checked against sentence-transformers",  # its tokenizer gives [CLS] token type 2
}
DEFAULT_RUN = {
    *BIDIRECTIONAL_FAMILIES,
    # the families of the original report
    "gpt_neox",
    "falcon",
    "stablelm",
    "olmo",
    # other decoders
    "gpt2",
    "phi",
    "phi3",
    "opt",
    "bloom",
    "gptj",
    "mpt",
    "gemma2",
    "mixtral",
    "deepseek_v3",
    "mamba",
    "rwkv",
    # encoders in the causal-LM mapping, and models that must be refused
    "bert",
    "roberta",
    "bart",
    "gemma3",
    "cpmant",
    "deepseek_v4",
}
# Natively bidirectional model types: transformers' masked-LM families, plus bidirectional encoders that
# transformers maps to a causal-LM head but not to a masked-LM one.
ENCODER_TYPES = set(MODEL_FOR_MASKED_LM_MAPPING_NAMES) | {"bert-generation", "xlnet"}


def tiny_config(model_type: str, vocab_size: int):
    """The model type's config with every size field it has set small (see :data:`TINY`)."""
    config_class = CONFIG_MAPPING[model_type]
    default = config_class()
    attribute_map = getattr(config_class, "attribute_map", {})
    known = set(default.to_dict()) | set(attribute_map)
    options = {k: v for k, v in {**TINY, "vocab_size": vocab_size}.items() if k in known}
    for name in LAYER_LISTS:
        kinds = getattr(default, name, None)
        if isinstance(getattr(config_class, attribute_map.get(name, name), None), property):
            continue  # derived from other fields
        if isinstance(kinds, list) and kinds:
            unique = list(dict.fromkeys(map(str, kinds)))
            options[name] = unique if len(unique) > 1 else unique * 2
            options["num_hidden_layers"] = len(options[name])
    options.update(FAMILY_OPTIONS.get(model_type, {}))
    return config_class(**options)


def _params(model_type: str):
    marks = () if model_type in DEFAULT_RUN else (pytest.mark.slow,)
    return pytest.param(model_type, marks=marks, id=model_type)


@pytest.mark.parametrize("model_type", [_params(t) for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)])
def test_every_causal_lm_family(model_type, tokenizer, tmp_path, one_torch_thread):
    if model_type in CANNOT_BUILD:
        pytest.skip(f"{model_type}: {CANNOT_BUILD[model_type]}")
    config = tiny_config(model_type, len(tokenizer))
    if model_type in NO_BASE_MODEL:
        with pytest.raises(ValueError, match="Unrecognized configuration class"):
            AutoModel.from_config(config)
        return
    with torch.device("meta"):
        shell = AutoModel.from_config(config)
    if sum(p.numel() for p in shell.parameters()) > MAX_TINY_PARAMS:
        # Composite (multimodal) models keep full-size towers; they are refused from the config alone.
        with pytest.raises(ModelLoadError, match="composite model"):
            check_runnable(shell)
        return
    torch.manual_seed(0)
    model = AutoModel.from_config(config)

    try:
        causal = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    except ModelLoadError as exc:
        expected = "encoder-decoder" if config.is_encoder_decoder else REFUSED.get(model_type)
        assert expected is not None, f"{model_type} was refused unexpectedly: {exc}"
        assert expected in str(exc)
        return
    assert model_type not in REFUSED, f"{model_type} should have been refused"

    # Decoder-ness comes from the model; it agrees with transformers' own split of encoders and decoders.
    is_decoder = causal.backbone.is_decoder
    assert is_decoder == (model_type not in ENCODER_TYPES), model_type
    assert is_decoder == (detect_kind(model).first_token_change <= CAUSAL_TOLERANCE)

    # Bidirectional attention: a tested path, native (encoders), or a clear refusal at construction.
    bidirectional_config = EmbeddingConfig(attention="bidirectional", pooling="cls", normalize=False)
    if is_decoder and model_type not in BIDIRECTIONAL_FAMILIES:
        with pytest.raises(AttentionError, match="not supported"):
            Embedder.from_model(model, tokenizer, bidirectional_config, use_cache=False, show_progress=False)
    else:
        bidir = Embedder.from_model(model, tokenizer, bidirectional_config, use_cache=False, show_progress=False)
        first = bidir.encode(PAIR)
        # tiny random encoders barely move (reformer: 4e-6); the tested decoder paths move clearly
        assert np.abs(first[0] - first[1]).max() > (1e-4 if is_decoder else 0.0), "the first token must see the last"

    # The causal strategy survives save + load exactly (and the decoder verdict with it).
    before = causal.encode(TEXTS)
    if is_decoder:
        first_causal = causal.with_config(causal.config.with_options(pooling="cls")).encode(PAIR)
        np.testing.assert_allclose(first_causal[0], first_causal[1], rtol=0, atol=1e-6)
    causal.save(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "lmembed.json").read_text())["is_decoder"] == is_decoder
    again = Embedder.from_pretrained(str(tmp_path / "saved"), cache=False, show_progress=False)
    assert again.backbone.is_decoder == is_decoder
    assert again.config == causal.config
    np.testing.assert_array_equal(again.encode(TEXTS), before)


def test_cannot_build_list_is_short():
    """The skip list stays small (and is printed: run with -s, or -rs for the skips themselves)."""
    present = {k: v for k, v in CANNOT_BUILD.items() if k in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    print("model types that cannot be built tiny:", ", ".join(f"{k} ({v})" for k, v in present.items()))
    assert len(CANNOT_BUILD) <= 15


@pytest.mark.parametrize("model_type", ["gpt_neox", "falcon", "stablelm", "olmo"])
def test_reported_families_are_causal_decoders(model_type, tokenizer, tmp_path, one_torch_thread):
    """The original report: these were taken for encoders, bidirectional was accepted while the model
    still attended causally, and a saved causal embedder came back as an encoder with other vectors."""
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config(model_type, len(tokenizer)))
    with pytest.raises(AttentionError, match=f"not supported for model_type='{model_type}'"):
        Embedder.from_model(model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False)
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="cls", normalize=False), use_cache=False)
    assert emb.backbone.is_decoder and emb.config.attention == "causal"
    first = emb.encode(PAIR)
    np.testing.assert_allclose(first[0], first[1], rtol=0, atol=1e-6)  # the first token ignores the last
    emb.save(tmp_path / "saved")
    again = Embedder.from_pretrained(str(tmp_path / "saved"), cache=False, show_progress=False)
    assert again.backbone.is_decoder and again.config.attention == "causal"
    np.testing.assert_array_equal(again.encode(TEXTS), emb.encode(TEXTS))


def test_saved_kind_is_read_back_and_checked(tokenizer, tmp_path, one_torch_thread):
    """``is_decoder`` in lmembed.json must match the model; a file written when the model was
    misclassified cannot reproduce its vectors, so loading it is refused."""
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config("gpt_neox", len(tokenizer)))
    Embedder.from_model(model, tokenizer, use_cache=False).save(tmp_path / "saved")
    meta_file = tmp_path / "saved" / "lmembed.json"
    meta = json.loads(meta_file.read_text())
    meta["is_decoder"] = False  # what lmembed wrote for GPT-NeoX before the fix
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match=r"records an encoder .* is a decoder \(causal attention\)"):
        Embedder.from_pretrained(str(tmp_path / "saved"), cache=False)


def test_decoder_verdict_follows_the_model_not_the_config(tokenizer, one_torch_thread):
    """A Gemma 3 config with bidirectional attention switched on is natively bidirectional whatever its
    family, and a BERT built as a decoder attends causally: the probe decides, not the model type."""
    torch.manual_seed(0)
    size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    gemma = AutoModel.from_config(
        Gemma3TextConfig(**size, vocab_size=len(tokenizer), head_dim=8, use_bidirectional_attention=True)
    )
    kind = detect_kind(gemma)
    assert not kind.is_decoder and kind.config_says_decoder
    bert = AutoModel.from_config(BertConfig(**size, vocab_size=len(tokenizer), is_decoder=True))
    assert detect_kind(bert).is_decoder
    emb = Embedder.from_model(bert, tokenizer, EmbeddingConfig(pooling="cls", normalize=False), use_cache=False)
    first = emb.encode(PAIR)
    np.testing.assert_allclose(first[0], first[1], rtol=0, atol=1e-6)


def test_encoder_decoder_and_composite_models_are_refused(tokenizer):
    bart = AutoModel.from_config(
        BartConfig(
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            vocab_size=len(tokenizer),
            **{
                "encoder_attention_heads": 4,
                "decoder_attention_heads": 4,
                "encoder_ffn_dim": 32,
                "decoder_ffn_dim": 32,
            },
        )
    )
    with pytest.raises(ModelLoadError, match="encoder-decoder model"):
        Embedder.from_model(bart, tokenizer)
    with torch.device("meta"):
        gemma3 = AutoModel.from_config(Gemma3Config())
    with pytest.raises(ModelLoadError, match=r"composite model \(sub-configs: text_config, vision_config\)"):
        check_runnable(gemma3)
