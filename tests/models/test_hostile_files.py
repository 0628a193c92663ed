"""Model folders from elsewhere with unsafe formats or hostile values are refused in one line naming the file and
the field, before anything is allocated: a pickled weight file (main model, Dense head, CrossEncoder, peft
adapter), an activation outside the closed list, and sizes that are negative, absurd or not what the weights hold.

Each pickled file here would, if unpickled, create a marker file: the tests check it never appears.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from helpers import add_dense_head, save_tiny_cross_encoder
from lmembed import Embedder
from lmembed.cli.app import app
from lmembed.errors import LmembedError, ModelLoadError
from lmembed.models.weights import ConfigSizeError, UnsafeWeightsError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Payload:
    """Unpickling this runs ``exec``, which creates ``marker``: what a hostile pickle would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def plant_pickle(path: Path, marker: Path) -> None:
    """Replace the safetensors weights beside ``path`` with a pickle that holds a payload next to a tensor."""
    for old in path.parent.glob("*.safetensors"):
        old.unlink()
    torch.save({"weight": torch.zeros(2), "payload": Payload(marker)}, path)


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    """A tiny BERT with its tokenizer (safetensors weights)."""
    from transformers import BertModel

    from conftest import build_tokenizer, tiny_bert_config

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert") / "model"
    tok = build_tokenizer()
    config = tiny_bert_config(len(tok), max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def model(bert_dir, tmp_path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(bert_dir, folder)
    return folder


def encode(folder: Path, tmp_path: Path):
    (tmp_path / "texts.txt").write_text("the cat\na dog\n")
    args = ["encode", str(tmp_path / "texts.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(folder), "--no-cache"]
    return CliRunner().invoke(app, args)


def assert_refused(result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    for part in parts:
        assert part in result.output, result.output
    assert "weights_only" not in result.output  # never the advice to switch the protection off
    assert "Traceback" not in result.output


def refuse_to_build(monkeypatch, backbone: bool = True) -> None:
    """Fail the test if a model (unless ``backbone`` is False) or a head layer is built: the refusal must come before
    any allocation."""
    import transformers

    from lmembed.pooling import head

    def built(*args, **kwargs):
        raise AssertionError("a model or layer was built before the refusal")

    for name in ("AutoModel", "AutoModelForSequenceClassification") if backbone else ():
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", built)
    monkeypatch.setattr(head.DenseLayer, "__init__", built)


# ---------------------------------------------------------------------------------------------- pickled weights
def test_a_pickled_main_model_is_refused_as_not_loadable_safely(model, tmp_path):
    marker = tmp_path / "ran"
    plant_pickle(model / "pytorch_model.bin", marker)
    result = encode(model, tmp_path)
    assert_refused(
        result, f"{model / 'pytorch_model.bin'}: this pickled file is not loadable safely", "asks to run exec"
    )
    assert not marker.exists()


def test_a_bin_of_plain_tensors_still_loads(model, tmp_path):
    from safetensors.torch import load_file

    state = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    torch.save(state, model / "pytorch_model.bin")
    emb = Embedder.from_pretrained(str(model), cache=False, show_progress=False)
    assert emb.encode(["the cat"]).shape == (1, 32)


def test_a_pickled_dense_head_is_refused(model, tmp_path):
    dense = add_dense_head(model)
    marker = tmp_path / "ran"
    plant_pickle(dense / "pytorch_model.bin", marker)
    assert_refused(encode(model, tmp_path), f"{dense / 'pytorch_model.bin'}: this pickled file is not loadable safely")
    assert not marker.exists()


def test_a_pickled_cross_encoder_is_refused(tmp_path):
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    marker = tmp_path / "ran"
    plant_pickle(folder / "pytorch_model.bin", marker)
    with pytest.raises(UnsafeWeightsError, match=r"ce/pytorch_model\.bin: this pickled file is not loadable safely"):
        load_reranker(str(folder))
    assert not marker.exists()


@pytest.fixture
def adapter(tmp_path) -> Path:
    """A LoRA adapter folder (rank 4) whose base, a tiny llama, lies inside it."""
    from peft import LoraConfig, get_peft_model

    from conftest import build_tokenizer, tiny_model

    folder = tmp_path / "adapter"
    tok = build_tokenizer()
    base = tiny_model("llama", len(tok))
    base.save_pretrained(folder / "base")
    tok.save_pretrained(folder / "base")
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])).save_pretrained(folder)
    edit_json(folder / "adapter_config.json", base_model_name_or_path="base")
    return folder


def test_an_adapter_loads_and_a_pickled_one_is_refused(adapter, tmp_path):
    from lmembed.models.adapters import load_adapter_stack

    assert load_adapter_stack(str(adapter)).hidden_size == 32  # the folder as peft saved it loads
    marker = tmp_path / "ran"
    plant_pickle(adapter / "adapter_model.bin", marker)
    with pytest.raises(UnsafeWeightsError, match=r"adapter_model\.bin: this pickled file is not loadable safely"):
        load_adapter_stack(str(adapter))
    assert not marker.exists()


@pytest.mark.parametrize(("rank", "message"), [(10**9, r"r=1000000000: .* beyond"), (8, r"r=8 does not match")])
def test_an_adapter_rank_is_checked_against_its_weights(adapter, rank, message):
    from lmembed.models.adapters import load_adapter_stack

    edit_json(adapter / "adapter_config.json", r=rank)
    with pytest.raises(ConfigSizeError, match=r"adapter_config\.json: " + message):
        load_adapter_stack(str(adapter))


# ---------------------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("activation", ["torch.seed", "torch.nn.modules.activation.Threshold", "torch.manual_seed"])
def test_a_cross_encoder_activation_outside_the_list_is_refused(tmp_path, activation):
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"activation_fn": activation}))
    seed = torch.initial_seed()
    with pytest.raises(ModelLoadError, match=rf"config_sentence_transformers\.json: activation_fn='{activation}'"):
        load_reranker(str(folder))
    assert torch.initial_seed() == seed  # nothing the file names was called


