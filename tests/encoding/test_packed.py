"""Padding-free (packed) forward passes equal padded ones (lmembed.encoding.packed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmembed import EmbeddingConfig
from lmembed.config import ConfigError
from lmembed.encoding.packed import encode_packed, pack, packed_attention, packed_hidden_states, unpack

# lengths from 1 word to many, so the padded batches carry a lot of padding
TEXTS = [
    "hello",
    "the cat sat on the mat",
    "a much longer text that forces padding of the first one and more words here, the model reads it all",
    "search",
    "retrieval of a document by a query: language model embedding vector search",
    "gene study result",
]


def _raw_padded(emb, texts: list[str], batch_size: int) -> np.ndarray:
    return emb.engine.encode_raw(texts, [emb.config], batch_size=batch_size)[0]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize(
    ("family", "strategy"),
    [
        ("bert", {"pooling": "mean"}),
        ("bert", {"pooling": "cls"}),
        ("llama", {"pooling": "mean", "attention": "causal"}),
        ("llama", {"pooling": "last", "attention": "causal"}),
        ("llama", {"pooling": "mean", "attention": "bidirectional"}),
        ("qwen2", {"pooling": "mean", "attention": "causal"}),
        ("qwen2", {"pooling": "mean", "attention": "bidirectional", "layer": -2}),
    ],
)
def test_packed_equals_padded(make_embedder, one_torch_thread, family, strategy):
    emb = make_embedder(family, **strategy)
    padded = _raw_padded(emb, TEXTS, batch_size=4)
    packed = encode_packed(emb.engine, TEXTS, emb.config, batch_size=4)
    assert packed.shape == padded.shape
    cos = _cosines(packed, padded)
    assert cos.min() >= 0.9999, cos
    np.testing.assert_allclose(packed, padded, atol=2e-5, rtol=1e-4)
    # the model's attention is restored after the packed pass
    assert emb.backbone.model.config._attn_implementation == "sdpa"


def test_packed_detects_a_leak_between_texts(make_embedder, one_torch_thread):
    """The comparison can fail: packing the texts with one shared position count (as if they were one text) and
    no bounds between them gives other vectors."""
    emb = make_embedder("llama", pooling="mean", attention="bidirectional")
    model = emb.backbone.model
    emb.engine.backend.prepare([emb.config], "bidirectional")  # the mode is set on the first pass otherwise
    feats = emb.engine.input_builder(emb.config).build_all(TEXTS[:3])
    good = pack([f.input_ids for f in feats])
    one = pack([[i for f in feats for i in f.input_ids]])  # the texts as a single sequence
    leaky = type(good)(one.input_ids, one.position_ids, one.cu_seqlens, one.lengths)
    with torch.inference_mode():
        right = unpack(packed_hidden_states(model, good, is_decoder=True)[-1], good)
        wrong = packed_hidden_states(model, leaky, is_decoder=True)[-1]
    first = len(feats[0])
    assert not torch.allclose(right[0, :first], wrong[0, :first], atol=1e-3)


@pytest.mark.parametrize("model_type", ["mpnet", "deberta-v2"])
def test_packed_refuses_a_model_that_computes_attention_itself(model_type, one_torch_thread, monkeypatch):
    """MPNet, DeBERTa and others never call transformers' attention interface: the packed kernel was not used, and
    every text of a row attended to the others (cosine 0.69-0.78 to the padded vectors). Refused by the class's own
    word, and, were that word wrong, by a probe that packs a text after another."""
    from transformers import AutoModel

    from family_builders import family_config, family_tokenizer
    from lmembed import Embedder

    tokenizer = family_tokenizer(model_type)
    torch.manual_seed(0)
    model = AutoModel.from_config(family_config(model_type, len(tokenizer))).eval()
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="mean"), use_cache=False, show_progress=False)
    with pytest.raises(ConfigError, match=f"model_type='{model_type}' computes attention in its own code"):
        encode_packed(emb.engine, TEXTS, emb.config)
    monkeypatch.setattr(type(model), "_supports_attention_backend", True)  # a class that claims what it does not do
    with pytest.raises(ConfigError, match="let a text attend to another packed in the same row"):
        encode_packed(emb.engine, TEXTS, emb.config)


def test_pack_and_unpack_shapes():
    batch = pack([[5, 6, 7], [8], [9, 10]], start=2)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert batch.position_ids.tolist() == [[2, 3, 4, 2, 2, 3]]
    assert batch.cu_seqlens.tolist() == [0, 3, 4, 6]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.max_length == 3
    states = torch.arange(6, dtype=torch.float32).reshape(1, 6, 1)
    assert unpack(states, batch)[..., 0].tolist() == [[0, 1, 2], [3, 0, 0], [4, 5, 0]]
    with pytest.raises(ConfigError):
        pack([[1], []])


def test_packed_refuses_what_it_does_not_compute(make_embedder):
    emb = make_embedder("llama", pooling="mean")
    with pytest.raises(ConfigError, match="final_norm"):  # raw last-layer states (before the final norm)
        encode_packed(emb.engine, TEXTS, EmbeddingConfig(pooling="mean", final_norm=False))
    model = emb.backbone.model
    with pytest.raises(RuntimeError, match="cu_seq_lens_q"):  # the packed kernel run without its bounds
        q = torch.zeros(1, 4, 3, 8)
        packed_attention(model.layers[0].self_attn, q, q[:, :2], q[:, :2], None)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["bert", "llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_packed_varlen_kernel_on_cuda_equals_padded(tokenizer, family, dtype):
    """On CUDA in half precision the packed pass runs torch's varlen flash kernel (not SDPA per text)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from conftest import tiny_model
    from lmembed import Embedder
    from lmembed.encoding import packed as packed_module

    model = tiny_model(family, len(tokenizer)).to("cuda", dtype)
    strategy = {"attention": "bidirectional"} if family != "bert" else {}
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(**strategy), use_cache=False, show_progress=False)
    calls = []
    real = packed_module.varlen_kernel_used

    def spy(query):
        calls.append(real(query))
        return calls[-1]

    packed_module.varlen_kernel_used = spy
    try:
        packed = encode_packed(emb.engine, TEXTS, emb.config, batch_size=4)
    finally:
        packed_module.varlen_kernel_used = real
    assert calls and all(calls)
    padded = _raw_padded(emb, TEXTS, batch_size=4)
    assert _cosines(packed, padded).min() >= 0.999
