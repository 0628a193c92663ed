"""Backends: ONNX Runtime gives the torch vectors for every strategy, exports are cached and keyed, the embedding
cache keeps backends apart, token-budget batching and batched tokenisation change no vector."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends import BackendError, make_backend
from lmembed.encoding.cache import model_key
from lmembed.encoding.engine import plan_batches
from lmembed.encoding.inputs import InputBuilder

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")

from conftest import tiny_model

TEXTS = [
    "the cat sat on the mat",
    "hello",
    "a much longer text that forces padding of the first one and more words here",
    "",
    "protein gene study result",
    "the dog was riding a horse in the movie",
]
DECODER_STRATEGIES = [
    {"pooling": "mean"},
    {"pooling": "last"},
    {"pooling": "weighted_mean", "layer": (1, 2), "final_norm": True},
    {"pooling": "mean", "layer": -1, "final_norm": False},
    {"pooling": "cls", "layer": 1},
    {"pooling": "mean", "echo": True},
]


@pytest.fixture(autouse=True)
def _isolated_exports(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def _pair(family, tokenizer, **strategy):
    model = tiny_model(family, len(tokenizer))
    config = EmbeddingConfig(**strategy)
    kwargs = {"use_cache": False, "show_progress": False}
    ref = Embedder.from_model(model, tokenizer, config, **kwargs)
    onnx = Embedder.from_model(model, tokenizer, config, backend="onnx", threads=1, **kwargs)
    return ref, onnx


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_onnx_encoder_matches_torch(tokenizer, pooling):
    ref, onnx = _pair("bert", tokenizer, pooling=pooling)
    assert onnx.backend.name == "onnx"
    assert _min_cos(ref.encode(TEXTS, batch_size=4), onnx.encode(TEXTS, batch_size=4)) >= 0.9999


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
@pytest.mark.parametrize("strategy", DECODER_STRATEGIES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_onnx_decoder_matches_torch_for_every_strategy(tokenizer, attention, strategy):
    ref, onnx = _pair("llama", tokenizer, attention=attention, **strategy)
    for instruction in (None, "retrieve a document"):
        want = ref.encode(TEXTS, batch_size=3, instruction=instruction)
        got = onnx.encode(TEXTS, batch_size=3, instruction=instruction)
        assert _min_cos(want, got) >= 0.9999, (strategy, attention, instruction)


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text", "mistral"])
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_onnx_matches_torch_for_other_decoder_families(tokenizer, family, attention):
    # the tiny Gemma 3 has a 4-token sliding window: longer texts check its per-layer-kind masks
    ref, onnx = _pair(family, tokenizer, attention=attention, pooling="mean")
    assert _min_cos(ref.encode(TEXTS, batch_size=3), onnx.encode(TEXTS, batch_size=3)) >= 0.9999


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_token_states_and_late_chunks_run_on_onnx_as_on_torch(tokenizer, family):
    """The two readings that take the states themselves (token vectors, late chunking) prepare the strategy's graph
    as encode does; late chunking on a fresh ONNX embedder had failed with "graph ... not prepared"."""
    from lmembed.encoding.chunking import Chunking

    strategy = {"pooling": "mean"} if family == "bert" else {"pooling": "mean", "layer": 1, "final_norm": True}
    ref, onnx = _pair(family, tokenizer, **strategy)
    chunking = Chunking(tokens=4, overlap=1, late=True)
    want = ref.encode_corpus(TEXTS, chunking=chunking)
    got = onnx.encode_corpus(TEXTS, chunking=chunking)
    assert np.array_equal(want.doc_index, got.doc_index) and _min_cos(want.vectors, got.vectors) >= 0.9999
    _, fresh = _pair(family, tokenizer, **strategy)  # nothing encoded before: the graph is made for the states
    for mine, theirs in zip(fresh.encode_tokens(TEXTS, batch_size=4), ref.encode_tokens(TEXTS), strict=True):
        assert mine.shape == theirs.shape and _min_cos(mine, theirs) >= 0.9999


def test_bidirectional_graph_differs_from_causal_and_is_probed(tokenizer):
    _, causal = _pair("qwen2", tokenizer, attention="causal")
    _, bidir = _pair("qwen2", tokenizer, attention="bidirectional")
    assert _min_cos(causal.encode(TEXTS[:3]), bidir.encode(TEXTS[:3])) < 0.999


def test_one_forward_group_exports_one_graph_with_every_readout(tokenizer, tmp_path):
    ref, onnx = _pair("llama", tokenizer)
    configs = [EmbeddingConfig(pooling=p, layer=layer) for p in ("mean", "last") for layer in (-1, 1)]
    want = ref.encode_strategies(TEXTS, configs)
    got = onnx.encode_strategies(TEXTS, configs)
    for w, g in zip(want, got, strict=True):
        assert _min_cos(w, g) >= 0.9999
    folders = [p for p in (tmp_path / "home" / "exports").iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1  # two readouts (layers -1 and 1), one graph
    assert json.loads((folders[0] / "manifest.json").read_text())["parts"]["readouts"] == ["L2", "L1"]


def test_exports_are_cached_and_keyed(tokenizer, tmp_path):
    model = tiny_model("bert", len(tokenizer))
    first = Embedder.from_model(model, tokenizer, backend="onnx", use_cache=False, show_progress=False)
    first.encode(TEXTS)
    root = tmp_path / "home" / "exports"
    (folder,) = list(root.iterdir())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {"torch", "transformers", "onnxruntime"} <= set(manifest["parts"]["versions"])
    assert manifest["parts"]["weights"] == first.backbone.fingerprint()
    stamp = (folder / "model.onnx").stat().st_mtime_ns
    again = Embedder.from_model(model, tokenizer, backend="onnx", use_cache=False, show_progress=False)
    again.encode(TEXTS)
    assert (folder / "model.onnx").stat().st_mtime_ns == stamp  # loaded, not exported again
    other = Embedder.from_model(model, tokenizer, EmbeddingConfig(layer=1), backend="onnx", use_cache=False)
    other.encode(TEXTS)
    assert len(list(root.iterdir())) == 2  # another readout, another graph; no temporary folder left behind


EXPORT_DAMAGE = {
    "graph truncated": lambda folder, tmp: (folder / "model.onnx").write_bytes(b"\x08"),
    "graph replaced": lambda folder, tmp: (folder / "model.onnx").write_bytes(b"\x08\x07" * 50),
    "graph gone": lambda folder, tmp: (folder / "model.onnx").unlink(),
    "graph linked from elsewhere": lambda folder, tmp: (
        (tmp / "elsewhere.onnx").write_bytes((folder / "model.onnx").read_bytes()),
        (folder / "model.onnx").unlink(),
        (folder / "model.onnx").symlink_to(tmp / "elsewhere.onnx"),
    ),
    "manifest not JSON": lambda folder, tmp: (folder / "manifest.json").write_text("{"),
    "manifest without digests": lambda folder, tmp: (folder / "manifest.json").write_text(
        json.dumps({k: v for k, v in json.loads((folder / "manifest.json").read_text()).items() if k != "files"})
    ),
}


def _reseal(folder, *names):
    """Record the sha256 of ``names`` (model.onnx always) in the manifest, as a writer of the cache could."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for name in ("model.onnx", *names):
        manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest))