@pytest.mark.parametrize(
    ("name", "what"),
    [("lmembed_reranker.json", "reranker record"), ("config_sentence_transformers.json", "cross-encoder config")],
)
def test_a_reranker_file_that_is_not_an_object_is_refused_naming_it(tmp_path, name, what):
    """A list where an object belongs ended in an internal AttributeError."""
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    (folder / name).write_text('["cross-encoder"]')
    with pytest.raises(ModelLoadError, match=rf"{name}: the {what} must hold an object at its top, not an array"):
        load_reranker(str(folder))


def test_a_listed_activation_is_built(tmp_path):
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"activation_fn": "torch.nn.Tanh"}))
    assert isinstance(load_reranker(str(folder)).activation, torch.nn.Tanh)


# ---------------------------------------------------------------------------------------------- sizes
SIZE_CASES = {
    "hidden size mismatch": ({"hidden_size": 64}, "hidden_size=64 does not match the weights"),
    "vocabulary mismatch": ({"vocab_size": 500}, "vocab_size=500 does not match the weights"),
    "more layers than the weights": ({"num_hidden_layers": 3}, "num_hidden_layers=3 does not match the weights"),
    "negative size": ({"intermediate_size": -16}, "intermediate_size=-16: -16 is not positive"),
    "zero heads": ({"num_attention_heads": 0}, "num_attention_heads=0: 0 is not positive"),
    "absurd vocabulary": ({"vocab_size": 10**10}, "vocab_size=10000000000: 10000000000 is beyond any real model"),
    "float size": ({"hidden_size": 1e10}, "hidden_size=10000000000.0: 1e+10 is a float"),
    "width beyond the files": (
        {"vocab_size": 100_000, "hidden_size": 4096},
        "vocab_size=100000 × hidden_size=4096 makes one tensor of 409,600,000 numbers, more than the weight files",
    ),
}


@pytest.mark.parametrize("case", SIZE_CASES)
def test_config_sizes_are_checked_before_allocation(case, model, tmp_path, monkeypatch):
    changes, message = SIZE_CASES[case]
    edit_json(model / "config.json", **changes)
    refuse_to_build(monkeypatch)
    result = encode(model, tmp_path)
    assert_refused(result, f"{model / 'config.json'}: {message}")


