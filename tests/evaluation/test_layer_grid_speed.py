"""A layer × dim grid in ``lmembed eval`` shows each point's measured texts/s (uncached encodes that stop at the
layer read); grids that do not vary the layer, the main job and the sweep measure nothing extra."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.evaluation.runner import evaluate_strategies, expand_grid, results_table
from lmembed.evaluation.tasks.retrieval import RetrievalTask

DOCS = [f"document {w} about the cat and the gene study number {i}" for i, w in enumerate("abcdefghij")]


@pytest.fixture
def beir(tmp_path):
    folder = tmp_path / "toy"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(DOCS))
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"the cat {i}"}) + "\n" for i in range(3))
    )
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td1\t1\nq2\td2\t1\n")
    return folder


def test_layer_by_dim_grid_measures_each_layers_speed(make_embedder, beir, monkeypatch, one_torch_thread):
    emb = make_embedder("llama", pooling="mean")
    task = RetrievalTask.from_path(beir, name="toy")
    configs = expand_grid(emb.config, {"layer": [1, -1], "dim": [16, 32]})
    timed = []
    original = type(emb).texts_per_second

    def spy(self, texts, **options):
        timed.append(self.config)
        return original(self, texts, **options)

    monkeypatch.setattr(type(emb), "texts_per_second", spy)
    results = evaluate_strategies(emb, [task], configs, batch_size=4, measure_speed=True)
    speeds = {(r.config.layer, r.config.dim): r.result.extra["texts_per_s"] for r in results}
    assert all(v > 0 for v in speeds.values())
    assert speeds[(1, 16)] == speeds[(1, 32)] and speeds[(-1, 16)] == speeds[(-1, 32)]  # a dim costs nothing
    assert [c.layer for c in timed] == [1, 1, -1, -1]  # per layer: a warm-up, then one uncached encode
    table = results_table(results)
    assert "| texts/s |" in table.splitlines()[0]
    assert f"| {speeds[(1, 16)]:.1f} |" in table
    plain = evaluate_strategies(emb, [task], configs, batch_size=4)
    assert not any("texts_per_s" in r.result.extra for r in plain) and "texts/s" not in results_table(plain)


def test_eval_command_shows_texts_per_second_for_a_layer_grid(make_embedder, beir, tmp_path):
    saved = str(make_embedder("llama", pooling="mean").save(tmp_path / "tiny"))
    args = ["eval", "--model", saved, "--data", str(beir), "-o", str(tmp_path / "out"), "--no-cache"]
    result = CliRunner().invoke(app, [*args, "--grid", "layer=1,2", "--grid", "dim=16,32"])
    assert result.exit_code == 0, result.output
    assert "texts/s" in result.output and result.output.count("toy") >= 4
    files = sorted((tmp_path / "out").rglob("*.json"))
    assert len(files) == 4
    assert all(json.loads(f.read_text())["lmembed"]["extra"]["texts_per_s"] > 0 for f in files)  # saved with each
    plain = CliRunner().invoke(app, [*args, "--grid", "dim=16,32"])
    assert plain.exit_code == 0 and "texts/s" not in plain.output
