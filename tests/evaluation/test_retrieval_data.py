"""BEIR loader: text assembly, split selection, CRLF/gzip input, errors, missing ids."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from lmembed.evaluation.retrieval_data import load_beir
from lmembed.io import DataFormatError, read_qrels
from lmembed.paths import shared_datasets_dir

CORPUS = [
    {"_id": "d1", "title": "Cats", "text": "Cats purr.", "metadata": {}},
    {"_id": "d2", "title": "", "text": "  Dogs bark. ", "metadata": {}},
    {"_id": "d3", "text": "No title field."},
    {"_id": 4, "title": None, "text": "Numeric id, null title."},
]
QUERIES = [
    {"_id": "q1", "text": "what do cats do"},
    {"_id": "q2", "text": "train-only query"},
    {"_id": "q3", "text": " dogs? "},
]


def write_beir(
    folder: Path,
    *,
    corpus: list[dict] = CORPUS,
    queries: list[dict] = QUERIES,
    qrels: dict[str, list[tuple[str, str, int]]] | None = None,
    gz: bool = False,
) -> Path:
    """Write a tiny BEIR folder; qrels files use CRLF line endings like BEIR's."""
    qrels = qrels or {
        "test": [("q1", "d1", 1), ("q3", "d2", 2), ("q3", "4", 1)],
        "train": [("q2", "d3", 1)],
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "qrels").mkdir(exist_ok=True)

    def put(path: Path, text: str) -> None:
        if gz:
            with gzip.open(path.with_name(path.name + ".gz"), "wt", encoding="utf-8", newline="") as handle:
                handle.write(text)
        else:
            path.write_bytes(text.encode("utf-8"))

    put(folder / "corpus.jsonl", "".join(json.dumps(row) + "\n" for row in corpus))
    put(folder / "queries.jsonl", "".join(json.dumps(row) + "\n" for row in queries))
    for split, rows in qrels.items():
        lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in rows)]
        put(folder / "qrels" / f"{split}.tsv", "\r\n".join(lines) + "\r\n")
    return folder


@pytest.mark.parametrize("gz", [False, True])
def test_load_assembles_texts_and_selects_judged_queries(tmp_path: Path, gz: bool) -> None:
    data = load_beir(write_beir(tmp_path / "toy", gz=gz), "test")
    assert data.corpus_ids == ["d1", "d2", "d3", "4"]
    assert data.corpus_texts == ["Cats Cats purr.", "Dogs bark.", "No title field.", "Numeric id, null title."]
    assert data.query_ids == ["q1", "q3"]  # q2 is judged only in train
    assert data.query_texts == ["what do cats do", " dogs? "]  # query text is used as given
    assert data.qrels == {"q1": {"d1": 1}, "q3": {"d2": 2, "4": 1}}
    assert data.missing_docs == [] and data.missing_queries == [] and data.warnings == []
    assert data.summary()["num_judgments"] == 3


def test_crlf_does_not_leak_into_ids_or_scores(tmp_path: Path) -> None:
    qrels = read_qrels(write_beir(tmp_path / "toy") / "qrels" / "test.tsv")
    assert all("\r" not in q and all("\r" not in d for d in docs) for q, docs in qrels.items())
    assert all(isinstance(s, int) for docs in qrels.values() for s in docs.values())


def test_other_split(tmp_path: Path) -> None:
    data = load_beir(write_beir(tmp_path / "toy"), "train")
    assert data.query_ids == ["q2"] and data.split == "train"


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    folder = write_beir(tmp_path / "toy")
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    lines[2] = '{"_id": "d3", "text": '
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl:3: invalid JSON") as info:
        load_beir(folder)
    assert info.value.line_no == 3


@pytest.mark.parametrize(
    ("row", "message"),
    [("q1\td1", "expected 3 tab-separated columns"), ("q1\td1\thigh", "not an integer")],
)
def test_malformed_qrels_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    folder = write_beir(tmp_path / "toy")
    path = folder / "qrels" / "test.tsv"
    path.write_bytes(b"query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\n" + row.encode() + b"\r\n")
    with pytest.raises(DataFormatError, match=rf"test\.tsv:3: .*{message}"):
        load_beir(folder)


def test_missing_id_field_is_an_error(tmp_path: Path) -> None:
    folder = write_beir(tmp_path / "toy", queries=[{"_id": "q1", "text": "x"}, {"text": "no id"}])
    with pytest.raises(DataFormatError, match=r"queries\.jsonl:2: missing id field \('_id' or 'id'\)"):
        load_beir(folder)


def test_missing_ids_are_reported_and_judgments_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    qrels = {"test": [("q1", "d1", 1), ("q1", "ghost-doc", 1), ("q9", "d2", 1)]}
    with caplog.at_level(logging.WARNING, logger="lmembed.evaluation.retrieval_data"):
        data = load_beir(write_beir(tmp_path / "toy", qrels=qrels))
    assert data.qrels["q1"] == {"d1": 1, "ghost-doc": 1}  # kept, as MTEB keeps it
    assert data.qrels["q9"] == {"d2": 1}
    assert data.missing_docs == [("q1", "ghost-doc")]
    assert data.missing_queries == ["q9"]
    assert data.query_ids == ["q1"]  # q9 has no text, so it cannot be encoded
    assert len(data.warnings) == 2
    assert "ghost-doc" in caplog.text and "q9" in caplog.text


def test_the_warnings_about_missing_ids_name_the_qrels_file_and_count_the_judgments(tmp_path: Path, caplog) -> None:
    """They named the dataset only, and counted query ids where the judgments left unscored matter."""
    qrels = {"test": [("q1", "d1", 1), ("q1", "ghost-doc", 1), ("q9", "d2", 1), ("q9", "d1", 0)]}
    folder = write_beir(tmp_path / "toy", qrels=qrels)
    with caplog.at_level(logging.WARNING, logger="lmembed.evaluation.retrieval_data"):
        load_beir(folder)
    judgments = folder / "qrels" / "test.tsv"
    docs, queries = [r.getMessage() for r in caplog.records]
    assert docs.startswith(f"toy: {judgments}: 1 judgment(s) name documents missing from {folder / 'corpus.jsonl'}")
    assert queries.startswith(f"toy: {judgments}: 2 judgment(s) of 1 query id(s) missing from ")


def test_missing_files_raise(tmp_path: Path) -> None:
    folder = write_beir(tmp_path / "toy")
    with pytest.raises(FileNotFoundError, match=r"dev\.tsv"):
        load_beir(folder, "dev")


def test_real_arguana_keeps_its_five_dangling_judgments() -> None:
    shared = shared_datasets_dir()
    if shared is None or not (shared / "beir" / "arguana").is_dir():
        pytest.skip("../shared/datasets/beir/arguana is not available in this checkout")
    data = load_beir(shared / "beir" / "arguana", "test")
    assert len(data.corpus_ids) == 8674 and len(data.query_ids) == 1406
    assert data.num_judgments == 1406
    assert sorted(d for _, d in data.missing_docs) == sorted(
        [
            "test-free-speech-debate-yfsdfkhbwu-con03b",
            "test-education-ufsdfkhbwu-con03b",
            "test-politics-dhwem-pro06b",
            "test-science-sghwbdgmo-con03b",
            "test-society-asfhwapg-con04b",
        ]
    )
