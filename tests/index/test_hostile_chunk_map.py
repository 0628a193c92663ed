"""A chunked index's chunk map (``{stem}.chunks.npy``) from elsewhere, its sha256 re-recorded in the manifest (a
checksum catches damage, not a forgery): it goes through the index's one ``.npy`` reader, so a header claiming more
rows than the file holds, another dtype (a float map with fractional rows), another rank or a pickle is refused
naming the file and the field, before numpy allocates anything, by ``Index.open``, ``lmembed index verify`` and
``lmembed search`` (exit 2, never an internal error)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.encoding.chunking import Chunking
from lmembed.index import Index
from lmembed.index.chunk_map import ChunkMap
from lmembed.index.errors import IndexFormatError
from lmembed.index.manifest import MANIFEST_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = [
    ("long", "the cat sat on the mat . a dog was in the study of language model search , the end"),
    ("short", "protein cell gene"),
    ("mid", "a dog was riding a horse in the study"),
]
CHUNKING = Chunking("maxp", tokens=4, overlap=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A chunked index of three documents, built once; tests change copies of it."""
    from conftest import build_tokenizer, tiny_model
    from lmembed import Embedder, EmbeddingConfig

    tok = build_tokenizer()
    emb = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(), use_cache=False)
    folder = tmp_path_factory.mktemp("chunked") / "ix"
    Index.build(emb, DOCS, folder, chunking=CHUNKING)
    return folder


@pytest.fixture
def index(built, tmp_path) -> Path:
    import shutil

    shutil.copytree(built, tmp_path / "ix")
    return tmp_path / "ix"


def chunk_file(folder: Path) -> Path:
    return folder / json.loads((folder / MANIFEST_FILE).read_text())["files"]["chunks"]


def rerecord(folder: Path, path: Path) -> None:
    """Record ``path``'s sha256 as it now is in the manifest, as whoever forged it would."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["checksums"][path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))


def claim_shape(path: Path, shape: str) -> None:
    """Rewrite the ``.npy`` header of ``path`` (format 1.0) to claim ``shape``, leaving its data as it is."""
    data = path.read_bytes()
    length = struct.unpack("<H", data[8:10])[0]
    header = data[10 : 10 + length].decode("latin1")
    start = header.index("'shape': ") + len("'shape': ")
    end = header.index(")", start) + 1
    new = (header[:start] + shape + header[end:]).rstrip()
    assert len(new) < length, "the new header must fit the old one's padding"
    path.write_bytes(data[:10] + (new.ljust(length - 1) + "\n").encode("latin1") + data[10 + length :])


def huge_header(path: Path) -> None:
    claim_shape(path, "(100000000000,)")


def float_rows(path: Path) -> None:
    rows = np.load(path).astype(np.float64)
    rows[0] = 0.5  # a fractional row: a float map was cast to int64 and accepted
    np.save(path, rows)


def two_dimensional(path: Path) -> None:
    rows = np.load(path)
    np.save(path, np.stack([rows, rows]))


def negative_row(path: Path) -> None:
    rows = np.load(path)
    rows[0] = -1  # still non-decreasing and covering the documents' count
    np.save(path, rows)


def pickled(path: Path) -> None:
    np.save(path, np.array([object()] * 3, dtype=object), allow_pickle=True)


def cut_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:9])


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "header claims 10**11 rows": (huge_header, "shape [100000000000] of int64 does not match the file's size"),
    "float64 with a fractional row": (float_rows, "dtype is float64, expected int64"),
    "two-dimensional": (two_dimensional, "a chunk map is 1-D"),
    "a negative row": (negative_row, "values: -1 is not a document row"),
    "a pickle": (pickled, "dtype is object, expected int64"),
    "a header cut short": (cut_header, "not a readable NumPy array file"),
}


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


@pytest.mark.parametrize("case", list(CASES))
def test_a_forged_chunk_map_is_refused_naming_the_file_and_the_field(case, index, monkeypatch):
    forge, expected = CASES[case]
    path = chunk_file(index)
    forge(path)
    rerecord(index, path)

    def no_load(*args, **kwargs):
        raise AssertionError("np.load ran before the header was checked")

    if case != "a negative row":  # refused from the header alone: numpy never reads (nor allocates) the array
        monkeypatch.setattr(np, "load", no_load)
    with pytest.raises(IndexFormatError) as caught:
        Index.open(index)
    assert str(path) in str(caught.value) and expected in str(caught.value)
    assert "rebuild it" in str(caught.value)  # what to do, never a protection to switch off
    for argv in (["index", "verify", str(index)], ["search", str(index), "cat mat", "-k", "2"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert expected in one_line(result.output) and path.name in one_line(result.output), result.output
        assert "internal error" not in result.output and "Traceback" not in result.output


def test_the_chunk_map_as_written_reads_back(index):
    reopened = Index.open(index)
    assert isinstance(reopened.chunks, ChunkMap) and reopened.chunks.doc_rows.dtype == np.int64
    assert reopened.chunks.doc_rows[0] == 0 and reopened.chunks.doc_rows[-1] == len(DOCS) - 1
    assert CliRunner().invoke(app, ["index", "verify", str(index)]).exit_code == 0
