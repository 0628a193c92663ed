"""A generator or teacher the command line cannot use is refused before any work, naming the option."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.synthesis.generators import GeneratorError, build_generator, check_generator


def _cli(argv: list[str]) -> tuple[int, str]:
    """Exit status and output (rich's boxes and line wrapping undone) of ``lmembed ARGV``."""
    result = CliRunner().invoke(app, argv)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tiny:abc", r"generator 'tiny:abc': the seed after 'tiny:' must be a whole number >= 0, got 'abc'"),
        ("tiny:-1", r"the seed after 'tiny:' must be a whole number"),
        ("local:", r"generator 'local:' names no model"),
        ("bogus", r"generator 'bogus': model 'bogus' is neither a bundled name"),
    ],
)
def test_a_generator_spec_it_cannot_use_is_refused(spec, message):
    with pytest.raises(GeneratorError, match=message):
        check_generator(spec)
    if spec.startswith("tiny"):
        with pytest.raises(GeneratorError, match=message):
            build_generator(spec)


def test_usable_generator_specs_pass():
    for spec in ("tiny", "tiny:7", "http://127.0.0.1:1/v1", "local:org/model"):
        check_generator(spec)
    assert build_generator("tiny:7").seed == 7


@pytest.mark.parametrize("spec", ["tiny:abc", "bogus"])
def test_synthesize_names_the_generator_option(tmp_path, spec):
    argv = ["synthesize", "--recipe", "e5-mistral", "--generator", spec, "-o", str(tmp_path / "rows.jsonl")]
    status, output = _cli(argv)
    assert status == 2 and "Invalid value for --generator" in output and repr(spec) in output, output
    assert not (tmp_path / "rows.jsonl").exists()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--generator", "tiny:abc", "the seed after 'tiny:'"), ("--teacher", "bogus:x", "model 'bogus:x' is neither")],
)
def test_adapt_names_the_generator_and_teacher_options(tmp_path, option, value, message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(4)))
    argv = ["adapt", "-m", "minilm", "--corpus", str(corpus), "-o", str(tmp_path / "run"), option, value]
    status, output = _cli(argv)
    assert status == 2 and f"Invalid value for {option}" in output and message in output, output
