"""The one reader of input formats (lmembed.io) and the one owner of folders and LMEMBED_* variables
(lmembed.paths): errors name file and line, qrels follow one rule, every cache folder follows its variable."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from lmembed import paths
from lmembed.errors import LmembedError
from lmembed.evaluation.retrieval_data import load_beir
from lmembed.evaluation.tasks import detect_task_type
from lmembed.evaluation.tasks._common import TaskDataError
from lmembed.evaluation.tasks._common import read_numbered_jsonl as read_task_rows
from lmembed.io import (
    DataFormatError,
    is_beir_folder,
    is_jsonl,
    iter_jsonl,
    iter_lines,
    iter_qrels,
    qrels_splits,
    read_json,
    read_jsonl,
    read_qrels,
    read_text_lines,
    read_texts_field,
)
from lmembed.mining import MiningError, load_corpus, read_rows
from lmembed.models import bundled
from lmembed.training.rows import TrainingDataError, read_beir, read_jsonl_examples

LATIN1 = "café".encode("latin-1")  # b"caf\xe9": not UTF-8


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


# ---------------------------------------------------------------------------------------------- lines and JSON
def test_latin1_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", b'{"text": "ok"}\n{"text": "' + LATIN1 + b'"}\n')
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 14\)") as info:
        read_jsonl(path)
    assert info.value.path == path and info.value.line_no == 2
    assert isinstance(info.value, LmembedError) and isinstance(info.value, ValueError)


def test_binary_file_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "image.txt", b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(DataFormatError, match=r"image\.txt:1: not valid UTF-8"):
        read_text_lines(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": ', r"rows\.jsonl:3: invalid JSON \(Expecting value at column 10\)"),
        ('["a", "b"]', r"rows\.jsonl:3: expected a JSON object, got an array"),
        ('"just text"', r"rows\.jsonl:3: expected a JSON object, got a string"),
        ("null", r"rows\.jsonl:3: expected a JSON object, got null"),
        ('{"n": ' + "9" * 4301 + "}", r"rows\.jsonl:3: invalid JSON \(an integer of more than 4300 digits at col"),
    ],
)
def test_bad_json_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "rows.jsonl", '{"a": 1}\n\n' + line + "\n")
    with pytest.raises(DataFormatError, match=message) as info:
        read_jsonl(path)
    assert info.value.line_no == 3


def test_crlf_bom_blank_lines_and_gzip(tmp_path: Path) -> None:
    text = '\ufeff{"text": "a"}\r\n\r\n  \r\n{"text": "b"}\r\n'
    plain = write(tmp_path / "rows.jsonl", text)
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    for path in (plain, packed):
        assert list(iter_jsonl(path)) == [(1, {"text": "a"}), (4, {"text": "b"})]
        assert read_texts_field(path, "text") == ["a", "b"]


def test_damaged_gzip_is_a_format_error(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl.gz", b"this is not gzip data\n")
    with pytest.raises(DataFormatError, match=r"rows\.jsonl\.gz:1: damaged gzip data"):
        read_jsonl(path)


def test_on_error_skips_bad_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", b'{"a": 1}\n{oops\n' + LATIN1 + b'\n[1]\n{"a": 2}\n')
    problems: list[DataFormatError] = []
    rows = list(iter_jsonl(path, on_error=problems.append))
    assert rows == [(1, {"a": 1}), (5, {"a": 2})]
    assert [p.line_no for p in problems] == [2, 3, 4]
    assert [p.where for p in problems] == [f"{path}:2", f"{path}:3", f"{path}:4"]


def test_text_lines_keep_or_strip(tmp_path: Path) -> None:
    path = write(tmp_path / "texts.txt", "first\r\n\r\n  second  \nlast")
    assert read_text_lines(path) == ["first", "", "  second  ", "last"]
    assert read_text_lines(path, strip=True) == ["first", "second", "last"]


def test_jsonl_field_must_be_a_string(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", '{"text": "a"}\n{"text": 3}\n')
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:2: expected an object with a string field 'text'"):
        read_texts_field(path, "text")


def test_every_reader_names_file_and_line_for_latin1(tmp_path: Path) -> None:
    """Each domain keeps its error type, but the message is the reader's ``<file>:<line>: ...``."""
    rows = write(tmp_path / "rows.jsonl", b'{"query": "q", "positive": "p"}\n{"query": "' + LATIN1 + b'"}\n')
    for reader, error in (
        (read_rows, MiningError),
        (read_jsonl_examples, TrainingDataError),
        (read_task_rows, TaskDataError),
    ):
        with pytest.raises(error, match=re.escape(f"{rows}:2: not valid UTF-8")):
            reader(rows)
    corpus = write(
        tmp_path / "corpus.jsonl", b'{"_id": "d1", "text": "fine"}\n{"_id": "d2", "text": "' + LATIN1 + b'"}\n'
    )
    text = write(tmp_path / "corpus.txt", b"fine\n" + LATIN1 + b"\n")
    for path in (corpus, text):
        with pytest.raises(DataFormatError, match=re.escape(f"{path}:2: not valid UTF-8")):
            load_corpus(path)
    sts = write(tmp_path / "sts" / "test.jsonl", b'{"sentence1": "' + LATIN1 + b'"}\n')
    with pytest.raises(TaskDataError, match=re.escape(f"{sts}:1: not valid UTF-8")):
        detect_task_type(sts.parent)


