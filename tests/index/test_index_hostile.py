"""Hostile index folders (issue 36): a manifest naming files outside the folder (``..``, an absolute path, a link),
a ``bm25/`` folder its checksums do not vouch for (flipped bytes, rotated word ids, another index's BM25 index),
and an index that cannot be written. Each is refused by `lmembed index verify`, `lmembed search` and
``Index.open`` with a message naming the file, exit 2, and nothing outside the folder is opened."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import WORDS
from helpers import opened, opened_under
from lmembed.cli.app import app
from lmembed.errors import UnsafeFileError
from lmembed.index import Index, IndexFormatError, IndexIntegrityError
from lmembed.index import integrity as integrity_module
from lmembed.index.errors import IndexPathError, IndexWriteError
from lmembed.index.manifest import MANIFEST_FILE
from lmembed.index.store import DocumentStore
from lmembed.lexical.bm25 import LEXICAL_DIR, LexicalIndex

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------- indexes
def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from conftest import build_tokenizer, tiny_model
    from lmembed import Embedder, EmbeddingConfig

    tok = build_tokenizer()
    emb = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(), use_cache=False)
    return emb.save(tmp_path_factory.mktemp("model") / "model")


@pytest.fixture(scope="module")
def pair(model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two indexes of 40 documents with the same ids (row numbers) and other texts; each searched once by BM25,
    so each holds a ``bm25/`` folder. Tests copy them before changing anything."""
    from lmembed import Embedder

    emb = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    root = tmp_path_factory.mktemp("pair")
    folders = []
    for name, seed in (("index", 1), ("other", 2)):
        index = Index.build(emb, texts(40, seed=seed), root / name)
        index.search("cat dog", 3, mode="bm25")
        folders.append(root / name)
    return folders[0], folders[1]


@pytest.fixture
def index_pair(pair, tmp_path) -> tuple[Path, Path]:
    copies = []
    for folder in pair:
        shutil.copytree(folder, tmp_path / folder.name, symlinks=True)
        copies.append(tmp_path / folder.name)
    return copies[0], copies[1]


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_FILE).read_text())


def write_manifest(folder: Path, data: dict) -> None:
    (folder / MANIFEST_FILE).write_text(json.dumps(data, indent=2))


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def invoke(*argv: str):
    return CliRunner().invoke(app, list(argv))


def refused_everywhere(folder: Path, outside: Path | None, expected: str, error: type[Exception]) -> None:
    """``index verify``, BM25 and dense ``search`` and ``Index.open`` all refuse ``folder`` with ``expected`` in the
    message and exit 2, and open no file under ``outside``."""
    with opened() as files:
        with pytest.raises(error) as caught:
            Index.open(folder)
        assert expected in str(caught.value)
        for argv in (
            ["index", "verify", str(folder)],
            ["search", str(folder), "cat dog", "--mode", "bm25"],
            ["search", str(folder), "cat dog"],
        ):
            result = invoke(*argv)
            assert result.exit_code == 2, (argv, result.output)
            assert expected in one_line(result.output), result.output
            assert "Traceback" not in result.output and "internal error" not in result.output
    if outside is not None:
        assert opened_under(files, outside) == []


# ---------------------------------------------------------------------------------------------- the index as built
def test_every_file_of_an_index_is_in_its_checksums(index_pair):
    folder, _ = index_pair
    data = manifest_of(folder)
    bm25 = sorted(f"{LEXICAL_DIR}/{p.name}" for p in (folder / LEXICAL_DIR).iterdir())
    assert bm25 and all(name in data["checksums"] for name in bm25)
    every_file = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    bookkeeping = {MANIFEST_FILE, ".lock"}
    assert every_file - bookkeeping == set(data["checksums"])
    for name, digest in data["checksums"].items():
        assert integrity_module.sha256_file(folder / name) == digest
    result = invoke("index", "verify", str(folder))
    assert result.exit_code == 0, result.output
    assert f"{len(bm25)} BM25 files" in result.output
    assert invoke("search", str(folder), "cat dog", "--mode", "bm25").exit_code == 0


