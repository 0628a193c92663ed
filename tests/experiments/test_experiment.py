"""`lmembed experiment` end to end on a tiny model: two training arms × two seeds (plus an arm without
training), per-run metrics and per-query scores, the summary, `lmembed report` on the folder, resuming after
a kill, and file:line errors for a bad experiment file."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.experiments import runner as runner_module
from lmembed.experiments.execute import execute_run
from lmembed.experiments.parallel import Slot, ready, worker_pool, worker_slots
from lmembed.experiments.plan import plan_runs
from lmembed.experiments.report import render_folder
from lmembed.experiments.runner import ExperimentError, run_experiment
from lmembed.experiments.spec import ExperimentSpecError, load_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = [
    ("d1", "the cat sat on the mat"),
    ("d2", "a dog was bad"),
    ("d3", "a man riding a horse"),
    ("d4", "a woman eating food"),
    ("d5", "the gene study result"),
    ("d6", "a great movie"),
    ("d7", "embedding vector search"),
    ("d8", "hello there friend"),
]
QUERIES = [("q1", "cat mat", "d1"), ("q2", "horse riding", "d3"), ("q3", "eating food", "d4"), ("q4", "gene", "d5")]
QUERIES += [("q5", "movie great", "d6"), ("q6", "vector search", "d7")]
STS = [
    ("the cat sat", "a cat sat on the mat", 4.5),
    ("a dog was bad", "the dog was bad", 4.8),
    ("a great movie", "the gene study", 0.2),
    ("a man riding a horse", "a woman riding", 2.5),
    ("hello there", "hello friend", 3.5),
    ("the cell gene", "a great movie", 0.1),
    ("language model", "the language model embedding", 3.9),
]
TRAIN = [
    {"query": "the cat sat on the mat", "positive": "a cat sat on a rug", "negatives": ["the dog was bad"]},
    {"query": "a man riding a horse", "positive": "the man is riding", "negatives": ["a woman eating food"]},
    {"query": "protein gene study", "positive": "the cell gene result", "negatives": ["a great movie"]},
    {"query": "a great movie", "positive": "the movie was great", "negatives": ["the movie was bad"]},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def workspace(tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A saved tiny encoder, a tiny BEIR folder and STS file, training rows, and a private embedding cache."""
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    Embedder.from_model(
        tiny_model("bert", len(tokenizer)), tokenizer, EmbeddingConfig(pooling="mean"), use_cache=False
    ).save(tmp_path / "tiny")
    beir = tmp_path / "beir"
    _write_jsonl(beir / "corpus.jsonl", [{"_id": i, "title": "", "text": t} for i, t in DOCS])
    _write_jsonl(beir / "queries.jsonl", [{"_id": q, "text": t} for q, t, _ in QUERIES])
    (beir / "qrels").mkdir()
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, _, d in QUERIES)
    )
    _write_jsonl(tmp_path / "sts.jsonl", [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in STS])
    _write_jsonl(tmp_path / "train.jsonl", TRAIN)
    return tmp_path


