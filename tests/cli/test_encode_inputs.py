"""``lmembed encode`` reads its input as the file's name says (``.jsonl``, ``.jsonl.gz``, any case), names the file
and line of a text it cannot embed, and names --output, not a temporary file, when the output cannot be written."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app

TEXTS = ["the cat sat on the mat", "a dog ran in the park"]


@pytest.fixture
def model(make_embedder, tmp_path):
    emb = make_embedder("bert", pooling="mean")
    return emb, str(emb.save(tmp_path / "model"))


def _run(*args: str):
    return CliRunner().invoke(app, ["encode", *args, "--no-cache"], env={"COLUMNS": "400"})  # messages on one line


@pytest.mark.parametrize("name", ["rows.jsonl.gz", "ROWS.JSONL", "rows.Jsonl.GZ"])
def test_json_lines_are_read_as_rows_whatever_the_case_or_compression(model, tmp_path, name):
    """They were embedded as raw JSON text (``{"text": ...}`` lines), or as gzip's decompressed lines of JSON."""
    emb, path = model
    source = tmp_path / name
    data = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)).encode()
    source.write_bytes(gzip.compress(data) if name.lower().endswith(".gz") else data)
    out = tmp_path / "out.npy"
    result = _run(str(source), "-o", str(out), "--model", path)
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(out), emb.encode(TEXTS), atol=1e-5)


def test_a_lone_surrogate_names_the_file_and_line(model, tmp_path):
    _, path = model
    source = tmp_path / "rows.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    result = _run(str(source), "-o", str(tmp_path / "out.npy"), "--model", path)
    assert result.exit_code == 2, result.output
    assert f"{source}:2: field 'text' holds a lone surrogate" in " ".join(result.output.split())
    assert "input 1" not in result.output


def test_cr_only_lines_are_embedded_one_text_each(model, tmp_path):
    emb, path = model
    source = tmp_path / "cr.txt"
    source.write_bytes("\r".join(TEXTS).encode() + b"\r")
    out = tmp_path / "out.npy"
    assert _run(str(source), "-o", str(out), "--model", path).exit_code == 0
    np.testing.assert_allclose(np.load(out), emb.encode(TEXTS), atol=1e-5)


def test_an_output_folder_that_takes_no_file_names_the_option_and_the_path(model, tmp_path, monkeypatch):
    """It said ``/proc/.tmp-xxxx.npy: No such file or directory``: a temporary file the user never named."""
    _, path = model
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out" / "vectors.npy"
    out.parent.mkdir()

    def refuse(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", str(out.parent / ".tmp-abcd.npy"))

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    result = _run(str(source), "-o", str(out), "--model", path)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "--output" in said and f"cannot write {out}" in said and ".tmp-" not in said


def test_a_json_file_is_refused_rather_than_embedded_line_by_line(model, tmp_path):
    """A JSON array file was read as text lines: its brackets and quotes were embedded as 17 texts."""
    _, path = model
    source = tmp_path / "texts.JSON"
    source.write_text(json.dumps(TEXTS, indent=1))
    result = _run(str(source), "-o", str(tmp_path / "out.npy"), "--model", path)
    assert result.exit_code == 2 and "a .json file is not read as texts" in " ".join(result.output.split())
    assert not (tmp_path / "out.npy").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc (a folder that takes no files)")
def test_every_commands_output_check_makes_a_file_where_the_output_goes(tmp_path):
    """``os.access`` says yes to root everywhere; only making a file tells that a folder takes none (``/proc``, a
    read-only mount), before the work starts rather than at the write."""
    import typer

    from lmembed.cli.options import check_writable

    for path, folder in ((Path("/proc/run.trec"), False), (Path("/proc/new-index"), True)):
        with pytest.raises(typer.BadParameter, match=r"cannot write to /proc"):
            check_writable(path, "--output", folder=folder)
    assert check_writable(tmp_path / "a" / "b.npy", "--output") == tmp_path / "a" / "b.npy"
    assert not list(tmp_path.iterdir())  # the probe leaves nothing behind