# ---------------------------------------------------------------------------------------------- files outside
def _documents_dotdot(folder: Path, other: Path) -> str:
    return f"../{other.name}/{manifest_of(other)['files']['documents']}"


def _documents_absolute(folder: Path, other: Path) -> str:
    return str(other / manifest_of(other)["files"]["documents"])


def _documents_symlink(folder: Path, other: Path) -> str:
    name = manifest_of(folder)["files"]["documents"]
    (folder / name).unlink()
    (folder / name).symlink_to(other / manifest_of(other)["files"]["documents"])
    return name


ESCAPES = {
    "dotdot": (_documents_dotdot, "climbs out of"),
    "absolute": (_documents_absolute, "is an absolute path"),
    "symlink": (_documents_symlink, "leads outside"),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_documents_named_outside_the_folder_are_refused_before_they_are_read(index_pair, escape):
    folder, other = index_pair
    make, reason = ESCAPES[escape]
    data = manifest_of(folder)
    own = data["files"]["documents"]
    name = make(folder, other)
    theirs = integrity_module.sha256_file(other / manifest_of(other)["files"]["documents"])
    data["files"]["documents"] = name
    data["checksums"].pop(own)
    data["checksums"][name] = theirs  # the checksum of the file it names: the checksums alone would pass it
    write_manifest(folder, data)

    expected = f"{folder / MANIFEST_FILE}: files.documents={name!r} {reason}"
    refused_everywhere(folder, other, expected, IndexPathError)
    with pytest.raises(UnsafeFileError, match=r"files\.documents"):
        Index.open(folder, verify=False)  # not a checksum: no way around it


def test_a_checksum_entry_outside_the_folder_is_refused(index_pair):
    folder, other = index_pair
    data = manifest_of(folder)
    data["checksums"]["../other/manifest.json"] = "0" * 64
    write_manifest(folder, data)
    expected = f"{folder / MANIFEST_FILE}: checksums['../other/manifest.json']='../other/manifest.json' climbs out of"
    refused_everywhere(folder, other, expected, IndexPathError)


def test_a_bm25_folder_linked_elsewhere_is_refused(index_pair):
    folder, other = index_pair
    shutil.rmtree(folder / LEXICAL_DIR)
    (folder / LEXICAL_DIR).symlink_to(other / LEXICAL_DIR)
    expected = f"{folder}: the BM25 index='bm25' leads outside {folder} through a link"
    refused_everywhere(folder, other, expected, IndexPathError)


# ---------------------------------------------------------------------------------------------- bm25/ checksums
def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 16, len(data)):  # the array's last bytes (past the .npy header)
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _flip_data(folder: Path, other: Path) -> list[str]:
    _flip(folder / LEXICAL_DIR / "data.csc.index.npy")
    return ["data.csc.index.npy"]


def _flip_indices(folder: Path, other: Path) -> list[str]:
    _flip(folder / LEXICAL_DIR / "indices.csc.index.npy")
    return ["indices.csc.index.npy"]


def _rotate_vocabulary(folder: Path, other: Path) -> list[str]:
    path = folder / LEXICAL_DIR / "vocab.tokenizer.json"
    vocab = json.loads(path.read_text())
    words = vocab.get("word_to_id", vocab)
    ids = list(words.values())
    for word, word_id in zip(list(words), ids[1:] + ids[:1], strict=True):
        words[word] = word_id
    path.write_text(json.dumps(vocab))
    return ["vocab.tokenizer.json"]


def _swap_in_another(folder: Path, other: Path) -> list[str]:
    """The other index's bm25/ (same ids, other texts) in place of this one's."""
    recorded = manifest_of(folder)["checksums"]
    shutil.rmtree(folder / LEXICAL_DIR)
    shutil.copytree(other / LEXICAL_DIR, folder / LEXICAL_DIR)
    files = sorted((folder / LEXICAL_DIR).iterdir())
    return [p.name for p in files if integrity_module.sha256_file(p) != recorded[f"{LEXICAL_DIR}/{p.name}"]]


