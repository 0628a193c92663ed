"""--backend / --precision / --calibration on the command line, and int8 indexes that reload as int8."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import WORDS
from lmembed import Embedder
from lmembed.cli.app import app
from lmembed.cli.options import CLI_PRECISIONS
from lmembed.encoding.backends.base import BACKENDS, PRECISIONS
from lmembed.index import Index, IndexMismatchError

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")

TEXTS = [" ".join(WORDS[i : i + 3 + i % 5]) for i in range(24)]


@pytest.fixture
def saved_model(make_embedder, tmp_path):
    return str(make_embedder("bert", pooling="mean").save(tmp_path / "tiny"))


@pytest.fixture
def files(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(reversed(TEXTS)) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    return texts, calibration, corpus


def _encode(saved_model, texts, out, *options):
    result = CliRunner().invoke(
        app, ["encode", str(texts), "-o", str(out), "--model", saved_model, "--no-cache", *options]
    )
    assert result.exit_code == 0, result.output
    return np.load(out)


def test_cli_precisions_are_library_precisions():
    assert set(CLI_PRECISIONS) <= set(PRECISIONS) and BACKENDS == ("torch", "onnx", "cuda-graphs")


def test_encode_on_onnx_and_int8_from_the_command_line(saved_model, files, tmp_path):
    texts, calibration, _ = files
    torch_vectors = _encode(saved_model, texts, tmp_path / "t.npy")
    onnx_vectors = _encode(saved_model, texts, tmp_path / "o.npy", "--backend", "onnx")
    assert (torch_vectors * onnx_vectors).sum(1).min() >= 0.9999
    int8 = _encode(saved_model, texts, tmp_path / "i.npy", "--precision", "int8", "--calibration", str(calibration))
    cos = (int8 * torch_vectors).sum(1)
    assert cos.min() > 0.9 and np.abs(int8 - torch_vectors).max() > 0  # quantised, and close


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--backend", "tensorrt"], "--backend"),
        (["--precision", "bfloat16"], "--precision"),
        (["--calibration", "{calibration}"], "--calibration"),  # calibration without int8
        (["--backend", "torch", "--precision", "int8", "--calibration", "{calibration}"], "--calibration"),
        (["--precision", "int8", "--calibration", "{missing}"], "--calibration"),
        (["--precision", "int8", "--calibration", "{few}"], "--calibration"),  # fewer than 8 distinct texts
        (["--precision", "int8", "--engine", "ray"], "--precision"),  # each Ray worker would calibrate on its own
    ],
)
def test_bad_backend_options_are_refused_naming_the_option(saved_model, files, tmp_path, options, named):
    texts, calibration, _ = files
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\none\n")
    filled = [o.format(calibration=calibration, missing=tmp_path / "nope.txt", few=few) for o in options]
    result = CliRunner().invoke(
        app, ["encode", str(texts), "-o", str(tmp_path / "v.npy"), "--model", saved_model, *filled]
    )
    assert result.exit_code == 2 and named in result.output, result.output
    assert not (tmp_path / "v.npy").exists()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--precision", "int8", "--calibration", "{few}"], "at least 8 distinct texts, got 2"),
        (["--calibration", "{calibration}"], "calibration texts are for --precision int8"),
    ],
)
def test_export_reads_calibration_texts_as_every_other_command(saved_model, files, tmp_path, options, said):
    """export read them unstripped and took 2 distinct texts (blank lines counted as texts); encode refused."""
    _, calibration, _ = files
    few = tmp_path / "few.txt"
    few.write_text("one\ntwo\n\n one \n\n")
    filled = [o.format(calibration=calibration, few=few) for o in options]
    result = CliRunner().invoke(app, ["export", str(tmp_path / "out"), "--model", saved_model, *filled])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()


def test_export_takes_its_folder_as_every_command_does(saved_model, tmp_path):
    """``-o DIR`` as every other command writes (the folder as the argument still works); two different folders, or
    none, are refused before any work."""
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", "-o", str(out), "--model", saved_model])
    assert result.exit_code == 0, result.output
    assert (out / "model.onnx").is_file() and (out / "lmembed.json").is_file()
    for argv, said in (
        (["export", str(tmp_path / "a"), "-o", str(tmp_path / "b")], "two folders to write"),
        (["export"], "the folder to write"),
    ):
        refused = CliRunner().invoke(app, [*argv, "--model", saved_model])
        assert refused.exit_code == 2 and said in " ".join(refused.output.split()), refused.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_served_int8_needs_its_calibration_up_front(saved_model):
    result = CliRunner().invoke(app, ["serve", saved_model, "--precision", "int8", "--port", "0"])
    assert result.exit_code == 2 and "--calibration" in result.output, result.output


def test_an_int8_index_reloads_as_the_same_int8_model(saved_model, files, tmp_path, monkeypatch):
    _, calibration, corpus = files
    int8_options = ["--precision", "int8", "--calibration", str(calibration)]
    folder = tmp_path / "index"
    built = CliRunner().invoke(
        app,
        ["index", "build", str(corpus), "-o", str(folder), "--model", saved_model, "--no-cache", *int8_options],
    )
    assert built.exit_code == 0, built.output
    manifest = Index.open(folder).manifest.model.load
    assert (manifest.backend, manifest.precision) == ("onnx", "int8")
    assert manifest.calibration == tuple(reversed(TEXTS))
    shown = CliRunner().invoke(app, ["index", "info", str(folder)])  # it said "float32" here
    assert shown.exit_code == 0 and f"onnx int8 ({len(TEXTS)} calibration texts)" in shown.output, shown.output
    index = Index.open(folder)
    index.load_embedder()
    assert index.embedder is not None and index.embedder.backend.precision == "int8"
    for i in (0, 7, 19):  # a document's own text is quantised as at build time: it finds itself at cosine 1
        top = index.search(TEXTS[i], k=1)[0]
        assert top.id == f"d{i}" and top.score == pytest.approx(1.0, abs=1e-5)
    float32 = Embedder.from_pretrained(saved_model, cache=False, show_progress=False)
    with pytest.raises(IndexMismatchError, match="backend: index=onnx int8 embedder=torch float32"):
        Index.open(folder, float32)

    for extra in ([], ["--model", saved_model]):  # searched with the model it records, or the one named
        found = CliRunner().invoke(app, ["search", str(folder), TEXTS[7], "-k", "1", *extra])
        assert found.exit_code == 0 and "d7" in found.output, found.output

    served = {}  # serve --index: the int8 model is calibrated as the index was, before the server starts
    monkeypatch.setattr("lmembed.serving.server.run", lambda app, **_: served.setdefault("app", app))
    result = CliRunner().invoke(app, ["serve", saved_model, "--index", str(folder), "--precision", "int8"])
    assert result.exit_code == 0, result.output
    backend = served["app"].state.lmembed.embedder.backend
    assert backend.precision == "int8" and backend.calibration_texts == index.embedder.backend.calibration_texts
    served.clear()  # no option at all: the model as the index was built (int8, its calibration), as `search` reads it
    result = CliRunner().invoke(app, ["serve", saved_model, "--index", str(folder)])
    assert result.exit_code == 0, result.output
    backend = served["app"].state.lmembed.embedder.backend
    assert backend.precision == "int8" and backend.calibration_texts == index.embedder.backend.calibration_texts
    refused = CliRunner().invoke(app, ["serve", saved_model, "--index", str(folder), "--backend", "onnx"])
    assert refused.exit_code != 0 and "backend: index=onnx int8" in refused.output  # float32 asked for an int8 index


def test_main_job_refuses_ray_naming_the_engine(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--engine", "ray", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--engine" in result.output and "main job runs locally" in result.output


def test_int8_evaluation_calibrates_on_queries_and_documents(tokenizer, tmp_path):
    from conftest import tiny_model
    from lmembed.evaluation.runner import evaluate_retrieval_strategies
    from lmembed.evaluation.tasks.retrieval import RetrievalTask

    folder = tmp_path / "toy"
    (folder / "qrels").mkdir(parents=True)
    docs = {f"d{i}": t for i, t in enumerate(TEXTS)}
    queries = {f"q{i}": " ".join(WORDS[i : i + 2]) for i in range(4)}
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": t}) + "\n" for k, t in docs.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": t}) + "\n" for k, t in queries.items()))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4))
    )
    emb = Embedder.from_model(
        tiny_model("bert", len(tokenizer)), tokenizer, precision="int8", use_cache=False, show_progress=False
    )
    evaluate_retrieval_strategies(emb, RetrievalTask.from_path(folder, name="toy"), [emb.config])
    seen = set(emb.backend.calibration_texts)
    assert seen & set(docs.values()) and seen <= set(docs.values()) | set(queries.values())


def test_verbose_logs_each_step_with_its_time(saved_model, files, tmp_path, monkeypatch):
    """``lmembed --verbose`` says how long loading, the export, int8 calibration and each encode took (the lines
    ``bench/main_job_time.py`` splits a cold run's time with)."""
    texts, calibration, _ = files
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))  # cold: nothing exported yet
    level_before = logging.getLogger("lmembed").level
    out = tmp_path / "v.npy"
    options = ["--precision", "int8", "--calibration", str(calibration), "--no-cache"]
    result = CliRunner().invoke(
        app, ["--verbose", "encode", str(texts), "-o", str(out), "--model", saved_model, *options]
    )
    assert result.exit_code == 0, result.output
    for pattern in (
        r"lmembed\.models\.loading: loaded .* in [\d.]+ s",
        r"exported .* to ONNX in [\d.]+ s",
        r"quantised .* to int8 in [\d.]+ s",
        r"int8 quality gate measured in [\d.]+ s",
        rf"encoded {len(TEXTS)} texts \(\d+ tokens, \d+% padding\) on onnx int8 in [\d.]+ s .*; tokenised in [\d.]+ s, "
        r"backend prepared in [\d.]+ s",
    ):
        assert re.search(pattern, result.output), (pattern, result.output)
    quiet = CliRunner().invoke(app, ["encode", str(texts), "-o", str(out), "--model", saved_model, "--no-cache"])
    assert quiet.exit_code == 0 and "lmembed.encoding.engine: encoded" not in quiet.output
    assert logging.getLogger("lmembed").level == level_before  # the verbose command's level is undone