def _spec(root: Path, **changes) -> Path:
    spec = {
        "name": "tiny",
        "claim": "mean pooling beats CLS pooling after the same training",
        "model": str(root / "tiny"),
        "device": "cpu",
        "seeds": [0, 1],
        "train": {
            "data": [str(root / "train.jsonl")],
            "steps": 3,
            "batch_size": 4,
            "lr": 5e-3,
            "warmup_steps": 1,
            "lora": False,
        },
        "evaluate": {
            "tasks": [
                {"path": str(root / "beir"), "type": "Retrieval", "name": "Toy"},
                {"path": str(root / "sts.jsonl"), "type": "STS", "name": "ToySTS"},
            ],
            "batch_size": 8,
        },
        "arms": {
            "untrained": {"strategy": {"pooling": "mean"}},
            "mean": {"strategy": {"pooling": "mean"}, "train": {}},
            "cls": {"strategy": {"pooling": "cls"}, "train": {}},
        },
        "compare": [
            {"a": "mean", "b": "cls", "claim": "better"},
            {"a": "mean", "b": "untrained"},
            {"a": "cls", "b": "untrained", "minus": ["mean", "untrained"]},  # (cls − untrained) − (mean − untrained)
        ],
    }
    if "arms" in changes:
        spec.pop("compare")  # default: every arm against the first
    spec.update(changes)
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_two_arms_two_seeds_end_to_end(workspace: Path):
    out = workspace / "out"
    result = CliRunner().invoke(app, ["experiment", str(_spec(workspace)), "-o", str(out)])
    assert result.exit_code == 0, result.output

    # one run for the arm without training, one per seed for each training arm
    folders = sorted(str(p.relative_to(out / "runs")) for p in (out / "runs").glob("*/*"))
    assert folders == ["cls/seed-0", "cls/seed-1", "mean/seed-0", "mean/seed-1", "untrained/eval"]
    record = json.loads((out / "runs/mean/seed-1/run.json").read_text())
    assert record["seed"] == 1 and record["trained"] and record["steps"] == 3 and len(record["losses"]["train"]) == 3
    assert record["strategy"]["pooling"] == "mean"
    toy = record["tasks"]["Toy"]
    assert toy["main_metric"] == "ndcg_at_10" and toy["items"] == 6 and "nauc_ndcg_at_10_max" in toy["scores"]
    items = json.loads((out / "runs/mean/seed-1/items.json").read_text())
    assert items["Toy"]["ids"] == [q for q, _, _ in QUERIES] and items["Toy"]["statistic"] == "mean"
    assert sum(items["Toy"]["values"]) / 6 == pytest.approx(toy["main_score"], abs=1e-5)
    assert items["ToySTS"]["statistic"] == "spearman" and items["ToySTS"]["reference"] == [s for *_, s in STS]
    assert json.loads((out / "runs/cls/seed-0/run.json").read_text())["strategy"]["pooling"] == "cls"

    summary = json.loads((out / "summary.json").read_text())
    cell = summary["scores"]["mean"]["Toy"]
    seeds = [
        json.loads((out / f"runs/mean/seed-{s}/run.json").read_text())["tasks"]["Toy"]["main_score"] for s in (0, 1)
    ]
    assert cell["n"] == 2 and cell["values"] == seeds and cell["mean"] == pytest.approx(sum(seeds) / 2)
    assert summary["scores"]["untrained"]["Toy"]["n"] == 1 and summary["scores"]["untrained"]["Toy"]["std"] == 0.0
    compared = {(c["a"], c["b"], c["task"]): c for c in summary["comparisons"]}
    assert set(compared) == {
        ("mean", "cls", "Toy"),
        ("mean", "cls", "ToySTS"),
        ("mean", "cls", "train loss"),
        ("mean", "untrained", "Toy"),
        ("mean", "untrained", "ToySTS"),
        ("cls", "untrained", "Toy"),  # the gap against mean's gap; no train loss (untrained has none)
        ("cls", "untrained", "ToySTS"),
    }
    steps = len(json.loads((out / "runs/mean/seed-0/run.json").read_text())["losses"]["train"])
    assert compared[("mean", "cls", "train loss")]["items"] == max(1, steps // math.isqrt(steps))  # step blocks
    toy_pair = compared[("mean", "cls", "Toy")]
    assert toy_pair["items"] == 6 and toy_pair["low"] <= toy_pair["difference"] <= toy_pair["high"]
    assert toy_pair["verdict"] in ("holds", "reversed", "not distinguishable") and 0 < toy_pair["p_value"] <= 1
    judged = [c for c in summary["comparisons"] if c.get("p_value") is not None]
    assert all(c["p_value"] <= c["p_holm"] <= 1 for c in judged)  # Holm over the experiment's comparisons
    assert max(c["p_holm"] / c["p_value"] for c in judged) > 1  # the family made a difference
    assert toy_pair["difference"] == pytest.approx(cell["mean"] - summary["scores"]["cls"]["Toy"]["mean"], abs=1e-5)
    assert compared[("mean", "untrained", "Toy")]["claim"] == "none"
    for task in ("Toy", "ToySTS"):  # (cls − untrained) − (mean − untrained) is cls − mean: the pair, negated
        gaps, pair = compared[("cls", "untrained", task)], compared[("mean", "cls", task)]
        assert gaps["minus"] == ["mean", "untrained"] and gaps["items"] == pair["items"]
        assert gaps["difference"] == pytest.approx(-pair["difference"], abs=1e-9)
        assert (gaps["low"], gaps["high"]) == pytest.approx((-pair["high"], -pair["low"]), abs=1e-9)
    toy_gaps = compared[("cls", "untrained", "Toy")]
    assert toy_gaps["p_value"] == pytest.approx(compared[("mean", "cls", "Toy")]["p_value"])  # mean: the same swaps
    assert summary["runs"]["missing"] == [] and len(summary["runs"]["finished"]) == 5
    markdown = (out / "summary.md").read_text()
    assert "## Comparisons" in markdown and "mean ± sample std" in markdown and "| p (Holm) |" in markdown
    assert (out / "summary.png").stat().st_size > 0
    assert "| (cls − untrained) | (mean − untrained) | Toy | none |" in markdown

    # `lmembed report` renders an experiment folder too
    report = render_folder(out, workspace / "rendered")
    assert report.markdown == markdown
    assert (workspace / "rendered/summary.png").is_file() and (workspace / "rendered/summary.json").is_file()
    assert report.table.scores[("mean", "2 run(s)")]["Toy"] == pytest.approx(cell["mean"])
    cli = CliRunner().invoke(app, ["report", str(out)])
    assert cli.exit_code == 0 and "Experiment: tiny" in cli.output


def test_resume_after_a_kill_skips_finished_runs(workspace: Path, monkeypatch: pytest.MonkeyPatch):
    spec = load_spec(_spec(workspace, seeds=[0, 1], arms={"base": {}, "tuned": {"train": {}}}))
    out = workspace / "out"
    real = runner_module.execute_run
    calls: list[str] = []

    def killed_during_third(spec_, run, tasks, output):
        calls.append(run.id)
        if len(calls) == 3:  # the third run dies part way: its folder is half written, no run.json
            run.folder.mkdir(parents=True, exist_ok=True)
            (run.folder / "train").mkdir()
            raise KeyboardInterrupt
        return real(spec_, run, tasks, output)

    monkeypatch.setattr(runner_module, "execute_run", killed_during_third)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(spec, out)
    assert calls == ["base/eval", "tuned/seed-0", "tuned/seed-1"]
    finished = {run.id: run.run_file.stat().st_mtime_ns for run in plan_runs(spec, out) if run.finished}
    assert set(finished) == {"base/eval", "tuned/seed-0"}

    with pytest.raises(ExperimentError, match="--resume"):  # a folder in use is not overwritten silently
        run_experiment(spec, out)

    calls.clear()
    outcome = run_experiment(spec, out, resume=True)
    assert calls == ["tuned/seed-1"]  # only the unfinished run, started over
    assert outcome.reused == ["base/eval", "tuned/seed-0"] and outcome.finished == ["tuned/seed-1"]
    assert {run.id: run.run_file.stat().st_mtime_ns for run in plan_runs(spec, out) if run.id in finished} == finished
    assert all(run.finished for run in plan_runs(spec, out))
    assert json.loads((out / "summary.json").read_text())["scores"]["tuned"]["Toy"]["n"] == 2

    # a changed setting makes the affected runs stale: they run again, the others are kept
    calls.clear()
    changed = load_spec(_spec(workspace, seeds=[0, 1], arms={"base": {}, "tuned": {"train": {"steps": 2}}}))
    run_experiment(changed, out, resume=True)
    assert calls == ["tuned/seed-0", "tuned/seed-1"]


def _two_untrained_arms(workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """An experiment of two arms without training (one run each), run once; and the list its reruns go to."""
    spec = load_spec(_spec(workspace, seeds=[0], arms={"mean": {}, "cls": {"strategy": {"pooling": "cls"}}}))
    out = workspace / "out"
    run_experiment(spec, out)
    calls: list[str] = []
    real = runner_module.execute_run

    def counted(spec_, run, tasks, output):
        calls.append(run.id)
        return real(spec_, run, tasks, output)

    monkeypatch.setattr(runner_module, "execute_run", counted)
    return spec, out, {run.id: run for run in plan_runs(spec, out)}, calls


def test_a_run_whose_files_changed_is_run_again_on_resume_naming_the_file(workspace, monkeypatch, caplog):
    """A finished run's run.json records its items.json's sha256 and has a checked shape: an items.json changed
    afterwards, a run.json that is not one, or one written without the digest (an older lmembed) leaves the run
    unfinished, said once naming the file and the field, and --resume runs it again; the summary is whole."""
    spec, out, runs, calls = _two_untrained_arms(workspace, monkeypatch)
    mean, cls = runs["mean/eval"], runs["cls/eval"]
    assert mean.finished and json.loads(mean.run_file.read_text())["files"].keys() == {"items.json"}
    items = json.loads(mean.items_file.read_text())
    items["Toy"]["values"][0] = 1.0  # a score edited by hand
    mean.items_file.write_text(json.dumps(items))
    cls.run_file.write_text("[1, 2]")
    with caplog.at_level("WARNING", logger="lmembed.experiments.plan"):
        assert not mean.finished and not cls.finished
        assert not mean.finished  # said once
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "items.json: its sha256 is not the one" in said[0] and "(files.items.json)" in said[0]
    assert "run.json: the whole file: Input should be a valid dictionary" in said[1]
    assert all("is started over" in message for message in said)
    run_experiment(spec, out, resume=True)
    assert sorted(calls) == ["cls/eval", "mean/eval"] and mean.finished and cls.finished
    assert json.loads((out / "summary.json").read_text())["scores"]["mean"]["Toy"]["n"] == 1

    record = json.loads(mean.run_file.read_text())
    del record["files"]  # as run.json was before it recorded the digest
    mean.run_file.write_text(json.dumps(record))
    caplog.clear()
    with caplog.at_level("WARNING", logger="lmembed.experiments.plan"):
        assert not mean.finished
    assert "run.json: files: Field required" in caplog.records[0].getMessage()


def test_a_run_whose_items_are_gone_is_run_again(workspace, monkeypatch, caplog):
    """A recorded file that is missing ended in an internal FileNotFoundError (the shared digest check hashed it
    without looking); it is a refusal naming the file and its record, and the run counts as unfinished."""
    spec, out, runs, calls = _two_untrained_arms(workspace, monkeypatch)
    runs["mean/eval"].items_file.unlink()
    with caplog.at_level("WARNING", logger="lmembed.experiments.plan"):
        assert not runs["mean/eval"].finished
    assert "items.json: " in caplog.records[0].getMessage()
    assert "records it (files.items.json), but it is not there" in caplog.records[0].getMessage()
    run_experiment(spec, out, resume=True)
    assert calls == ["mean/eval"] and runs["mean/eval"].finished


def test_per_item_scores_of_another_shape_are_refused_naming_the_field(workspace, monkeypatch):
    from lmembed.experiments.plan import RunFileError
    from lmembed.io import sha256_file

    spec, out, runs, calls = _two_untrained_arms(workspace, monkeypatch)
    mean = runs["mean/eval"]
    items = json.loads(mean.items_file.read_text())
    items["Toy"]["values"].pop()  # one value fewer than the items, and the digest made to match
    mean.items_file.write_text(json.dumps(items))
    record = json.loads(mean.run_file.read_text())
    record["files"]["items.json"] = sha256_file(mean.items_file)
    mean.run_file.write_text(json.dumps(record))
    assert mean.finished
    with pytest.raises(RunFileError, match=r"items.json: Toy: ids, values and reference must have one"):
        run_experiment(spec, out, resume=True)
    assert calls == []


def test_report_refuses_a_summary_of_another_shape_and_a_folder_without_results(workspace, monkeypatch):
    _, out, _, _ = _two_untrained_arms(workspace, monkeypatch)
    summary = json.loads((out / "summary.json").read_text())
    summary["scores"]["mean"]["Toy"]["interval"] = [0.1]
    (out / "summary.json").write_text(json.dumps(summary))
    elsewhere = workspace / "rendered"
    result = CliRunner().invoke(app, ["report", str(out), "-o", str(elsewhere)])
    assert result.exit_code == 2, result.output
    assert "summary.json: scores.mean.Toy.interval: List should have at least 2 items" in result.output
    summary["scores"]["mean"]["Toy"]["interval"] = [0.1, 0.2]
    assert summary["format"] == 1
    for form in (2, True, "1"):  # a newer lmembed's layout is not read as this one's
        (out / "summary.json").write_text(json.dumps({**summary, "format": form}))
        result = CliRunner().invoke(app, ["report", str(out), "-o", str(elsewhere)])
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.replace("│", " ").split())
        assert f"summary.json: format: {form!r}; this lmembed reads experiment summaries of format 1" in said, said
    assert not elsewhere.exists() or not any(elsewhere.iterdir())
    empty = workspace / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["report", str(empty)])
    said = " ".join(result.output.replace("│", " ").split())  # the refusal comes in a box, wrapped
    assert result.exit_code == 2 and "no results in it" in said and "RESULTS_DIR" in said and not any(empty.iterdir())