DENSE_CASES = {
    "in_features mismatch": ({"in_features": 48}, "in_features=48 does not match the weights"),
    "out_features mismatch": ({"out_features": 16}, "out_features=16 does not match the weights"),
    "negative out_features": ({"out_features": -16}, "out_features=-16: -16 is not positive"),
    "absurd out_features": ({"out_features": 10**10}, "out_features=10000000000: 10000000000 is beyond"),
}


@pytest.mark.parametrize("case", DENSE_CASES)
def test_dense_sizes_are_checked_before_the_layer_is_built(case, model, tmp_path, monkeypatch):
    changes, message = DENSE_CASES[case]
    dense = add_dense_head(model)
    edit_json(dense / "config.json", **changes)
    refuse_to_build(monkeypatch)
    assert_refused(encode(model, tmp_path), f"{dense / 'config.json'}: {message}")


#: a field of a sentence-transformers file with the wrong type: each ended in an internal error (TypeError, ValueError,
#: AttributeError) or was misread ("false" as true, "64" skipped); (file, changes, the field the refusal names)
FIELD_CASES = {
    "pooling_mode a number": ("1_Pooling/config.json", {"pooling_mode": 5}, "pooling_mode"),
    "pooling_mode nested lists": ("1_Pooling/config.json", {"pooling_mode": [["mean"]]}, "pooling_mode"),
    "pooling_mode an object": ("1_Pooling/config.json", {"pooling_mode": {"mean": 1}}, "pooling_mode"),
    "pooling dimension absurd": ("1_Pooling/config.json", {"word_embedding_dimension": 10**30}, "word_embedding"),
    "max_length text": ("sentence_bert_config.json", {"processing_kwargs": {"text": {"max_length": "abc"}}}, "text"),
    "model_kwargs a number": ("sentence_bert_config.json", {"model_kwargs": 5}, "model_kwargs"),
    "do_lower_case a string": ("sentence_bert_config.json", {"do_lower_case": "false"}, "do_lower_case"),
    "max_seq_length a string": ("sentence_bert_config.json", {"max_seq_length": "64"}, "max_seq_length"),
    "default prompt a list": ("config_sentence_transformers.json", {"default_prompt_name": ["q"]}, "default_prompt"),
    "similarity a list": ("config_sentence_transformers.json", {"similarity_fn_name": ["cosine"]}, "similarity_fn"),
    "truncation side": ("sentence_bert_config.json", {"tokenizer_args": {"truncation_side": "middle"}}, "truncation"),
}


@pytest.mark.parametrize("case", FIELD_CASES)
def test_a_field_of_the_wrong_type_is_refused_naming_file_and_field(case, model, tmp_path, monkeypatch):
    name, changes, field = FIELD_CASES[case]
    add_dense_head(model)
    path = model / name
    if not path.exists():
        path.write_text("{}")
    edit_json(path, **changes)
    refuse_to_build(monkeypatch)
    assert_refused(encode(model, tmp_path), f"{path}: ", field)