def test_training_rows_may_skip_undecodable_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.jsonl", b'{"query": "q", "positive": "p"}\n' + LATIN1 + b"\n")
    examples, skipped = read_jsonl_examples(path, skip_invalid=True)
    assert len(examples) == 1 and skipped == 1


# ---------------------------------------------------------------------------------------------- qrels
@pytest.mark.parametrize("header", ["query-id\tcorpus-id\tscore", "query_id\tdoc_id\tscore", "qid\tdocid\trel", None])
def test_qrels_header_is_skipped_on_the_first_line(tmp_path: Path, header: str | None) -> None:
    lines = [header] if header else []
    path = write(tmp_path / "test.tsv", "\r\n".join([*lines, "q1\td1\t1", "q1\td2\t0"]) + "\r\n")
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 0}}


def test_qrels_three_and_four_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "mixed.tsv", "q1\td1\t2\nq1\t0\td2\t1\nq2 Q0 d3 1\n q3 \t d4 \t -1 \n")
    assert read_qrels(path) == {"q1": {"d1": 2, "d2": 1}, "q2": {"d3": 1}, "q3": {"d4": -1}}
    assert [j.line_no for j in iter_qrels(path)] == [1, 2, 3, 4]


def test_qrels_integral_float_scores_are_read_as_integers(tmp_path: Path) -> None:
    path = write(tmp_path / "test.tsv", "q1\td1\t1.0\nq1\td2\t0.0\n")
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 0}}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("q1\td9\t0.5", r"relevance score '0\.5' is not an integer"),
        ("q1\td9\thigh", r"relevance score 'high' is not an integer"),
        ("q1\td9", r"expected 3 tab-separated columns \(or TREC's 4\), got 2"),
        ("q1\ta\tb\tc\t1", r"expected 3 tab-separated columns \(or TREC's 4\), got 5"),
        ("q1\t \t1", r"empty query or document id"),
        ("qid\tdocid\trel", r"relevance score 'rel' is not an integer"),  # a header only counts on line 1
    ],
)
def test_bad_qrels_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path / "test.tsv", f"query-id\tcorpus-id\tscore\nq1\td1\t1\n{row}\n")
    with pytest.raises(DataFormatError, match=rf"test\.tsv:3: {message}"):
        read_qrels(path)


def test_both_consumers_share_the_qrels_rule(tmp_path: Path) -> None:
    """Evaluation and training read the same qrels the same way (TREC columns, a float score, gzip)."""
    folder = tmp_path / "beir"
    write(folder / "corpus.jsonl", "".join(json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in (1, 2)))
    write(folder / "queries.jsonl", json.dumps({"_id": "q1", "text": "query"}) + "\n")
    qrels = b"qid iter docid rel\r\nq1 0 d1 1.0\r\nq1 0 d2 0\r\n"
    (folder / "qrels").mkdir()
    (folder / "qrels" / "train.tsv.gz").write_bytes(gzip.compress(qrels))
    assert is_beir_folder(folder) and qrels_splits(folder) == ["train"]
    assert load_beir(folder, "train").qrels == {"q1": {"d1": 1, "d2": 0}}
    examples, _, skipped = read_beir(folder, "train")
    assert skipped == 0 and examples[0].positives == ("doc 1",) and examples[0].negatives == ("doc 2",)
    (folder / "qrels" / "train.tsv.gz").write_bytes(gzip.compress(qrels + b"q1 0 d2 0.5\r\n"))
    with pytest.raises(DataFormatError, match=r"train\.tsv\.gz:4: relevance score '0\.5' is not an integer"):
        load_beir(folder, "train")
    with pytest.raises(TrainingDataError, match=r"train\.tsv\.gz:4: relevance score '0\.5' is not an integer"):
        read_beir(folder, "train")
    assert read_beir(folder, "train", skip_invalid=True)[2] == 1


