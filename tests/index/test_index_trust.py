"""Index files made by someone else, whose checksums were updated to match as an attacker would: every field of the
manifest, the BM25 arrays and JSON files, the binary kind's rescoring array, the FAISS file's class, dimension and
values, and the documents' ids are checked before they are used. Each is refused naming the file and the field, exit 2
from the CLI, never an internal error."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import WORDS
from lmembed.cli.app import app
from lmembed.index import Index, IndexFormatError
from lmembed.index import integrity as integrity_module
from lmembed.index.manifest import MANIFEST_FILE
from lmembed.lexical.bm25 import LEXICAL_DIR, LexicalIndex, LexicalIndexError, read_saved

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """A flat index searched once by BM25 (so it holds ``bm25/``), an hnsw one and a binary one, 20 documents each;
    tests copy them before changing anything."""
    from conftest import build_tokenizer, tiny_model
    from lmembed import Embedder, EmbeddingConfig

    tok = build_tokenizer()
    model = Embedder.from_model(tiny_model("bert", len(tok)), tok, EmbeddingConfig(), use_cache=False)
    model_dir = model.save(tmp_path_factory.mktemp("model") / "model")
    emb = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    root = tmp_path_factory.mktemp("built")
    docs = texts(20, seed=1)
    flat = Index.build(emb, docs, root / "flat")
    flat.search("cat dog", 3, mode="bm25")
    Index.build(emb, docs, root / "hnsw", kind="hnsw")
    Index.build(emb, docs, root / "binary", kind="binary")
    return {"flat": root / "flat", "hnsw": root / "hnsw", "binary": root / "binary"}


def copy_of(built: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    target = tmp_path / kind
    shutil.copytree(built[kind], target, symlinks=True)
    return target


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_FILE).read_text())


def write_manifest(folder: Path, data: dict) -> None:
    (folder / MANIFEST_FILE).write_text(json.dumps(data, indent=2))


def resum(folder: Path) -> None:
    """Record the sha256 of every file as it now is: the damage passes the checksum check."""
    data = manifest_of(folder)
    data["checksums"] = {name: integrity_module.sha256_file(folder / name) for name in data["checksums"]}
    write_manifest(folder, data)


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def invoke(*argv: str):
    return CliRunner().invoke(app, list(argv))


def refused(argv: list[str], *expected: str) -> None:
    """The command exits 2 with each of ``expected`` in its message, and no internal error."""
    result = invoke(*argv)
    shown = one_line(result.output)
    assert result.exit_code == 2, (argv, result.output)
    for part in expected:
        assert part in shown, (argv, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output


# ---------------------------------------------------------------------------------------------- bm25/
def _npy_header_claims_huge(bm25: Path) -> tuple[str, str]:
    path = bm25 / "data.csc.index.npy"
    raw = path.read_bytes()
    header_end = raw.index(b"\n") + 1
    header = raw[:header_end].decode("latin1")
    start = header.index("'shape': (") + len("'shape': (")
    stop = header.index(")", start)
    changed = header[:start] + "9999999999999," + header[stop:]
    changed = changed[: header_end - 1].ljust(header_end - 1) + "\n"  # the same header length
    path.write_bytes(changed.encode("latin1") + raw[header_end:])
    return "data.csc.index.npy", "shape claims 9999999999999 values"


def _indices_out_of_range(bm25: Path) -> tuple[str, str]:
    path = bm25 / "indices.csc.index.npy"
    array = np.load(path)
    array[:] = 10**6
    np.save(path, array)
    return "indices.csc.index.npy", "the document rows must lie in [0, 20)"


def _indptr_past_the_end(bm25: Path) -> tuple[str, str]:
    path = bm25 / "indptr.csc.index.npy"
    array = np.load(path)
    array[-1] = 10**9
    np.save(path, array)
    return "indptr.csc.index.npy", "the column offsets must go from 0"


def _indptr_going_back(bm25: Path) -> tuple[str, str]:
    path = bm25 / "indptr.csc.index.npy"
    array = np.load(path)
    array[1], array[2] = array[2] + 1, array[1]
    np.save(path, array)
    return "indptr.csc.index.npy", "the column offsets"


def _scores_nan(bm25: Path) -> tuple[str, str]:
    path = bm25 / "data.csc.index.npy"
    array = np.load(path)
    array[0] = np.nan
    np.save(path, array)
    return "data.csc.index.npy", "the scores hold NaN"


def _scores_as_objects(bm25: Path) -> tuple[str, str]:
    path = bm25 / "data.csc.index.npy"
    np.save(path, np.array([1.0, "x"], dtype=object), allow_pickle=True)
    return "data.csc.index.npy", "dtype is object"


def _scores_two_dimensional(bm25: Path) -> tuple[str, str]:
    path = bm25 / "data.csc.index.npy"
    array = np.load(path)
    np.save(path, np.stack([array, array]))
    return "data.csc.index.npy", "shape is"


def _vocabulary_an_array(bm25: Path) -> tuple[str, str]:
    (bm25 / "vocab.index.json").write_text("[1, 2, 3]")
    return "vocab.index.json", "the BM25 vocabulary must hold an object at its top, not an array"


def _json_change(name: str, change: Callable[[dict], object], field: str) -> Callable[[Path], tuple[str, str]]:
    """A damage that edits one JSON file of ``bm25/`` with ``change`` and expects ``field`` in the refusal."""

    def damage(bm25: Path) -> tuple[str, str]:
        path = bm25 / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
        return name, field

    return damage


_vocabulary_id_out_of_range = _json_change(
    "vocab.index.json", lambda d: d.update(cat=10**6), "the vocabulary['cat'] is 1000000, not a word id below"
)
_tokenizer_id_out_of_range = _json_change(
    "vocab.tokenizer.json", lambda d: d["word_to_id"].update(cat=10**6), "word_to_id['cat'] is 1000000"
)
_params_nan = _json_change("params.index.json", lambda d: d.update(k1=float("nan")), "k1 must be a finite number")
_params_document_count = _json_change(
    "params.index.json", lambda d: d.update(num_docs=10**12), "num_docs is 1000000000000"
)
_record_params_nan = _json_change(
    "lexical.json", lambda d: d["params"].update(b=float("nan")), "params.b must be a finite number"
)
_record_stopwords_unknown = _json_change(
    "lexical.json",
    lambda d: d["params"].update(stopwords="klingon"),
    "params.stopwords must name one of bm25s' stop word lists, not 'klingon'",
)


BM25_DAMAGE: dict[str, Callable[[Path], tuple[str, str]]] = {
    "an npy header claiming 10^13 floats": _npy_header_claims_huge,
    "document rows out of range": _indices_out_of_range,
    "indptr past the end": _indptr_past_the_end,
    "indptr going back": _indptr_going_back,
    "a NaN score": _scores_nan,
    "scores as Python objects": _scores_as_objects,
    "scores in two dimensions": _scores_two_dimensional,
    "a vocabulary that is an array": _vocabulary_an_array,
    "a vocabulary id out of range": _vocabulary_id_out_of_range,
    "a tokenizer id out of range": _tokenizer_id_out_of_range,
    "a NaN in params.index.json": _params_nan,
    "another document count": _params_document_count,
    "a NaN in lexical.json": _record_params_nan,
    "unknown stop words in lexical.json": _record_stopwords_unknown,
}


@pytest.mark.parametrize("damage", list(BM25_DAMAGE))
def test_bm25_files_are_checked_before_they_are_used(built, tmp_path, damage):
    folder = copy_of(built, "flat", tmp_path)
    name, field = BM25_DAMAGE[damage](folder / LEXICAL_DIR)
    resum(folder)
    path = folder / LEXICAL_DIR / name
    with pytest.raises(LexicalIndexError) as caught:
        read_saved(folder)  # needs numpy only: what `index verify` runs where bm25s is not installed
    assert f"{path}: {field}" in str(caught.value)
    with pytest.raises(LexicalIndexError, match=str(path)):
        Index.open(folder).search("cat dog", 3, mode="bm25")
    for argv in (
        ["index", "verify", str(folder)],
        ["search", str(folder), "cat dog", "--mode", "bm25"],
        ["search", str(folder), "cat dog", "--mode", "hybrid"],
        ["serve", "minilm", "--index", str(folder), "--port", "0"],  # refused at start, not at a first BM25 search
    ):
        refused(argv, f"{path}: {field}")


def test_a_bm25_folder_as_saved_still_reads_and_scores_alike(built, tmp_path):
    folder = copy_of(built, "flat", tmp_path)
    index = Index.open(folder)
    saved = LexicalIndex.load(folder)
    fresh = LexicalIndex.build(index.store.texts, index.store.ids)
    assert saved is not None and (saved.count, saved.digest) == (fresh.count, fresh.digest)
    for query in ("cat dog", "the mat", "protein cell gene"):
        np.testing.assert_allclose(saved.scores(query), fresh.scores(query), rtol=1e-6)
        np.testing.assert_array_equal(saved.search([query], 5)[1], fresh.search([query], 5)[1])
    assert invoke("index", "verify", str(folder)).exit_code == 0


# ---------------------------------------------------------------------------------------------- binary rescoring
def _rescore_wider(array: np.ndarray) -> np.ndarray:
    return np.hstack([array, array[:, :8]])


def _rescore_float64(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64)


def _rescore_nan(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array[3, 5] = np.nan
    return array


def _rescore_three_d(array: np.ndarray) -> np.ndarray:
    return array[:, None, :]


def _rescore_fortran(array: np.ndarray) -> np.ndarray:
    return np.asfortranarray(array)


def _rescore_fewer_rows(array: np.ndarray) -> np.ndarray:
    return array[:5]


RESCORE_DAMAGE: dict[str, tuple[Callable[[np.ndarray], np.ndarray], str]] = {
    "wider rows": (_rescore_wider, "shape is [20, "),
    "float64": (_rescore_float64, "dtype is float64, expected float32"),
    "a NaN": (_rescore_nan, "values: NaN or infinite values"),
    "three dimensions": (_rescore_three_d, "shape is [20, 1, "),
    "Fortran order": (_rescore_fortran, "fortran_order is true"),
    "fewer rows": (_rescore_fewer_rows, "shape is [5, "),
}


@pytest.mark.parametrize("damage", list(RESCORE_DAMAGE))
def test_a_binary_index_rescoring_array_is_checked_by_its_header_and_values(built, tmp_path, damage):
    folder = copy_of(built, "binary", tmp_path)
    path = folder / manifest_of(folder)["files"]["rescore"]
    change, field = RESCORE_DAMAGE[damage]
    array = np.load(path)
    with path.open("wb") as handle:  # np.save would write a Fortran array's header as C order
        np.lib.format.write_array(handle, change(array))
    resum(folder)
    with pytest.raises(IndexFormatError) as caught:
        Index.open(folder)
    assert f"{path}: {field}" in str(caught.value)
    for argv in (["index", "verify", str(folder)], ["search", str(folder), "cat dog"]):
        refused(argv, f"{path}: {field}")


# ---------------------------------------------------------------------------------------------- the manifest
MANIFEST_DAMAGE: dict[str, tuple[Callable[[dict], None], str]] = {
    "similarity os.system": (lambda m: m.update(similarity="os.system"), "similarity 'os.system' is unknown"),
    "dim a string": (lambda m: m.update(dim="384"), "dim must be a whole number >= 1, not '384'"),
    "dim true": (lambda m: m.update(dim=True), "dim must be a whole number >= 1, not True"),
    "count negative": (lambda m: m.update(count=-1), "count must be a whole number >= 0, not -1"),
    "generation a path": (lambda m: m.update(generation="../x"), "generation must be a whole number >= 0"),
    "kind against params.kind": (lambda m: m.update(kind="hnsw"), "kind is 'hnsw', but params.kind is 'flat'"),
    "files not names": (lambda m: m["files"].update(documents=7), "files must map each role to a file name"),
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_manifest_fields_are_checked_naming_the_field(built, tmp_path, damage):
    folder = copy_of(built, "flat", tmp_path)
    change, field = MANIFEST_DAMAGE[damage]
    data = manifest_of(folder)
    change(data)
    write_manifest(folder, data)
    expected = f"{folder / MANIFEST_FILE}: {field}"
    with pytest.raises(IndexFormatError) as caught:
        Index.open(folder)
    assert expected in str(caught.value)
    for argv in (
        ["index", "verify", str(folder)],
        ["index", "info", str(folder)],
        ["search", str(folder), "cat dog"],
        ["index", "add", str(folder), str(tmp_path / "more.txt")],
    ):
        (tmp_path / "more.txt").write_text("a new document about cats\n")
        refused(argv, expected)


def test_a_faiss_file_of_another_kind_than_the_manifest_says_is_refused(built, tmp_path):
    flat = copy_of(built, "flat", tmp_path)
    hnsw_file = built["hnsw"] / manifest_of(built["hnsw"])["files"]["vectors"]
    vectors = flat / manifest_of(flat)["files"]["vectors"]
    shutil.copyfile(hnsw_file, vectors)  # the file is HNSW, the manifest says flat
    resum(flat)
    expected = f"{vectors}: holds IndexHNSWFlat; the manifest's kind flat is stored as IndexFlatIP"
    with pytest.raises(IndexFormatError, match="holds IndexHNSWFlat"):
        Index.open(flat)
    for argv in (["index", "verify", str(flat)], ["index", "info", str(flat)], ["search", str(flat), "cat"]):
        refused(argv, expected)

    hnsw = copy_of(built, "hnsw", tmp_path)  # the manifest says hnsw, the file is flat
    data = manifest_of(hnsw)
    shutil.copyfile(built["flat"] / manifest_of(built["flat"])["files"]["vectors"], hnsw / data["files"]["vectors"])
    resum(hnsw)
    refused(["index", "verify", str(hnsw)], f"{hnsw / data['files']['vectors']}: holds IndexFlatIP")


def test_a_faiss_file_of_another_dimension_or_with_nan_vectors_is_refused(built, tmp_path):
    folder = copy_of(built, "flat", tmp_path)
    data = manifest_of(folder)
    vectors = folder / data["files"]["vectors"]
    original = faiss.read_index(str(vectors))
    nan = faiss.IndexFlatIP(original.d)
    nan.add(np.full((original.ntotal, original.d), np.nan, dtype=np.float32))
    faiss.write_index(nan, str(vectors))
    resum(folder)
    expected = f"{vectors}: vectors: NaN or infinite values"
    with pytest.raises(IndexFormatError, match="NaN or infinite"):
        Index.open(folder)
    for argv in (["index", "verify", str(folder)], ["search", str(folder), "cat"]):
        refused(argv, expected)

    narrow = faiss.IndexFlatIP(8)
    narrow.add(np.ones((original.ntotal, 8), dtype=np.float32))
    faiss.write_index(narrow, str(vectors))
    resum(folder)
    refused(["index", "verify", str(folder)], f"{vectors}: d is 8; the manifest's dim is {data['dim']}")


def test_documents_that_repeat_an_id_are_refused(built, tmp_path):
    folder = copy_of(built, "flat", tmp_path)
    path = folder / manifest_of(folder)["files"]["documents"]
    lines = path.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])["id"]
    second = json.loads(lines[1])
    lines[1] = json.dumps({**second, "id": first}) + "\n"
    path.write_text("".join(lines))
    resum(folder)
    expected = f"{path}:2: id {first!r} is given twice (first on line 1)"
    with pytest.raises(IndexFormatError) as caught:
        Index.open(folder)
    assert expected in str(caught.value)
    (tmp_path / "more.txt").write_text("a new document about cats\n")
    for argv in (
        ["index", "verify", str(folder)],
        ["search", str(folder), "cat"],
        ["index", "add", str(folder), str(tmp_path / "more.txt")],
    ):
        refused(argv, expected)