def test_a_tokenizer_config_that_is_not_an_object_is_refused(model, tmp_path):
    add_dense_head(model)
    (model / "tokenizer_config.json").write_text("[1, 2]")
    named = f"{model / 'tokenizer_config.json'}: the tokenizer config must hold an object at its top, not an array"
    assert_refused(encode(model, tmp_path), named)


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_a_file_linked_from_outside_the_folder_is_refused(name, model, tmp_path, monkeypatch):
    """transformers opens a folder's files by name and follows links: tokenizer.json -> /etc/passwd was read."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(model / name, outside / name)
    (model / name).symlink_to(outside / name)
    refuse_to_build(monkeypatch)
    assert_refused(encode(model, tmp_path), f"{model / name}: a link leading outside {model}")


TOKENIZER_CASES = {
    "cut short": (lambda text: text[: len(text) // 2], "tokenizer.json: not readable JSON"),
    "a vocabulary that is a number": (
        lambda text: json.dumps({"model": {"type": "WordPiece", "vocab": 5}}),
        "tokenizer.json: the tokenizer cannot be read from it",
    ),
}


@pytest.mark.parametrize("case", TOKENIZER_CASES)
def test_a_malformed_tokenizer_file_is_refused_naming_it(case, model, tmp_path):
    change, message = TOKENIZER_CASES[case]
    path = model / "tokenizer.json"
    path.write_text(change(path.read_text()))
    assert_refused(encode(model, tmp_path), f"{model}/{message}")


def test_the_dense_folder_as_written_loads(model, tmp_path):
    add_dense_head(model)
    result = encode(model, tmp_path)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_labels": 0, "id2label": {}}, "num_labels=0: 0 is not positive"),
        ({"num_labels": -3}, "num_labels=-3: -3 is not positive"),
        ({"hidden_size": 64}, "hidden_size=64 does not match the weights"),
    ],
)
def test_cross_encoder_sizes_are_checked(tmp_path, changes, message, monkeypatch):
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    edit_json(folder / "config.json", **changes)
    refuse_to_build(monkeypatch)
    with pytest.raises(ConfigSizeError, match=rf"ce/config\.json: {message}"):
        load_reranker(str(folder))


def test_a_num_labels_option_out_of_bounds_is_refused(tmp_path):
    from lmembed.rerank import load_reranker

    folder = save_tiny_cross_encoder(tmp_path / "ce")
    with pytest.raises(LmembedError, match="the num_labels option: num_labels=0"):
        load_reranker(str(folder), num_labels=0)


def test_a_saved_embedders_head_sizes_are_checked_against_its_weights(model, tmp_path, monkeypatch):
    add_dense_head(model)
    saved = Embedder.from_pretrained(str(model), cache=False, show_progress=False).save(tmp_path / "saved")
    strategy_file = saved / "lmembed.json"
    meta = json.loads(strategy_file.read_text())
    meta["strategy"]["head"][0]["out_features"] = 10**6
    strategy_file.write_text(json.dumps(meta))
    refuse_to_build(monkeypatch, backbone=False)  # the backbone loads first; the head must not be built
    with pytest.raises(ConfigSizeError, match=r"lmembed\.json: out_features=1000000 does not match the weights"):
        Embedder.from_pretrained(str(saved), cache=False, show_progress=False)


def test_a_hub_id_that_cannot_be_fetched_is_a_clear_error(monkeypatch):
    """With the Hub unreachable, ``lmembed encode -m foo/bar`` ended in ``internal error (OSError)``."""
    import huggingface_hub.constants

    from lmembed.models.loading import load_backbone

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network: as an unreachable Hub
    with pytest.raises(ModelLoadError, match=r"^foo/bar: cannot be loaded: "):
        load_backbone("foo/bar")


def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(model, tmp_path, monkeypatch):
    """transformers joins a shard index's file names to the folder: ``../elsewhere/x.safetensors`` loaded weights
    from outside it. Every name an index gives must lie inside the folder, checked before anything is built."""
    from safetensors import safe_open

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(model / "model.safetensors", outside / "x.safetensors")
    with safe_open(str(outside / "x.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "../elsewhere/x.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    refuse_to_build(monkeypatch)
    named = "model.safetensors.index.json: weight_map[...]='../elsewhere/x.safetensors'"
    assert_refused(encode(model, tmp_path), named)


def test_a_config_giving_one_key_twice_is_refused(model, tmp_path):
    """Python's json keeps the last of two values for one key; another reader may keep the first."""
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text.replace("{", '{"hidden_size": 4096, ', 1))
    assert_refused(encode(model, tmp_path), f"{model / 'config.json'}: the model config gives key 'hidden_size' twice")


# ---------------------------------------------------------------------------------------------- safetensors layout
def _rewrite_safetensors(path: Path, change) -> None:
    """Apply ``change(header, data) -> data`` to a safetensors file, writing its header back as given."""
    import struct

    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    data = change(header, raw[8 + length :])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _first_two(header):
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    return header[names[0]], header[names[1]]


def _share_offsets(header, data):
    first, second = _first_two(header)
    second["data_offsets"] = first["data_offsets"]
    return data


def _half_width_dtype(header, data):
    first, _ = _first_two(header)
    first["dtype"] = "F16"
    return data