def test_the_dtype_is_part_of_a_run_s_fingerprint(workspace: Path):
    """A run at bfloat16 is never reused for float32 (or the other way) on ``--resume``; float32, the default, leaves
    the digest as it was before dtype joined it, so runs recorded then still count as finished."""
    arms = {"base": {}, "tuned": {"train": {}}}
    keys = {}
    for dtype in ("float32", "bfloat16", "float16"):
        spec = load_spec(_spec(workspace, seeds=[0], arms=arms, dtype=dtype))
        keys[dtype] = {run.id: run.key for run in plan_runs(spec, workspace / "out")}
        if dtype == "float32":
            assert all(
                arm.fingerprint(spec.evaluation, 0) == arm.fingerprint(spec.evaluation, 0, "float32")
                for arm in spec.arms
            )
    assert set(keys["float32"]) == set(keys["bfloat16"]) == {"base/eval", "tuned/seed-0"}
    for run_id in keys["float32"]:
        assert len({keys[dtype][run_id] for dtype in keys}) == 3, run_id


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: 12 s more, same rule
def test_a_run_another_process_is_running_is_left_alone(workspace: Path, workers: int):
    """Two processes on one output folder: a run whose lock another process holds is not deleted or started over
    (it is listed as not run, with why); once that process is gone (killed: the system drops its lock), --resume
    runs it."""
    spec = load_spec(_spec(workspace, seeds=[0], arms={"base": {}, "tuned": {"train": {}}}))
    out = workspace / "out"
    tuned = next(run for run in plan_runs(spec, out) if run.id == "tuned/seed-0")
    (tuned.folder / "train").mkdir(parents=True)
    partial = tuned.folder / "train" / "step-1"
    partial.write_text("the other process's work")
    lock = out / ".locks" / "tuned.seed-0.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        lines: list[str] = []
        outcome = run_experiment(spec, out, resume=True, progress=lines.append, workers=workers)
        assert outcome.finished == ["base/eval"]
        assert outcome.skipped["tuned/seed-0"] == f"tuned/seed-0: another process is running it (it holds {lock})"
        assert partial.read_text() == "the other process's work"
        assert f"    tuned/seed-0: not run (tuned/seed-0: another process is running it (it holds {lock}))" in lines
        assert json.loads((out / "summary.json").read_text())["runs"]["missing"] == ["tuned/seed-0"]
    finally:
        holder.kill()
        holder.wait()
    outcome = run_experiment(spec, out, resume=True)
    assert outcome.finished == ["tuned/seed-0"] and outcome.reused == ["base/eval"] and not partial.exists()


