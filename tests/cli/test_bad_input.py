"""Bad input gets a clean error: a non-zero exit status, one short message naming the argument or the file
and line, and never a traceback. Table-driven over the classes of mistakes a new user makes, for every
command that takes the input.

Each case is ``(id, argv, expected)``: ``argv`` may use ``{model}`` (a saved tiny decoder), ``{beir}`` (a
tiny BEIR folder), ``{tmp}`` (a scratch folder) and the files that :func:`inputs` writes; ``expected`` are
substrings the output must contain.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A saved tiny model, a tiny BEIR folder, and input files of every broken kind."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, where conftest lives
    from conftest import build_tokenizer, tiny_model
    from lmembed import Embedder, EmbeddingConfig

    tmp = tmp_path_factory.mktemp("bad")
    tok = build_tokenizer()
    emb = Embedder.from_model(
        tiny_model("llama", len(tok)), tok, EmbeddingConfig(pooling="mean"), use_cache=False, show_progress=False
    )
    model = emb.save(tmp / "model")
    beir = tmp / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "the cat"}\n{"_id": "d2", "text": "a dog"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "cat"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    for name, corpus, qrels in (
        ("noquery", '{"_id": "d1", "text": "the cat"}\n', "query-id\tcorpus-id\tscore\nzz\td1\t1\n"),
        ("nocorpus", "", "query-id\tcorpus-id\tscore\nq1\td1\t1\n"),
        ("nojudged", '{"_id": "d1", "text": "the cat"}\n', "query-id\tcorpus-id\tscore\nq1\tghost\t1\n"),
    ):
        (tmp / name / "qrels").mkdir(parents=True)
        (tmp / name / "corpus.jsonl").write_text(corpus)
        (tmp / name / "queries.jsonl").write_text('{"_id": "q1", "text": "cat"}\n')
        (tmp / name / "qrels" / "test.tsv").write_text(qrels)
    files = {
        "good": "the cat\na dog\n",
        "latin1": None,
        "binary": None,
        "badjson.jsonl": '{"text": "ok"}\n{"text": broken\n',
        "nofield.jsonl": '{"text": "ok"}\n{"txt": "bad"}\n',
        "surrogate.jsonl": '{"text": "ok"}\n{"text": "bad \\udc80 text"}\n',
        "rows.jsonl": '{"query": "cat", "positive": "the cat"}\n' * 4,
        "lossoption.yaml": "loss: gte\nloss_kwargs:\n  colour: red\n",
        "exponent.yaml": "lr: 2e-5\nsteps: 1\n",
        "badrows.jsonl": '{"query": "cat", "positive": "the cat"}\n{"query": broken\n',
    }
    for name, text in files.items():
        if text is not None:
            (tmp / name).write_text(text)
    (tmp / "latin1").write_bytes("caf\xe9 au lait\nna\xefve\n".encode("latin-1"))
    (tmp / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp / "afile").write_text("x")
    return {"model": str(model), "beir": str(beir), "tmp": str(tmp)}


def fill(argv: list[str], ws: dict[str, str]) -> list[str]:
    return [a.format(**ws) for a in argv]


CASES = [
    # bad option values: refused before any work, naming the option
    ("encode-batch-size", ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--batch-size", "-3"], ["--batch-size"]),
    ("eval-batch-size", ["eval", "--data", "{beir}", "--batch-size", "0"], ["--batch-size"]),
    (
        "mine-batch-size",
        ["mine", "-t", "minilm", "--data", "{tmp}/rows.jsonl", "-o", "{tmp}/m.jsonl", "--batch-size", "-1"],
        ["--batch-size"],
    ),
    (
        "train-batch-size",
        ["train", "--model", "{model}", "--data", "{tmp}/rows.jsonl", "--batch-size", "-8"],
        ["batch"],
    ),
    ("encode-max-length", ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--max-length", "0"], ["--max-length"]),
    ("encode-dim-zero", ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--dim", "0"], ["--dim"]),
    (
        "encode-layer-syntax",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--layer", "x"],
        ["--layer"],
    ),
    ("encode-output-suffix", ["encode", "{tmp}/good", "-o", "{tmp}/v.csv"], ["--output", ".npy"]),
    # strategy values the library refuses
    (
        "encode-pooling",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--pooling", "maxx"],
        ["maxx"],
    ),
    (
        "encode-attention",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--attention", "side"],
        ["side"],
    ),
    (
        "encode-layer-range",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--layer", "40"],
        ["40"],
    ),
    (
        "encode-dim-too-big",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--dim", "4096"],
        ["4096", "32"],
    ),
    (
        "train-unknown-loss",
        [
            "train",
            "--model",
            "{model}",
            "--data",
            "{tmp}/rows.jsonl",
            "-o",
            "{tmp}/run",
            "--steps",
            "1",
            "--loss",
            "nope",
        ],
        ["unknown loss 'nope'", "infonce"],
    ),
    (
        "train-loss-option",
        [
            "train",
            "--model",
            "{model}",
            "--data",
            "{tmp}/rows.jsonl",
            "-o",
            "{tmp}/run",
            "--config",
            "{tmp}/lossoption.yaml",
        ],
        ["loss 'gte' has no option colour", "temperature"],
    ),
    (
        "train-config-type",
        [
            "train",
            "--model",
            "{model}",
            "--data",
            "{tmp}/rows.jsonl",
            "-o",
            "{tmp}/run",
            "--config",
            "{tmp}/exponent.yaml",
        ],
        ["exponent.yaml", "lr: expected float, got '2e-5'", "write 2.0e-5"],
    ),
    (
        "eval-instruction-set",
        ["eval", "--model", "{model}", "--data", "{beir}", "--instructions", "nope"],
        ["unknown instruction set 'nope'"],
    ),
    ("eval-grid-key", ["eval", "--model", "{model}", "--data", "{beir}", "--grid", "colour=red"], ["colour"]),
    (
        "eval-rerank-missing",
        ["eval", "--model", "{model}", "--data", "{beir}", "--rerank", "{tmp}/no-such-reranker"],
        ["--rerank", "the reranker: model", "no-such-reranker"],
    ),
    ("eval-grid-dim", ["eval", "--model", "{model}", "--data", "{beir}", "--grid", "dim=big"], ["dim='big'"]),
    (
        "eval-grid-final-norm",
        ["eval", "--model", "{model}", "--data", "{beir}", "--grid", "final_norm=maybe"],
        ["final_norm='maybe'"],
    ),
    (
        "eval-grid-pooling",
        ["eval", "--model", "{model}", "--data", "{beir}", "--grid", "pooling=mean,maxx", "-o", "{tmp}/r"],
        ["maxx"],
    ),
    # models and devices
    (
        "encode-unknown-model",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{tmp}/no-such-model"],
        ["no-such-model"],
    ),
    ("encode-file-as-model", ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{tmp}/afile"], ["afile"]),
    (
        "encode-no-cuda",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--device", "cuda:3"],
        ["cuda"],
    ),
    (
        "encode-bad-device",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--device", "gpu0"],
        ["gpu0"],
    ),
    (
        "encode-bad-dtype",
        ["encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--dtype", "int3"],
        ["int3"],
    ),
    (
        "train-unknown-model",
        ["train", "--model", "{tmp}/no-such-model", "--data", "{tmp}/rows.jsonl", "-o", "{tmp}/run", "--steps", "1"],
        ["no-such-model"],
    ),
    # missing and malformed data, named by file and line
    ("encode-missing-input", ["encode", "{tmp}/nope.txt", "-o", "{tmp}/v.npy"], ["nope.txt"]),
    ("encode-latin1", ["encode", "{tmp}/latin1", "-o", "{tmp}/v.npy", "--model", "{model}"], ["latin1", ":1"]),
    ("encode-binary", ["encode", "{tmp}/binary", "-o", "{tmp}/v.npy", "--model", "{model}"], ["binary"]),
    (
        "encode-bad-json",
        ["encode", "{tmp}/badjson.jsonl", "-o", "{tmp}/v.npy", "--model", "{model}"],
        ["badjson.jsonl:2"],
    ),
    (
        "encode-missing-field",
        ["encode", "{tmp}/nofield.jsonl", "-o", "{tmp}/v.npy", "--model", "{model}"],
        ["nofield.jsonl:2", "text"],
    ),
    (
        "encode-surrogate",
        ["encode", "{tmp}/surrogate.jsonl", "-o", "{tmp}/v.npy", "--model", "{model}", "--no-cache"],
        ["surrogate"],
    ),
    ("eval-missing-data", ["eval", "--model", "{model}", "--data", "{tmp}/no-such-set"], ["no-such-set"]),
    ("eval-no-tasks", ["eval", "--model", "{model}", "-o", "{tmp}/r"], ["--data", "nothing to evaluate"]),
    ("eval-unknown-suite", ["eval", "--model", "{model}", "--suite", "mteb-huge"], ["mteb-huge"]),
    ("eval-task-type", ["eval", "--model", "{model}", "--data", "{beir}", "--task-type", "Ranking"], ["Ranking"]),
    (
        "train-missing-data",
        ["train", "--model", "{model}", "--data", "/definitely/not/here.jsonl", "-o", "{tmp}/run", "--steps", "1"],
        ["/definitely/not/here.jsonl"],
    ),
    (
        "train-bad-json",
        ["train", "--model", "{model}", "--data", "{tmp}/badrows.jsonl", "-o", "{tmp}/run", "--steps", "1"],
        ["badrows.jsonl:2"],
    ),
    (
        "mine-missing-data",
        ["mine", "-t", "{model}", "--data", "{tmp}/nope.jsonl", "-o", "{tmp}/m.jsonl"],
        ["nope.jsonl"],
    ),
    ("report-missing-dir", ["report", "{tmp}/no-results"], ["no-results"]),
    # unwritable outputs are found before the work starts
    (
        "encode-output-under-file",
        ["encode", "{tmp}/good", "-o", "{tmp}/afile/v.npy", "--model", "{tmp}/nomodel"],
        ["--output", "afile"],
    ),
    (
        "eval-output-under-file",
        ["eval", "--model", "{tmp}/nomodel", "--data", "{beir}", "-o", "{tmp}/afile/r"],
        ["--output", "afile"],
    ),
    (
        "mine-output-under-file",
        ["mine", "-t", "{tmp}/nomodel", "--data", "{tmp}/rows.jsonl", "-o", "{tmp}/afile/m.jsonl"],
        ["--output", "afile"],
    ),
]


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clean_error(workspace, argv, expected, monkeypatch, one_torch_thread):
    monkeypatch.delenv("LMEMBED_DEBUG", raising=False)
    monkeypatch.setenv("LMEMBED_CACHE", str(Path(workspace["tmp"]) / "cache"))
    result = CliRunner().invoke(app, fill(argv, workspace))
    output = result.output
    assert result.exit_code == 2, f"exit {result.exit_code}:\n{output}"
    assert "Traceback" not in output and 'File "' not in output, output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), output
    for text in expected:
        assert text.format(**workspace) in output, f"{text!r} not in:\n{output}"
    assert len(output.strip().splitlines()) <= 16, output


def test_debug_shows_the_traceback(workspace, monkeypatch):
    """``--debug`` lets the exception through (CliRunner keeps it in ``result.exception``)."""
    argv = ["--debug", "encode", "{tmp}/good", "-o", "{tmp}/v.npy", "--model", "{model}", "--pooling", "maxx"]
    result = CliRunner().invoke(app, fill(argv, workspace))
    assert result.exit_code != 0 and isinstance(result.exception, ValueError)


def test_a_bad_verbose_environment_value_names_the_variable(monkeypatch):
    """``LMEMBED_VERBOSE`` that is not a boolean stops with exit 2, naming the option and the variable."""
    monkeypatch.setenv("LMEMBED_VERBOSE", "maybe")
    result = CliRunner().invoke(app, ["models"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--verbose" in result.output and "LMEMBED_VERBOSE" in result.output


def test_an_internal_error_says_so(workspace, monkeypatch):
    """A bug (not a user mistake) exits 1 with 'internal error' and still no traceback."""
    import lmembed.cli.encode as encode_module

    def boom(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'shape'")

    monkeypatch.setattr(encode_module, "read_texts", boom)
    result = CliRunner().invoke(app, fill(["encode", "{tmp}/good", "-o", "{tmp}/v.npy"], workspace))
    assert result.exit_code == 1 and "internal error" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("error", [TypeError, ValueError, KeyError, RuntimeError])
def test_a_builtin_error_is_a_bug_not_a_user_error(workspace, monkeypatch, error):
    """Only ``LmembedError`` (and the OS refusing a path) count as the user's mistake: a builtin ``TypeError``
    or ``ValueError`` that reaches the boundary is a bug, exit 1, said to be internal; ``--debug`` shows it."""
    import lmembed.cli.encode as encode_module

    def boom(*args, **kwargs):
        raise error("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.delenv("LMEMBED_DEBUG", raising=False)
    monkeypatch.setattr(encode_module, "read_texts", boom)
    argv = fill(["encode", "{tmp}/good", "-o", "{tmp}/v.npy"], workspace)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 1, result.output
    assert f"internal error ({error.__name__})" in result.output and "please report it" in result.output
    assert "check your input" not in result.output and "Traceback" not in result.output
    debug = CliRunner().invoke(app, ["--debug", *argv])
    assert isinstance(debug.exception, error)


def test_good_input_still_works(workspace, monkeypatch):
    monkeypatch.setenv("LMEMBED_CACHE", str(Path(workspace["tmp"]) / "cache"))
    out = Path(workspace["tmp"]) / "ok.npy"
    result = CliRunner().invoke(app, fill(["encode", "{tmp}/good", "-o", str(out), "--model", "{model}"], workspace))
    assert result.exit_code == 0, result.output
    assert np.load(out).shape == (2, 32)
    assert json.loads((Path(workspace["model"]) / "lmembed.json").read_text())


def test_an_absolute_data_path_means_exactly_that_path(workspace, monkeypatch):
    """A missing absolute path is never looked up relative to the working directory (it used to lose its
    leading '/' and resolve to ./definitely/x.jsonl)."""
    from lmembed.datasets import DatasetNotFoundError, resolve_local

    cwd = Path(workspace["tmp"]) / "cwd"
    (cwd / "definitely").mkdir(parents=True)
    (cwd / "definitely" / "x.jsonl").write_text('{"query": "cat", "positive": "the cat"}\n' * 4)
    monkeypatch.chdir(cwd)
    with pytest.raises(DatasetNotFoundError, match=r"/definitely/x\.jsonl"):
        resolve_local("/definitely/x.jsonl")
    assert resolve_local("definitely/x.jsonl") == Path("definitely/x.jsonl")  # a relative path still works
    argv = ["train", "--model", "{model}", "--data", "/definitely/x.jsonl", "-o", "{tmp}/run2", "--steps", "1"]
    result = CliRunner().invoke(app, fill(argv, workspace))
    assert result.exit_code == 2 and "/definitely/x.jsonl: no such file" in result.output, result.output


def test_a_run_folder_is_accepted_as_a_model(workspace, tmp_path, monkeypatch):
    """``lmembed train -o RUN`` keeps its model in RUN/model and a recipe in RUN/<stage>/model: either folder
    works wherever a model is expected, and gives the saved model's vectors."""
    import shutil

    from lmembed import Embedder

    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    shutil.copytree(workspace["model"], run / "model")
    recipe = tmp_path / "recipe"
    shutil.copytree(workspace["model"], recipe / "second" / "model")
    shutil.copytree(workspace["model"], recipe / "first" / "model")
    (recipe / "recipe_result.json").write_text(json.dumps({"stages": [{"name": "first"}, {"name": "second"}]}))
    texts = ["the cat sat", "a dog"]
    expected = Embedder.from_pretrained(workspace["model"], cache=False, show_progress=False).encode(texts)
    for folder in (run, recipe):
        got = Embedder.from_pretrained(str(folder), cache=False, show_progress=False).encode(texts)
        np.testing.assert_array_equal(got, expected)
    out = tmp_path / "v.npy"
    result = CliRunner().invoke(app, fill(["encode", "{tmp}/good", "-o", str(out), "--model", str(run)], workspace))
    assert result.exit_code == 0, result.output
    empty = tmp_path / "empty-run"
    empty.mkdir()
    refused = CliRunner().invoke(app, fill(["encode", "{tmp}/good", "-o", str(out), "--model", str(empty)], workspace))
    assert refused.exit_code == 2 and "holds no model" in refused.output