SAFETENSORS_DAMAGE = {
    # each ended in "internal error (SafetensorError)" once transformers read the weights
    "cut short": (lambda header, data: data[: len(data) // 2], "a file cut short"),
    "two tensors on one byte range": (_share_offsets, "data_offsets"),
    "a dtype the format lacks": (lambda h, d: (_first_two(h)[0].update(dtype="Q4_EVIL"), d)[1], "'Q4_EVIL' is not"),
    "F16 over F32 bytes": (_half_width_dtype, "but its data_offsets span"),
    "bytes after the last tensor": (lambda header, data: data + b"\0" * 64, "a file cut short, or one with more"),
    "metadata that is not strings": (lambda h, d: (h.update(__metadata__={"format": ["pt"]}), d)[1], "__metadata__"),
    "offsets that are not numbers": (
        lambda h, d: (_first_two(h)[0].update(data_offsets=["0", "8"]), d)[1],
        "are not [begin, end] byte offsets",
    ),
}


@pytest.mark.parametrize("case", SAFETENSORS_DAMAGE)
def test_a_safetensors_file_whose_header_does_not_fit_its_bytes_is_refused_naming_it(case, model, tmp_path):
    change, said = SAFETENSORS_DAMAGE[case]
    _rewrite_safetensors(model / "model.safetensors", change)
    assert_refused(encode(model, tmp_path), f"{model / 'model.safetensors'}: ", said)


#: values of config.json that transformers takes without a check: each ended in an internal error (KeyError,
#: AttributeError, AssertionError, a strict dataclass's own error) or was believed (a negative RoPE base)
CONFIG_VALUE_CASES = {
    "an activation by any name": ({"hidden_act": "os.system"}, "transformers cannot build the model from it"),
    "a dtype torch lacks": ({"dtype": "evil"}, "transformers cannot build the model from it"),
    "a padding id beyond the rows": ({"pad_token_id": 10**12}, "transformers cannot build the model from it"),
    "an epsilon as text": ({"layer_norm_eps": "x"}, "layer_norm_eps='x' must be a positive finite number"),
    "a negative RoPE base": ({"rope_theta": -1.0}, "rope_theta=-1.0 must be a positive finite number"),
    "a RoPE factor past any model": ({"rope_scaling": {"rope_type": "linear", "factor": 1e30}}, "factor=1e+30 is"),
    "a negative window": ({"sliding_window": -5}, "sliding_window=-5: -5 is not positive"),
}


@pytest.mark.parametrize("case", CONFIG_VALUE_CASES)
def test_a_config_value_transformers_cannot_take_is_refused_naming_config_json(case, model, tmp_path):
    changes, said = CONFIG_VALUE_CASES[case]
    edit_json(model / "config.json", **changes)
    assert_refused(encode(model, tmp_path), f"{model / 'config.json'}: ", said)


TOKENIZER_SETTING_CASES = {
    "a key given twice": ('{"do_lower_case": true, "do_lower_case": false}', "gives key 'do_lower_case' twice"),
    "a length as text": ('{"model_max_length": "big"}', "model_max_length='big' must be a number"),
    "a padding side of neither": ('{"padding_side": "middle"}', "padding_side='middle' must be 'left' or 'right'"),
    "lower case as text": ('{"do_lower_case": "false"}', "do_lower_case='false' must be true or false"),
}


@pytest.mark.parametrize("case", TOKENIZER_SETTING_CASES)
def test_a_tokenizer_setting_of_the_wrong_kind_is_refused_naming_tokenizer_config(case, model, tmp_path):
    """Each was believed (the last value of a key given twice; "false" read as true) or ended in an internal
    TypeError at the first text, and a refusal blamed tokenizer.json for what tokenizer_config.json held."""
    text, said = TOKENIZER_SETTING_CASES[case]
    (model / "tokenizer_config.json").write_text(text)
    assert_refused(encode(model, tmp_path), f"{model / 'tokenizer_config.json'}: ", said)


def test_a_token_beyond_the_models_embedding_rows_is_refused_at_load(model, tmp_path):
    """A tokenizer.json giving a token an id past the embedding matrix ended in an internal IndexError at the first
    text holding that token (and loaded without a word when no text did)."""
    path = model / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["model"]["vocab"]["zzzhuge"] = 10**9
    path.write_text(json.dumps(tokenizer))
    assert_refused(encode(model, tmp_path), f"{path}: token 'zzzhuge' has id 1000000000, beyond the model's")


def test_a_pooling_config_whose_every_flag_is_false_is_refused_not_read_as_mean(model, tmp_path):
    """sentence-transformers pools nothing from such a config; lmembed read it as mean pooling without a word."""
    add_dense_head(model)
    flags = dict.fromkeys(("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens"), False)
    (model / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}))
    assert_refused(
        encode(model, tmp_path), f"{model / '1_Pooling' / 'config.json'}: every pooling_mode_* flag is false"
    )


