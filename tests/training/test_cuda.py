"""The CPU suite's guarantees, checked again on a CUDA GPU (skipped where there is none, as in CI).

Run on a GPU machine with ``pytest -m gpu``. What can differ on a GPU and is checked here:

* SDPA dispatches to fused CUDA kernels (flash / memory-efficient) that take their own path for
  masks and ``is_causal``; bidirectional attention must survive that, in float32 and bfloat16;
* left padding under those kernels and in bfloat16;
* GradCache must replay dropout from the *CUDA* generator's state, not the CPU's;
* a resumed run must restore the CUDA generator too, or its dropout masks (and losses) drift.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_model
from helpers import write_jsonl
from lmembed import Embedder, EmbeddingConfig
from lmembed.models.attention import first_token_sensitivity
from lmembed.training.gradcache import GradCache
from lmembed.training.losses import InfoNCELoss
from lmembed.training.trainer import Trainer
from test_gradcache import CHUNK, _features, _grads, _model, _reference_step, _retrieval_loss
from test_gradcache import _embedder as embed_fn
from test_trainer import ROWS, make_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with -m gpu on a GPU machine)"),
]

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3_text"]
TEXTS = ["the cat", "a man riding a horse on the mat in the first movie", "hello there friend", "science"]


def _embedder(tokenizer, family: str, attn: str, device: str, dtype: torch.dtype, **strategy) -> Embedder:
    model = tiny_model(family, len(tokenizer), attn).to(device=device, dtype=dtype)
    config = EmbeddingConfig(**{"pooling": "mean", "attention": "bidirectional", **strategy})
    return Embedder.from_model(model, tokenizer, config, use_cache=False, show_progress=False)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bidirectional_left_padded_batches_on_gpu(tokenizer, family, attn, dtype):
    gpu = _embedder(tokenizer, family, attn, "cuda", dtype)
    assert first_token_sensitivity(gpu.backbone.model, "bidirectional") > 0, "first token blind to later ones"
    assert first_token_sensitivity(gpu.backbone.model, "causal") == 0
    batched = gpu.encode(TEXTS, batch_size=len(TEXTS))  # padded batch (the engine pads on the left)
    alone = np.concatenate([gpu.encode([text]) for text in TEXTS])
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert _min_cosine(batched, alone) > 1 - tolerance
    cpu = _embedder(tokenizer, family, attn, "cpu", torch.float32).encode(TEXTS, batch_size=len(TEXTS))
    assert _min_cosine(batched, cpu) > 1 - tolerance


def test_gradcache_replays_cuda_dropout():

    loss = InfoNCELoss()
    groups = [{k: v.cuda() for k, v in _features(seed).items()} for seed in (1, 2, 3)]
    runs = []
    for cached in (False, True):
        model = _model().cuda().train()  # dropout on: the masks come from the CUDA generator
        torch.cuda.manual_seed(11)
        if cached:
            value = GradCache(embed_fn(model), loss, chunk_size=CHUNK)(*groups)
        else:
            value = _reference_step(model, _retrieval_loss(loss), groups, chunked=True)
        runs.append((value.item(), _grads(model)))
    (plain_loss, plain_grads), (cached_loss, cached_grads) = runs
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain_grads.keys() == cached_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_resume_restores_cuda_dropout(tmp_path, tokenizer):

    data = write_jsonl(tmp_path / "train.jsonl", [{"query": q, "positive": p, "negatives": [n]} for q, p, n in ROWS])
    options = {"steps": 4, "save_every": 2, "lora_dropout": 0.1, "device": "cuda"}

    def model():
        return _embedder(tokenizer, "llama", "sdpa", "cuda", torch.float32)

    expected = Trainer(make_config(tmp_path, data, output=str(tmp_path / "a"), **options), model=model()).train().losses
    first = Trainer(make_config(tmp_path, data, output=str(tmp_path / "b"), **options), model=model())
    head = [first.train_step()["loss"] for _ in range(2)]
    first.save_checkpoint()
    first.train_step()  # lost in the "crash"
    resumed = Trainer(make_config(tmp_path, data, output=str(tmp_path / "b"), resume=True, **options), model=model())
    assert str(resumed.model.device).startswith("cuda")
    assert head + resumed.train().losses == expected