def test_a_run_another_process_finished_after_this_one_planned_it_is_kept(workspace: Path):
    spec = load_spec(_spec(workspace, seeds=[0], arms={"base": {}}))
    out = workspace / "out"
    run_experiment(spec, out)
    (base,) = plan_runs(spec, out)
    stamp = base.run_file.stat().st_mtime_ns
    record = execute_run(spec, base, [], out)  # what a process that planned it before it finished goes on to do
    assert record == json.loads(base.run_file.read_text()) and base.run_file.stat().st_mtime_ns == stamp


HOLD_LOCK = (  # another process's run: holds the lock until killed
    "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
    "print('locked', flush=True); time.sleep(120)"
)


def test_budget_skips_runs_that_do_not_fit(workspace: Path):
    spec = load_spec(_spec(workspace, seeds=[0, 1, 2], arms={"tuned": {"train": {}}}))
    lines: list[str] = []
    outcome = run_experiment(spec, workspace / "out", budget_minutes=0.0, progress=lines.append)
    assert outcome.finished == ["tuned/seed-0"]  # the first run is timed; nothing else fits in no time
    assert set(outcome.skipped) == {"tuned/seed-1", "tuned/seed-2"}
    assert "needs ~" in outcome.skipped["tuned/seed-1"]
    assert any(line.startswith("budget: will not fit: tuned/seed-1") for line in lines)
    assert json.loads((workspace / "out/summary.json").read_text())["runs"]["missing"] == sorted(outcome.skipped)