def _forged_graph(folder, *, width=None, external=None, dims=None, op="Mul", declared=None):
    """Replace model.onnx by a one-output graph (states = ids * W) of the same output name, and reseal it.

    ``width`` the output's width (the model's by default), ``external`` W's external-data entries, ``dims`` W's
    declared dims (16 bytes held), ``op`` the last node's operator, ``declared`` the output width the graph
    declares (its real one by default; a name leaves it symbolic)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    old = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph.output[0]
    width = width or old.type.tensor_type.shape.dim[2].dim_value
    weights = numpy_helper.from_array(np.ones(width, dtype=np.float32), "W")
    if external is not None:
        weights = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[width])
        weights.data_location = TensorProto.EXTERNAL
        for key, value in external.items():
            weights.external_data.add(key=key, value=value)
    if dims is not None:
        weights = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=dims, raw_data=b"\0" * 16)
    axis = numpy_helper.from_array(np.array([2], dtype=np.int64), "axis")
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["f", "axis"], ["f3"]),
        helper.make_node(op, ["f3", "W"], [old.name]),
    ]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
        for n in ("input_ids", "attention_mask")
    ]
    output = helper.make_tensor_value_info(old.name, TensorProto.FLOAT, ["batch", "tokens", declared or width])
    model = helper.make_model(
        helper.make_graph(nodes, "forged", inputs, [output], [weights, axis]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)


def _weights_beside(folder, link_to=None):
    """A forged graph whose weights are external data in ``w.bin`` (a link to ``link_to``, or a file of ones)."""
    if link_to is not None:
        (folder / "w.bin").symlink_to(link_to)
    else:
        (folder / "w.bin").write_bytes(np.full(4096, 0.5, dtype=np.float32).tobytes())
    _forged_graph(folder, external={"location": "w.bin", "offset": "0"})


RESEALED_DAMAGE = {
    "graph truncated and resealed": lambda folder, tmp: (
        (folder / "model.onnx").write_bytes((folder / "model.onnx").read_bytes()[:5000]),
        _reseal(folder),
    ),
    "graph replaced by zeros and resealed": lambda folder, tmp: (
        (folder / "model.onnx").write_bytes(b"\0" * 100),
        _reseal(folder),
    ),
    "graph of another width": lambda folder, tmp: _forged_graph(folder, width=7),
    "graph of another width, left symbolic": lambda folder, tmp: _forged_graph(folder, width=7, declared="width"),
    "weights read from outside by '..'": lambda folder, tmp: _forged_graph(
        folder, external={"location": "../../../../../../etc/passwd", "offset": "0", "length": "128"}
    ),
    "weights read from an absolute path": lambda folder, tmp: _forged_graph(
        folder, external={"location": "/etc/passwd", "offset": "0", "length": "128"}
    ),
    "weights in a file the manifest does not record": lambda folder, tmp: _weights_beside(folder),
    "weights through a link the manifest does not record": lambda folder, tmp: _weights_beside(folder, "/etc/passwd"),
    "weights in a recorded file, shorter than declared": lambda folder, tmp: (
        (folder / "w.bin").write_bytes(b"\0" * 8),
        _forged_graph(folder, external={"location": "w.bin"}),
        _reseal(folder, "w.bin"),
    ),
    "weights declared far larger than held": lambda folder, tmp: _forged_graph(folder, dims=[2**40]),
    "graph ONNX Runtime cannot run": lambda folder, tmp: _forged_graph(folder, op="NoSuchOperator"),
}


@pytest.mark.parametrize("damage", [*EXPORT_DAMAGE, *RESEALED_DAMAGE])
def test_a_damaged_export_is_said_and_built_again(tokenizer, tmp_path, caplog, damage):
    """Each ended in an internal error (JSONDecodeError, ONNX Runtime's NoSuchFile / InvalidProtobuf / Fail, a
    shape mismatch), or was loaded as it stood (a replaced graph of the right shape, a link to a graph elsewhere,
    weights in a file no checksum covers). The resealed ones record their new sha256, as any writer of the cache
    could."""
    model = tiny_model("bert", len(tokenizer))
    first = Embedder.from_model(model, tokenizer, backend="onnx", use_cache=False, show_progress=False)
    expected = first.encode(TEXTS)
    (folder,) = list((tmp_path / "home" / "exports").iterdir())
    {**EXPORT_DAMAGE, **RESEALED_DAMAGE}[damage](folder, tmp_path)
    again = Embedder.from_model(model, tokenizer, backend="onnx", use_cache=False, show_progress=False)
    with caplog.at_level("WARNING", logger="lmembed.encoding.backends.store"):
        np.testing.assert_allclose(again.encode(TEXTS), expected, atol=1e-6)
    (said,) = [r.getMessage() for r in caplog.records]
    assert str(folder) in said and said.endswith("the export is built again"), said
    assert not (folder / "model.onnx").is_symlink()
    assert json.loads((folder / "manifest.json").read_text())["files"]["model.onnx"]
    assert not (folder / "w.bin").exists() and not (folder / "w.bin").is_symlink()


def test_embedding_cache_keeps_backends_apart(tokenizer, tmp_path):
    model = tiny_model("bert", len(tokenizer))
    cache = tmp_path / "cache"
    torch_emb = Embedder.from_model(model, tokenizer, cache_dir=cache, show_progress=False)
    onnx_emb = Embedder.from_model(model, tokenizer, cache_dir=cache, backend="onnx", show_progress=False)
    torch_emb.encode(TEXTS)
    onnx_emb.encode(TEXTS)
    keys = sorted(p.name for p in cache.iterdir())
    fingerprint = model_key(torch_emb.backbone.fingerprint())  # the weights', and lmembed's encoding version
    assert keys == sorted([fingerprint, f"{fingerprint}-onnx-float32"])


def test_an_onnx_backend_follows_a_model_changed_in_place(tokenizer, tmp_path):
    """The graph was exported once and kept: after a training step (weights written in place) the ONNX backend gave
    the old model's vectors, and cached them under the changed model's key. It exports again when the backbone's
    fingerprint moves."""
    model = tiny_model("bert", len(tokenizer))
    torch_emb = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    onnx_emb = Embedder.from_model(model, tokenizer, cache_dir=tmp_path / "cache", backend="onnx", show_progress=False)
    before = onnx_emb.encode(TEXTS)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05, alpha=1.0)
    after = onnx_emb.encode(TEXTS)
    assert _min_cos(after, before) < 0.999
    np.testing.assert_allclose(after, torch_emb.encode(TEXTS), atol=1e-5)


def test_unknown_backend_and_precision_are_refused(tokenizer):
    model = tiny_model("bert", len(tokenizer))
    emb = Embedder.from_model(model, tokenizer, use_cache=False)
    with pytest.raises(BackendError, match="backend='tpu' is unknown"):
        make_backend(emb.backbone, "tpu")
    with pytest.raises(BackendError, match="precision='int4' is unknown"):
        make_backend(emb.backbone, "onnx", "int4")
    with pytest.raises(BackendError, match="loaded dtype"):
        make_backend(emb.backbone, "torch", "bfloat16")


def test_plan_batches_respects_count_and_token_budget():
    lengths = [5, 40, 7, 7, 12, 3, 40, 9, 100]
    batches = plan_batches(lengths, batch_size=4, max_batch_tokens=60)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 60
    assert batches[0] == [8]  # longest first; longer than the budget, so alone
    assert plan_batches(lengths, batch_size=4) == [[8, 1, 6, 4], [7, 2, 3, 0], [5]]


def test_token_budget_batches_give_the_same_vectors(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    plain = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    budget = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False, max_batch_tokens=24)
    np.testing.assert_allclose(plain.encode(TEXTS, batch_size=8), budget.encode(TEXTS, batch_size=8), atol=2e-6)


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("instruction", [None, "retrieve a document"])
def test_batched_tokenisation_equals_one_by_one(tokenizer, echo, instruction):
    cfg = EmbeddingConfig(pooling="last", echo=echo)
    builder = InputBuilder(tokenizer, cfg, is_decoder=True, max_length=24)
    texts = [*TEXTS, " ".join(["protein"] * 60)]  # the last one is truncated
    assert builder.build_all(texts, instruction) == [builder.build(t, instruction) for t in texts]


def test_export_command_writes_a_graph_that_gives_the_torch_vectors(tokenizer, tmp_path, monkeypatch):
    # lazy: onnxruntime is optional (the module is skipped without it)
    import onnxruntime as ort
    from typer.testing import CliRunner

    from lmembed.cli.app import app
    from lmembed.pooling.poolers import mean_pool

    saved = tmp_path / "model"
    Embedder.from_model(tiny_model("bert", len(tokenizer)), tokenizer, use_cache=False).save(saved)
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(out), "--model", str(saved), "--format", "onnx", "--no-cache"])
    assert result.exit_code != 0 and "--no-cache" in result.output  # export has no cache option
    result = CliRunner().invoke(app, ["export", str(out), "--model", str(saved), "--format", "onnx"])
    assert result.exit_code == 0, result.output
    assert {"model.onnx", "manifest.json", "lmembed.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    ref = Embedder.from_pretrained(str(saved), cache=False, show_progress=False)
    features = InputBuilder(tokenizer, ref.config, is_decoder=False, max_length=64).build_all(TEXTS[:3])
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for text, feat in zip(TEXTS[:3], features, strict=True):
        ids = np.array([feat.input_ids], dtype=np.int64)
        (states,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        vec = mean_pool(torch.from_numpy(states), torch.tensor([feat.pool_mask])).numpy()
        assert _min_cos(vec, ref.encode([text], batch_size=1)) >= 0.9999
    # the card says what the graph takes and gives, and its snippet loads the exported model with this very graph
    card = (out / "README.md").read_text()
    assert "- onnx\n" in card and "exported to ONNX (float32)" in card and "`input_ids` and `attention_mask`" in card
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(out)
    scope: dict = {}
    exec(snippet, scope)
    assert scope["model"].backend.describe() == {"backend": "onnx", "precision": "float32"}
    np.testing.assert_allclose(scope["vectors"], ref.encode(["It turns texts into vectors."]), atol=1e-5)
    bad = CliRunner().invoke(app, ["export", str(out), "--model", str(saved), "--format", "tflite"])
    assert bad.exit_code == 2 and "the only format is onnx" in bad.output


def test_an_export_holds_what_acts_after_pooling(tokenizer, tmp_path):
    """The graph stops where pooling starts, so an export carries the pooling head's weights and the term table,
    in the files a saved model keeps them in, the table hashing to the strategy's sha256."""
    from typer.testing import CliRunner

    from lmembed.cli.app import app
    from lmembed.load_plan import HEAD_FILE
    from lmembed.pooling.terms import TERMS_FILE, load_terms

    config = EmbeddingConfig(pooling="latent_attention")
    emb = Embedder.from_model(tiny_model("bert", len(tokenizer)), tokenizer, config, use_cache=False)
    saved = tmp_path / "model"
    emb.fit_terms(TEXTS, dims=64).save(saved)
    kept = {p.name for p in saved.iterdir()} - {"model.safetensors", "config.json", "README.md"}  # README: the card
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(out), "--model", str(saved), "--format", "onnx"])
    assert result.exit_code == 0, result.output
    exported = {p.name for p in out.iterdir()}
    assert kept <= exported and {TERMS_FILE, HEAD_FILE} <= kept, (kept, exported)
    strategy = EmbeddingConfig.from_dict(json.loads((out / "lmembed.json").read_text())["strategy"])
    channel = load_terms(out, strategy.terms, len(tokenizer), out / "lmembed.json")  # checks the sha256
    np.testing.assert_array_equal(channel.idf.numpy(), load_terms(saved, strategy.terms, len(tokenizer), saved).idf)


@pytest.mark.gpu
def test_gpu_half_precision_sdpa_agrees_with_cpu_float32(tokenizer):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_model("llama", len(tokenizer))
    ref = Embedder.from_model(model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False)
    want = ref.encode(TEXTS)
    for dtype in (torch.bfloat16, torch.float16):
        gpu_model = tiny_model("llama", len(tokenizer)).to("cuda", dtype)
        emb = Embedder.from_model(gpu_model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False)
        assert emb.backend.precision == str(dtype).removeprefix("torch.")
        assert _min_cos(want, emb.encode(TEXTS)) >= 0.99
