"""How a result's texts were read is part of where it lands: a run with chunked documents (``--chunking``) or with
instructions from a table of its own choosing (``--instructions``) writes its own file beside the plain run's, whose
folder is unchanged, and ``lmembed report`` and the eval table label each."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import WORDS
from helpers import random_beir
from lmembed.cli.app import app
from lmembed.encoding.chunking import Chunking
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.report import build_table
from lmembed.evaluation.results import load_results, result_path, strategy_digest, strategy_label
from lmembed.evaluation.runner import evaluate_strategies, write_all
from lmembed.evaluation.tasks.retrieval import RetrievalTask

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def beir(tmp_path):
    """A tiny BEIR folder named as a task the instruction tables know (so ``--instructions e5`` gives it one)."""
    return random_beir(tmp_path / "SciFact", WORDS[9:], docs=12, queries=4, relevant=2, seed=3, lengths=(6, 14))


def _rows(folder) -> dict[tuple[str, str], float]:
    table = build_table(load_results(folder))
    return {row: scores["SciFact"] for row, scores in table.scores.items()}


def _result(**extra) -> TaskResult:
    return TaskResult(
        task_name="SciFact",
        task_type="Retrieval",
        split="test",
        scores={"ndcg_at_10": 0.5, "main_score": 0.5},
        main_metric="ndcg_at_10",
        model_name="org/model",
        strategy={"pooling": "mean", "layer": -1},
        extra={"strategy_label": "mean@-1", **extra},
    )


def test_folder_and_label_name_the_reading_and_leave_a_plain_run_where_it_was(tmp_path):
    digest = strategy_digest({"pooling": "mean", "layer": -1})
    plain = _result(instruction=None, settings={"similarity": "cosine", "top_k": 1000})
    chunked = _result(settings={"chunking": {"aggregate": "maxp", "tokens": 64, "overlap": 32, "late": False}})
    late = _result(settings={"chunking": {"aggregate": "mean", "tokens": 64, "overlap": 0, "late": True}})
    e5 = _result(instructions="e5", instruction="Given a scientific claim, ...")
    both = _result(
        instructions="e5",
        settings={"chunking": {"aggregate": "maxp", "tokens": 64, "overlap": 32, "late": False}},
        runtime={"backend": "onnx", "precision": "int8"},
    )
    assert result_path(tmp_path, plain).parent.name == f"mean--1-{digest}"  # as it always was
    folders = [result_path(tmp_path, r).parent.name for r in (chunked, late, e5, both)]
    assert folders == [
        f"mean--1+maxp64-32-{digest}",
        f"mean--1+mean64-0-late-{digest}",
        f"mean--1+instr-e5-{digest}",
        f"mean--1+maxp64-32+instr-e5+onnx-int8-{digest}",
    ]
    assert [strategy_label(r) for r in (plain, chunked, late, e5, both)] == [
        "mean@-1",
        "mean@-1 (maxp 64/32)",
        "mean@-1 (mean 64/0 late)",
        "mean@-1 (instructions e5)",
        "mean@-1 (maxp 64/32, instructions e5, onnx int8)",
    ]


def test_a_chunked_run_lands_beside_the_plain_run_and_the_report_labels_both(beir, make_embedder, tmp_path):
    emb = make_embedder("bert")
    task = RetrievalTask.from_path(beir, name="SciFact")
    (plain,) = evaluate_strategies(emb, [task], [emb.config])
    (chunked,) = evaluate_strategies(emb, [task.with_chunking(Chunking("maxp", tokens=4, overlap=1))], [emb.config])
    paths = write_all([plain, chunked], tmp_path)
    label = emb.config.label()
    digest = strategy_digest(emb.config.to_dict())
    assert paths[0].parent.name == f"{label.replace('@', '-')}-{digest}"  # the plain run's folder, unchanged
    assert paths[1].parent.name == f"{label.replace('@', '-')}+maxp4-1-{digest}"
    assert _rows(tmp_path) == {
        (emb.name, label): pytest.approx(plain.result.main_score),
        (emb.name, f"{label} (maxp 4/1)"): pytest.approx(chunked.result.main_score),
    }


def _eval(runner: CliRunner, model: str, beir, out, *extra: str) -> str:
    result = runner.invoke(app, ["eval", "--model", model, "--data", str(beir), "-o", str(out), "--no-cache", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def _report_rows(runner: CliRunner, out) -> list[str]:
    report = runner.invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    return [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]


@pytest.mark.parametrize(
    ("flags", "tag", "label"),
    [
        (["--chunking", "maxp", "--chunk-tokens", "4", "--chunk-overlap", "1"], "maxp4-1", "maxp 4/1"),
        (["--instructions", "e5"], "instr-e5", "instructions e5"),
    ],
)
def test_eval_with_chunking_or_instructions_keeps_apart_from_the_plain_run(
    flags, tag, label, beir, make_embedder, tmp_path
):
    """The probe's pairs: ``lmembed eval`` plain, then with ``--chunking`` (or ``--instructions e5``), on one task
    into one folder leave two files; the plain one where a plain run always wrote it, and two report rows."""
    model = str(make_embedder("llama", pooling="mean").save(tmp_path / "tiny"))
    out = tmp_path / "results"
    runner = CliRunner()
    _eval(runner, model, beir, out)
    output = _eval(runner, model, beir, out, *flags)
    assert f"mean@-1 ({label})" in output  # the run's own table says so
    files = sorted(out.rglob("SciFact.json"))
    assert len(files) == 2
    records = {f.parent.name: json.loads(f.read_text())["lmembed"] for f in files}
    digest = strategy_digest(next(iter(records.values()))["strategy"])
    assert set(records) == {f"mean--1-{digest}", f"mean--1+{tag}-{digest}"}
    if tag.startswith("instr"):
        assert records[f"mean--1+{tag}-{digest}"]["extra"]["instructions"] == "e5"
        assert records[f"mean--1+{tag}-{digest}"]["extra"]["instruction"]  # the table's definition was read
        assert not records[f"mean--1-{digest}"]["extra"].get("instruction")
    rows = _report_rows(runner, out)
    for cell in ("| mean@-1 |", f"| mean@-1 ({label}) |"):
        assert any(cell in row for row in rows), rows