def test_an_adapter_without_its_weights_is_refused_naming_the_folder(adapter):
    """It ended in a bare "No such file or directory" from peft."""
    from lmembed.models.adapters import load_adapter_stack

    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"adapter: holds adapter_config\.json but no adapter weights"):
        load_adapter_stack(str(adapter))


# ---------------------------------------------------------------------------------------------- what is missing
def _one_line(result) -> str:
    return " ".join(result.output.replace("│", " ").split())


def test_a_tensor_missing_from_the_weights_is_refused_not_filled_at_random(model, tmp_path):
    """transformers fills a tensor the weights lack with random values (each load other vectors): refused, naming
    it; a sharded checkpoint whose index leaves tensors out is refused the same way; a missing pooler, which an
    embedder never reads, is not."""
    from safetensors.torch import load_file

    state = load_file(str(model / "model.safetensors"))
    kept = {k: v for k, v in state.items() if k != "embeddings.token_type_embeddings.weight"}
    save_file(kept, str(model / "model.safetensors"), metadata={"format": "pt"})
    result = encode(model, tmp_path)
    assert_refused(result)
    said = _one_line(result)
    assert "the model needs embeddings.token_type_embeddings.weight" in said and "model.safetensors" in said

    sharded = tmp_path / "sharded"
    shutil.copytree(model, sharded)
    (sharded / "model.safetensors").unlink()
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({k: state[k] for k in first}, str(sharded / "model-00001-of-00002.safetensors"), {"format": "pt"})
    save_file({k: state[k] for k in second}, str(sharded / "model-00002-of-00002.safetensors"), {"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(first, "model-00001-of-00002.safetensors")}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=rf"the model needs {second[0]}.* by its index"):
        Embedder.from_pretrained(str(sharded), cache=False, show_progress=False)

    no_pooler = tmp_path / "no_pooler"
    shutil.copytree(model, no_pooler)
    without = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    save_file(without, str(no_pooler / "model.safetensors"), metadata={"format": "pt"})
    whole = Embedder.from_pretrained(str(no_pooler), cache=False, show_progress=False)
    assert whole.encode(["the cat"]).shape == (1, 32)


def test_a_folder_without_weights_or_vocabulary_is_refused_naming_it(model, tmp_path):
    empty = tmp_path / "no_weights"
    shutil.copytree(model, empty)
    (empty / "model.safetensors").unlink()
    assert_refused(encode(empty, tmp_path), "the model's weights cannot be loaded")
    # no vocabulary file: transformers builds a BERT tokenizer of the special tokens alone, every word unknown
    bare = tmp_path / "no_vocab"
    shutil.copytree(model, bare)
    (bare / "tokenizer.json").unlink()
    (bare / "vocab.txt").unlink(missing_ok=True)
    specials = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
    edit_json(bare / "tokenizer_config.json", tokenizer_class="BertTokenizer", **specials)
    result = encode(bare, tmp_path)
    assert_refused(result, "holds no vocabulary beyond its", "special tokens")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_pipe_in_place_of_a_file_is_refused_not_waited_on(name, model, tmp_path):
    import os

    (model / name).unlink()
    os.mkfifo(model / name)
    result = encode(model, tmp_path)  # a read would block forever
    assert_refused(result, f"{model / name}", "not a plain file")


def test_the_settings_file_at_fault_is_named(model, tmp_path):
    """special_tokens_map.json's mask_token overrides tokenizer_config.json's: a bad one is named in its own file."""
    (model / "special_tokens_map.json").write_text(json.dumps({"mask_token": 7}))
    edit_json(model / "tokenizer_config.json", mask_token="[MASK]")
    assert_refused(encode(model, tmp_path), f"{model / 'special_tokens_map.json'}: the tokenizer cannot be read")