DAMAGE = {
    "flipped data.csc": _flip_data,
    "flipped indices.csc": _flip_indices,
    "rotated word ids": _rotate_vocabulary,
    "another index's bm25": _swap_in_another,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_changed_bm25_folder_is_refused_naming_its_files(index_pair, damage):
    folder, other = index_pair
    assert manifest_of(folder)["files"] and texts(40, 1) != texts(40, 2)
    changed = DAMAGE[damage](folder, other)
    assert changed
    first = folder / LEXICAL_DIR / sorted(changed)[0]
    expected = f"{first}"
    refused_everywhere(folder, None, expected, IndexIntegrityError)
    result = invoke("index", "verify", str(folder))
    assert "the BM25 index cannot be trusted" in one_line(result.output)
    assert f"remove {folder / LEXICAL_DIR}" in one_line(result.output)

    shutil.rmtree(folder / LEXICAL_DIR)  # what the message says: it is rebuilt from the verified documents
    assert invoke("index", "verify", str(folder)).exit_code == 0
    index = Index.open(folder)
    hits = index.search("cat dog", 5, mode="bm25")
    assert {h.text for h in hits} <= set(texts(40, 1))
    assert invoke("index", "verify", str(folder)).exit_code == 0  # rebuilt, with its checksums recorded
    assert all(f"{LEXICAL_DIR}/{p.name}" in manifest_of(folder)["checksums"] for p in (folder / LEXICAL_DIR).iterdir())


def test_a_bm25_folder_the_manifest_does_not_list_is_refused(index_pair):
    """An index whose bm25/ was saved before its files were checksummed (or one put there by hand)."""
    folder, _ = index_pair
    data = manifest_of(folder)
    data["checksums"] = {n: s for n, s in data["checksums"].items() if not n.startswith(f"{LEXICAL_DIR}/")}
    write_manifest(folder, data)
    expected = f"not in the checksums of {folder / MANIFEST_FILE}, so the BM25 index cannot be trusted"
    refused_everywhere(folder, None, expected, IndexIntegrityError)


def test_a_bm25_folder_saved_by_another_reader_is_verified_against_the_manifest_on_disk(index_pair):
    """Two readers of one index (two server workers): the second uses the BM25 index the first saved and
    recorded, instead of taking it for one nobody vouched for."""
    folder, _ = index_pair
    shutil.rmtree(folder / LEXICAL_DIR)
    first, second = Index.open(folder), Index.open(folder)
    expected = first.search("cat dog", 5, mode="bm25")
    assert (folder / LEXICAL_DIR).is_dir()
    assert second.search("cat dog", 5, mode="bm25") == expected
    assert invoke("index", "verify", str(folder)).exit_code == 0


def test_restore_drops_the_bm25_folder_of_the_newer_generation(index_pair, model_dir):
    from lmembed import Embedder

    folder, _ = index_pair
    emb = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    index = Index.open(folder, emb)
    index.add([("new-1", "a cat sat on the mat"), ("new-2", "the dog ran")])
    assert index.search("cat", 3, mode="bm25")  # rebuilt over 42 documents, its checksums recorded
    assert invoke("index", "verify", str(folder)).exit_code == 0
    result = invoke("index", "restore", str(folder))
    assert result.exit_code == 0, result.output
    assert not (folder / LEXICAL_DIR).exists()
    assert invoke("index", "verify", str(folder)).exit_code == 0
    restored = Index.open(folder)
    assert restored.count == 40 and restored.search("cat dog", 3, mode="bm25")
    assert invoke("index", "verify", str(folder)).exit_code == 0


# ---------------------------------------------------------------------------------------------- unwritable
def test_add_to_a_read_only_index_is_a_user_error_naming_the_path(index_pair, tmp_path, monkeypatch):
    folder, _ = index_pair
    docs = tmp_path / "more.jsonl"
    docs.write_text('{"_id": "new-1", "text": "a new cat"}\n{"_id": "new-2", "text": "another dog"}\n')
    before = manifest_of(folder)

    def read_only(self, where: Path, stem: str):
        raise OSError(errno.EROFS, "Read-only file system", str(where / f"{stem}.docs.jsonl"))

    monkeypatch.setattr(DocumentStore, "save", read_only)
    result = invoke("index", "add", str(folder), str(docs))
    assert result.exit_code == 2, result.output
    text = one_line(result.output)
    assert f"{folder}/g000002.docs.jsonl: cannot write the index {folder} (Read-only file system)" in text
    assert "internal error" not in text and "Traceback" not in result.output
    assert manifest_of(folder) == before  # the index is left at its generation
    assert Index.open(folder).count == 40
    with pytest.raises(IndexWriteError):
        index = Index.open(folder)
        index._write(folder, replace_existing=True)


def test_add_is_refused_before_the_model_loads_where_the_folder_is_not_writable(index_pair, tmp_path, monkeypatch):
    folder, _ = index_pair
    docs = tmp_path / "more.jsonl"
    docs.write_text('{"_id": "new-1", "text": "a new cat"}\n')
    real_access = os.access

    def access(path, mode: int, **kwargs) -> bool:  # as a read-only folder answers (root writes anywhere)
        return not (Path(path) == folder and mode & os.W_OK) and real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    loaded = []
    monkeypatch.setattr(Index, "load_embedder", lambda self, **kw: loaded.append(kw))
    result = invoke("index", "add", str(folder), str(docs))
    assert result.exit_code == 2, result.output
    assert f"cannot write to {folder}" in one_line(result.output)
    assert loaded == []


def test_bm25_search_of_a_read_only_index_serves_from_memory(index_pair, monkeypatch, caplog):
    folder, _ = index_pair
    shutil.rmtree(folder / LEXICAL_DIR)
    before = manifest_of(folder)

    def read_only(self, where: Path) -> Path:
        raise OSError(errno.EROFS, "Read-only file system", str(where / LEXICAL_DIR))

    monkeypatch.setattr(LexicalIndex, "save", read_only)
    result = invoke("search", str(folder), "cat dog", "--mode", "bm25")
    assert result.exit_code == 0, result.output
    assert manifest_of(folder) == before and not (folder / LEXICAL_DIR).exists()


def test_a_manifest_without_its_documents_entry_is_a_format_error(index_pair):
    folder, _ = index_pair
    data = manifest_of(folder)
    del data["files"]["documents"]
    write_manifest(folder, data)
    with pytest.raises(IndexFormatError, match=r"files\.documents is missing"):
        Index.open(folder, verify=False)
    assert invoke("index", "verify", str(folder)).exit_code == 2


# ---------------------------------------------------------------------------------------------- a BM25 save killed
def _dies_after(real):
    def call(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt  # what a kill leaves: the step done, nothing after it

    return call


@pytest.mark.parametrize("moment", ["old bm25/ removed", "new checksums recorded", "bm25/ renamed into place"])
def test_a_bm25_save_killed_at_any_moment_leaves_an_index_every_command_opens(index_pair, monkeypatch, moment):
    """The BM25 index is saved aside, its checksums recorded, then renamed in: a kill at any step leaves no bm25/ or
    one the manifest vouches for (a kill just after the rename made every command refuse the index before)."""
    from lmembed.index.manifest import Manifest

    folder, _ = index_pair
    shutil.rmtree(folder / LEXICAL_DIR)  # as built: no BM25 index yet, none recorded
    data = manifest_of(folder)
    data["checksums"] = {n: s for n, s in data["checksums"].items() if not n.startswith(f"{LEXICAL_DIR}/")}
    write_manifest(folder, data)
    with monkeypatch.context() as patch:
        if moment == "old bm25/ removed":
            patch.setattr(integrity_module, "drop_lexical", _dies_after(integrity_module.drop_lexical))
        elif moment == "new checksums recorded":
            patch.setattr(Manifest, "write", _dies_after(Manifest.write))
        else:
            real_rename = Path.rename
            patch.setattr(
                Path,
                "rename",
                lambda self, to: (
                    _dies_after(real_rename)(self, to) if Path(to).name == LEXICAL_DIR else real_rename(self, to)
                ),
            )
        with pytest.raises(KeyboardInterrupt):
            Index.open(folder).search("cat dog", 3, mode="bm25")
    assert invoke("index", "verify", str(folder)).exit_code == 0
    dense = invoke("search", str(folder), "cat dog", "-k", "3")
    assert dense.exit_code == 0, dense.output
    hits = Index.open(folder).search("cat dog", 3, mode="bm25")  # built and saved again where it was lost
    assert {h.text for h in hits} <= set(texts(40, 1))
    assert all(f"{LEXICAL_DIR}/{p.name}" in manifest_of(folder)["checksums"] for p in (folder / LEXICAL_DIR).iterdir())
    assert invoke("index", "verify", str(folder)).exit_code == 0


def test_a_build_killed_before_its_manifest_is_built_again_in_its_folder(model_dir, tmp_path):
    """A build killed while writing its data files leaves its lock, a generation's files and temporary files, and no
    manifest: the same build runs again over them (it was refused as 'a folder with other files in it'); a folder
    holding anything else still is."""
    from lmembed import Embedder

    emb = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    folder = tmp_path / "index"
    folder.mkdir()
    (folder / ".lock").write_text("")
    (folder / "g000001.faiss").write_bytes(b"half of a faiss file")
    (folder / ".tmp-abc.npy").write_bytes(b"half")
    Index.build(emb, texts(20, 3), folder)
    assert invoke("index", "verify", str(folder)).exit_code == 0
    assert not (folder / ".tmp-abc.npy").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "g000001.faiss").write_bytes(b"x")
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="a folder with other files in it"):
        Index.build(emb, texts(20, 3), other)


