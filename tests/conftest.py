"""Shared fixtures: tiny randomly initialised models and a tiny tokenizer, built offline in seconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lmembed.paths import shared_candidates, shared_datasets_dir

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

REPO = Path(__file__).resolve().parents[1]
SHARED = shared_datasets_dir() or shared_candidates()[0]

WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
    "is",
    "was",
    "cat",
    "dog",
    "sat",
    "mat",
    "rug",
    "man",
    "woman",
    "food",
    "horse",
    "riding",
    "eating",
    "movie",
    "great",
    "bad",
    "query",
    "document",
    "instruct",
    "rewrite",
    "sentence",
    "hello",
    "there",
    "friend",
    "longer",
    "text",
    "forces",
    "padding",
    "first",
    "one",
    "science",
    "protein",
    "cell",
    "gene",
    "study",
    "result",
    "model",
    "language",
    "embedding",
    "vector",
    "search",
    "retrieval",
]


def build_tokenizer(bos: bool = False):
    """A word-level fast tokenizer over a fixed vocabulary (unknown words map to [UNK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS)) + list(":,.!?\n"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )


def tiny_decoder_config(family: str, vocab_size: int):
    """Config of a 2-layer, 32-wide decoder of the given family."""
    import transformers as tf

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return tf.Qwen2Config(**common)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=8)
    if family == "gemma3_text":
        return tf.Gemma3TextConfig(**common, head_dim=8, sliding_window=4, query_pre_attn_scalar=8)
    raise ValueError(family)


def tiny_bert_config(vocab_size: int, **overrides):
    """Config of a 2-layer, 32-wide BERT (``overrides`` replace fields: ``num_labels``, ``max_position_embeddings``)."""
    from transformers import BertConfig

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    return BertConfig(**{"vocab_size": vocab_size, **sizes, "max_position_embeddings": 128, **overrides})


def tiny_model(family: str, vocab_size: int, attn: str = "sdpa", seed: int = 0):
    from transformers import AutoModel

    torch.manual_seed(seed)
    config = tiny_bert_config(vocab_size) if family == "bert" else tiny_decoder_config(family, vocab_size)
    return AutoModel.from_config(config, attn_implementation=attn).eval()


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a busy machine two threads stall on every matmul."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster with 2 CPUs, started once per test module that asks for it (Ray takes seconds to start);
    yields its address (for ``--ray-address`` and drivers in child processes). Skipped without Ray."""
    ray = pytest.importorskip("ray", reason="the Ray engine needs Ray Data: pip install 'lmembed[scale]'")
    from lmembed.scale import make_engine

    engine = make_engine("ray", num_cpus=2)
    engine.start()
    yield ray.get_runtime_context().gcs_address
    engine.shutdown()


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def make_embedder(tokenizer):
    """Factory: ``make_embedder(family, attn="sdpa", **strategy)`` → uncached Embedder on a tiny model."""
    from lmembed import Embedder, EmbeddingConfig

    def factory(family: str = "llama", attn: str = "sdpa", tok=None, **strategy):
        tok = tok or tokenizer
        model = tiny_model(family, len(tok), attn)
        return Embedder.from_model(model, tok, EmbeddingConfig(**strategy), use_cache=False, show_progress=False)

    return factory


def shared_or_skip(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"real data not found at {path} (../shared/datasets beside the checkout)")
    return path


def bundled_or_skip(name: str) -> str:
    from lmembed.models.bundled import BUNDLED, BundledModelMissing, _package_dir

    spec = BUNDLED[name]
    try:
        _package_dir(spec.package, spec.install)
    except BundledModelMissing as exc:
        pytest.skip(str(exc))
    return name