def test_zero_budget_on_resume_starts_no_run_of_an_untimed_backbone(workspace: Path, monkeypatch):
    """`--resume --budget-minutes 0` only writes the summary: a run on a backbone with nothing timed (no
    estimate) is not started once the experiment has finished runs (it once was, deleting the folder of a run
    another process was still training in)."""
    shutil.copytree(workspace / "tiny", workspace / "tiny2")
    arms = {"base": {}, "other": {"model": str(workspace / "tiny2"), "train": {}}}
    spec = load_spec(_spec(workspace, seeds=[0], arms=arms))
    run_experiment(spec, workspace / "out", only=["base"])
    calls: list[str] = []
    monkeypatch.setattr(runner_module, "execute_run", lambda spec_, run, tasks, output: calls.append(run.id))
    outcome = run_experiment(spec, workspace / "out", resume=True, budget_minutes=0.0)
    assert calls == [] and outcome.reused == ["base/eval"]
    assert list(outcome.skipped) == ["other/seed-0"]
    assert json.loads((workspace / "out/summary.json").read_text())["runs"]["missing"] == ["other/seed-0"]


def test_budget_estimates_a_run_from_its_own_backbone_only(tmp_path: Path):
    """A run is estimated from its arm's runs, else from arms on the same backbone; a backbone not timed yet has
    no estimate (a 135M decoder's seconds are not a 22M encoder's)."""
    arms = {
        "big": {"model": "big-model", "train": {"steps": 4}},
        "small": {"model": "small-model", "train": {"steps": 2}},
        "small-long": {"model": "small-model", "strategy": {"max_length": 64}},
    }
    spec = load_spec(_spec(tmp_path, seeds=[0], arms=arms))
    backbones = {arm.name: arm.model for arm in spec.arms}
    runs = {run.arm.name: run for run in plan_runs(spec, tmp_path / "out")}
    big = {"arm": "big", "steps": 4, "seconds": {"train": 40.0, "evaluate": 30.0}}
    assert runner_module.estimate_seconds(runs["big"], [big], backbones) == pytest.approx(30.0 + 10.0 * 4)
    assert runner_module.estimate_seconds(runs["small"], [big], backbones) is None
    assert runner_module.estimate_seconds(runs["small-long"], [big], backbones) is None
    small = {"arm": "small", "steps": 2, "seconds": {"train": 2.0, "evaluate": 3.0}}
    assert runner_module.estimate_seconds(runs["small-long"], [big, small], backbones) == pytest.approx(3.0)
    assert runner_module.estimate_seconds(runs["small"], [big, small], backbones) == pytest.approx(3.0 + 1.0 * 2)
    # an evaluation-only arm timed on the backbone: a training arm of that backbone takes its per-step time elsewhere
    long = {"arm": "small-long", "steps": 0, "seconds": {"train": 0.0, "evaluate": 5.0}}
    assert runner_module.estimate_seconds(runs["small"], [big, long], backbones) is None
    assert runner_module.estimate_seconds(runs["small"], [big, long, small], backbones) == pytest.approx(3.0 + 2.0)


