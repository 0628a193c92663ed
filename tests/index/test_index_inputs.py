"""What ``lmembed index build`` and ``lmembed search`` refuse before any model loads: chunk options without
--chunking (said by their own names), an empty query, a queries file without a query; and a corpus whose name is
JSON lines in capitals, read as rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.index import load_corpus, load_queries
from lmembed.io import DataFormatError


def _run(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(3)))
    return path


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["--late-chunking"], "--late-chunking shapes the chunks of --chunking"),
        (["--chunk-tokens", "16"], "--chunk-tokens shapes the chunks of --chunking"),
        (["--chunk-tokens", "256"], "--chunk-tokens shapes"),  # the default's value, given: still said
        (["--chunk-overlap", "4", "--late-chunking"], "--late-chunking and --chunk-overlap shape"),
    ],
)
def test_chunk_options_without_chunking_are_refused_by_name(corpus, tmp_path, given, named):
    """--late-chunking alone said "Invalid value for --chunking: expected one of ..." (never given); --chunk-tokens
    alone was ignored without a word."""
    for command in (["index", "build", str(corpus), "-o", str(tmp_path / "ix")], ["eval", "-d", str(corpus)]):
        result = _run(*command, "--model", "no-such-model", *given)
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert named in said and "add --chunking" in said and "expected one of" not in said, said
    assert not (tmp_path / "ix").exists()


def test_an_empty_query_is_refused(tmp_path):
    for query in ("", "   "):
        result = _run("search", str(tmp_path / "no-index"), query)
        assert result.exit_code == 2, result.output
        assert "the query is empty" in result.output


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_a_queries_file_without_a_query_is_refused_naming_it(tmp_path, content):
    """It wrote a run file of one newline."""
    queries = tmp_path / "queries.txt"
    queries.write_text(content)
    run = tmp_path / "run.trec"
    result = _run("search", str(tmp_path / "no-index"), "--queries", str(queries), "-o", str(run))
    assert result.exit_code == 2, result.output
    assert f"{queries}: holds no query" in " ".join(result.output.split())
    assert not run.exists()


def test_a_queries_row_without_text_names_its_line(tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "cats"}\n{"_id": "q2", "text": " "}\n')
    with pytest.raises(DataFormatError, match=rf"^{queries}:2: empty query"):
        load_queries(queries)


def test_capital_and_gzip_json_lines_names_are_read_as_rows(corpus, tmp_path):
    """``CORPUS.JSONL`` was read as a text file: each raw JSON line a document, with its line number as id."""
    upper = tmp_path / "CORPUS.JSONL"
    upper.write_bytes(corpus.read_bytes())
    assert [d.id for d in load_corpus(upper)] == ["d0", "d1", "d2"]
    queries = tmp_path / "Q.Jsonl"
    queries.write_text('{"_id": "q1", "text": "cats"}\n')
    assert load_queries(queries) == [("q1", "cats")]