def test_python_api_names_the_bad_input(workspace):
    """The same checks hold without the CLI: a lone surrogate names its input index, a too-large ``dim``
    names both sizes."""
    from lmembed import Embedder
    from lmembed.errors import ConfigError, InputError

    emb = Embedder.from_pretrained(workspace["model"], cache=False, show_progress=False)
    with pytest.raises(InputError, match="input 2"):
        emb.encode(["fine", "also fine", "bad \udc80"])
    with pytest.raises((ConfigError, ValueError), match=r"(?s)4096.*32|32.*4096"):
        Embedder.from_pretrained(workspace["model"], dim=4096, cache=False, show_progress=False)


def test_sigterm_stops_a_command_as_ctrl_c_does_flushing_its_work(tmp_path):
    """A scheduler's stop (SIGTERM) raises an interrupt inside the command, so what is done is flushed (the engine's
    cache, a job's shards) before the exit, status 143; it ended the process at once, writing nothing, before."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, signal, time
        import typer
        from lmembed.cli.boundary import guarded

        def work():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            finally:
                print("flushed", flush=True)

        try:
            guarded(None, work)
        except typer.Exit as stop:
            raise SystemExit(stop.exit_code)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143, done.stderr
    assert "flushed" in done.stdout and "terminated (SIGTERM)" in done.stdout + done.stderr


def test_a_suite_with_no_data_here_is_refused_naming_what_is_absent(tmp_path, monkeypatch):
    """Nothing to score is an error saying what is missing, not an empty table and exit 0."""
    monkeypatch.setenv("LMEMBED_DATA", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["eval", "--model", "minilm", "--suite", "retrieval", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "--suite" in result.output and "absent" in result.output and not (tmp_path / "r").exists()