@pytest.mark.slow  # 20 s: two processes each load and train; `pytest -m slow` runs it
def test_workers_give_the_runs_one_process_gives(workspace: Path):
    spec = load_spec(_spec(workspace))
    lines: list[str] = []
    parallel = run_experiment(spec, workspace / "par", workers=2, progress=lines.append)
    serial = run_experiment(spec, workspace / "ser")
    assert sorted(parallel.finished) == sorted(serial.finished) and len(serial.finished) == 5
    assert any(line.startswith("2 workers: cpu (") for line in lines)
    assert sum(line.endswith("(started)") for line in lines) == 5
    for run in plan_runs(spec, workspace / "ser"):
        ours = json.loads((workspace / "par" / run.run_file.relative_to(workspace / "ser")).read_text())
        theirs = json.loads(run.run_file.read_text())
        assert ours["key"] == theirs["key"]
        for task, cell in theirs["tasks"].items():
            assert ours["tasks"][task]["main_score"] == pytest.approx(cell["main_score"], abs=1e-4)
        for stage, losses in theirs["losses"].items():
            assert ours["losses"][stage] == pytest.approx(losses, rel=1e-4)
    assert (workspace / "par/summary.json").is_file()
    again = run_experiment(spec, workspace / "par", resume=True, workers=2)
    assert again.finished == [] and len(again.reused) == 5
    with pytest.raises(ExperimentError, match="one worker"):
        run_experiment(spec, workspace / "other", workers=2, budget_minutes=5)
    cli = CliRunner().invoke(app, ["experiment", str(_spec(workspace)), "--workers", "2", "--budget-minutes", "5"])
    assert cli.exit_code == 2 and "--workers" in cli.output


def test_sigterm_stops_the_worker_processes_at_once():
    """SIGTERM during the parallel runs ends the workers too, at once: left running, they wrote on into the run
    folders beside a resumed experiment (the pool's own exit waits for their running tasks)."""
    started = time.perf_counter()
    before = signal.getsignal(signal.SIGTERM)  # Ray, once started in this process, has a handler of its own
    with (
        pytest.raises(KeyboardInterrupt, match="signal"),
        worker_pool(2, multiprocessing.get_context("spawn")) as pool,
    ):
        futures = [pool.submit(time.sleep, 60) for _ in range(2)]
        processes = list(pool._processes.values())
        assert len(processes) == 2
        while not all(future.running() for future in futures):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises here
    assert time.perf_counter() - started < 20
    # the pool's executor thread may reap a worker concurrently with the pool's own join; give the reaping a moment
    gone = time.perf_counter() + 5
    while any(process.is_alive() for process in processes) and time.perf_counter() < gone:
        time.sleep(0.05)
    assert not any(process.is_alive() for process in processes)
    assert signal.getsignal(signal.SIGTERM) is before  # the block's handler is gone, the one before is back
    with worker_pool(1, multiprocessing.get_context("spawn")) as pool:  # a block that ends well waits for its tasks
        assert pool.submit(pow, 2, 5).result() == 32


