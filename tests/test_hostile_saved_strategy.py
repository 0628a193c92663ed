"""A model folder's strategy and head from elsewhere, refused in one line naming the file and the field (an lmembed
error: exit 2 from the command line, never an internal error): a saved folder's ``lmembed.json`` whose
``strategy.head`` is not a list of layer objects, or whose layers hold values of the wrong kind; and a
sentence-transformers Dense layer whose weight file holds a tensor the layer does not have (or lacks one)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from helpers import add_dense_head, reseal
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.errors import ConfigError, ModelLoadError
from lmembed.load_spec import STRATEGY_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DENSE = {"type": "dense", "in_features": 32, "out_features": 12, "path": "2_Dense"}


def load(folder: Path) -> Embedder:
    return Embedder.from_pretrained(str(folder), cache=False, show_progress=False)


def encode(folder: Path, tmp_path: Path):
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat\na dog\n")
    argv = ["encode", str(texts), "-o", str(tmp_path / "v.npy"), "--model", str(folder), "--no-cache"]
    return CliRunner().invoke(app, argv)


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def assert_exit_2(result, *parts: str) -> None:
    text = one_line(result.output)
    assert result.exit_code == 2, result.output
    assert "internal error" not in text and "Traceback" not in result.output, result.output
    for part in parts:
        assert part in text, result.output


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory) -> Path:
    from conftest import build_tokenizer, tiny_model

    tok = build_tokenizer()
    emb = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(), use_cache=False)
    return emb.save(tmp_path_factory.mktemp("saved") / "saved")


@pytest.fixture
def saved(saved_dir, tmp_path) -> Path:
    shutil.copytree(saved_dir, tmp_path / "saved")
    return tmp_path / "saved"


def set_strategy(folder: Path, **options: Any) -> Path:
    record = folder / STRATEGY_FILE
    meta = json.loads(record.read_text())
    meta["strategy"].update(options)
    record.write_text(json.dumps(meta))
    return record


# ---------------------------------------------------------------------------------------------- strategy.head
HEADS: dict[str, tuple[Any, str]] = {
    "a layer that is a string": (["dense"], "head[0] must be an object whose 'type' is one of"),
    "a layer that is two letters": (["ab"], "head[0] must be an object whose 'type' is one of"),
    "a layer that is a number": ([5], "head[0] must be an object whose 'type' is one of"),
    "the second layer a list": ([{"type": "normalize"}, ["dense"]], "head[1] must be an object"),
    "head a string": ("dense", "head must be a list of layer objects, not a string"),
    "head a number": (5, "head must be a list of layer objects, not a number"),
    "head one object": ({"type": "normalize"}, "head must be a list of layer objects, not an object"),
    "an unknown type": ([{"type": "conv"}], "head[0].type must be one of dense, layer_norm, normalize"),
    "a type that is a list": ([{"type": ["dense"]}], "head[0].type must be one of"),
    "in_features as text": ([{**DENSE, "in_features": "32"}], "head[0].in_features must be a whole number"),
    "out_features true": ([{**DENSE, "out_features": True}], "head[0].out_features must be a whole number"),
    "out_features negative": ([{**DENSE, "out_features": -4}], "head[0].out_features must be a positive size"),
    "path a number": ([{**DENSE, "path": 5}], "head[0].path must be a string"),
    "bias as text": ([{**DENSE, "bias": "yes"}], "head[0].bias must be true or false"),
    "activation a list": ([{**DENSE, "activation": ["tanh"]}], "head[0].activation must be a string"),
    "activation unknown": ([{**DENSE, "activation": "swish"}], "head[0].activation must be one of identity"),
    "eps as text": (
        [{"type": "layer_norm", "dimension": 32, "path": "2_LayerNorm", "eps": "abc"}],
        "head[0].eps must be a number",
    ),
    "eps infinite": (
        [{"type": "layer_norm", "dimension": 32, "path": "2_LayerNorm", "eps": float("inf")}],
        "head[0].eps must be a number above 0",
    ),
    "eps too large for a float": (
        [{"type": "layer_norm", "dimension": 32, "path": "2_LayerNorm", "eps": 10**400}],
        "head[0].eps must be a number above 0",
    ),
}


@pytest.mark.parametrize("case", list(HEADS))
def test_a_strategy_head_that_is_not_layer_objects_is_a_config_error_naming_the_field(case):
    head, message = HEADS[case]
    with pytest.raises(ConfigError) as caught:
        EmbeddingConfig.from_dict({"head": head})
    assert message in str(caught.value)


@pytest.mark.parametrize("head", [["dense"], [5], ["ab"], "dense", [{"type": "dense", "in_features": "x"}]])
def test_a_saved_folder_whose_head_is_not_layer_objects_is_refused_naming_lmembed_json(head, saved, tmp_path):
    """``["dense"]`` ended in ``internal error (ValueError): dictionary update sequence element #0 ...`` and ``[5]``
    in ``strategy: 'int' object is not iterable``."""
    record = set_strategy(saved, head=head)
    with pytest.raises(ModelLoadError) as caught:
        load(saved)
    message = str(caught.value)
    assert message.startswith(f"{record}: strategy: head"), message
    assert_exit_2(encode(saved, tmp_path), f"{record}: strategy: head")


def test_the_saved_folder_as_written_loads(saved, tmp_path):
    assert_exit_0 = encode(saved, tmp_path)
    assert assert_exit_0.exit_code == 0, assert_exit_0.output


# ---------------------------------------------------------------------------------------------- strategy.layer
def test_a_saved_strategy_layer_out_of_range_names_the_file_and_the_field(saved, tmp_path):
    record = set_strategy(saved, layer=10**9)
    result = encode(saved, tmp_path)
    assert_exit_2(result, "layer 1000000000 is out of range")
    assert str(record) in one_line(result.output) and "strategy.layer" in one_line(result.output)


def test_a_saved_dim_past_the_width_names_the_file_and_the_field(saved):
    """It was refused naming neither."""
    record = set_strategy(saved, dim=64)
    with pytest.raises(ModelLoadError) as caught:
        load(saved)
    assert str(caught.value).startswith(f"{record}: strategy.dim: dim=64 is larger than the model's vector width (32)")


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_saved_window_past_the_positions_is_said_naming_the_file_and_read_as_run(tmp_path, caplog, family):
    """It loaded in silence. A folder an earlier lmembed saved so (its constructor took such a window) still loads:
    the window is the model's positions, said in a warning naming the file and the field."""
    from conftest import build_tokenizer, tiny_model

    tok = build_tokenizer()
    strategy = EmbeddingConfig(pooling="last") if family == "llama" else EmbeddingConfig()
    emb = Embedder.from_model(tiny_model(family, len(tok)), tok, strategy, use_cache=False)
    folder = emb.save(tmp_path / family)
    positions = emb.backbone.model.config.max_position_embeddings
    record = set_strategy(folder, max_length=100000)
    with caplog.at_level("WARNING", logger="lmembed.embedder"):
        loaded = load(folder)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{record}: strategy.max_length: max_length=100000:") for m in said), said
    assert loaded.config.max_length == positions
    big = Embedder.from_model(tiny_model(family, len(tok)), tok, strategy.with_options(max_length=100000))
    assert big.config.max_length == positions  # the constructor records the window the model runs
    assert load(big.save(tmp_path / "again")).config.max_length == positions


