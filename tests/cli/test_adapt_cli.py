"""``lmembed adapt`` from the command line: a run on a tiny model saved as a folder, and bad input refused with
exit 2, a message naming the file (and line), and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import write_jsonl
from lmembed.cli.app import app

BODIES = [
    "the cat sat on the mat and the dog sat on the rug in the cell of the man",
    "protein folding in the cell is a study of the gene and the protein result",
    "a man was riding a horse on the rug and the woman was eating food there",
    "the movie was great and the movie was bad for the man and the woman friend",
    "language model embedding vector search is retrieval with a language model text",
    "gene expression study of the cell and the protein result in science text",
]


@pytest.fixture
def tiny_model_dir(tmp_path, make_embedder) -> Path:
    folder = tmp_path / "tiny"
    make_embedder("bert", pooling="mean").save(folder)
    return folder


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "adapt.yaml"
    path.write_text(
        "sources:\n  crops: {per_document: 3, min_words: 3, max_words: 6, min_rest_words: 4}\n"
        "selection: {fraction: 0.2, every: 2}\nmining: {k: 2}\n"
        "training: {steps: 2, batch_size: 4, warmup_steps: 1, lr: 0.001, max_length: 32}\n"
    )
    return path


def adapt(model: Path, corpus: Path, out: Path, *options: str):
    """``lmembed adapt --model M --corpus C -o OUT [options]`` through the CLI."""
    return CliRunner().invoke(app, ["adapt", "--model", str(model), "--corpus", str(corpus), "-o", str(out), *options])


def untitled_corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", [{"_id": f"d{i}", "text": b} for i, b in enumerate(BODIES)])


def test_adapt_writes_a_model_that_loads_and_encodes(tmp_path, tiny_model_dir, recipe, one_torch_thread):
    from lmembed import Embedder

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(BODIES) + "\n")
    out = tmp_path / "out"
    result = adapt(tiny_model_dir, corpus, out, "--recipe", str(recipe), "--device", "cpu", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "adapted model" in result.output and "nDCG@10" in result.output
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["report"]["by_source"] == {"crop": summary["report"]["train_rows"]}  # no titles in a text file
    vectors = Embedder.from_pretrained(out / "model", show_progress=False).encode(["the cat", "a gene"])
    assert vectors.shape[0] == 2


def test_adapt_with_the_tiny_generator(tmp_path, tiny_model_dir, recipe, one_torch_thread):
    corpus = untitled_corpus(tmp_path)
    out = tmp_path / "out"
    result = adapt(
        tiny_model_dir, corpus, out, "--recipe", str(recipe), "--generator", "tiny", "--device", "cpu", "--no-progress"
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["report"]["sources"]["generator"]["synthesize"]["attempted"] == len(BODIES)
    assert (out / "generated.jsonl").exists()


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([], ["corpus.jsonl", "empty"]),
        ([{"_id": "a", "text": "the cat"}, {"_id": "b", "title": "", "text": ""}], ["corpus.jsonl:2", "neither"]),
        ([{"_id": "a", "text": "the cat sat"}], ["corpus.jsonl", "one distinct document"]),
    ],
    ids=["empty", "no-text", "one-document"],
)
def test_bad_corpora_exit_2_and_write_nothing(tmp_path, tiny_model_dir, rows, expected):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    out = tmp_path / "out"
    result = adapt(tiny_model_dir, corpus, out)
    assert result.exit_code == 2, result.output
    assert all(text in result.output for text in expected), result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_a_model_that_cannot_be_loaded_exits_2_and_writes_nothing(tmp_path):
    corpus = untitled_corpus(tmp_path)
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "readme.txt").write_text("no weights here")
    out = tmp_path / "out"
    result = adapt(tmp_path / "notamodel", corpus, out)
    assert result.exit_code == 2, result.output
    assert "notamodel" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_bad_recipe_exits_2_naming_file_and_line(tmp_path, tiny_model_dir):
    corpus = untitled_corpus(tmp_path)
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("training:\n  steps: 2\n  optimiser: sgd\n")
    result = adapt(tiny_model_dir, corpus, tmp_path / "o", "--recipe", str(recipe))
    assert result.exit_code == 2, result.output
    assert "bad.yaml:3" in result.output and "optimiser" in result.output


def test_a_corpus_that_makes_too_few_queries_exits_2_and_leaves_nothing(tmp_path, tiny_model_dir):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("the cat\nthe dog\n")  # no titles, too short to crop
    out = tmp_path / "out"
    result = adapt(tiny_model_dir, corpus, out)
    assert result.exit_code == 2, result.output
    assert "pseudo-quer" in result.output and "at least two" in result.output
    assert not out.exists()


def test_terms_only_fits_the_channel_to_the_model_as_it_is(tmp_path, tiny_model_dir, recipe, one_torch_thread):
    import numpy as np

    from lmembed import Embedder

    out = tmp_path / "out"
    result = adapt(tiny_model_dir, untitled_corpus(tmp_path), out, "--terms-only", "--recipe", str(recipe))
    assert result.exit_code == 0, result.output
    assert "model with a term channel" in result.output and "4096 dims" in result.output
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["terms_only"] and summary["documents"] == len(BODIES) and not (out / "rows.jsonl").exists()
    fitted = Embedder.from_pretrained(str(out / "model"), show_progress=False, cache=False)
    start = Embedder.from_pretrained(str(tiny_model_dir), show_progress=False, cache=False)
    hidden = start.backbone.hidden_size
    dense = fitted.encode_corpus(BODIES)[:, :hidden]  # the dense part is the untrained model's, normalised
    expected = start.encode_corpus(BODIES)
    np.testing.assert_allclose(dense / np.linalg.norm(dense, axis=1, keepdims=True), expected, atol=1e-5)
    again = adapt(tiny_model_dir, untitled_corpus(tmp_path), out, "--terms-only")
    assert again.exit_code == 2 and "already holds an adapt run" in again.output


def test_terms_only_refuses_training_options(tmp_path, tiny_model_dir):
    out = tmp_path / "out"
    result = adapt(tiny_model_dir, untitled_corpus(tmp_path), out, "--terms-only", "--steps", "3")
    assert result.exit_code == 2 and "--terms-only" in result.output and "training options" in result.output
    assert not out.exists()