def test_worker_slots_split_the_cores_or_take_one_gpu_each():
    assert worker_slots("cpu", 2, cores=2) == [Slot("cpu", 1)] * 2
    assert worker_slots("cpu", 3, cores=8) == [Slot("cpu", 2)] * 3
    assert worker_slots("cpu", 4, cores=2) == [Slot("cpu", 1)] * 4
    assert [s.device for s in worker_slots("cuda", 3, cores=8, gpus=2)] == ["cuda:0", "cuda:1", "cuda:0"]
    assert worker_slots("auto", 2, cores=4, gpus=0) == [Slot("cpu", 2)] * 2
    with pytest.raises(ValueError, match="no CUDA GPU"):
        worker_slots("cuda", 2, gpus=0)


def test_seeds_of_a_recipe_arm_that_prepares_data_wait_for_the_first():
    preparing = SimpleNamespace(name="recipe", recipe={"prepare": [{"name": "mined"}]}, model_from=None)
    plain = SimpleNamespace(name="plain", recipe=None, model_from=None)
    first, second = (SimpleNamespace(arm=preparing, id=f"recipe/seed-{s}") for s in (0, 1))
    other = SimpleNamespace(arm=plain, id="plain/seed-0")
    spec, out = None, Path(".")  # neither is read for arms without model_from
    assert ready(spec, second, out, [first], set()) is False  # the first seed is preparing the shared files
    assert ready(spec, second, out, [other], set()) is True
    assert ready(spec, second, out, [first], {"recipe"}) is True  # prepared by a finished run
    assert ready(spec, other, out, [first, second], set()) is True


def test_only_runs_the_named_arms(workspace: Path):
    spec = load_spec(_spec(workspace))
    outcome = run_experiment(spec, workspace / "out", only=["untrained"])
    assert outcome.finished == ["untrained/eval"]
    with pytest.raises(ExperimentError, match="no such arm"):
        run_experiment(spec, workspace / "out2", only=["nope"])


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


def test_spec_errors_name_file_and_line(tmp_path: Path):
    good = {
        "model": "minilm",
        "evaluate": {"tasks": ["scifact"]},
        "arms": {"a": {"strategy": {"pooling": "mean"}}, "b": {"strategy": {"pooling": "cls"}}},
    }

    def write(data: dict) -> Path:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    cases = [
        ({**good, "arms": {"a": {"strategy": {"pooing": "mean"}}}}, "pooing", "unknown strategy key 'pooing'"),
        (
            {**good, "arms": {"a": {"strategy": {"pooling": "median"}}}},
            "pooling: median",
            "pooling='median' is unknown",
        ),
        ({**good, "arms": {"a": {"strategy": {"layer": "top"}}}}, "layer: top", "layer 'top'"),
        ({**good, "arms": {"a": {"train": {"steps": 0, "data": ["x"]}}}}, "steps: 0", "steps=0 must be >= 1"),
        ({**good, "arms": {"a": {"train": {"steps": 5}}}}, "train:", "needs 'data'"),
        ({**good, "compare": [{"a": "a", "b": "zz"}]}, "b: zz", "'zz' is not an arm"),
        ({**good, "compare": [{"a": "a", "b": "b", "minus": ["a", "zz"]}]}, "minus:", "'zz' is not an arm"),
        ({**good, "compare": [{"a": "a", "b": "b", "minus": ["a"]}]}, "minus:", "must be two arms [c, d]"),
        ({**good, "seeds": [1, 1]}, "seeds:", "listed twice"),
        ({**good, "evaluate": {"task": ["scifact"]}}, "task:", "unknown evaluate key 'task'"),
        (
            {**good, "arms": {"a": {"model_from": {"arm": "b", "stage": "s"}}, "b": {}}},
            "model_from:",
            "not a recipe arm",
        ),
    ]
    for data, marker, message in cases:
        path = write(data)
        with pytest.raises(ExperimentSpecError) as info:
            load_spec(path)
        assert f"{path}:{_line_of(path, marker)}:" in str(info.value), (marker, str(info.value))
        assert message in str(info.value), str(info.value)

    path = tmp_path / "broken.yaml"
    path.write_text("model: minilm\narms:\n  a: {strategy: [\n")
    with pytest.raises(ExperimentSpecError, match=rf"{path}:\d+: invalid YAML"):
        load_spec(path)
    spec = load_spec(write(good), ["seeds=[3, 4]", "arms.b.strategy.max_length=64", "device=cuda"])
    assert spec.seeds == (3, 4) and spec.arm("b").strategy["max_length"] == 64 and spec.device == "cuda"
    with pytest.raises(ExperimentSpecError, match="--set 'seeds'"):
        load_spec(write(good), ["seeds"])
    assert [(c.a, c.b, c.expected) for c in spec.compare] == [("b", "a", 0)]  # default: each arm vs the first
    gaps = load_spec(write({**good, "compare": [{"a": "b", "b": "a", "minus": ["a", "b"], "claim": "better"}]}))
    assert [(c.a, c.b, c.minus, c.expected) for c in gaps.compare] == [("b", "a", ("a", "b"), 1)]
    result = CliRunner().invoke(app, ["experiment", str(write({**good, "arms": {}}))])
    assert result.exit_code == 2 and "arms: must be a mapping" in result.output