@pytest.mark.parametrize(
    ("options", "said"), [({"pooling": "cls"}, "pooling='cls'"), ({"include_prompt": True}, "include_prompt=True")]
)
def test_a_strategy_changed_in_lmembed_json_against_the_sentence_transformers_files_is_refused(saved, options, said):
    """lmembed.json said cls, 1_Pooling/config.json mean: lmembed read cls pooling, sentence-transformers mean pooling
    of one folder (cosine 0.78 between them)."""
    record = set_strategy(saved, **options)
    with pytest.raises(ModelLoadError) as caught:
        load(saved)
    assert str(caught.value).startswith(f"{record}: strategy says {said}, but "), caught.value
    assert "the folder's two records of its strategy disagree" in str(caught.value)


def test_a_saved_record_with_a_field_of_its_own_is_refused_naming_it(saved):
    record = saved / STRATEGY_FILE
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({**meta, "pooling_override": "cls"}))
    with pytest.raises(ModelLoadError, match="pooling_override: not a field of a saved strategy record"):
        load(saved)


# ---------------------------------------------------------------------------------------------- Dense weights
@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    from transformers import BertModel

    from conftest import build_tokenizer, tiny_bert_config

    torch.manual_seed(0)
    tok = build_tokenizer()
    folder = tmp_path_factory.mktemp("bert") / "model"
    BertModel(tiny_bert_config(len(tok), max_position_embeddings=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def with_dense(source: Path, folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """A copy of ``source`` made a sentence-transformers folder (itself → mean pooling → a 32 → 12 Dense layer) whose
    Dense weight file holds ``tensors``; returns the Dense folder."""
    shutil.copytree(source, folder)
    return add_dense_head(folder, tensors=tensors, activation="torch.nn.modules.linear.Identity")


def right_tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return {"linear.weight": torch.randn(12, 32), "linear.bias": torch.randn(12)}


def test_a_dense_weight_file_with_one_tensor_too_many_is_a_model_load_error(bert_dir, tmp_path):
    """It ended in ``internal error (ValueError): .../2_Dense: holds {'evil': (2,), ...} but the layer needs ...``."""
    dense = with_dense(bert_dir, tmp_path / "model", {**right_tensors(), "evil": torch.zeros(2)})
    with pytest.raises(ModelLoadError) as caught:
        load(tmp_path / "model")
    message = str(caught.value)
    assert message.startswith(f"{dense}: "), message
    assert "evil (not a tensor of this layer)" in message and "linear.weight [12, 32]" in message
    assert_exit_2(encode(tmp_path / "model", tmp_path), str(dense), "evil (not a tensor of this layer)")


def test_a_saved_folders_dense_weight_file_with_a_tensor_too_many_is_a_model_load_error(bert_dir, tmp_path):
    with_dense(bert_dir, tmp_path / "model", right_tensors())
    saved = load(tmp_path / "model").save(tmp_path / "saved")
    path = json.loads((saved / STRATEGY_FILE).read_text())["strategy"]["head"][0]["path"]
    weights = next((saved / path).glob("*.safetensors"))
    save_file({**right_tensors(), "evil": torch.zeros(2)}, str(weights))
    reseal(saved)  # the record re-made to match, as a forger would: the layer's own check must refuse it
    with pytest.raises(ModelLoadError, match=r"evil \(not a tensor of this layer\)") as caught:
        load(saved)
    assert str(saved / path) in str(caught.value)


def test_a_dense_head_with_its_own_tensors_loads(bert_dir, tmp_path):
    with_dense(bert_dir, tmp_path / "model", right_tensors())
    assert load(tmp_path / "model").encode(["the cat"]).shape == (1, 12)
