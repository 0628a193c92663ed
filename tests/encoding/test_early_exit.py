"""Early exit: ``layer=k`` runs the first k blocks only (counted with hooks), on torch, in an exported ONNX
graph and in the server, and gives exactly the vectors of the full pass read at layer k, for encoders and
decoders, with and without the final norm, and for fused layer sets (which stop at their deepest layer)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_decoder_config
from lmembed import Embedder, EmbeddingConfig
from lmembed.models.depth import block_list, early_exit, exit_depth

LAYERS = 4
TEXTS = [
    "the cat sat on the mat",
    "hello",
    "a much longer text that forces padding of the first one and more words here",
    "protein gene study result",
    "the dog was riding a horse in the movie",
]


@pytest.fixture(autouse=True)
def _quiet(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def deep_model(family: str, vocab_size: int) -> nn.Module:
    """A tiny random model of ``family`` with :data:`LAYERS` blocks (conftest's have two)."""
    from transformers import AutoModel, BertConfig

    torch.manual_seed(0)
    if family == "bert":
        config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    else:
        base = tiny_decoder_config(family, vocab_size).to_dict()
        base.update(num_hidden_layers=LAYERS, layer_types=None)
        config = type(tiny_decoder_config(family, vocab_size))(**base)
    return AutoModel.from_config(config, attn_implementation="sdpa").eval()


def blocks_of(model: nn.Module) -> nn.ModuleList:
    found = block_list(model)
    assert found is not None
    parent, name = found
    return getattr(parent, name)


class BlockCounter:
    """Counts forward calls of every block of a model."""

    def __init__(self, model: nn.Module) -> None:
        self.calls = [0] * LAYERS
        self.handles = [
            block.register_forward_hook(lambda *_args, i=i: self.calls.__setitem__(i, self.calls[i] + 1))
            for i, block in enumerate(blocks_of(model))
        ]

    def ran(self) -> int:
        """How many distinct blocks ran."""
        return sum(1 for c in self.calls if c)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _embedder(model, tokenizer, backend: str | None = None, **strategy) -> Embedder:
    kwargs = {"use_cache": False, "show_progress": False}
    if backend:
        kwargs.update(backend=backend, threads=1)
    return Embedder.from_model(model, tokenizer, EmbeddingConfig(**strategy), **kwargs)


STRATEGIES = [
    {"layer": 1},
    {"layer": 2, "pooling": "last"},
    {"layer": 0},
    {"layer": -2},
    {"layer": (1, 2)},
    {"layer": 2, "final_norm": True},
    {"layer": 2, "final_norm": False},
    {"layer": (0, 3), "final_norm": True, "pooling": "weighted_mean"},
]


@pytest.mark.parametrize("family", ["bert", "llama", "gemma3_text"])
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: EmbeddingConfig(**s).label())
def test_early_exit_gives_the_full_pass_vectors_and_runs_fewer_blocks(tokenizer, family, strategy):
    if family == "bert" and strategy.get("final_norm") is not None:
        pytest.skip("encoders have no final norm")
    model = deep_model(family, len(tokenizer))
    config = EmbeddingConfig(**strategy)
    emb = _embedder(model, tokenizer, **strategy)
    # the full pass read at layer k: the same strategy beside one that reads the last layer (one shared pass)
    full = emb.encode_strategies(TEXTS, [config, config.with_options(layer=-1)], batch_size=2)[0]
    counter = BlockCounter(model)
    try:
        early = emb.encode(TEXTS, batch_size=2)
    finally:
        counter.close()
    np.testing.assert_array_equal(early, full)
    depth = exit_depth([x % (LAYERS + 1) for x in config.layers], LAYERS)
    assert counter.ran() == depth < LAYERS
    assert counter.calls[:depth] == [3] * depth  # every batch (5 texts, 2 a batch) ran each of those blocks


def test_last_layer_runs_every_block_and_the_block_list_is_restored(tokenizer):
    model = deep_model("llama", len(tokenizer))
    blocks = blocks_of(model)
    counter = BlockCounter(model)
    try:
        _embedder(model, tokenizer).encode(TEXTS)
    finally:
        counter.close()
    assert counter.ran() == LAYERS
    with early_exit(model, 2) as stop:
        assert len(model.layers) == 2 and stop is blocks[1]
    assert blocks_of(model) is blocks  # the same list object is back after the pass


def test_early_exit_keeps_gradients_for_training(tokenizer):
    model = deep_model("bert", len(tokenizer))
    emb = _embedder(model, tokenizer, layer=2)
    batch = emb.backbone.tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    pooled = emb.engine.forward_pool(batch["input_ids"], batch["attention_mask"], batch["attention_mask"], [emb.config])
    pooled[0].sum().backward()
    grads = [any(p.grad is not None for p in block.parameters()) for block in blocks_of(model)]
    assert grads == [True, True, False, False]


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_onnx_graph_stops_at_the_read_layer(tokenizer, family):
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")
    import onnx

    model = deep_model(family, len(tokenizer))
    sizes = {}
    for layer in (1, -1):
        torch_emb = _embedder(model, tokenizer, layer=layer, final_norm=True if family == "llama" else None)
        onnx_emb = _embedder(model, tokenizer, "onnx", layer=layer, final_norm=True if family == "llama" else None)
        want, got = torch_emb.encode(TEXTS), onnx_emb.encode(TEXTS)
        assert float((want * got).sum(1).min()) >= 0.9999
        folder = onnx_emb.engine.prepare_backend([onnx_emb.config])
        graph = onnx.load(str(folder / "model.onnx"))
        sizes[layer] = sum(int(np.prod(t.dims)) for t in graph.graph.initializer)
    embeddings = model.get_input_embeddings().weight.numel()
    per_block = sum(p.numel() for p in blocks_of(model)[0].parameters())
    # the layer-1 graph holds the embeddings and one block's weights; the full graph all four blocks'
    assert sizes[1] - embeddings < 1.5 * per_block
    assert sizes[-1] - embeddings > (LAYERS - 0.5) * per_block


def test_server_runs_only_the_blocks_of_its_layer(tokenizer):
    from lmembed.serving.app import create_app
    from lmembed.serving.server import BackgroundServer

    model = deep_model("bert", len(tokenizer))
    emb = _embedder(model, tokenizer, layer=1)
    want = emb.encode(TEXTS)
    with BackgroundServer(create_app(emb, model_name="tiny")) as server:
        deadline = time.monotonic() + 20
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.01)
        counter = BlockCounter(model)
        try:
            body = {"model": "tiny", "input": TEXTS, "encoding_format": "float"}
            reply = httpx.post(server.url + "/v1/embeddings", json=body, timeout=30)
        finally:
            counter.close()
    assert reply.status_code == 200, reply.text
    got = np.asarray([d["embedding"] for d in sorted(reply.json()["data"], key=lambda d: d["index"])], np.float32)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert counter.calls[0] >= 1 and counter.calls[1:] == [0] * (LAYERS - 1)
