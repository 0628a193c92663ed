"""Cache keys cover everything that decides a vector: the same weights under an edited ``config.json`` (a sliding
window, a RoPE base) or an edited tokenizer get another ``Backbone.fingerprint``, so another embedding-cache folder
and another export folder, and are never served the first model's vectors; reloads and copies of one folder, and
the bookkeeping fields of its config, keep the fingerprint (and the cache hits)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import MistralConfig, MistralModel

from conftest import build_tokenizer
from lmembed import Embedder
from lmembed.models.loading import backbone_from_model, load_backbone

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "was", "riding", "a", "horse", "in", "movie", "gene", "study"]
TEXTS = ["the cat sat", *(" ".join(WORDS[(i * 5) % len(WORDS)] for i in range(n)) for n in (12, 20, 30))]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def save_mistral(folder: Path, tokenizer) -> Path:
    """A tiny Mistral with no sliding window; attention weights large enough for positions to matter."""
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        sliding_window=None,
        initializer_range=0.3,
    )
    MistralModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def edited_copy(source: Path, target: Path, config=None, tokenizer=None) -> Path:
    """A copy of ``source`` (same weights) with ``config(dict)`` / ``tokenizer(dict)`` applied to its JSON files."""
    shutil.copytree(source, target)
    for name, edit in (("config.json", config), ("tokenizer.json", tokenizer)):
        if edit is not None:
            data = json.loads((target / name).read_text())
            edit(data)
            (target / name).write_text(json.dumps(data))
    return target


def set_window(config: dict) -> None:
    config["sliding_window"] = 8


def set_rope_base(config: dict) -> None:
    config["rope_parameters"] = {**config.get("rope_parameters", {}), "rope_theta": 100.0}


def swap_cat_and_dog(tokenizer: dict) -> None:
    vocab = tokenizer["model"]["vocab"]
    vocab["cat"], vocab["dog"] = vocab["dog"], vocab["cat"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return save_mistral(tmp_path_factory.mktemp("models") / "original", build_tokenizer())


def fingerprint(folder: Path) -> str:
    return load_backbone(str(folder)).fingerprint()


def test_the_fingerprint_is_stable_across_reloads_copies_and_bookkeeping(original, tmp_path):
    first = load_backbone(str(original))
    key = first.fingerprint()
    Embedder.from_pretrained(str(original), cache=False, show_progress=False).encode(TEXTS)  # tokenises, encodes
    assert first.fingerprint() == key == fingerprint(original)
    assert fingerprint(edited_copy(original, tmp_path / "copy")) == key  # the folder's path is not part of it

    def bookkeeping(config: dict) -> None:
        config["transformers_version"] = "0.0.1"
        config["architectures"] = ["MistralForCausalLM"]
        config["use_cache"] = not config.get("use_cache", True)

    assert fingerprint(edited_copy(original, tmp_path / "bookkeeping", config=bookkeeping)) == key


@pytest.mark.parametrize(
    ("edit", "config", "tokenizer"),
    [("sliding_window", set_window, None), ("rope_theta", set_rope_base, None), ("tokenizer", None, swap_cat_and_dog)],
)
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_an_edited_config_or_tokenizer_is_not_served_the_original_s_vectors(
    original, tmp_path, edit, config, tokenizer, backend
):
    if backend == "onnx":
        pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    edited = edited_copy(original, tmp_path / edit, config=config, tokenizer=tokenizer)
    cache = tmp_path / "cache"
    kwargs = {"cache_dir": cache, "show_progress": False, "backend": backend}
    first = Embedder.from_pretrained(str(original), **kwargs)
    served_first = first.encode(TEXTS)
    second = Embedder.from_pretrained(str(edited), **kwargs)
    assert second.backbone.fingerprint() != first.backbone.fingerprint()
    served = second.encode(TEXTS)
    truth = Embedder.from_pretrained(str(edited), cache=False, show_progress=False).encode(TEXTS)
    assert cosines(served, truth).min() >= 0.9999
    assert cosines(served_first, truth).min() < 0.999  # the edit changes the vectors: a shared key would show
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2  # one cache folder per model
    if backend == "onnx":
        exports = [p for p in (tmp_path / "home" / "exports").iterdir() if not p.name.startswith(".")]
        assert len(exports) == 2  # and one exported graph per model
        assert second.backend.graph_folder([second.config], "causal") != first.backend.graph_folder(
            [first.config], "causal"
        )


def test_an_in_memory_model_s_fingerprint_covers_its_tokenizer_and_config():
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = MistralModel(
        MistralConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=None,
        )
    )
    plain = backbone_from_model(model, tok).fingerprint()
    assert backbone_from_model(model, build_tokenizer()).fingerprint() == plain  # an equal tokenizer, rebuilt
    assert backbone_from_model(model, build_tokenizer(bos=True)).fingerprint() != plain  # a BOS token prepended
    left = build_tokenizer()
    left.truncation_side = "left"
    assert backbone_from_model(model, left).fingerprint() != plain
    backbone = backbone_from_model(model, tok)
    backbone.fingerprint()
    model.config.sliding_window = 8
    assert backbone.fingerprint() != plain  # a config field changed after hashing: hashed again
    model.config.sliding_window = None
    assert backbone.fingerprint() == plain


def test_a_model_changed_in_place_is_not_served_its_old_vectors(original):
    """The fingerprint was hashed once and kept: weights written in place (a user's own training loop,
    ``load_state_dict``, ``add_``) or a tokenizer setting changed after a cached encode were served the vectors
    of the model as it was, in silence."""
    emb = Embedder.from_pretrained(str(original), show_progress=False)  # cached (in the test's own home)
    long = " ".join(WORDS * 8)
    before = emb.encode([*TEXTS, long])
    key = emb.backbone.fingerprint()
    emb.encode([*TEXTS, long])
    assert emb.backbone.fingerprint() == key  # encoding changes nothing the stamp sees: no hashing again
    with torch.no_grad():
        for parameter in emb.backbone.model.layers[0].parameters():
            parameter.mul_(1.5)
    changed = emb.encode([*TEXTS, long])
    fresh = Embedder.from_model(emb.backbone.model, emb.backbone.tokenizer, use_cache=False, show_progress=False)
    np.testing.assert_allclose(changed, fresh.encode([*TEXTS, long]), atol=1e-6)
    assert np.abs(changed - before).max() > 1e-3
    emb.backbone.tokenizer.truncation_side = "left"
    emb.backbone.model.load_state_dict(emb.backbone.model.state_dict())  # the same values: the same hash
    cut = Embedder.from_model(emb.backbone.model, emb.backbone.tokenizer, use_cache=False, show_progress=False)
    np.testing.assert_allclose(emb.encode([long]), cut.encode([long]), atol=1e-6)


def test_an_instruction_and_a_text_holding_nul_do_not_share_a_key():
    from lmembed.encoding.cache import text_key

    assert text_key("b\x00c", "a") != text_key("c", "a\x00b")
    assert text_key("text", None) == text_key("text", "")


def test_vectors_an_earlier_lmembed_cached_are_not_served(original, monkeypatch, tmp_path):
    """Input building changed between versions (a wrapped long text's cut) and the cache, keyed on the model and the
    strategy alone, served the old code's vectors after an upgrade. The cache's model key carries ENCODING_VERSION,
    as an experiment's run key does."""
    from lmembed.encoding import cache
    from lmembed.experiments.spec import ArmSpec, EvalSpec

    emb = Embedder.from_pretrained(str(original), show_progress=False)
    emb.encode(TEXTS)
    folders = {p.name for p in (tmp_path / "home").rglob("*") if p.is_dir() and cache.MODEL_DIR_NAME.fullmatch(p.name)}
    arm, evaluation = ArmSpec(name="a", model="minilm", strategy={}), EvalSpec(tasks=())
    before = arm.fingerprint(evaluation, seed=0)
    monkeypatch.setattr(cache, "ENCODING_VERSION", cache.ENCODING_VERSION + 1)
    monkeypatch.setattr("lmembed.experiments.spec.ENCODING_VERSION", cache.ENCODING_VERSION)
    emb.encode(TEXTS)
    again = {p.name for p in (tmp_path / "home").rglob("*") if p.is_dir() and cache.MODEL_DIR_NAME.fullmatch(p.name)}
    assert len(folders) == 1 and len(again) == 2  # a folder of its own: nothing of the earlier one read
    assert arm.fingerprint(evaluation, seed=0) != before


def test_each_shard_is_read_once_however_many_calls(original, monkeypatch, tmp_path):
    """A new cache per call read every earlier call's shard again: many small calls slowed down without bound."""
    from lmembed.encoding import cache

    reads = []
    real = cache.read_shard
    monkeypatch.setattr(cache, "read_shard", lambda path, width=None: reads.append(path) or real(path, width))
    first = Embedder.from_pretrained(str(original), show_progress=False)
    for i in range(5):
        first.encode([f"{TEXTS[0]} {i}"])
    assert reads == []  # its own shards are in its index already
    second = Embedder.from_pretrained(str(original), show_progress=False)
    vectors = [second.encode([f"{TEXTS[0]} {i}"]) for i in range(5)]
    assert len(reads) == 5 and len(set(reads)) == 5  # each of the first's shards once, then none again
    np.testing.assert_array_equal(np.concatenate(vectors), first.encode([f"{TEXTS[0]} {i}" for i in range(5)]))