# ---------------------------------------------------------------------------------------------- paths
@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No LMEMBED_* variable set and a private home folder."""
    for name in paths.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    return tmp_path


def test_defaults_live_under_the_user_cache(clean_env: Path) -> None:
    root = clean_env / "home" / ".cache" / "lmembed"
    assert paths.lmembed_home() == root
    assert paths.dataset_cache_dir() == root / "datasets"
    assert paths.embedding_cache_dir() == root / "embeddings"
    assert paths.converted_model_dir("smollm2-135m") == root / "models" / "smollm2-135m"
    assert paths.gguf_dir() == root / "gguf"
    assert paths.data_env_dir() is None and paths.debug_from_env() is False


def test_lmembed_home_moves_dataset_model_and_embedding_caches(clean_env: Path, monkeypatch) -> None:
    home = clean_env / "lmhome"
    monkeypatch.setenv("LMEMBED_HOME", str(home))
    assert paths.lmembed_home() == home
    assert paths.dataset_cache_dir() == home / "datasets"
    assert paths.converted_model_dir("gemma3-270m") == home / "models" / "gemma3-270m"
    assert paths.models_dir() == home / "models" and paths.gguf_dir() == home / "gguf"
    assert paths.embedding_cache_dir() == home / "embeddings"
    assert bundled.converted_model_dir("minilm") == home / "models" / "minilm"  # bundled conversions follow the home


def test_each_variable_wins_over_the_home(clean_env: Path, monkeypatch) -> None:
    monkeypatch.setenv("LMEMBED_HOME", str(clean_env / "lmhome"))
    monkeypatch.setenv("LMEMBED_DATA", str(clean_env / "data"))
    monkeypatch.setenv("LMEMBED_CACHE", str(clean_env / "vectors"))
    monkeypatch.setenv("LMEMBED_DEBUG", "yes")
    assert paths.dataset_cache_dir() == clean_env / "data"
    assert paths.data_env_dir() == clean_env / "data" and paths.default_data_root() == clean_env / "data"
    assert paths.embedding_cache_dir() == clean_env / "vectors"
    assert paths.debug_from_env() is True


def test_empty_variables_are_unset_and_tilde_is_expanded(clean_env: Path, monkeypatch) -> None:
    monkeypatch.setenv("LMEMBED_DATA", "")
    monkeypatch.setenv("LMEMBED_CACHE", "  ")
    monkeypatch.setenv("LMEMBED_HOME", "~/elsewhere")
    monkeypatch.setenv("HOME", str(clean_env / "tilde"))
    assert paths.lmembed_home() == clean_env / "tilde" / "elsewhere"
    assert paths.data_env_dir() is None
    assert paths.embedding_cache_dir() == clean_env / "tilde" / "elsewhere" / "embeddings"


def test_default_data_root_falls_back_to_the_shared_folder(clean_env: Path, monkeypatch) -> None:
    shared = clean_env / "shared" / "datasets"
    monkeypatch.setattr(paths, "shared_candidates", lambda: [clean_env / "none", shared])
    assert paths.default_data_root() is None
    shared.mkdir(parents=True)
    assert paths.default_data_root() == shared.resolve() == paths.shared_datasets_dir()


def test_a_lone_cr_ends_a_line_as_in_universal_newlines(tmp_path: Path) -> None:
    """A file with CR-only line endings (old Mac) was one line: its texts embedded as one."""
    path = tmp_path / "cr.txt"
    path.write_bytes(b"one\rtwo\r\nthree\r\rfive\nsix\r")
    assert list(iter_lines(path)) == [(1, "one"), (2, "two"), (3, "three"), (4, ""), (5, "five"), (6, "six")]
    assert read_text_lines(path, strip=True) == ["one", "two", "three", "five", "six"]
    rows = tmp_path / "cr.jsonl"
    rows.write_bytes(b'{"a": 1}\r{"a": 2}\r{"a": [\r')
    with pytest.raises(DataFormatError, match=r"cr\.jsonl:3: invalid JSON"):
        list(iter_jsonl(rows))


def test_json_lines_and_gzip_are_told_by_name_in_any_case(tmp_path: Path) -> None:
    for name in ("a.jsonl", "A.JSONL", "a.jsonl.gz", "a.JSONL.GZ", "a.ndjson", "a.Ndjson.gz"):
        assert is_jsonl(tmp_path / name), name
    for name in ("a.txt", "a.txt.gz", "jsonl", "a.json", "a.jsonl.txt"):
        assert not is_jsonl(tmp_path / name), name
    upper = tmp_path / "ROWS.JSONL.GZ"
    upper.write_bytes(gzip.compress(b'{"text": "x"}\n'))
    assert read_texts_field(upper, "text") == ["x"]


def test_a_json_string_with_a_lone_surrogate_names_file_line_and_field(tmp_path: Path) -> None:
    """It was read, and failed later as "input 0: text contains a lone surrogate", naming no file."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "ok \\ud83d\\ude00"}\n\n{"text": "a\\ud800b"}\n{"neg": ["x", "\\uDC00"]}\n')
    with pytest.raises(DataFormatError) as caught:
        read_texts_field(path, "text")
    assert str(caught.value) == f"{path}:3: field 'text' holds a lone surrogate ('\\ud800' at character 2)"
    skipped: list[DataFormatError] = []
    rows = list(iter_jsonl(path, on_error=skipped.append))
    assert [n for n, _ in rows] == [1] and rows[0][1]["text"] == "ok 😀"  # a surrogate pair is one character
    assert [e.where for e in skipped] == [f"{path}:3", f"{path}:4"]
    assert "field 'neg'[1]" in skipped[1].reason


