"""A binary file given where text is expected is named, with its line, by every reader and every command:
experiment files, recipes, training configs, calibration texts, inputs to encode, result files."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.evaluation.results import read_result
from lmembed.experiments.spec import load_spec
from lmembed.io import DataFormatError, read_text
from lmembed.training.recipes import load_recipe
from lmembed.training.train_config import TrainConfig

#: the start of a PNG file, then a second line: byte 0x89 at line 1, column 1 is not UTF-8
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00"
LATE = b"name: fine\nmodel: minilm\nstages: caf\xe9\n"  # line 3, column 12


def reason(line: int, column: int, byte: int) -> str:
    return f":{line}: not valid UTF-8 (byte 0x{byte:02x} at column {column}); is this a text file?"


def one_line(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


@pytest.fixture
def binary(tmp_path) -> Path:
    path = tmp_path / "picture.yaml"
    path.write_bytes(BINARY)
    return path


def test_read_text_names_file_line_and_column(tmp_path, binary):
    with pytest.raises(DataFormatError) as caught:
        read_text(binary)
    assert str(caught.value) == f"{binary}{reason(1, 1, 0x89)}"
    late = tmp_path / "late.yaml"
    late.write_bytes(LATE)
    with pytest.raises(DataFormatError) as caught:
        read_text(late)
    assert str(caught.value) == f"{late}{reason(3, 12, 0xE9)}"
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfkey: caf\xc3\xa9\n")
    assert read_text(bom) == "key: café\n"


@pytest.mark.parametrize("reader", [load_spec, load_recipe, TrainConfig.from_yaml, read_result])
def test_every_document_reader_names_the_binary_file(binary, reader):
    with pytest.raises(DataFormatError) as caught:
        reader(binary)
    assert str(caught.value) == f"{binary}{reason(1, 1, 0x89)}"


def test_every_command_names_the_binary_file(tmp_path, binary):
    runner = CliRunner()
    expected = f"error: {binary}{reason(1, 1, 0x89)}"
    texts = tmp_path / "texts.txt"
    texts.write_text("one text\nanother text\n")
    commands = [
        ["experiment", str(binary), "-o", str(tmp_path / "out")],
        ["train", "--recipe", str(binary), "--output", str(tmp_path / "run")],
        ["train", "--config", str(binary), "--output", str(tmp_path / "run")],
        ["encode", str(binary), "-o", str(tmp_path / "v.npy")],
        ["export", str(tmp_path / "onnx"), "--precision", "int8", "--calibration", str(binary)],
        [*["encode", str(texts), "-o", str(tmp_path / "w.npy"), "--precision", "int8"], "--calibration", str(binary)],
    ]
    for argv in commands:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert one_line(result.output).startswith(expected), (argv, result.output)