def test_arms_without_training_share_forward_passes(workspace: Path, monkeypatch: pytest.MonkeyPatch):
    from lmembed.encoding.engine import EncodingEngine

    passes = []
    real = EncodingEngine.forward_pool

    def counted(self, *args, **kwargs):
        passes.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(EncodingEngine, "forward_pool", counted)
    layers = {
        "last": {"strategy": {"layer": -1}},
        "mid": {"strategy": {"layer": "mid"}},
        "first": {"strategy": {"layer": 0}},
    }
    one = run_experiment(load_spec(_spec(workspace, arms={"mid": layers["mid"]})), workspace / "one")
    single = len(passes)
    passes.clear()
    three = run_experiment(load_spec(_spec(workspace, arms=layers)), workspace / "three")
    assert single > 0 and len(passes) == single  # three strategies, one set of forward passes
    assert three.summary["scores"]["mid"]["Toy"]["mean"] == one.summary["scores"]["mid"]["Toy"]["mean"]
    strategies = {a: json.loads((workspace / f"three/runs/{a}/eval/run.json").read_text())["strategy"] for a in layers}
    assert [strategies[a]["layer"] for a in ("last", "mid", "first")] == [-1, 1, 0]  # two layers: "mid" is 1


@pytest.mark.slow
def test_resume_after_sigkill_in_another_process(workspace: Path):
    """The same as the in-process interruption above, with a real `kill -9` of the running experiment."""
    import signal
    import subprocess
    import sys
    import time

    spec_file = _spec(workspace, seeds=[0, 1, 2, 3], arms={"tuned": {"train": {"steps": 40}}})
    out = workspace / "out"
    code = (
        "from lmembed.experiments.runner import run_experiment\n"
        "from lmembed.experiments.spec import load_spec\n"
        f"run_experiment(load_spec({str(spec_file)!r}), {str(out)!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"})
    first = out / "runs/tuned/seed-0/run.json"
    deadline = time.time() + 300
    while not first.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first run never finished"
    child.send_signal(signal.SIGKILL)
    child.wait()
    spec = load_spec(spec_file)
    finished = {run.id: run.run_file.stat().st_mtime_ns for run in plan_runs(spec, out) if run.finished}
    assert "tuned/seed-0" in finished and len(finished) < 4
    outcome = run_experiment(spec, out, resume=True)
    assert sorted(outcome.reused) == sorted(finished) and len(outcome.finished) == 4 - len(finished)
    assert {run.id: run.run_file.stat().st_mtime_ns for run in plan_runs(spec, out) if run.id in finished} == finished


RUN_VALUES = {
    # each was believed: a NaN score ended in an internal TypeError in the summary, 1e9 showed as an nDCG of 10^11,
    # an infinite time left every later run "not started", a negative one gave a negative budget
    "a NaN score": (lambda r: r["tasks"]["Toy"].update(main_score=float("nan")), "tasks.Toy.main_score"),
    "a score past any": (lambda r: r["tasks"]["Toy"].update(main_score=1e9), "tasks.Toy.main_score"),
    "negative steps": (lambda r: r.update(steps=-5), "steps"),
    "infinite seconds": (lambda r: r["seconds"].update(total=float("inf")), "seconds.total"),
    "negative seconds": (lambda r: r["seconds"].update(total=-1e9), "seconds.total"),
}


@pytest.mark.parametrize("case", RUN_VALUES)
def test_a_run_record_of_impossible_values_is_run_again_naming_the_field(workspace, monkeypatch, caplog, case):
    spec, out, runs, calls = _two_untrained_arms(workspace, monkeypatch)
    mean = runs["mean/eval"]
    record = json.loads(mean.run_file.read_text())
    change, field = RUN_VALUES[case]
    change(record)
    mean.run_file.write_text(json.dumps(record))
    with caplog.at_level("WARNING", logger="lmembed.experiments.plan"):
        assert not mean.finished
    assert f"run.json: {field}" in caplog.records[0].getMessage(), caplog.records[0].getMessage()
    run_experiment(spec, out, resume=True)
    assert calls == ["mean/eval"] and mean.finished
