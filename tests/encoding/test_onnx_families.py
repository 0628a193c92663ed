"""The ONNX export matrix: every decoder family in ``graph.EXPORT_DECODERS`` gives the torch vectors on padded
batches of texts longer than its 8-token sliding window (where it has one: Mistral, Phi-3 and StarCoder2 window
every layer, Qwen2, Qwen3 and Gemma 2/3 the layers typed ``sliding_attention``); a family outside the matrix, or a
verified one with a setting its export is not verified with, is refused before anything is traced."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModel

from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends import BackendError, quality
from lmembed.encoding.backends.graph import (
    EXPORT_DECODERS,
    INT8_UNVERIFIED,
    NO_WINDOW,
    WINDOW_BY_LAYER_TYPE,
    WINDOW_EVERY_LAYER,
    export_refusal,
)

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")

WINDOW = 8
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "was", "riding", "a", "horse", "in", "movie", "gene", "study"]
# a short text, and texts of 12, 20 and 30 words: the longer ones reach well past the window (padded batch)
TEXTS = ["the cat sat", *(" ".join(WORDS[(i * 5) % len(WORDS)] for i in range(n)) for n in (12, 20, 30))]
STRATEGIES = [EmbeddingConfig(pooling="mean"), EmbeddingConfig(pooling="last")]
# Sizes set wherever a family's config has the field.
SIZES = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "sliding_window": WINDOW,
}
# What each family needs beyond the sizes for its window to apply to (some of) its layers.
OPTIONS: dict[str, dict] = {
    "qwen2": {"use_sliding_window": True, "max_window_layers": 1},  # layer 0 full, layer 1 windowed
    "qwen3": {"use_sliding_window": True, "max_window_layers": 1},
    "gemma2": {"layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 8},
    "gemma3_text": {"layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 8},
    "gptj": {"rotary_dim": 4},
}


@pytest.fixture(autouse=True)
def _isolated_exports(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def tiny_config(model_type: str, vocab_size: int, **overrides):
    config_class = CONFIG_MAPPING[model_type]
    known = set(config_class().to_dict()) | set(getattr(config_class, "attribute_map", {}))
    options = {k: v for k, v in {**SIZES, "vocab_size": vocab_size}.items() if k in known}
    return config_class(**{**options, **OPTIONS.get(model_type, {}), **overrides})


def tiny_decoder(model_type: str, vocab_size: int, seed: int = 0, **overrides):
    config = tiny_config(model_type, vocab_size, **overrides)
    torch.manual_seed(seed)
    try:
        return AutoModel.from_config(config, attn_implementation="sdpa").eval()
    except ValueError:  # no SDPA in this family (Gemma 2): transformers' default, as load_backbone does
        return AutoModel.from_config(tiny_config(model_type, vocab_size, **overrides)).eval()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def encode_both(model, tokenizer, **kwargs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    common = {"use_cache": False, "show_progress": False}
    ref = Embedder.from_model(model, tokenizer, **common)
    onnx = Embedder.from_model(model, tokenizer, backend="onnx", threads=1, **common, **kwargs)
    return ref.encode_strategies(TEXTS, STRATEGIES, batch_size=4), onnx.encode_strategies(TEXTS, STRATEGIES)


def test_the_texts_reach_past_the_window(tokenizer):
    lengths = [len(tokenizer(t)["input_ids"]) for t in TEXTS]
    assert lengths[0] < WINDOW < 2 * WINDOW < max(lengths)


@pytest.mark.parametrize("model_type", sorted(EXPORT_DECODERS))
def test_every_verified_decoder_family_exports_the_torch_vectors(tokenizer, model_type):
    model = tiny_decoder(model_type, len(tokenizer))
    assert export_refusal(model.config) is None
    want, got = encode_both(model, tokenizer)
    for strategy, w, g in zip(STRATEGIES, want, got, strict=True):
        per_text = cosines(w, g)
        assert per_text.min() >= 0.9999, (model_type, strategy.pooling, per_text.round(5).tolist())


def _int8_param(model_type: str):
    # the windowed families (and Llama) run by default; the others with -m slow (about 2 s each)
    default = EXPORT_DECODERS[model_type] != NO_WINDOW or model_type == "llama"
    return pytest.param(model_type, marks=() if default else (pytest.mark.slow,), id=model_type)


@pytest.mark.parametrize("model_type", [_int8_param(t) for t in sorted(set(EXPORT_DECODERS) - set(INT8_UNVERIFIED))])
def test_every_verified_decoder_family_quantises_to_int8(tokenizer, model_type):
    model = tiny_decoder(model_type, len(tokenizer))
    assert export_refusal(model.config, "int8") is None
    ref = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    int8 = Embedder.from_model(
        model, tokenizer, backend="onnx", precision="int8", threads=1, use_cache=False, show_progress=False
    )
    int8.calibrate([" ".join(WORDS[i : i + n]) for n in (3, 9, 17, 25) for i in range(4)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the gate's verdict on a random tiny model is not the point here
        got = int8.encode(TEXTS)
    per_text = cosines(ref.encode(TEXTS), got)
    assert per_text.min() >= quality.MIN_COSINE, (model_type, per_text.round(5).tolist())


@pytest.mark.parametrize("model_type", [t for t, rule in sorted(EXPORT_DECODERS.items()) if rule != NO_WINDOW])
def test_the_window_changes_the_vectors_so_the_matrix_can_fail(tokenizer, model_type):
    """With a window longer than every text the same weights give other vectors for the long texts: a graph that
    dropped the window (as the export did for Mistral, Phi-3 and StarCoder2) fails the matrix above."""
    windowed = tiny_decoder(model_type, len(tokenizer))
    rule = EXPORT_DECODERS[model_type]
    assert rule in (WINDOW_EVERY_LAYER, WINDOW_BY_LAYER_TYPE)
    unwindowed = tiny_decoder(model_type, len(tokenizer), sliding_window=1024)  # longer than any text
    unwindowed.load_state_dict(windowed.state_dict())
    kwargs = {"use_cache": False, "show_progress": False}
    a = Embedder.from_model(windowed, tokenizer, **kwargs).encode(TEXTS)
    b = Embedder.from_model(unwindowed, tokenizer, **kwargs).encode(TEXTS)
    per_text = cosines(a, b)
    assert per_text[0] >= 0.9999  # shorter than the window: the same
    assert per_text[1:].min() < 0.9995, per_text.round(5).tolist()


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3", "gemma3_text"])
def test_bidirectional_graphs_of_windowed_families_match_torch(tokenizer, model_type):
    """Bidirectional attention is one padding-only mask for every layer, on both paths, except on Gemma 3's local
    layers, which keep transformers' bidirectional window (tests/models/test_attention.py) on both paths."""
    model = tiny_decoder(model_type, len(tokenizer))
    config = EmbeddingConfig(attention="bidirectional")
    common = {"use_cache": False, "show_progress": False}
    want = Embedder.from_model(model, tokenizer, config, **common).encode(TEXTS)
    got = Embedder.from_model(model, tokenizer, config, backend="onnx", threads=1, **common).encode(TEXTS)
    assert cosines(want, got).min() >= 0.9999


