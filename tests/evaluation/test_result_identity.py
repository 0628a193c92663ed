"""What a result file says it measured, and where it lands: a staged evaluation records its stages' strategy (the
dense strategy, BM25 and the fusion, the reranker and its top-k) and a run on another backend or precision records
them, so that no run replaces another's file and ``lmembed report`` labels each row truthfully."""

from __future__ import annotations

import json

import pytest

from conftest import WORDS
from helpers import random_beir, save_tiny_cross_encoder
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.report import build_table
from lmembed.evaluation.results import load_results, read_result, result_path, strategy_digest, write_result
from lmembed.evaluation.runner import evaluate_strategies, write_all
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.evaluation.two_stage import evaluate_two_stage
from lmembed.rerank import load_reranker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def task(tmp_path):
    folder = random_beir(tmp_path / "tiny-beir", WORDS[9:], docs=24, queries=6, relevant=2, seed=3, lengths=(4, 10))
    return RetrievalTask.from_path(folder, name="tiny")


def _record(path) -> dict:
    return json.loads(path.read_text())["lmembed"]


def _rows(folder) -> dict[tuple[str, str], float]:
    table = build_table(load_results(folder))
    return {row: table.scores[row]["tiny"] for row in table.rows}


def test_staged_runs_record_their_strategy_and_keep_apart(task, make_embedder, tmp_path):
    """The probe's runs: a reranked dense first stage at layer 1 beside a plain run; hybrid first stages under two
    dense strategies. Each stage's file names its strategy and none replaces another."""
    emb = make_embedder("bert")
    layer1 = emb.with_config(emb.config.with_options(layer=1))
    cls = emb.with_config(emb.config.with_options(pooling="cls"))
    reranker = load_reranker(str(save_tiny_cross_encoder(tmp_path / "ce", seed=5)))
    out = tmp_path / "results"

    staged = evaluate_two_stage(task, first_stage="dense", encoder=layer1, reranker=reranker, rerank_top_k=5)
    (plain,) = evaluate_strategies(emb, [task], [emb.config])
    hybrid_mean = evaluate_two_stage(task, first_stage="hybrid", encoder=emb).first
    hybrid_cls = evaluate_two_stage(task, first_stage="hybrid", encoder=cls).first
    bm25 = evaluate_two_stage(task, first_stage="bm25").first
    results = [staged.first, staged.reranked, plain.result, hybrid_mean, hybrid_cls, bm25]
    paths = [write_result(r, out) for r in results]
    assert len(set(paths)) == len(paths)  # no run replaces another
    assert all(p.parent.name != "default" for p in paths)

    first, reranked = _record(paths[0]), _record(paths[1])
    assert first["strategy"]["layer"] == 1 and first["strategy"]["pooling"] == "mean"
    assert first["strategy"]["first_stage"] == "dense" and "reranker" not in first["strategy"]
    assert first["extra"]["strategy_label"] == layer1.config.label()
    assert {k: reranked["strategy"][k] for k in ("layer", "first_stage", "reranker", "rerank_top_k")} == {
        "layer": 1,
        "first_stage": "dense",
        "reranker": reranker.name,
        "rerank_top_k": 5,
    }
    hybrid = _record(paths[3])["strategy"]
    assert hybrid["fusion"] == "rrf" and hybrid["bm25"]["k1"] == 1.5 and hybrid["pooling"] == "mean"
    assert _record(paths[4])["strategy"]["pooling"] == "cls"
    assert _record(paths[5])["strategy"]["first_stage"] == "bm25" and "pooling" not in _record(paths[5])["strategy"]
    assert read_result(paths[1]).strategy == staged.reranked.strategy  # read back as written

    rows = _rows(out)
    label, label1 = emb.config.label(), layer1.config.label()
    model = emb.name
    assert rows == {
        (model, label): pytest.approx(plain.result.main_score),
        (model, label1): pytest.approx(staged.first.main_score),
        (f"{model} » {reranker.name}", f"{label1} rerank_top_k=5"): pytest.approx(staged.reranked.main_score),
        (f"{model}+bm25 (rrf)", label): pytest.approx(hybrid_mean.main_score),
        (f"{model}+bm25 (rrf)", cls.config.label()): pytest.approx(hybrid_cls.main_score),
        ("bm25", "lucene k1=1.5 b=0.75"): pytest.approx(bm25.main_score),
    }


