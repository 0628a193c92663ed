"""int8: calibrated on the user's texts, keyed apart from float32 in the embedding cache, checked by a quality gate
that warns with the gap; torch's own dynamic int8 stays available."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends import BackendError, quality
from lmembed.encoding.backends.int8 import int8_error, within_budget
from lmembed.encoding.backends.quality import gate, neighbour_ndcg
from lmembed.encoding.cache import model_key
from lmembed.models.loading import quantize_int8

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")

from conftest import WORDS, tiny_model

RNG = np.random.default_rng(0)
TEXTS = [" ".join(RNG.choice(WORDS, size=int(RNG.integers(3, 20)))) for _ in range(48)]


@pytest.fixture(autouse=True)
def _isolated_exports(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def test_gate_of_identical_vectors_passes():
    x = RNG.normal(size=(20, 8))
    report = gate(x, x.copy())
    assert report.passed and report.min_cosine == pytest.approx(1.0) and report.neighbour_ndcg_at_10 == 1.0


def test_gate_reports_shortfall_with_the_gap():
    x = RNG.normal(size=(30, 8))
    noisy = x + RNG.normal(scale=0.5, size=x.shape)
    report = gate(x, noisy)
    assert not report.passed
    (cos_line, *_) = report.shortfalls()
    assert f"by {quality.MIN_COSINE - report.min_cosine:.4f}" in cos_line


def test_neighbour_ndcg_drops_when_rankings_change():
    x = RNG.normal(size=(25, 6))
    assert neighbour_ndcg(x, x) == 1.0
    assert neighbour_ndcg(x, RNG.normal(size=x.shape)) < 0.6


def test_int8_error_is_small_for_plain_and_large_for_outlier_activations():
    w = RNG.normal(size=(64, 32)).astype(np.float32)
    x = RNG.normal(size=(256, 64)).astype(np.float32)
    assert int8_error(x, w) < 0.02
    x[:, 3] *= 300  # one outlier channel sets the quantisation step of all the others
    assert int8_error(x, w) > int8_error(x / np.r_[np.ones(3), 300, np.ones(60)], w)


def test_int8_encodes_close_to_float32_and_records_the_gate(tokenizer, tmp_path):
    model = tiny_model("bert", len(tokenizer))
    ref = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    int8 = Embedder.from_model(model, tokenizer, precision="int8", threads=1, use_cache=False, show_progress=False)
    assert int8.backend.name == "onnx" and int8.backend.precision == "int8"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a random tiny model may or may not pass the gate
        got = int8.encode(TEXTS)
    want = ref.encode(TEXTS)
    assert float((got * want).sum(1).mean()) > 0.95
    report = int8.backend.describe()["quality_gate"][ref.config.label()]
    assert report["texts"] == len(set(TEXTS)) // 4
    exports = [p for p in (tmp_path / "home" / "exports").iterdir()]
    manifests = [json.loads((p / "manifest.json").read_text()) for p in exports]
    (int8_manifest,) = [m for m in manifests if m["parts"]["precision"] == "int8"]
    assert int8_manifest["quality_gate"][ref.config.label()]["min_cosine"] == pytest.approx(report["min_cosine"])
    assert int8_manifest["int8"]["products"] == 2 * 4  # QKV (fused) + attention output + FFN in + FFN out
    assert int8_manifest["int8"]["weight_rounding"] == "compensated"
    assert "compensation" in int8_manifest["parts"]["recipe"]  # graphs rounded otherwise are keyed apart


def _int8_manifest(tmp_path) -> tuple[dict, object]:
    exports = [p / "manifest.json" for p in (tmp_path / "home" / "exports").iterdir()]
    (path,) = [p for p in exports if json.loads(p.read_text())["parts"]["precision"] == "int8"]
    return json.loads(path.read_text()), path


def test_every_strategy_an_int8_graph_serves_is_gated(tokenizer, tmp_path, caplog):
    """mean and cls pooling read the same layer, so they share one int8 graph; the gate was measured for the first
    strategy only, and cls vectors were written unchecked ("gate passed for mean", in this process or the next)."""
    model = tiny_model("bert", len(tokenizer))
    options = {"precision": "int8", "threads": 1, "use_cache": False, "show_progress": False}
    mean = Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="mean"), **options).calibrate(TEXTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean.encode(TEXTS[:10])
        cls = mean.with_config(mean.config.with_options(pooling="cls"))
        cls.encode(TEXTS[:10])  # the same process, the same graph
    labels = {mean.config.label(), cls.config.label()}
    assert set(cls.backend.describe()["quality_gate"]) == {cls.config.label()}
    manifest, path = _int8_manifest(tmp_path)
    assert set(manifest["quality_gate"]) == labels
    # a manifest whose gate is of another shape: said, and measured again
    manifest["quality_gate"] = ["passed"]
    path.write_text(json.dumps(manifest))
    fresh = Embedder.from_model(model, tokenizer, EmbeddingConfig(pooling="cls"), **options).calibrate(TEXTS)
    with warnings.catch_warnings(), caplog.at_level("WARNING"):
        warnings.simplefilter("ignore")
        fresh.encode(TEXTS[:10])
    assert any("quality_gate is not as lmembed writes it" in r.getMessage() for r in caplog.records)
    assert set(_int8_manifest(tmp_path)[0]["quality_gate"]) == {cls.config.label()}


def test_failing_gate_warns_with_the_gap(tokenizer, monkeypatch):
    monkeypatch.setattr(quality, "MIN_COSINE", 1.01)  # unreachable: the gate must fail and say by how much
    emb = Embedder.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, precision="int8", threads=1, use_cache=False
    )
    with pytest.warns(UserWarning, match=r"int8 quality gate failed .*min cosine .* < 1\.01 \(by "):
        emb.encode(TEXTS[:20])


def test_int8_vectors_are_cached_apart_and_keyed_by_calibration(tokenizer, tmp_path):
    model = tiny_model("bert", len(tokenizer))
    cache = tmp_path / "cache"
    kwargs = {"cache_dir": cache, "show_progress": False}
    fp32 = Embedder.from_model(model, tokenizer, **kwargs)
    a = Embedder.from_model(model, tokenizer, precision="int8", threads=1, **kwargs).calibrate(TEXTS[:24])
    b = Embedder.from_model(model, tokenizer, precision="int8", threads=1, **kwargs).calibrate(TEXTS[24:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for emb in (fp32, a, b):
            emb.encode(TEXTS[:10])
    names = sorted(p.name for p in cache.iterdir())
    fingerprint = model_key(fp32.backbone.fingerprint())
    assert fingerprint in names
    int8_keys = [n for n in names if n.startswith(f"{fingerprint}-onnx-int8-")]
    assert len(int8_keys) == 2  # two calibrations, two keys: never mixed, never served as float32


def test_calibration_needs_enough_texts(tokenizer):
    emb = Embedder.from_model(tiny_model("bert", len(tokenizer)), tokenizer, precision="int8", use_cache=False)
    with pytest.raises(BackendError, match="at least 8 distinct texts"):
        emb.calibrate(["one", "two", "two"])


def test_torch_dynamic_int8_is_still_available(tokenizer):
    model = tiny_model("bert", len(tokenizer))
    ref = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    want = ref.encode(TEXTS[:8])
    qmodel, _ = quantize_int8(tiny_model("bert", len(tokenizer)), "int8", torch.device("cpu"))
    emb = Embedder.from_model(qmodel, tokenizer, use_cache=False, show_progress=False)
    assert float((emb.encode(TEXTS[:8]) * want).sum(1).mean()) > 0.95


def test_per_row_int8_error_beats_per_tensor_when_token_scales_differ():
    rng = np.random.default_rng(1)
    # tokens whose magnitudes differ by 100x: one range for all of them wastes the small ones' resolution
    x = rng.normal(size=(128, 64)) * np.geomspace(0.05, 5.0, 128)[:, None]
    w = rng.normal(size=(64, 32))
    assert int8_error(x, w, weight_levels=127) < 0.5 * int8_error(x, w, per_row=False)
    # equal per-row ranges and the same weights: both recipes agree closely
    same = rng.uniform(-1, 1, size=(128, 64))
    same[:, 0] = np.where(np.arange(128) % 2, 1.0, -1.0)
    assert abs(int8_error(same, w, weight_levels=127) - int8_error(same, w, per_row=False)) < 0.003
    # 7-bit weights (the graph's, against AVX2's 16-bit pair sums) cost a little accuracy, measurably
    assert int8_error(same, w, weight_levels=127) < int8_error(same, w) < 3 * int8_error(same, w, weight_levels=127)


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("outliers", [False, True])
def test_int8_vector_does_not_depend_on_its_batch(tokenizer, tmp_path, monkeypatch, family, outliers):
    """Every activation row is quantised on its own range, so a text's int8 vector is the same whichever texts
    share its batch (a per-call range moved minilm's vectors by up to 0.035: bench/int8_products.py --graphs);
    outlier channels, fixed at calibration, keep it so (a low ratio makes the tiny model have some)."""
    from lmembed.encoding.backends.int8 import calibration

    monkeypatch.setattr(calibration, "OUTLIER_RATIO", 1.5 if outliers else 1e9)
    emb = Embedder.from_model(
        tiny_model(family, len(tokenizer)), tokenizer, precision="int8", threads=1, use_cache=False
    ).calibrate(TEXTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a random tiny model may or may not pass the gate
        alone = np.stack([emb.encode([t])[0] for t in TEXTS[:6]])
        together = emb.encode(TEXTS[:6] + TEXTS[30:], batch_size=16)[:6]
        reversed_small = emb.encode(TEXTS[5::-1], batch_size=4)[::-1]
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(reversed_small, alone, atol=1e-5)
    manifests = [json.loads(m.read_text()) for m in (tmp_path / "home" / "exports").glob("*/manifest.json")]
    (int8_manifest,) = [m for m in manifests if m["parts"]["precision"] == "int8"]
    assert bool(int8_manifest["int8"]["outlier_channels"]) == outliers


@pytest.mark.parametrize("levels", [0, 128])
def test_weight_levels_outside_int8_are_refused(tmp_path, levels):
    from lmembed.encoding.backends.int8 import quantize_graph

    with pytest.raises(ValueError, match=rf"weight_levels: must be 1 to 127 .*got {levels}"):
        quantize_graph(tmp_path / "in.onnx", tmp_path / "out.onnx", [], threads=1, weight_levels=levels)
    assert not (tmp_path / "out.onnx").exists()


def test_outlier_channels_are_multiplied_in_float32_exactly_as_modelled():
    """A few input channels far above the rest (a decoder's massive activations) take the int8 resolution of
    every row they appear in; multiplied in float32 instead, the product's error falls, and the graph computes
    exactly what ``int8_error`` models."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from lmembed.encoding.backends.int8 import outlier_channels, per_row_int8, weight_products
    from lmembed.encoding.backends.runtime import session_options

    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 40, 64)).astype(np.float32)
    x[..., [5, 17]] *= 40.0  # two outlier channels
    w = rng.normal(size=(64, 24)).astype(np.float32)
    absmax = np.abs(x).reshape(-1, 64).max(axis=0)
    split = outlier_channels(absmax)
    assert split.tolist() == [5, 17]
    rows = x.reshape(-1, 64)
    plain, with_split = int8_error(rows, w), int8_error(rows, w, split=split)
    assert with_split < 0.3 * plain

    def graph() -> onnx.ModelProto:
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="product")
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 64])]
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        body = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(w, "w")])
        return helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)])

    exact = rows @ w
    for splits, expected in (({}, plain), ({"x": split}, with_split)):
        model = graph()
        assert per_row_int8(model, weight_products(model), splits=splits) == set()
        session = ort.InferenceSession(
            model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"]
        )
        got = session.run(None, {"x": x})[0].reshape(-1, 24)
        error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
        assert error == pytest.approx(expected, rel=0.02)
        one = session.run(None, {"x": x[1:, :7]})[0]  # and a row's result does not depend on the others
        np.testing.assert_allclose(one, got.reshape(2, 40, 24)[1:, :7], atol=1e-5)