def test_qwen2_without_use_sliding_window_has_no_window(tokenizer):
    """Qwen2 configs carry a ``sliding_window`` they do not use unless ``use_sliding_window`` is set."""
    plain = tiny_decoder("qwen2", len(tokenizer), use_sliding_window=False)
    assert "sliding_attention" not in plain.config.layer_types
    want, got = encode_both(plain, tokenizer)
    assert cosines(want[0], got[0]).min() >= 0.9999


@pytest.mark.parametrize(
    ("model_type", "overrides", "fragment"),
    [
        ("bloom", {}, "model_type='bloom' has no verified ONNX export"),
        ("cohere", {}, "model_type='cohere' has no verified ONNX export"),
        ("falcon", {"alibi": True}, "model_type='falcon' with alibi=True has no verified ONNX export"),
    ],
)
@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_an_unverified_family_is_refused_before_export(tokenizer, tmp_path, model_type, overrides, fragment, precision):
    config = tiny_config(model_type, len(tokenizer), **overrides)
    model = AutoModel.from_config(config).eval()
    with pytest.raises(BackendError) as caught:
        Embedder.from_model(model, tokenizer, backend="onnx", precision=precision, use_cache=False)
    message = str(caught.value)
    assert fragment in message
    assert f"backend='onnx' (precision={precision!r})" in message
    assert "mistral" in message and "qwen2" in message  # the verified families are listed
    assert not (tmp_path / "home" / "exports").exists()  # refused before anything was traced


def test_a_family_verified_in_float32_only_is_refused_int8(tokenizer):
    model = tiny_decoder("gpt2", len(tokenizer))
    Embedder.from_model(model, tokenizer, backend="onnx", use_cache=False)  # float32: verified above
    with pytest.raises(BackendError, match=r"precision='int8'.*model_type='gpt2' has no verified int8 graph"):
        Embedder.from_model(model, tokenizer, backend="onnx", precision="int8", use_cache=False)


def test_the_refusal_names_the_config_file(tokenizer, tmp_path):
    folder = tmp_path / "bloom"
    AutoModel.from_config(tiny_config("bloom", len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(BackendError, match=r"bloom/config\.json: backend='onnx'.*model_type='bloom'"):
        Embedder.from_pretrained(str(folder), backend="onnx", cache=False, show_progress=False)


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_an_export_leaves_the_shared_model_in_eval_mode(tokenizer, precision):
    """torch.onnx.export restores the training mode of the module it traces; the graph wrapper was created in
    training mode, so GPT-2 and OPT (dropout 0.1) came back training and the torch path then refused them."""
    model = tiny_decoder("opt", len(tokenizer))
    ref = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    before = ref.encode(TEXTS)
    onnx = Embedder.from_model(model, tokenizer, backend="onnx", precision=precision, threads=1, use_cache=False)
    onnx.calibrate([" ".join(WORDS[i : i + n]) for n in (3, 9, 17, 25) for i in range(4)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx.encode(TEXTS)
    assert not any(module.training for module in model.modules())
    np.testing.assert_allclose(ref.encode(TEXTS), before, rtol=0, atol=1e-6)