def test_a_staged_first_stage_is_kept_apart_from_a_plain_run_of_the_same_strategy(task, make_embedder, tmp_path):
    emb = make_embedder("bert")
    staged = evaluate_two_stage(task, first_stage="dense", encoder=emb).first
    (plain,) = evaluate_strategies(emb, [task], [emb.config])
    assert staged.main_score == pytest.approx(plain.result.main_score)
    paths = [*write_all([plain], tmp_path), write_result(staged, tmp_path)]
    assert paths[0] != paths[1] and paths[0].parent.parent == paths[1].parent.parent
    label = emb.config.label()
    assert set(_rows(tmp_path)) == {(emb.name, label), (emb.name, f"{label} first_stage=dense")}


def _runtime(result: TaskResult, backend: str, precision: str) -> TaskResult:
    result.extra = {
        **result.extra,
        "strategy_label": "mean@-1",
        "runtime": {"backend": backend, "precision": precision},
    }
    return result


def _make(score: float, strategy: dict | None = None) -> TaskResult:
    return TaskResult(
        task_name="tiny",
        task_type="Retrieval",
        split="test",
        scores={"ndcg_at_10": score, "main_score": score},
        main_metric="ndcg_at_10",
        model_name="org/model",
        strategy=strategy or {"pooling": "mean", "layer": -1},
    )


def test_another_backend_or_precision_lands_apart_and_is_labelled(tmp_path):
    reference = _runtime(_make(0.5), "torch", "float32")
    int8 = _runtime(_make(0.6), "onnx", "int8")
    onnx = _runtime(_make(0.55), "onnx", "float32")
    legacy = _make(0.5)  # written before results recorded their runtime: torch at float32
    legacy.extra["strategy_label"] = "mean@-1"
    digest = strategy_digest(reference.strategy)
    assert result_path(tmp_path, reference).parent.name == f"mean--1-{digest}"  # the reference keeps its folder
    assert result_path(tmp_path, legacy) == result_path(tmp_path, reference)
    assert result_path(tmp_path, int8).parent.name == f"mean--1+onnx-int8-{digest}"
    assert result_path(tmp_path, onnx).parent.name == f"mean--1+onnx-float32-{digest}"
    paths = [write_result(r, tmp_path) for r in (reference, int8, onnx)]
    assert len(set(paths)) == 3
    assert _record(paths[1])["extra"]["runtime"] == {"backend": "onnx", "precision": "int8"}
    assert _rows(tmp_path) == {
        ("org/model", "mean@-1"): 0.5,
        ("org/model", "mean@-1 (onnx int8)"): 0.6,
        ("org/model", "mean@-1 (onnx float32)"): 0.55,
    }


def test_an_int8_run_is_recorded_as_such_beside_the_float32_run(task, tokenizer, tmp_path):
    """The runner records what ran the model: float32 on torch keeps its folder; int8 (ONNX Runtime) gets its own."""
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'lmembed[onnx]')")
    from conftest import tiny_model
    from lmembed import Embedder

    model = tiny_model("bert", len(tokenizer))
    options = {"use_cache": False, "show_progress": False}
    reference = Embedder.from_model(model, tokenizer, **options)
    int8 = Embedder.from_model(model, tokenizer, precision="int8", threads=1, **options)
    results = evaluate_strategies(reference, [task], [reference.config])
    results += evaluate_strategies(int8, [task], [int8.config])
    paths = write_all(results, tmp_path)
    assert paths[0] != paths[1] and paths[1].parent.name.startswith(
        reference.config.label().replace("@", "-") + "+onnx-int8-"
    )
    assert _record(paths[0])["extra"]["runtime"] == {"backend": "torch", "precision": "float32"}
    assert _record(paths[1])["extra"]["runtime"] == {"backend": "onnx", "precision": "int8"}
    label = reference.config.label()
    assert set(_rows(tmp_path)) == {(reference.name, label), (reference.name, f"{label} (onnx int8)")}