def test_calibration_is_thinned_to_its_token_budget_keeping_every_length():
    """A large calibration set is cut to about the budget's real tokens by taking the same share of every
    (length-sorted) batch, so short and long texts stay in the mix; a small one is left whole."""
    batches = []
    for length in (8, 32, 128, 512):  # one batch of 40 texts per length
        mask = np.zeros((40, length), dtype=np.int64)
        mask[:, : length // 2 + 1] = 1
        batches.append((np.arange(40 * length).reshape(40, length), mask))
    total = sum(int(m.sum()) for _, m in batches)
    thinned = within_budget(batches, budget=total // 10)
    kept = sum(int(m.sum()) for _, m in thinned)
    assert 0.08 * total <= kept <= 0.12 * total
    assert [len(ids) for ids, _ in thinned] == [4, 4, 4, 4]  # the same share of each length
    for (ids, mask), (kept_ids, kept_mask) in zip(batches, thinned, strict=True):
        rows = [int(np.flatnonzero((ids == row).all(1))[0]) for row in kept_ids]
        assert rows == sorted(rows) and rows[0] == 0 and rows[-1] == len(ids) - 1  # spread, first to last
        assert (mask[rows] == kept_mask).all()
    whole = within_budget(batches, budget=total)
    assert all((a == b).all() for (a, _), (b, _) in zip(batches, whole, strict=True))


def _correlated_rows(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """Token-like rows: a shared offset (every token's common direction), a few strong directions, and noise."""
    basis, offset = rng.normal(size=(8, width)), 2.0 * rng.normal(size=width)
    return (rng.normal(size=(n, 8)) @ basis + rng.normal(size=(n, width)) + offset).astype(np.float32)


def test_compensated_rounding_cuts_the_error_that_mean_pooling_keeps():
    """Rounding each weight to its nearest level leaves an error that does not depend on the input, so it
    survives averaging over a text's tokens; rounding with compensation for the calibration inputs cuts it
    several times on new inputs from the same distribution, on the same grid of levels."""
    from lmembed.encoding.backends.int8 import WEIGHT_LEVELS, compensated_weights, round_weights

    rng = np.random.default_rng(7)
    rows = _correlated_rows(rng, 2048, 96)  # one distribution: calibration rows, and new rows to check on
    fit, new = rows[:1024], rows[1024:]
    w = rng.normal(size=(96, 40)).astype(np.float32)
    dead = fit.copy()
    dead[:, 11] = 0.0  # a channel the sample never uses must not break the inverse
    (codes, step), (other, _) = compensated_weights([w[:, :30], w[:, 30:]], dead)
    assert codes.dtype == np.int8 and np.abs(codes).max() <= WEIGHT_LEVELS
    np.testing.assert_array_equal(step, round_weights(w[:, :30])[1])  # the same steps as nearest rounding
    assert other.shape == (96, 10)
    (codes, step), _ = compensated_weights([w[:, :30], w[:, 30:]], fit)
    nearest = np.multiply(*round_weights(w[:, :30]))
    exact = new @ w[:, :30]
    pooled = exact.mean(axis=0)
    error_nearest = np.linalg.norm((new @ nearest).mean(axis=0) - pooled) / np.linalg.norm(pooled)
    error_compensated = np.linalg.norm((new @ (codes * step)).mean(axis=0) - pooled) / np.linalg.norm(pooled)
    assert error_compensated < 0.5 * error_nearest
    # and token by token, with the activations' own rounding, it is no worse
    assert int8_error(new, w[:, :30], codes=(codes, step)) <= int8_error(new, w[:, :30])


def test_compensated_codes_run_in_the_graph_exactly_as_modelled():
    """The int8 graph built from compensated codes computes what ``int8_error`` models for those codes."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from lmembed.encoding.backends.int8 import compensated_weights, per_row_int8, weight_products
    from lmembed.encoding.backends.runtime import session_options

    rng = np.random.default_rng(5)
    rows = _correlated_rows(rng, 160, 48)
    w = rng.normal(size=(48, 16)).astype(np.float32)
    codes = compensated_weights([w], rows)[0]
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="product")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 48])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    body = helper.make_graph([node], "g", inputs, outputs, [numpy_helper.from_array(w, "w")])
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", 17)])
    assert per_row_int8(model, weight_products(model), codes={"product": codes}) == set()
    session = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": rows.reshape(4, 40, 48)})[0].reshape(-1, 16)
    exact = rows @ w
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert error == pytest.approx(int8_error(rows, w, codes=codes), rel=0.02)
    assert error != pytest.approx(int8_error(rows, w), rel=1e-4)  # the codes were used, not nearest rounding


def test_compensation_needs_more_rows_than_channels():
    """Fitted on fewer token rows than the input has channels, compensated rounding would follow the sample rather
    than the inputs: such an input keeps rounding to the nearest level."""
    from types import SimpleNamespace

    from lmembed.encoding.backends.int8 import Product, compensate

    rng = np.random.default_rng(2)
    weights = {"w1": rng.normal(size=(32, 8)).astype(np.float32), "w2": rng.normal(size=(32, 8)).astype(np.float32)}
    products = [
        Product(SimpleNamespace(name="many"), "w1", "x_many"),
        Product(SimpleNamespace(name="few"), "w2", "x_few"),
    ]
    samples = {"x_many": _correlated_rows(rng, 64, 32), "x_few": _correlated_rows(rng, 31, 32)}
    codes = compensate(products, weights, samples, splits={})
    assert set(codes) == {"many"}


def test_int8_rounding_is_numpy_arithmetic_apart_from_the_graph():
    """The int8 package keeps its concerns apart: the rounding and error arithmetic imports neither onnx nor
    onnxruntime nor the graph rewriting, so the recipe's numbers can be checked (and benchmarked) on arrays."""
    import ast
    import inspect

    from lmembed.encoding.backends.int8 import rounding

    imported = set()
    for node in ast.walk(ast.parse(inspect.getsource(rounding))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported if m.split(".")[0] in {"onnx", "onnxruntime", "torch"}}, imported
    assert not {m for m in imported if m.startswith("lmembed")}, imported


# each was read back as it stood: a TypeError (internal error), a gate passed on values no measurement gives, or a
# failed gate with no shortfall named
FORGED_REPORTS = [
    ("min_cosine", {"min_cosine": "x"}),
    ("min_cosine", {"min_cosine": None}),
    ("min_cosine", {"min_cosine": True, "neighbour_ndcg_at_10": True}),
    ("min_cosine", {"min_cosine": float("inf"), "neighbour_ndcg_at_10": 5.0}),
    ("neighbour_ndcg_at_10", {"neighbour_ndcg_at_10": 5.0}),
    ("min_cosine", {"min_cosine": float("nan")}),
    ("mean_cosine", {"mean_cosine": -3.0}),
    ("texts", {"texts": [1]}),
    ("texts", {"texts": True}),
    ("passed", {"passed": "yes"}),
]


def test_a_forged_gate_report_is_said_and_measured_again(tokenizer, tmp_path, caplog):
    """The report in an int8 export's manifest is covered by no checksum: each field is read strictly (finite
    numbers in their ranges, a count, a bool), and one that fails is said, naming the field, and measured again."""
    model = tiny_model("bert", len(tokenizer))
    options = {"precision": "int8", "threads": 1, "use_cache": False, "show_progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = Embedder.from_model(model, tokenizer, **options).calibrate(TEXTS)
        first.encode(TEXTS[:4])
    label = first.config.label()
    manifest, path = _int8_manifest(tmp_path)
    measured = manifest["quality_gate"][label]
    for field, forged in FORGED_REPORTS:
        path.write_text(json.dumps({**manifest, "quality_gate": {label: {**measured, **forged}}}))
        caplog.clear()
        again = Embedder.from_model(model, tokenizer, **options).calibrate(TEXTS)
        with warnings.catch_warnings(), caplog.at_level("WARNING"):
            warnings.simplefilter("ignore")
            again.encode(TEXTS[:4])
        said = [r.getMessage() for r in caplog.records if "quality_gate is not as lmembed writes it" in r.getMessage()]
        assert len(said) == 1 and f"quality_gate.{label}.{field}" in said[0] and str(path) in said[0], (forged, said)
        assert again.backend.describe()["quality_gate"][label] == pytest.approx(measured)
        assert _int8_manifest(tmp_path)[0]["quality_gate"][label] == pytest.approx(measured)
