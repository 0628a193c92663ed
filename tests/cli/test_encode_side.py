"""``lmembed encode --side``: texts embedded as queries or as documents, as ``encode_queries`` / ``encode_corpus``
embed them (an asymmetric model: a term channel weighs the two apart, a query instruction is added to queries
only); prompt options the side decides are refused before anything is loaded or written."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import flat
from lmembed.cli.app import app

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "the cat and the dog"]
TEXTS = ["cat cat dog", "the park", "a cat on the mat"]  # a repeated token: BM25 weighs it apart from a query's idf


@pytest.fixture
def asymmetric(make_embedder, tmp_path):
    emb = make_embedder("bert", pooling="mean", query_instruction="Find: ").fit_terms(CORPUS, dims=64)
    return emb, str(emb.save(tmp_path / "model"))


def _encode(tmp_path, model: str, *extra: str):
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / f"out{len(list(tmp_path.glob('out*.npy')))}.npy"
    result = CliRunner().invoke(app, ["encode", str(source), "-o", str(out), "--model", model, "--no-cache", *extra])
    return result, out


def test_each_side_gives_the_python_api_vectors(asymmetric, tmp_path):
    emb, model = asymmetric
    expected = {
        ("--side", "query"): emb.encode_queries(TEXTS),
        ("--side", "query", "--instruction", "Look up: "): emb.encode_queries(TEXTS, instruction="Look up: "),
        ("--side", "document"): emb.encode_corpus(TEXTS),
        (): emb.encode(TEXTS),
    }
    got = {}
    for extra, vectors in expected.items():
        result, out = _encode(tmp_path, model, *extra)
        assert result.exit_code == 0, result.output
        got[extra] = np.load(out)
        np.testing.assert_allclose(got[extra], vectors, atol=1e-6, err_msg=str(extra))
    assert not np.allclose(got["--side", "query"], got["--side", "document"], atol=1e-3)  # the sides differ here


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--side", "queries"], "--side"),
        (["--side", "document", "--instruction", "Find: "], "--instruction"),
        (["--side", "query", "--prompt-name", "query"], "--prompt-name"),
    ],
)
def test_a_side_and_the_prompts_it_decides_are_refused_by_name(asymmetric, tmp_path, extra, named):
    _, model = asymmetric
    result, out = _encode(tmp_path, model, *extra)
    assert result.exit_code == 2 and named in result.output, result.output
    assert not out.exists()


def test_tokens_writes_encode_tokens_arrays_for_each_side(asymmetric, tmp_path):
    """`lmembed encode --tokens -o F.npz`: every text's token vectors (as Embedder.encode_tokens gives them, the
    side's prompt included) one after another, with the offsets that cut them apart."""
    emb, model = asymmetric
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    for extra, expected in [
        ((), emb.encode_tokens(TEXTS)),
        (("--side", "query"), emb.encode_tokens(TEXTS, side="query")),
    ]:
        out = tmp_path / f"tokens{len(extra)}.npz"
        command = ["encode", str(source), "-o", str(out), "--model", model, "--no-cache", "--tokens", *extra]
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, result.output
        with np.load(out, allow_pickle=False) as saved:
            vectors, offsets = saved["vectors"], saved["offsets"]
        assert offsets[0] == 0 and offsets.dtype == np.int64 and len(offsets) == len(TEXTS) + 1
        for i, states in enumerate(expected):
            np.testing.assert_allclose(vectors[offsets[i] : offsets[i + 1]], states, atol=1e-6)
        assert offsets[-1] == len(vectors)
    assert len(expected[0]) > len(emb.encode_tokens(TEXTS[:1])[0])  # the query instruction's tokens are there
    wrong = CliRunner().invoke(
        app, ["encode", str(source), "-o", str(tmp_path / "t.npy"), "--model", model, "--tokens"]
    )
    assert wrong.exit_code == 2 and "--tokens writes an .npz" in flat(wrong.output)