def test_every_corpus_reader_tells_json_lines_by_is_jsonl(tmp_path: Path) -> None:
    """mining, adapt and synthesis read ``.gz`` as JSON lines whatever came before it (a ``.txt.gz`` of passages was a
    JSON error) and a ``.JSONL`` corpus as text lines (its JSON became documents)."""
    import gzip

    from lmembed.mining import load_corpus
    from lmembed.synthesis.synthesize import read_passages
    from lmembed.training.adapt import read_adapt_corpus

    lines = tmp_path / "docs.txt.gz"
    lines.write_bytes(gzip.compress(b"the first passage of text here\nthe second passage of text here\n"))
    rows = tmp_path / "CORPUS.JSONL"
    rows.write_text(
        "".join(
            json.dumps({"_id": f"d{i}", "title": "", "text": f"passage number {i} of text"}) + "\n" for i in range(2)
        )
    )
    assert load_corpus(lines) == ["the first passage of text here", "the second passage of text here"]
    assert load_corpus(rows) == ["passage number 0 of text", "passage number 1 of text"]
    assert read_passages(lines)[1] == load_corpus(lines) and read_passages(rows)[0] == ["d0", "d1"]
    assert [d.text for d in read_adapt_corpus(rows)] == load_corpus(rows)
    assert len(read_adapt_corpus(lines)) == 2


def test_ids_may_be_numbers_but_texts_may_not(tmp_path: Path) -> None:
    """A number given as a title, a text or a query was embedded as its digits without a word (ids may be numbers,
    as BEIR files give them)."""
    from lmembed.io import read_corpus, read_queries

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": 7, "title": "T", "text": "body"}\n')
    assert read_corpus(corpus) == (["7"], ["T body"])
    for row, field in (('{"_id": "d", "text": 12345}', "text"), ('{"_id": "d", "title": 3.5, "text": "x"}', "title")):
        corpus.write_text(row + "\n")
        with pytest.raises(DataFormatError, match=rf"corpus.jsonl:1: field '{field}' must be a string, got"):
            read_corpus(corpus)
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": 1, "text": "q"}\n{"_id": "q2", "text": 42}\n')
    with pytest.raises(DataFormatError, match=r"queries.jsonl:2: field 'text' must be a string, got int"):
        read_queries(queries)
    queries.write_text('{"_id": 1.5, "text": "q"}\n')
    with pytest.raises(DataFormatError, match=r"queries.jsonl:1: field '_id' must be a string, got float"):
        read_queries(queries)


def test_json_giving_one_key_twice_is_refused_naming_file_line_and_key(tmp_path):
    from lmembed.io import DuplicateKeyError, loads_json, read_json

    with pytest.raises(DuplicateKeyError, match="'a' is given twice"):
        loads_json('{"b": {"a": 1, "a": 2}}')
    assert loads_json('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]  # one key in two objects is fine
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "x"}\n{"text": "y", "text": "z"}\n')
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:2: key 'text' is given twice"):
        read_jsonl(rows)
    config = tmp_path / "config.json"
    config.write_text('{"lr": 1, "lr": 2}')
    with pytest.raises(ValueError, match=r"config\.json: the settings gives key 'lr' twice"):
        read_json(config, what="settings")


