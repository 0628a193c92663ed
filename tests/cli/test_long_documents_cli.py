"""Long documents on the command line: --rope-scale (position interpolation) and a max_length grid over a long task."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import write_beir
from lmembed import Embedder
from lmembed.cli.app import app
from lmembed.index import Index, IndexMismatchError
from lmembed.models.context import interpolate_positions, interpolation_factor

LONG = " ".join(["the cat sat on the mat"] * 30)  # about 180 tokens: past the tiny models' 128 positions


@pytest.fixture
def saved(make_embedder, tmp_path):
    def save(family: str) -> str:
        return str(make_embedder(family, pooling="mean").save(tmp_path / family))

    return save


def _encode(tmp_path, model: str, *flags: str):
    src = tmp_path / "texts.jsonl"
    src.write_text(json.dumps({"text": LONG}) + "\n" + json.dumps({"text": "a dog"}) + "\n")
    out = tmp_path / f"v{len(list(tmp_path.glob('v*.npy')))}.npy"
    result = CliRunner().invoke(app, ["encode", str(src), "-o", str(out), "--model", model, "--no-cache", *flags])
    return result, out


def test_rope_scale_flag_reads_as_the_library_does(saved, tmp_path):
    model = saved("llama")
    result, out = _encode(tmp_path, model, "--rope-scale", "2", "--max-length", "256")
    assert result.exit_code == 0, result.output
    reference = Embedder.from_pretrained(model, cache=False, show_progress=False, max_length=128)
    interpolate_positions(reference.backbone, 2.0)
    reference = reference.with_config(reference.config.with_options(max_length=256))
    np.testing.assert_allclose(np.load(out), reference.encode([LONG, "a dog"]), atol=1e-5)
    plain, plain_out = _encode(tmp_path, model, "--max-length", "128")
    assert plain.exit_code == 0, plain.output
    assert not np.allclose(np.load(plain_out)[0], np.load(out)[0], atol=1e-3)  # the flag changed the reading
    beyond, _ = _encode(tmp_path, model, "--max-length", "256")  # 256 of 128 positions: refused, not cut to 128
    assert beyond.exit_code == 2 and "has 128 positions" in " ".join(beyond.output.replace("│", " ").split())


def test_rope_scale_is_refused_for_a_model_without_rotary_positions(saved, tmp_path):
    result, out = _encode(tmp_path, saved("bert"), "--rope-scale", "2")
    assert result.exit_code == 2 and not out.exists()
    shown = " ".join(result.output.replace("│", " ").split())
    assert "--rope-scale" in shown and "rope_scale=2: bert has no rotary position embedding" in shown


def test_an_index_built_with_rope_scale_is_searched_with_it(saved, tmp_path):
    """The factor is recorded in the index's manifest and applied when the index loads its model (search needs no
    flag); an embedder read without it is refused, the difference named."""
    model = saved("llama")
    docs = {"long": LONG, "dog": "a dog", "other": " ".join(["a bird flew over the house"] * 30)}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in docs.items()))
    folder = tmp_path / "index"
    flags = ["--model", model, "--no-cache", "--max-length", "256"]
    built = CliRunner().invoke(app, ["index", "build", str(corpus), "-o", str(folder), *flags, "--rope-scale", "2"])
    assert built.exit_code == 0, built.output
    index = Index.open(folder)
    assert index.manifest.model.load.rope_scale == 2.0
    assert interpolation_factor(index.load_embedder().backbone.model) == 2.0
    top = index.search(LONG, k=1)[0]
    assert top.id == "long" and top.score == pytest.approx(1.0, abs=1e-5)  # read as at build time: finds itself
    found = CliRunner().invoke(app, ["search", str(folder), LONG, "-k", "1"])
    assert found.exit_code == 0 and "long" in found.output, found.output
    plain = Embedder.from_pretrained(model, cache=False, show_progress=False, max_length=128)
    with pytest.raises(IndexMismatchError, match="rope_scale: index=2 embedder=none"):
        Index.open(folder, plain)

    manifest = folder / "manifest.json"  # a hand-edited factor is refused, naming the file and the field
    data = json.loads(manifest.read_text())
    data["model"]["rope_scale"] = "2x"
    manifest.write_text(json.dumps(data))
    broken = CliRunner().invoke(app, ["search", str(folder), LONG, "-k", "1"])
    shown = " ".join(broken.output.replace("│", " ").split())
    assert broken.exit_code != 0 and "manifest.json: not a valid lmembed index manifest" in shown, broken.output
    assert "model.rope_scale='2x' must be a number > 1 or null" in shown and "Traceback" not in broken.output


def test_eval_grid_over_max_length_on_concatenated_documents(saved, tmp_path):
    docs = [(f"d{i}", f"document {i} about topic {i} " * 6) for i in range(6)]
    queries = [(f"q{i}", f"topic {i}") for i in range(3)]
    beir = write_beir(tmp_path / "toy", docs, queries, [(f"q{i}", f"d{i}") for i in range(3)])
    out = tmp_path / "results"
    result = CliRunner().invoke(
        app,
        ["eval", "--model", saved("llama"), "--data", f"concat:{beir}:2", "--grid", "max_length=8,64", "-o", str(out)],
    )
    assert result.exit_code == 0, result.output
    written = [json.loads(path.read_text()) for path in sorted(out.rglob("*.json"))]
    assert len(written) == 2 and {w["task_name"] for w in written} == {"toy[x2]"}
    assert sorted(json.dumps(w).count('"max_length": 8') > 0 for w in written) == [False, True]
    bad = CliRunner().invoke(app, ["eval", "--model", saved("llama"), "--grid", "max_length=long", "--data", str(beir)])
    assert bad.exit_code != 0 and "max_length" in bad.output