def test_a_faiss_file_that_claims_more_than_it_holds_is_refused_before_anything_is_allocated(index_pair):
    """FAISS sized an array by the length the file declares and zero-filled it before reading: a file of a few
    hundred bytes declaring 2 GiB took 2 GiB, and a larger claim ended in a bare MemoryError. Its checksum is from
    the same folder, so it vouches for nothing; the read is bounded by the file's own size."""
    import hashlib
    import resource
    import struct

    folder = index_pair[0]
    manifest = manifest_of(folder)
    name = manifest["files"]["vectors"]
    raw = (folder / name).read_bytes()
    # IndexFlat: its vector of codes is a count of floats at byte 37, then the bytes
    forged = raw[:37] + struct.pack("<Q", 2**31 // 4) + raw[45:109]
    (folder / name).write_bytes(forged)
    manifest["checksums"][name] = hashlib.sha256(forged).hexdigest()
    write_manifest(folder, manifest)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(IndexFormatError, match=f"{name}: not a readable FAISS index"):
        Index.open(folder)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB: far below the 2 GiB
    Index.open(index_pair[1])  # a real one still opens under the bound


def test_an_index_made_by_another_input_building_is_opened_with_a_warning(index_pair, caplog):
    """Its vectors were made by an earlier lmembed's input building (before ENCODING_VERSION was recorded): queries
    are read by this one's, so opening it says so rather than mixing the two in silence."""
    from lmembed.encoding.cache import ENCODING_VERSION

    folder = index_pair[0]
    assert manifest_of(folder)["encoding"] == ENCODING_VERSION
    Index.open(folder)
    assert "input building" not in caplog.text
    manifest = manifest_of(folder)
    del manifest["encoding"]  # as an index built before the field: version 1
    write_manifest(folder, manifest)
    Index.open(folder)
    assert f"input building of version 1, this lmembed's is {ENCODING_VERSION}" in caplog.text