def test_read_json_names_the_file_for_every_way_it_can_be_unreadable(tmp_path):
    from lmembed.errors import ModelLoadError
    from lmembed.io import read_json

    path = tmp_path / "record.json"
    cases = {
        b"[1, 2]": "must hold an object at its top, not an array",
        b"{": "line 1: invalid JSON in the record",
        b"\xff{}": "the record is not UTF-8 text",
        b"[" * 100_000 + b"]" * 100_000: "nests arrays or objects too deeply",
    }
    for content, message in cases.items():
        path.write_bytes(content)
        with pytest.raises(ModelLoadError, match=re.escape(f"{path}: ") + ".*" + re.escape(message)):
            read_json(path, error=ModelLoadError, what="record")
    with pytest.raises(ModelLoadError, match="cannot be read"):
        read_json(tmp_path / "absent.json", error=ModelLoadError, what="record")
    path.write_bytes(b"[1]")
    assert read_json(path, kind=list) == [1]


def test_a_jsonl_row_nesting_past_the_parser_limit_names_its_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataFormatError, match=r"rows\.jsonl:2: arrays or objects nest too deeply"):
        read_jsonl(rows)


def test_every_corpus_reader_takes_the_same_id_fields(tmp_path: Path) -> None:
    """A corpus whose rows say ``id`` was indexed, but refused by eval, mine, synthesize and adapt ("missing field
    '_id'"): one list of id fields (``io.ID_FIELDS``) now serves every reader; ``_id`` wins when a row gives both."""
    from lmembed.index.corpus import load_corpus
    from lmembed.io import read_corpus, read_queries
    from lmembed.training.adapt import read_adapt_corpus

    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "text": "cats purr"}, {"id": 7, "text": "dogs bark"}, {"_id": "c", "id": "x", "text": "owls"}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = ["a", "7", "c"]
    assert read_corpus(corpus)[0] == expected
    assert [d.id for d in load_corpus(corpus)] == expected
    assert [d.id for d in read_adapt_corpus(corpus)] == expected
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "text": "what purrs"}) + "\n")
    assert read_queries(queries) == {"q1": "what purrs"}


def test_every_corpus_reader_refuses_an_empty_or_absent_id_the_same_way(tmp_path: Path) -> None:
    """The index refused an empty id while evaluation, adaptation and synthesis took ``""`` as a document's id:
    every reader now goes through ``io.row_id``."""
    from lmembed.index.corpus import load_corpus
    from lmembed.io import read_corpus
    from lmembed.synthesis.synthesize import read_passages
    from lmembed.training.adapt import AdaptError, read_adapt_corpus

    readers = [read_corpus, load_corpus, read_adapt_corpus, read_passages]
    for row, reason in [({"_id": "", "text": "t"}, "field '_id' is empty"), ({"text": "t"}, "missing id field")]:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text(json.dumps({"_id": "ok", "text": "fine"}) + "\n" + json.dumps(row) + "\n")
        for reader in readers:
            with pytest.raises((DataFormatError, AdaptError), match=rf"corpus\.jsonl:2: {reason}"):
                reader(corpus)


def test_a_plain_text_corpus_gets_the_same_ids_from_every_command(tmp_path: Path) -> None:
    """A text file with one document per line was given ids ``1, 3`` by the index and ``line-1, line-3`` by
    synthesis and adaptation, so a document's id differed between commands. One reader gives line numbers."""
    from lmembed.index.corpus import load_corpus
    from lmembed.synthesis.synthesize import read_passages
    from lmembed.training.adapt import read_adapt_corpus

    path = tmp_path / "docs.txt"
    path.write_text("the cat sat\n\n  the dog ran  \n")
    expected = ["1", "3"]
    assert [d.id for d in load_corpus(path)] == expected
    assert [d.id for d in read_adapt_corpus(path)] == expected
    assert read_passages(path)[0] == expected


def test_a_whole_file_with_an_endless_integer_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", '{\n  "hidden_size": ' + "1" * 5000 + "\n}")
    with pytest.raises(ValueError, match=r"config\.json: line 2: invalid JSON in the file \(an integer of more"):
        read_json(path)
