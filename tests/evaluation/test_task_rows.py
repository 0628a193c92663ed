"""A task file's bad row is refused naming the file and its line: a score or label that is no number (NaN), a
missing sentence. NaN scores were accepted (and written as a null score); other errors named the file only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmembed.evaluation.tasks import TaskDataError
from lmembed.evaluation.tasks.classification import load_labelled_texts
from lmembed.evaluation.tasks.pair_classification import load_pairs
from lmembed.evaluation.tasks.sts import load_sts_pairs
from lmembed.evaluation.tasks.summarization import load_summarization

STS_ROW = {"sentence1": "a cat", "sentence2": "a dog", "score": 2.5}


def _write(path: Path, rows: list[dict | str]) -> Path:
    """``rows`` one per line (a string as it is: JSON's NaN is no valid JSON for json.dumps to write)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ('{"sentence1": "x", "sentence2": "y", "score": NaN}', "field 'score' must be a finite number"),
        ('{"sentence1": "x", "sentence2": "y", "score": Infinity}', "field 'score' must be a finite number"),
        ('{"sentence1": "x", "sentence2": "y", "score": "high"}', "field 'score' must be a number, got 'high'"),
        ('{"sentence1": "x", "sentence2": "y", "score": "nan"}', "field 'score' must be a finite number"),
        ('{"sentence1": "x", "sentence2": "y", "score": true}', "field 'score' must be a number"),
        ('{"sentence1": "x", "score": 1.0}', "missing field 'sentence2'"),
        ('{"sentence1": null, "sentence2": "y", "score": 1.0}', "field 'sentence1' must be a string, got null"),
    ],
)
def test_a_bad_sts_row_names_file_and_line(tmp_path: Path, bad: str, said: str) -> None:
    path = _write(tmp_path / "test.jsonl", [STS_ROW, "", STS_ROW, bad, STS_ROW])
    with pytest.raises(TaskDataError) as caught:
        load_sts_pairs(path)
    assert str(caught.value).startswith(f"{path}:4: {said}"), caught.value


@pytest.mark.parametrize("label", ["NaN", "null", "1.5", "[1]", '{"a": 1}'])
def test_a_classification_label_that_names_no_class_is_refused(tmp_path: Path, label: str) -> None:
    good = {"text": "t", "label": 1}
    path = _write(tmp_path / "test.jsonl", [good, good, f'{{"text": "t", "label": {label}}}'])
    with pytest.raises(TaskDataError, match=rf"^{path}:3: field 'label' must be a string or an integer"):
        load_labelled_texts(path)


def test_classification_rows_keep_their_labels(tmp_path: Path) -> None:
    path = _write(tmp_path / "test.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": 2.0}])
    assert load_labelled_texts(path) == (["a", "b"], ["x", 2])
    missing = _write(tmp_path / "missing.jsonl", [{"text": "a", "label": 0}, {"label": 1}])
    with pytest.raises(TaskDataError, match=rf"^{missing}:2: missing field 'text'"):
        load_labelled_texts(missing)


@pytest.mark.parametrize("label", ["NaN", "0.5", '"yes"', "null", "2"])
def test_a_pair_label_that_is_not_0_or_1_names_the_line(tmp_path: Path, label: str) -> None:
    """NaN was an internal ValueError (int(nan)); 0.5 was read as 0 without a word."""
    good = {"sentence1": "a", "sentence2": "b", "label": 1}
    path = _write(tmp_path / "test.jsonl", [good, f'{{"sentence1": "a", "sentence2": "b", "label": {label}}}'])
    with pytest.raises(TaskDataError, match=rf"^{path}:2: field 'label': labels must be 0 or 1"):
        load_pairs(path)


def test_pair_rows_in_both_layouts(tmp_path: Path) -> None:
    lists = _write(tmp_path / "lists.jsonl", [{"sentence1": ["a", "b"], "sentence2": ["c", "d"], "labels": [1, 0]}])
    assert load_pairs(lists) == (["a", "b"], ["c", "d"], [1, 0])
    short = _write(tmp_path / "short.jsonl", [{"sentence1": ["a"], "sentence2": ["c", "d"], "labels": [1, 0]}])
    with pytest.raises(TaskDataError, match=rf"^{short}:1: .*different lengths"):
        load_pairs(short)


def test_a_summarization_relevance_that_is_nan_names_the_line(tmp_path: Path) -> None:
    good = {"text": "t", "human_summaries": ["h"], "machine_summaries": ["m"], "relevance": [1.0]}
    bad = '{"text": "t", "human_summaries": ["h"], "machine_summaries": ["m"], "relevance": [NaN]}'
    path = _write(tmp_path / "test.jsonl", [good, bad])
    with pytest.raises(TaskDataError, match=rf"^{path}:2: a relevance score must be a finite number"):
        load_summarization(path)


def test_clustering_and_reranking_rows_name_their_line_and_take_texts_only(tmp_path: Path) -> None:
    """They said "row N" (a count, not the file's line) and embedded a null sentence or document as the text
    "None"."""
    from lmembed.evaluation.tasks.clustering import load_cluster_sets
    from lmembed.evaluation.tasks.reranking import load_rerank_samples

    good = {"sentences": ["a", "b"], "labels": [0, 1]}
    path = _write(tmp_path / "clusters.jsonl", [good, "", {"sentences": ["a", None], "labels": [0, 1]}])
    with pytest.raises(TaskDataError, match=rf"^{path}:3: field 'sentences\[1\]' must be a string, got null"):
        load_cluster_sets(path)
    path = _write(tmp_path / "uneven.jsonl", [good, {"sentences": ["a"], "labels": [0, 1]}])
    with pytest.raises(TaskDataError, match=rf"^{path}:2: has 1 sentences, 2 labels"):
        load_cluster_sets(path)
    sample = {"query": "q", "positive": ["p"], "negative": ["n"]}
    for bad, said in (
        ({**sample, "negative": ["n", 3]}, r"field 'negative\[1\]' must be a string"),
        ({**sample, "query": None}, "field 'query' must be a string, got null"),
        ({**sample, "query": ["q", None]}, r"field 'query\[1\]' must be a string"),
        ({**sample, "positive": "p"}, "needs list-valued 'positive' and 'negative'"),
    ):
        path = _write(tmp_path / "rerank.jsonl", [sample, "", "", bad])
        with pytest.raises(TaskDataError, match=rf"^{path}:4: {said}"):
            load_rerank_samples(path)
    assert load_rerank_samples(_write(tmp_path / "ok.jsonl", [sample]))[0].positive == ["p"]
