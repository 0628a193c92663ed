"""Index files that check themselves: sha256 in the manifest verified on open and by `lmembed index verify`,
damaged files named with what to do, FAISS/NumPy read errors in our words, the previous generation kept by
`index add` and restored by `lmembed index restore`, interrupted saves that leave an index that still opens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import WORDS
from lmembed.cli.app import app
from lmembed.index import Index, IndexFormatError, IndexIntegrityError
from lmembed.index import integrity as integrity_module
from lmembed.index.manifest import MANIFEST_FILE, Manifest
from lmembed.index.store import DocumentStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture
def model_dir(make_embedder, tmp_path) -> Path:
    folder = tmp_path / "model"
    make_embedder("bert").save(folder)
    return folder


def build(model_dir: Path, folder: Path, kind: str = "flat", **params) -> Index:
    from lmembed import Embedder

    emb = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    return Index.build(emb, texts(40, seed=1), folder, kind=kind, **params)


def flip_middle(path: Path, size: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + size] = bytes(b ^ 0xFF for b in data[middle : middle + size])
    path.write_bytes(bytes(data))


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def test_flipped_bytes_are_refused_everywhere_with_the_file_named(model_dir, tmp_path):
    folder = tmp_path / "index"
    build(model_dir, folder)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    vectors = folder / manifest["files"]["vectors"]
    sums = manifest["checksums"]
    assert sums == {name: integrity_module.sha256_file(folder / name) for name in sums}
    assert sorted(manifest["checksums"]) == sorted(manifest["files"].values())
    runner = CliRunner()
    assert runner.invoke(app, ["index", "verify", str(folder)]).exit_code == 0

    flip_middle(vectors)
    expected = (
        f"{vectors}: damaged (its sha256 is not the one recorded in {folder / MANIFEST_FILE}); the index cannot be "
        f"trusted: rebuild it (`lmembed index build ... -o {folder} --overwrite`)"
    )
    with pytest.raises(IndexIntegrityError) as caught:
        Index.open(folder)
    assert str(caught.value) == expected
    for argv in (["index", "verify", str(folder)], ["index", "info", str(folder)], ["search", str(folder), "cat"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert one_line(result.output).startswith(f"error: {expected}"), result.output
    assert Index.open(folder, verify=False).count == 40  # the caller may still look, on purpose


def test_add_keeps_the_previous_generation_and_restore_brings_it_back(model_dir, tmp_path):
    folder = tmp_path / "index"
    build(model_dir, folder)
    runner = CliRunner()
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps({"_id": f"x{i}", "text": t}) + "\n" for i, t in enumerate(texts(5, 2))))
    assert runner.invoke(app, ["index", "add", str(folder), str(extra), "--no-cache"]).exit_code == 0
    current = Manifest.read(folder)
    assert current.generation == 2 and current.count == 45
    previous = json.loads((folder / integrity_module.PREVIOUS_MANIFEST).read_text())
    assert previous["generation"] == 1 and all((folder / name).is_file() for name in previous["files"].values())

    flip_middle(folder / current.files["documents"], size=8)
    result = runner.invoke(app, ["index", "verify", str(folder)])
    assert result.exit_code == 2
    assert f"`lmembed index restore {folder}` (documents added since are lost)" in one_line(result.output)
    result = runner.invoke(app, ["index", "restore", str(folder)])
    assert result.exit_code == 0, result.output
    assert "restored generation 1 (40 documents)" in one_line(result.output)
    assert Index.open(folder).count == 40
    result = runner.invoke(app, ["index", "restore", str(folder)])  # only one step back is kept
    assert result.exit_code == 2 and "no previous generation is kept" in one_line(result.output)

    # the next add writes over the damaged generation's names and leaves a whole index
    assert runner.invoke(app, ["index", "add", str(folder), str(extra), "--no-cache"]).exit_code == 0
    assert runner.invoke(app, ["index", "verify", str(folder)]).exit_code == 0
    assert Index.open(folder).count == 45


@pytest.mark.parametrize("stage", ["documents", "previous", "manifest"])
def test_an_interrupted_add_leaves_an_index_that_opens(model_dir, tmp_path, monkeypatch, stage):
    folder = tmp_path / "index"
    index = build(model_dir, folder)
    target = {
        "documents": (DocumentStore, "save"),
        "manifest": (Manifest, "write"),
        "previous": (integrity_module, "keep_previous"),
    }[stage]
    original = getattr(*target)

    def interrupted(*args, **kwargs):
        if stage == "manifest":
            original(*args, **kwargs)  # the manifest is replaced, then the process dies before the clean-up
        raise KeyboardInterrupt

    monkeypatch.setattr(*target, interrupted)
    with pytest.raises(KeyboardInterrupt):
        index.add(texts(3, seed=3))
    monkeypatch.setattr(*target, original)
    reopened = Index.open(folder)
    assert reopened.count == (43 if stage == "manifest" else 40)
    Index.verify(folder)


def test_unreadable_files_are_named_in_our_words(model_dir, tmp_path):
    folder = tmp_path / "index"
    build(model_dir, folder, kind="binary", rescore="float")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    del manifest["checksums"]  # as an index written before checksums existed, or a hand-edited manifest
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match=r"manifest.json: checksums: none recorded.*rebuild it"):
        Index.open(folder)  # nothing in it could be verified
    assert Index.open(folder, verify=False).count == 40  # the readers below, reached without the checksums

    codes, rescore = folder / manifest["files"]["codes"], folder / manifest["files"]["rescore"]
    rescore.write_bytes(rescore.read_bytes()[:20])
    with pytest.raises(IndexFormatError) as caught:
        Index.open(folder, verify=False)
    assert str(caught.value).startswith(f"{rescore}: not a readable NumPy array file (")
    codes.write_bytes(codes.read_bytes()[:10])
    with pytest.raises(IndexFormatError) as caught:
        Index.open(folder, verify=False)
    message = str(caught.value)
    assert message.startswith(f"{codes}: not a readable FAISS index (")
    assert "faiss::" not in message and "std::" not in message
    assert message.endswith(f"rebuild it (`lmembed index build ... -o {folder} --overwrite`)")
