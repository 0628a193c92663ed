"""The backend interface declares what its users ask of a backend: the engine, the Embedder and the evaluation
runner call it the same way for every backend (no attribute probing, no branch on which backend it is), and a
backend with nothing to calibrate or export answers with a no-op or None."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lmembed
from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends import Backend, TorchBackend, make_backend
from lmembed.encoding.backends.base import CALIBRATION_TEXTS
from lmembed.models.loading import backbone_from_model

SRC = Path(lmembed.__file__).resolve().parent
TEXTS = [f"text number {i} about {word}" for i, word in enumerate(["cats", "dogs", "proteins", "rivers"] * 80)]


def _backend_attributes_used() -> dict[str, list[str]]:
    """Every ``<x>.backend.<attr>`` (and ``backend.<attr>`` where ``backend`` is an engine's backend) read in src/,
    attribute name -> where."""
    used: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if (isinstance(owner, ast.Attribute) and owner.attr in {"backend", "torch_backend"}) or (
                isinstance(owner, ast.Name) and owner.id == "backend" and path.name != "__init__.py"
            ):
                used.setdefault(node.attr, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return used


def test_backend_interface_declares_every_attribute_the_library_reads():
    used = _backend_attributes_used()
    assert {"calibrate", "ensure_calibration", "graph_folder", "prepare", "cache_tag"} <= set(used), sorted(used)
    undeclared = {name: where for name, where in used.items() if not hasattr(Backend, name)}
    assert not undeclared, f"read from a backend but not declared on Backend: {undeclared}"


#: Capabilities a caller might be tempted to probe for instead of asking the interface.
CAPABILITIES = {"calibrate", "set_calibration", "ensure_calibration", "needs_calibration", "calibration_texts"}
CAPABILITIES |= {"graph_folder", "prepare", "quality"}


def test_no_backend_is_probed_with_getattr_or_hasattr():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or len(node.args) < 2:
                continue
            if node.func.id not in {"getattr", "hasattr"}:
                continue
            owner, attribute = ast.unparse(node.args[0]), node.args[1]
            named = isinstance(attribute, ast.Constant) and attribute.value in CAPABILITIES
            if named or re.search(r"\b(backend|runner)\b", owner):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "backends probed for attributes:\n" + "\n".join(found)


def test_engine_does_not_branch_on_which_backend_runs():
    engine = (SRC / "encoding" / "engine.py").read_text()
    assert not re.search(r"\bis (not )?self\.torch_backend\b", engine)
    assert not re.search(r"isinstance\(self\.backend\b", engine)


@pytest.mark.parametrize("name", ["torch", "onnx"])
def test_training_runs_on_the_encoding_backend_only_where_it_is_differentiable(tokenizer, name):
    from lmembed.encoding.engine import EncodingEngine

    if name == "onnx":
        pytest.importorskip("onnxruntime")
    backbone = backbone_from_model(tiny_model("bert", len(tokenizer)), tokenizer)
    threads = 1 if name == "onnx" else None  # ONNX Runtime's threads; the torch backend refuses the option
    engine = EncodingEngine(backbone, backend=make_backend(backbone, name, threads=threads), use_cache=False)
    assert engine.torch_backend.differentiable
    assert (engine.torch_backend is engine.backend) == (name == "torch") == engine.backend.differentiable


@pytest.mark.parametrize("name", ["torch", "onnx"])
def test_float_backends_calibrate_as_a_no_op(tokenizer, name):
    backbone = backbone_from_model(tiny_model("llama", len(tokenizer)), tokenizer)
    if name == "onnx":
        pytest.importorskip("onnxruntime")
    backend = make_backend(backbone, name, "float32", threads=1 if name == "onnx" else None)
    tag = backend.cache_tag()
    assert not backend.needs_calibration
    backend.calibrate(TEXTS)
    backend.ensure_calibration(TEXTS)
    assert backend.calibration_texts is None and backend.cache_tag() == tag and not backend.needs_calibration
    assert backend.graph_folder([EmbeddingConfig()], "causal") is None  # torch exports nothing; onnx: not prepared


def test_int8_backend_needs_calibration_until_it_has_texts(tokenizer):
    pytest.importorskip("onnxruntime")
    from lmembed.encoding.backends import BackendError
    from lmembed.encoding.backends.onnx_backend import OnnxBackend

    backend = OnnxBackend(backbone_from_model(tiny_model("llama", len(tokenizer)), tokenizer), "int8", threads=1)
    assert backend.needs_calibration and backend.calibration_texts is None
    with pytest.raises(BackendError, match="calibration texts"):
        backend.cache_tag()
    assert backend.graph_folder([EmbeddingConfig()], "causal") is None  # nothing prepared yet
    backend.ensure_calibration(TEXTS)
    assert not backend.needs_calibration and len(backend.calibration_texts) == CALIBRATION_TEXTS
    chosen = list(backend.calibration_texts)
    backend.ensure_calibration(TEXTS[::-1])  # calibrated already: kept
    assert backend.calibration_texts == chosen
    backend.calibrate(TEXTS[:10])  # the user's own texts replace the sample
    assert backend.calibration_texts == TEXTS[:10]


class _Recording(TorchBackend):
    """The torch backend, asked to calibrate once before it encodes, recording what the engine asks of it."""

    def __init__(self, backbone) -> None:
        super().__init__(backbone)
        self.calls: list[tuple[str, object]] = []

    @property
    def needs_calibration(self) -> bool:
        return self.calibration_texts is None

    def calibrate(self, texts) -> None:
        self.calls.append(("calibrate", len(texts)))
        self.calibration_texts = list(texts)

    def prepare(self, configs, mode, batches_for=None, pool=None) -> None:
        self.calls.append(("prepare", mode))
        super().prepare(configs, mode, batches_for, pool)

    def states(self, input_ids, attention_mask, configs, mode):
        self.calls.append(("states", mode))
        return super().states(input_ids, attention_mask, configs, mode)


def test_engine_and_embedder_ask_any_backend_the_same_way(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    recording = _Recording(backbone_from_model(model, tokenizer))
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(attention="bidirectional"), backend=recording)
    emb.engine.use_cache = False
    emb.engine.show_progress = False
    reference = Embedder.from_model(model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False)
    got = emb.encode(TEXTS[:8], batch_size=4)
    assert recording.calls[0] == ("calibrate", 8)  # the texts being encoded, before anything runs
    assert ("prepare", "bidirectional") in recording.calls and ("states", "bidirectional") in recording.calls
    assert got == pytest.approx(reference.encode(TEXTS[:8], batch_size=4), abs=1e-5)
    recording.calls.clear()
    assert emb.calibrate(TEXTS[:3]) is emb and recording.calls == [("calibrate", 3)]
