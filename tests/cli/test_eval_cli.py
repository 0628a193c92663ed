"""Evaluation runner and CLI: grids share forward passes, sweeps plot, reports render."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import write_beir
from lmembed.cli.app import app
from lmembed.config import ConfigError, EmbeddingConfig
from lmembed.evaluation.runner import evaluate_strategies, expand_grid, parse_grid, sweep_configs
from lmembed.evaluation.tasks.retrieval import RetrievalTask

DOCS = [
    ("d1", "the cat sat on the mat"),
    ("d2", "a dog was riding a horse"),
    ("d3", "the man was eating food"),
    ("d4", "protein cell gene study"),
    ("d5", "language model embedding vector search"),
]
QUERIES = [("q1", "cat mat"), ("q2", "horse riding"), ("q3", "embedding search"), ("q4", "gene cell")]
QRELS = [("q1", "d1"), ("q2", "d2"), ("q3", "d5"), ("q4", "d4")]


@pytest.fixture
def beir(tmp_path):
    return write_beir(tmp_path / "toy", DOCS, QUERIES, QRELS, newline="\r\n")


@pytest.fixture
def saved_model(make_embedder, tmp_path):
    emb = make_embedder("llama", pooling="mean")
    return str(emb.save(tmp_path / "tiny"))


def test_grid_parsing_and_expansion():
    grid = parse_grid(["pooling=mean,last", "layer=-1,mid,15+16", "attention=causal"], num_layers=30)
    assert grid == {"pooling": ["mean", "last"], "layer": [-1, 15, (15, 16)], "attention": ["causal"]}
    configs = expand_grid(EmbeddingConfig(), grid)
    assert len(configs) == 6 and len(set(configs)) == 6
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        parse_grid(["colour=red"], 30)
    layers = [c.layer for c in sweep_configs(EmbeddingConfig(), 4)]
    assert layers[:5] == [0, 1, 2, 3, 4] and (3, 4) in layers


def test_grid_shares_forward_passes(make_embedder, beir, monkeypatch):
    emb = make_embedder("llama", pooling="mean")
    task = RetrievalTask.from_path(beir, name="toy")
    calls = []
    original = emb.backbone.model.forward
    monkeypatch.setattr(emb.backbone.model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    configs = expand_grid(emb.config, {"pooling": ["mean", "weighted_mean", "cls"], "layer": [-1, 1, (1, 2)]})
    results = evaluate_strategies(emb, [task], configs, batch_size=64)
    assert len(results) == 9
    # the one-off attention probe, then one batch of queries + one of documents for all nine strategies
    assert len(calls) == 3
    assert all(0 <= r.result.main_score <= 1 for r in results)


def test_eval_command_writes_results_and_report(saved_model, beir, tmp_path):
    out = tmp_path / "results"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            saved_model,
            "--data",
            str(beir),
            "--grid",
            "pooling=mean,last",
            "-o",
            str(out),
            "--no-cache",
        ],
    )
    assert result.exit_code == 0, result.output
    files = sorted(out.rglob("*.json"))
    assert len(files) == 2
    data = json.loads(files[0].read_text())
    assert data["task_name"] == "toy" and "ndcg_at_10" in data["scores"]["test"][0]
    report = runner.invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    assert (out / "report.png").exists() and (out / "report.md").exists()


def test_sweep_command_plots_every_layer(saved_model, beir, tmp_path):
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(beir), "--model", saved_model, "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    for normed in (False, True):  # decoders are swept raw and through the final norm
        assert [r["layer"] for r in rows if isinstance(r["layer"], int) and r["final_norm"] == normed] == [0, 1, 2]
    assert (out / "sweep.png").stat().st_size > 1000


def test_a_decoder_sweeps_its_last_layer_raw_as_well_as_through_the_final_norm(make_embedder):
    """transformers hands a decoder's last state out normed: the sweep's raw row reads the state before the norm
    (it was the normed one under a "no" label, scoring exactly as the normed row)."""
    emb = make_embedder("llama", pooling="mean")
    last = emb.backbone.num_layers
    configs = [c for c in sweep_configs(emb.config, last, with_final_norm=True) if c.layer == last]
    assert [c.final_norm for c in configs] == [False, True]
    raw, normed = emb.encode_strategies(["a cat sat on the mat", "protein cell gene study"], configs)
    assert not np.allclose(raw, normed, atol=1e-3)
    [transformers_own] = emb.encode_strategies(["a cat sat on the mat", "protein cell gene study"], [emb.config])
    np.testing.assert_allclose(normed, transformers_own, atol=1e-6)


def test_encode_command_and_bad_input(saved_model, tmp_path):
    src = tmp_path / "texts.jsonl"
    src.write_text('{"text": "the cat"}\n{"text": "a dog"}\n')
    result = CliRunner().invoke(app, ["encode", str(src), "-o", str(tmp_path / "v.npy"), "--model", saved_model])
    assert result.exit_code == 0, result.output
    import numpy as np

    assert np.load(tmp_path / "v.npy").shape == (2, 32)
    src.write_text('{"text": "ok"}\n{"txt": "bad"}\n')
    bad = CliRunner().invoke(app, ["encode", str(src), "-o", str(tmp_path / "w.npy"), "--model", saved_model])
    assert bad.exit_code != 0 and "texts.jsonl:2" in bad.output


def test_eval_of_a_published_model_uses_its_mteb_instructions(beir, tmp_path):
    """A tiny model in e5-mistral's Hub cache folder is evaluated with the instruction mteb gives e5-mistral."""
    mteb = pytest.importorskip("mteb")
    from conftest import build_tokenizer, tiny_model

    folder = tmp_path / "models--intfloat--e5-mistral-7b-instruct" / "snapshots" / "0123abc"
    tok = build_tokenizer(bos=True)
    tiny_model("mistral", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    data = beir.rename(beir.parent / "SciFact")  # a task mteb knows, by its name
    out = tmp_path / "results"
    result = CliRunner().invoke(
        app, ["eval", "--model", str(folder), "--data", str(data), "-o", str(out), "--no-cache"]
    )
    assert result.exit_code == 0, result.output
    written = json.loads(next(out.rglob("SciFact.json")).read_text())
    assert mteb.get_task("SciFact").metadata.prompt["query"] in json.dumps(written)


def _report_rows(runner, out) -> list[str]:
    report = runner.invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    return [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]


def test_eval_on_int8_lands_beside_float32_and_says_so(saved_model, beir, tmp_path):
    """--precision int8 (and --backend onnx) write their own result file, which records them; float32 on torch keeps
    its folder, and the report shows each in a row of its own."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")
    out = tmp_path / "results"
    runner = CliRunner()
    base = ["eval", "--model", saved_model, "--data", str(beir), "-o", str(out), "--no-cache"]
    for extra in ([], ["--precision", "int8"], ["--backend", "onnx"]):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
    assert "mean@-1 (onnx float32)" in result.output  # the run's own table says so too
    files = sorted(out.rglob("toy.json"))
    by_runtime = {}
    for f in files:
        runtime = json.loads(f.read_text())["lmembed"]["extra"]["runtime"]
        by_runtime[runtime["backend"], runtime["precision"]] = f.parent.name
    digest = by_runtime["torch", "float32"].rsplit("-", 1)[-1]
    assert len(files) == 3 and by_runtime == {
        ("torch", "float32"): f"mean--1-{digest}",  # the float32 folder, as it was
        ("onnx", "int8"): f"mean--1+onnx-int8-{digest}",
        ("onnx", "float32"): f"mean--1+onnx-float32-{digest}",
    }
    rows = _report_rows(runner, out)
    for label in ("| mean@-1 |", "| mean@-1 (onnx int8) |", "| mean@-1 (onnx float32) |"):
        assert any(label in row for row in rows), rows


def test_staged_evals_of_two_dense_strategies_keep_apart(saved_model, beir, tmp_path):
    """Two hybrid evaluations under different dense strategies write two files, each naming its strategy."""
    out = tmp_path / "results"
    runner = CliRunner()
    base = [
        "eval",
        "--model",
        saved_model,
        "--data",
        str(beir),
        "-o",
        str(out),
        "--no-cache",
        "--first-stage",
        "hybrid",
    ]
    for extra in ([], ["--pooling", "last"]):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
    files = sorted(out.rglob("toy.json"))
    strategies = [json.loads(f.read_text())["lmembed"]["strategy"] for f in files]
    assert len(files) == 2 and {s["pooling"] for s in strategies} == {"mean", "last"}
    assert all(s["first_stage"] == "hybrid" and s["fusion"] == "rrf" for s in strategies)
    rows = _report_rows(runner, out)
    assert any("| last@-1 |" in row for row in rows) and any("| mean@-1 |" in row for row in rows), rows
    result = runner.invoke(app, [*base, "--instructions", "e5"])  # a staged run with an instruction table: a third file
    assert result.exit_code == 0, result.output
    assert len(sorted(out.rglob("toy.json"))) == 3
    assert any("instructions e5" in row for row in _report_rows(runner, out))
