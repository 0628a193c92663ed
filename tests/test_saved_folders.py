"""A saved Embedder folder loads only as it was written: ``Embedder.save`` fills it atomically and records the sha256 of
every file in ``lmembed.json`` (written last); a load checks each before anything is read, refuses a file it does not
record, and a Hub repository an Embedder was saved to is read the same way from its snapshot (links to the cache's
blobs), known by its Hub id."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from helpers import unrecord
from lmembed import Embedder
from lmembed.errors import ConfigError
from lmembed.io import sha256_file
from lmembed.load_plan import FILES_KEY, SAVED_FORMAT, plan_load
from lmembed.load_spec import STRATEGY_FILE
from lmembed.model_card import CARD_FILE, CARD_KEY
from lmembed.models.loading import ModelLoadError

TEXTS = ["the cat sat on the mat", "a dog ran", "hello world"]


@pytest.fixture
def saved(make_embedder, tmp_path):
    """A decoder pooling with a latent-attention head in both directions: a strategy sentence-transformers cannot
    express, so nothing but ``lmembed.json`` says how to reproduce its vectors."""
    emb = make_embedder("llama", pooling="latent_attention", attention="bidirectional")
    folder = emb.save(tmp_path / "saved")
    return folder, emb.encode(TEXTS)


def load(where: str | Path, **options) -> Embedder:
    return Embedder.from_pretrained(str(where), cache=False, show_progress=False, **options)


def test_the_record_covers_every_file_and_the_folder_reloads_to_the_same_vectors(saved):
    folder, before = saved
    meta = json.loads((folder / STRATEGY_FILE).read_text())
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    # every file but the record and the card, which is recorded apart (an edited card must not fail the checks)
    assert meta["format"] == SAVED_FORMAT
    assert sorted(meta[FILES_KEY]) == [f for f in files if f not in (STRATEGY_FILE, "README.md")]
    assert meta["card"] == hashlib.sha256((folder / "README.md").read_bytes()).hexdigest()
    for name, digest in meta[FILES_KEY].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    assert "pooling_head.safetensors" in meta[FILES_KEY] and "model.safetensors" in meta[FILES_KEY]
    np.testing.assert_allclose(load(folder).encode(TEXTS), before, atol=1e-6)


@pytest.mark.parametrize("name", ["model.safetensors", "pooling_head.safetensors", "tokenizer.json", "config.json"])
def test_one_flipped_byte_in_any_file_is_refused_naming_it(saved, name):
    """Before the record, a backbone or head with flipped bits loaded and gave other vectors without a word."""
    folder, _ = saved
    path = folder / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        ModelLoadError, match=rf"{name}: its sha256 is not the one .*lmembed.json records \(files.{name}"
    ):
        load(folder)


def test_a_file_added_to_the_folder_is_refused_but_a_card_or_hidden_file_is_not(saved):
    """An ``adapter_config.json`` dropped beside the weights would make transformers apply an adapter nobody saved."""
    folder, before = saved
    (folder / "README.md").write_text("# my model\n")
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x").write_text("y")
    np.testing.assert_allclose(load(folder).encode(TEXTS), before, atol=1e-6)
    (folder / "adapter_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"adapter_config.json: a file .*lmembed.json does not record \(files\)"):
        load(folder)


def test_a_record_that_is_missing_damaged_or_of_another_format_is_refused(saved):
    folder, _ = saved
    record = folder / STRATEGY_FILE
    meta = json.loads(record.read_text())
    cases = {
        "no files": ({k: v for k, v in meta.items() if k != FILES_KEY}, r"lmembed.json: files is missing"),
        "files a list": ({**meta, FILES_KEY: ["model.safetensors"]}, r"files must map each file's name to its sha256"),
        "a path out": (
            {**meta, FILES_KEY: {**meta[FILES_KEY], "../elsewhere": "0" * 64}},
            r"files.../elsewhere.*climbs out",
        ),
        "format 3": ({**meta, "format": 3}, r"lmembed.json: format=3: this lmembed reads formats 1 and 2"),
        "format true": ({**meta, "format": True}, r"format=True"),
        "is_decoder as text": ({**meta, "is_decoder": "false"}, r"lmembed.json: is_decoder='false' must be true"),
        "latent heads not dividing the width": (
            {**meta, "strategy": {**meta["strategy"], "latent": {**meta["strategy"]["latent"], "num_heads": 3}}},
            r"lmembed.json: strategy.latent: latent.num_heads=3 does not divide the model's hidden size",
        ),
    }
    for case, (content, message) in cases.items():
        record.write_text(json.dumps(content))
        with pytest.raises(ModelLoadError, match=message):
            load(folder)
        assert case


def test_a_folder_saved_before_the_record_loads_with_a_warning(saved, caplog):
    folder, before = saved
    unrecord(folder)
    with caplog.at_level("WARNING", logger="lmembed"):
        np.testing.assert_allclose(load(folder).encode(TEXTS), before, atol=1e-6)
    assert any("saved before lmembed recorded the sha256" in r.getMessage() for r in caplog.records)


def test_saving_is_atomic_and_never_replaces_a_folder_of_other_files(make_embedder, tmp_path, monkeypatch):
    emb = make_embedder("llama")
    target = tmp_path / "model"
    emb.save(target)
    first = (target / STRATEGY_FILE).read_text()
    monkeypatch.setattr(type(emb.backbone.tokenizer), "save_pretrained", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # a save that fails half-way leaves the earlier one as it was
        make_embedder("llama", pooling="last").save(target)
    monkeypatch.undo()
    assert (target / STRATEGY_FILE).read_text() == first and load(target).config.pooling == "mean"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary folder left behind
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"mine: writing an Embedder replaces .* files that are not a saved"):
        emb.save(mine)
    assert (mine / "notes.txt").read_text() == "keep me"
    (mine / STRATEGY_FILE).write_text('{"note": "mine too"}')  # a file merely named lmembed.json vouches for nothing
    with pytest.raises(ConfigError, match=r"mine: .* not a saved Embedder's \(lmembed.json records none\)"):
        emb.save(mine)
    assert sorted(p.name for p in mine.iterdir()) == [STRATEGY_FILE, "notes.txt"]
    (target / "sub").mkdir()
    (target / "sub" / "results.csv").write_text("mine")  # added to a saved folder: not recorded, would be lost
    with pytest.raises(ConfigError, match=r"model: .* which would be lost: sub/results.csv"):
        emb.save(target)
    assert (target / "sub" / "results.csv").read_text() == "mine"
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        emb.save(tmp_path / "a-file")


def test_a_saved_folder_is_readable_by_others_as_a_plain_write_would_be(make_embedder, tmp_path):
    """Temporary files and folders are made private (0600/0700); what is renamed into place gets the modes of the
    umask, so a model saved to a shared drive (or an index beside it) stays readable."""
    folder = make_embedder("llama").save(tmp_path / "model")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask
    for path in folder.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044 & ~umask, path


# ---------------------------------------------------------------------------------------------- a Hub repository
def to_hub_cache(folder: Path, cache: Path, repo_id: str, revision: str = "0" * 40) -> Path:
    """Lay ``folder`` out as huggingface_hub keeps a downloaded repository: each file once in ``blobs/`` (named by its
    digest) and linked from ``snapshots/<revision>/``, ``refs/main`` naming the revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            shutil.copyfile(path, blob)
            link = snapshot / path.relative_to(folder)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """huggingface_hub reading only its cache at ``tmp_path/hub`` (no network), as a machine that downloaded
    before."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_repository_an_embedder_was_saved_to_loads_with_its_strategy_and_head(saved, offline_hub):
    """Before, a Hub id went to the transformers reader: lmembed's defaults (mean pooling, causal attention, no head),
    other vectors without a word."""
    folder, before = saved
    to_hub_cache(folder, offline_hub, "me/tiny-latent")
    plan = plan_load("me/tiny-latent")
    assert plan.reader == "saved" and plan.where == "me/tiny-latent" and plan.exact_tokenizer
    loaded = load("me/tiny-latent")
    assert loaded.config.pooling == "latent_attention" and loaded.source == "me/tiny-latent"
    assert loaded.load_spec.source == "me/tiny-latent"
    np.testing.assert_allclose(loaded.encode(TEXTS), before, atol=1e-6)


def test_a_damaged_blob_of_a_hub_repository_is_refused_naming_the_snapshot_file(saved, offline_hub):
    folder, _ = saved
    snapshot = to_hub_cache(folder, offline_hub, "me/tiny-latent")
    blob = (snapshot / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"snapshots/0+/model.safetensors: its sha256 is not the one"):
        load("me/tiny-latent")


def test_a_hub_id_without_lmembed_json_goes_on_to_the_other_readers(offline_hub, tokenizer, tmp_path):
    from conftest import tiny_model

    plain = tmp_path / "plain"
    tiny_model("bert", len(tokenizer)).save_pretrained(plain)
    tokenizer.save_pretrained(plain)
    to_hub_cache(plain, offline_hub, "me/plain")
    assert plan_load("me/plain").reader == "transformers"
    assert plan_load("not a hub id").reader == "transformers"


def test_an_export_records_its_files_and_never_replaces_a_folder_of_other_files(tokenizer, tmp_path, monkeypatch):
    from conftest import tiny_model
    from lmembed import EmbeddingConfig

    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))
    model = tiny_model("bert", len(tokenizer))
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(), backend="onnx", use_cache=False, show_progress=False)
    folder = emb.export(tmp_path / "export")
    meta = json.loads((folder / STRATEGY_FILE).read_text())
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    recorded = [f for f in files if f not in (STRATEGY_FILE, CARD_FILE)]  # the card is recorded apart
    assert meta["format"] == SAVED_FORMAT and sorted(meta[FILES_KEY]) == recorded
    assert meta[CARD_KEY] == sha256_file(folder / CARD_FILE)
    assert "model.onnx" in meta[FILES_KEY] and "manifest.json" in meta[FILES_KEY]
    assert emb.export(folder) == folder  # an earlier export is replaced
    with pytest.raises(ModelLoadError, match=r"export is an lmembed export .* loads the model it was exported from"):
        load(folder)  # an export is for ONNX Runtime: said, not "holds no model"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=r"mine: writing an Embedder replaces .* files that are not a saved"):
        emb.export(mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_an_option_given_over_a_saved_strategy_is_said(make_embedder, tmp_path, caplog):
    """A published folder's overridden convention was said; a saved folder's was overridden without a word (now in
    the log, --verbose: experiments and grids override it on purpose)."""
    folder = make_embedder("bert").save(tmp_path / "saved")
    with caplog.at_level("INFO", logger="lmembed.load_plan"):
        load(folder, pooling="cls")
        load(folder, pooling="mean")  # the saved value itself: nothing to say
    said = [r.getMessage() for r in caplog.records if "overrides the saved strategy" in r.getMessage()]
    assert said == [f"pooling='cls' (given) overrides the saved strategy's pooling='mean' (from {folder}/lmembed.json)"]
