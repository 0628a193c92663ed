"""Result files in MTEB's layout (readable by MTEB itself) and the comparison report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.report import build_table, render_report, table_markdown
from lmembed.evaluation.results import (
    load_results,
    read_result,
    result_path,
    results_markdown,
    strategy_digest,
    strategy_slug,
    write_result,
)


def make_result(
    task: str = "SciFact",
    task_type: str = "Retrieval",
    score: float = 0.64508,
    model: str = "sentence-transformers/all-MiniLM-L6-v2",
    strategy: dict | None = None,
) -> TaskResult:
    main = {"Retrieval": "ndcg_at_10", "STS": "cosine_spearman", "Classification": "accuracy"}[task_type]
    return TaskResult(
        task_name=task,
        task_type=task_type,
        split="test",
        scores={main: score, "other_metric": np.float32(0.5), "main_score": score},
        main_metric=main,
        evaluation_time=12.5,
        model_name=model,
        strategy=strategy if strategy is not None else {"pooling": "mean", "layer": -1},
        extra={"timings": {"search_s": 0.1}, "languages": ["eng-Latn"], "dataset_revision": "sha256:abc"},
    )


def test_layout_and_json_keys(tmp_path: Path) -> None:
    path = write_result(make_result(), tmp_path)
    assert path == tmp_path / "sentence-transformers__all-MiniLM-L6-v2" / "layer=-1_pooling=mean" / "SciFact.json"
    assert path == result_path(tmp_path, make_result())
    data = json.loads(path.read_text())
    assert {"dataset_revision", "task_name", "mteb_version", "scores", "evaluation_time"} <= set(data)
    entry = data["scores"]["test"][0]
    assert entry["hf_subset"] == "default" and entry["languages"] == ["eng-Latn"]
    assert entry["main_score"] == 0.64508 and entry["ndcg_at_10"] == 0.64508
    assert entry["other_metric"] == 0.5  # numpy scalars become plain JSON numbers
    assert data["lmembed"]["task_type"] == "Retrieval"
    assert [p.name for p in path.parent.iterdir()] == ["SciFact.json"]  # no temp files left behind


def test_round_trip(tmp_path: Path) -> None:
    original = make_result()
    loaded = read_result(write_result(original, tmp_path))
    assert loaded.task_name == "SciFact" and loaded.task_type == "Retrieval" and loaded.split == "test"
    assert loaded.main_score == 0.64508 and loaded.scores["ndcg_at_10"] == 0.64508
    assert loaded.main_metric == "ndcg_at_10"
    assert loaded.model_name == original.model_name and loaded.strategy == original.strategy
    assert loaded.extra["timings"] == {"search_s": 0.1}
    assert loaded.evaluation_time == 12.5


def test_overwrite_is_atomic_and_complete(tmp_path: Path) -> None:
    write_result(make_result(score=0.1), tmp_path)
    path = write_result(make_result(score=0.2), tmp_path)
    assert read_result(path).main_score == 0.2
    assert len(list(path.parent.iterdir())) == 1


def test_mteb_can_load_our_file(tmp_path: Path) -> None:
    results_module = pytest.importorskip("mteb.results")
    path = write_result(make_result(), tmp_path)
    loaded = results_module.TaskResult.from_disk(path)
    assert loaded.task_name == "SciFact"
    assert loaded.scores["test"][0]["main_score"] == 0.64508
    assert loaded.get_score() == pytest.approx(0.64508)
    assert loaded.eval_splits == ["test"] and loaded.hf_subsets == ["default"]


def test_mteb_validates_our_file_against_its_task_metadata(tmp_path: Path) -> None:
    mteb = pytest.importorskip("mteb")
    loaded = mteb.results.TaskResult.from_disk(write_result(make_result(), tmp_path))
    filtered = loaded.validate_and_filter_scores(mteb.get_task("SciFact"))
    assert filtered.scores["test"][0]["main_score"] == 0.64508  # split and subset are MTEB's


def test_reads_files_written_by_mteb(tmp_path: Path) -> None:
    path = tmp_path / "BAAI__bge-small-en-v1.5" / "5c38ec7c" / "STS12.json"
    path.parent.mkdir(parents=True)
    mteb_file = {
        "dataset_revision": "a0d554a64d88156834ff5ae9920b964011b16384",
        "task_name": "STS12",
        "mteb_version": "1.18.0",
        "scores": {
            "test": [
                {"cosine_spearman": 0.77443, "main_score": 0.77443, "hf_subset": "default", "languages": ["eng-Latn"]}
            ]
        },
        "evaluation_time": 3.2,
        "kg_co2_emissions": None,
    }
    path.write_text(json.dumps(mteb_file))
    loaded = read_result(path)
    assert loaded.task_type == "STS" and loaded.main_score == 0.77443
    assert loaded.model_name == "BAAI/bge-small-en-v1.5" and strategy_slug(loaded.strategy) == "5c38ec7c"


def test_load_results_skips_other_json(tmp_path: Path, caplog) -> None:
    write_result(make_result(), tmp_path)
    (tmp_path / "model_meta.json").write_text('{"name": "x"}')
    (tmp_path / "list.json").write_text("[1, 2]")
    with caplog.at_level("WARNING"):
        assert [r.task_name for r in load_results(tmp_path)] == ["SciFact"]
    assert not caplog.records  # not task results: nothing to say


def _cut_short(path: Path) -> Path:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    return path


def test_a_damaged_result_file_is_skipped_aloud_by_name(tmp_path: Path, caplog) -> None:
    """A result file cut short (not JSON) vanished from the report without a word (logged at debug level)."""
    write_result(make_result(), tmp_path)
    damaged = _cut_short(write_result(make_result(task="STS12", task_type="STS"), tmp_path))
    with caplog.at_level("WARNING"):
        assert [r.task_name for r in load_results(tmp_path)] == ["SciFact"]
    [record] = caplog.records
    assert record.getMessage().startswith(f"skipping {damaged}:") and "invalid JSON" in record.getMessage()


def test_a_json_array_of_results_is_refused_by_name(tmp_path: Path) -> None:
    from lmembed.evaluation.results import ResultFileError, to_mteb_dict

    path = tmp_path / "m" / "s" / "SciFact.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps([to_mteb_dict(make_result())]))
    with pytest.raises(ResultFileError, match="a JSON array of results"):
        read_result(path)


def test_a_folder_of_damaged_results_is_refused_naming_them(tmp_path: Path) -> None:
    """It said "no results in it", as for an empty folder, and named none of the damaged files."""
    from lmembed.evaluation.report import NoResultsError, render_report

    damaged = _cut_short(write_result(make_result(), tmp_path))
    with pytest.raises(NoResultsError, match="no readable results") as caught:
        render_report(tmp_path, tmp_path / "out", empty_ok=False)
    assert f"{damaged}:" in str(caught.value)
    assert not (tmp_path / "out").exists()


ENTRY = {"hf_subset": "default", "main_score": 0.5}
HOSTILE_RESULTS = {
    "score as text": ({"scores": {"test": [{**ENTRY, "main_score": "high"}]}}, "scores.test.0.main_score"),
    # these ended in an internal KeyError ("0.9" was read, then not found among the numbers) or showed nan / inf
    "score as numeric text": ({"scores": {"test": [{**ENTRY, "main_score": "0.9"}]}}, "scores.test.0.main_score"),
    "score NaN": ({"scores": {"test": [{**ENTRY, "main_score": float("nan")}]}}, "scores.test.0.main_score: Input"),
    "score infinite": ({"scores": {"test": [{**ENTRY, "main_score": float("inf")}]}}, "scores.test.0.main_score"),
    "score past any": ({"scores": {"test": [{**ENTRY, "main_score": 1e308}]}}, "scores.test.0.main_score: Input"),
    "no main score": ({"scores": {"test": [{"hf_subset": "default"}]}}, "scores.test: no main_score"),
    "an empty split": ({"scores": {"test": []}}, "scores.test: no entry"),
    "no split": ({"scores": {}}, "scores: Dictionary should have at least 1 item"),
    "scores as text": ({"scores": "oops"}, "scores: Input should be a valid dictionary"),
    "scores null": ({"scores": None}, "scores: Input should be a valid dictionary"),
    "time as text": ({"scores": {"test": [ENTRY]}, "evaluation_time": "slow"}, "evaluation_time: Input should"),
    "strategy a number": ({"scores": {"test": [ENTRY]}, "lmembed": {"strategy": 5}}, "lmembed.strategy: Input"),
    "record a list": ({"scores": {"test": [ENTRY]}, "lmembed": [1]}, "lmembed: Input should be a valid dictionary"),
    "languages a number": ({"scores": {"test": [{**ENTRY, "languages": 3}]}}, "scores.test.0.languages: Input"),
}


@pytest.mark.parametrize("case", HOSTILE_RESULTS)
def test_a_result_file_of_another_shape_is_refused_naming_the_field_and_skipped_aloud(tmp_path, caplog, case):
    """They ended in internal errors (KeyError, AttributeError) or vanished from the report without a word."""
    from lmembed.evaluation.results import ResultFileError

    fields, said = HOSTILE_RESULTS[case]
    write_result(make_result(), tmp_path)
    bad = tmp_path / "m" / "s" / "STS12.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"task_name": "STS12", **fields}))
    with pytest.raises(ResultFileError, match="not a task result in MTEB's layout") as caught:
        read_result(bad)
    assert str(caught.value).startswith(f"{bad}: {said}"), caught.value
    with caplog.at_level("WARNING"):
        assert [r.task_name for r in load_results(tmp_path)] == ["SciFact"]
    assert [r.getMessage() for r in caplog.records] == [f"skipping {caught.value}"]


def test_a_result_record_of_another_format_is_refused_by_name(tmp_path, caplog):
    from lmembed.evaluation.results import ResultFileError

    path = write_result(make_result(), tmp_path)
    data = json.loads(path.read_text())
    assert data["lmembed"]["format"] == 1
    for form in (2, True, "1"):
        path.write_text(json.dumps({**data, "lmembed": {**data["lmembed"], "format": form}}))
        with pytest.raises(ResultFileError) as caught:
            read_result(path)
        assert str(caught.value) == (
            f"{path}: lmembed.format: {form!r}; this lmembed reads result records of format 1 (a newer lmembed wrote "
            "it?): read it with the lmembed that wrote it"
        )
    del data["lmembed"]["format"]  # a record written before formats were recorded, and MTEB's own files, read on
    path.write_text(json.dumps(data))
    assert read_result(path).task_name == "SciFact"


def test_strategy_slug() -> None:
    assert strategy_slug(None) == "default" and strategy_slug({}) == "default"
    assert strategy_slug("last token / L-12") == "last-token-L-12"
    assert strategy_slug({"name": "mean", "layer": 3}) == "mean"
    assert strategy_slug({"layers": [-1, -2], "pool": "mean"}) == "layers=-1+-2_pool=mean"
    long_a = strategy_slug({"x": "a" * 300})
    long_b = strategy_slug({"x": "a" * 299 + "b"})
    assert len(long_a) <= 100 and long_a != long_b


def labelled(label: str, **strategy) -> TaskResult:
    result = make_result(strategy={"pooling": "mean", "layer": -1, **strategy})
    result.extra["strategy_label"] = label  # what the evaluation runner records (EmbeddingConfig.label)
    return result


def test_a_strategy_is_shown_and_filed_by_its_label(tmp_path: Path) -> None:
    """Results name their strategy by its label (``mean@-1``) in folders, tables and charts, not by a slug of every
    field; strategies that share a label (they differ in a field it leaves out) keep apart: their folders by a
    digest of the whole strategy, their report rows by the fields that differ."""
    short, long = labelled("mean@-1", max_length=128), labelled("mean@-1", max_length=512)
    terms = labelled("mean@-1+terms4096", terms={"dims": 4096})
    paths = [write_result(r, tmp_path) for r in (short, long, terms)]
    assert len({p.parent for p in paths}) == 3
    assert [p.parent.name for p in paths] == [
        f"mean--1-{strategy_digest(short.strategy)}",
        f"mean--1-{strategy_digest(long.strategy)}",
        f"mean--1+terms4096-{strategy_digest(terms.strategy)}",
    ]
    table = build_table(load_results(tmp_path))
    names = sorted(row[1] for row in table.rows)
    assert names[2] == "mean@-1+terms4096"  # a label of its own is shown as it is
    assert names[:2] == ["mean@-1 max_length=128", "mean@-1 max_length=512"]  # what tells them apart, named
    assert "| mean@-1+terms4096 |" in results_markdown(load_results(tmp_path))
    assert result_path(tmp_path, make_result()).parent.name == "layer=-1_pooling=mean"  # no label: the slug, as before


def test_markdown_summary() -> None:
    md = results_markdown([make_result(), make_result("STS12", "STS", 0.72369)])
    assert "| SciFact | Retrieval | test | ndcg_at_10 | 64.51 |" in md
    assert "72.37" in md


def _write_grid(root: Path) -> None:
    for model, shift in (("org/model-a", 0.0), ("org/model-b", 0.05)):
        write_result(make_result("SciFact", "Retrieval", 0.60 + shift, model), root)
        write_result(make_result("NFCorpus", "Retrieval", 0.30 + shift, model), root)
        write_result(make_result("STS12", "STS", 0.70 + shift, model), root)
    write_result(make_result("Banking77Classification", "Classification", 0.80, "org/model-a"), root)


def test_table_groups_by_type_with_means(tmp_path: Path) -> None:
    _write_grid(tmp_path)
    table = build_table(load_results(tmp_path))
    assert list(table.task_types) == ["Retrieval", "STS", "Classification"]
    assert table.task_types["Retrieval"] == ["NFCorpus", "SciFact"]
    row_a = ("org/model-a", "layer=-1_pooling=mean")
    assert table.type_mean(row_a, "Retrieval") == (pytest.approx(0.45), True)
    row_b = ("org/model-b", "layer=-1_pooling=mean")
    assert table.type_mean(row_b, "Classification") == (None, False)
    value, complete = table.task_mean(row_b)
    assert value == pytest.approx((0.65 + 0.35 + 0.75) / 3) and not complete
    md = table_markdown(table)
    assert "## Retrieval" in md and "## STS" in md and "## Classification" in md
    assert "| org/model-a | layer=-1_pooling=mean | 30.00 | 60.00 | 45.00 |" in md  # Retrieval: NFCorpus, SciFact, mean
    assert "–" in md and "*" in md  # model-b lacks Banking77


def test_a_sample_of_a_task_is_a_type_of_its_own_outside_the_overall_means(tmp_path: Path) -> None:
    """The main job scores SciFact whole and SciFact[500 docs]: the easier sample is not averaged with the task."""
    write_result(make_result("SciFact", "Retrieval", 0.60), tmp_path)
    write_result(make_result("SciFact[500 docs]", "Retrieval", 0.8380), tmp_path)
    write_result(make_result("STS12", "STS", 0.70), tmp_path)
    table = build_table(load_results(tmp_path))
    assert list(table.task_types) == ["Retrieval", "STS", "Retrieval (samples)"]
    row = ("sentence-transformers/all-MiniLM-L6-v2", "layer=-1_pooling=mean")
    assert table.type_mean(row, "Retrieval") == (pytest.approx(0.60), True)
    assert table.task_mean(row) == (pytest.approx(0.65), True)  # the sample left out
    assert table.mean_of_type_means(row) == (pytest.approx(0.65), True)
    md = table_markdown(table)
    assert "## Retrieval (samples)" in md and "left out of the overall means" in md
    assert "| 60.00 | 70.00 | 83.80 | 65.00 | 65.00 |" in md


def test_render_report_writes_markdown_png_json(tmp_path: Path) -> None:
    _write_grid(tmp_path / "results")
    report = render_report(tmp_path / "results", tmp_path / "report")
    assert report.files["markdown"].read_text() == report.markdown
    assert report.files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(report.files["json"].read_text())
    assert {r["model"] for r in summary["rows"]} == {"org/model-a", "org/model-b"}
    # Reports written inside the results folder are not mistaken for results.
    again = render_report(tmp_path / "results", tmp_path / "results" / "report")
    assert len(again.table.rows) == 2


def test_render_report_on_empty_folder(tmp_path: Path) -> None:
    report = render_report(tmp_path / "nothing", tmp_path / "out")
    assert report.table.rows == [] and report.files["png"].exists()


def test_a_result_nested_past_the_parser_is_skipped_aloud(tmp_path, caplog):
    """It ended in an internal RecursionError."""
    write_result(make_result(), tmp_path)
    bad = tmp_path / "m" / "s" / "STS12.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"task_name": "STS12", "scores": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with caplog.at_level("WARNING"):
        assert [r.task_name for r in load_results(tmp_path)] == ["SciFact"]
    assert any(f"{bad}" in r.getMessage() and "too deeply" in r.getMessage() for r in caplog.records)


def test_a_model_name_cannot_break_a_markdown_table(tmp_path):
    """A model name with a newline or a ``|``, from a result file written elsewhere, ended a row early or added
    columns to both Markdown tables."""
    result = make_result(model="evil | extra\n| injected | row")
    rows = results_markdown([result]).splitlines()
    assert len(rows) == 3 and rows[2].count(" | ") == 7 and "evil \\| extra \\| injected \\| row" in rows[2]
    write_result(result, tmp_path)
    text = table_markdown(build_table(load_results(tmp_path)))
    tables = [block.splitlines() for block in text.split("\n\n") if block.startswith("|")]
    assert tables and all(any("evil" in line for line in table) for table in tables)
    for table in tables:  # every row has its header's columns: no "|" of the name counts as one
        assert len({len(re.findall(r"(?<!\\)\|", line)) for line in table}) == 1, table
