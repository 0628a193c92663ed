"""Decontamination drops planted overlaps with evaluation texts, each for its reason, and keeps the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import write_jsonl
from lmembed.cli.app import app
from lmembed.errors import ConfigError
from lmembed.synthesis.decontaminate import (
    DecontaminationSettings,
    decontaminate,
    normalise,
    protected_texts,
    shingles,
)
from lmembed.synthesis.eval_texts import evaluation_texts, parse_names

EVAL_QUERIES = [
    "What causes scurvy in sailors on long voyages?",
    "Does vitamin D supplementation reduce the risk of bone fractures in elderly women living at home",
    "How do mitochondria produce energy in muscle cells during exercise",
    "Effect of aspirin on cardiovascular events",
]
CLEAN = [
    ("cats are small domesticated carnivorous mammals", "the cat sat on the mat"),
    ("protein folding in the endoplasmic reticulum", "chaperones assist folding"),
    ("what is the capital of france", "paris is the capital"),
    ("rain forests hold many species of plants", "biodiversity is high in the tropics"),
]


def _rows():
    planted = [
        # exact after normalisation: case, punctuation and spaces differ
        ("what causes SCURVY in sailors on long voyages", "lack of vitamin c"),
        # a 13-word run shared with the second query, inside a longer text
        (
            "a question: does vitamin D supplementation reduce the risk of bone fractures in elderly women "
            "living at home, asked in a trial",
            "a trial",
        ),
        # near duplicate: one word changed
        ("How do mitochondria produce energy in heart cells during exercise", "ATP synthase"),
        # a positive with the query's content words but not its wording (word-set Jaccard 4/7): BM25 only
        ("unrelated query about the weather", "aspirin effect cardiovascular events study"),
        # the same words in another order are a near duplicate (word sets equal)
    ]
    reordered = [("cardiovascular events: effect of aspirin on", "a positive")]
    return CLEAN[:2] + planted + reordered + CLEAN[2:]


def test_planted_overlaps_are_dropped_for_their_reasons_and_the_rest_kept():
    report = decontaminate(_rows(), protected_texts({"SciFact": EVAL_QUERIES}))
    assert report.kept == [0, 1, 7, 8]
    assert [(d.row, d.reason) for d in report.dropped] == [
        (2, "exact"),
        (3, "ngram"),
        (4, "near_duplicate"),
        (5, "bm25"),
        (6, "near_duplicate"),
    ]
    assert all(d.source == "SciFact" for d in report.dropped)
    assert report.dropped[1].matched == EVAL_QUERIES[1]
    assert report.by_reason == {"exact": 1, "ngram": 1, "near_duplicate": 2, "bm25": 1}
    summary = report.to_dict()
    assert summary["rows"] == 9 and summary["kept"] == 4 and summary["by_source"] == {"SciFact": 5}
    assert "| bm25 | 1 |" in report.markdown()


def test_a_short_test_query_wrapped_in_a_training_query_is_dropped():
    """Test queries under 13 words were caught only when equal or of like length: "Is it true that <query>?" and
    "What is the evidence for the claim that <query>?" were kept for 163 of SciFact's 300 test queries. A row's
    query holding a test query of 6 words or more as a run of its words is dropped (``contains``); a passage
    using such a phrase is not."""
    rows = [
        ("What is the evidence for the claim that the effect of aspirin on cardiovascular events is small?", "p"),
        ("Is it true that what causes scurvy in sailors on long voyages?", "p"),
        ("aspirin and the heart", "a review of the effect of aspirin on cardiovascular events in adults"),
    ]
    report = decontaminate(rows, protected_texts({"SciFact": EVAL_QUERIES}))
    assert [(d.row, d.reason) for d in report.dropped] == [(0, "contains"), (1, "contains")]
    assert report.dropped[0].matched == EVAL_QUERIES[3] and report.dropped[0].score == 6.0
    assert report.kept == [2]
    off = decontaminate(rows, protected_texts({"SciFact": EVAL_QUERIES}), DecontaminationSettings(contains=None))
    assert 0 in off.kept and "contains" not in off.by_reason  # off: the long wrapped query passes the rest


def test_each_test_can_be_turned_off():
    off = DecontaminationSettings(ngram=None, contains=None, near_duplicate=None, bm25=None)
    report = decontaminate(_rows(), protected_texts({"SciFact": EVAL_QUERIES}), off)
    assert [d.reason for d in report.dropped] == ["exact"]


def test_a_long_passage_containing_a_short_querys_words_is_not_dropped():
    """Without the length bound every passage mentioning 'aspirin' and 'cardiovascular events' would go."""
    passage = (
        "In a randomised trial of 20,000 adults, the effect of aspirin on cardiovascular events was small, "
        "while bleeding rose; the authors discuss dosing, adherence and follow-up over ten years in detail."
    )
    report = decontaminate([("a query about trials", passage)], protected_texts({"SciFact": EVAL_QUERIES}))
    assert report.kept == [0]


def test_helpers_and_bad_settings():
    assert normalise("  Hello,   WORLD! ") == "hello world"
    assert shingles(["a", "b"]) == {("a", "b")}
    assert len(shingles(list("abcde"))) == 3
    with pytest.raises(ConfigError, match="ngram=2"):
        DecontaminationSettings(ngram=2)
    with pytest.raises(ConfigError, match="contains=2: use 3 words or more"):
        DecontaminationSettings(contains=2)
    with pytest.raises(ConfigError, match="bm25=0"):
        DecontaminationSettings(bm25=0)
    with pytest.raises(ConfigError, match=r"near_duplicate=1.2: a threshold in \(0, 1\]"):
        DecontaminationSettings(near_duplicate=1.2)  # a Jaccard overlap never passes 1: the test would be off
    assert DecontaminationSettings(near_duplicate=1.0, bm25=1.2).bm25 == 1.2
    empty = decontaminate(CLEAN, [])
    assert empty.kept == [0, 1, 2, 3] and not empty.dropped


# ---------------------------------------------------------------------------------------------- evaluation sets, CLI
def make_eval_beir(folder: Path) -> Path:
    """A tiny BEIR test split: two queries and their corpus."""
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": "d1", "title": "", "text": "Scurvy comes from a lack of vitamin C."}, {"_id": "d2", "text": "x y"}]
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": EVAL_QUERIES[0]}, {"_id": "q2", "text": "cat mat"}])
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return folder


def test_evaluation_texts_are_queries_not_corpus_documents(tmp_path):
    protected = evaluation_texts([str(make_eval_beir(tmp_path / "ev"))])
    assert sorted(p.text for p in protected) == sorted([EVAL_QUERIES[0], "cat mat"])
    assert parse_names(" scifact, nfcorpus,,scifact ") == ["scifact", "nfcorpus"]


def test_cli_keeps_rows_as_written_and_reports_the_drops(tmp_path):
    folder = make_eval_beir(tmp_path / "ev")
    rows = [
        {"query": "WHAT causes scurvy in sailors on long voyages", "positive": "vitamin c", "provenance": {"g": 1}},
        {"query": "where does scurvy come from", "positive": "Scurvy comes from a lack of vitamin C."},
        {"query": "the cat sat on the mat", "positive": "a cat sat", "provenance": {"g": 2}},
    ]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "clean.jsonl"
    result = CliRunner().invoke(app, ["decontaminate", str(data), "--against", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert kept == rows[1:]  # a corpus document as a positive is not an evaluation item
    report = json.loads((tmp_path / "clean.jsonl.decontamination.json").read_text())
    assert report["by_reason"] == {"exact": 1} and report["drops"][0]["row"] == 0
    assert (tmp_path / "clean.jsonl.decontamination.md").read_text().startswith("Decontamination: 3 rows")


def test_cli_bad_input_names_the_file_line_or_set(tmp_path):
    folder = make_eval_beir(tmp_path / "ev")
    data = write_jsonl(tmp_path / "rows.jsonl", [{"query": "q", "positive": "p"}, {"query": "q2"}])
    out = tmp_path / "clean.jsonl"
    bad_row = CliRunner().invoke(app, ["decontaminate", str(data), "--against", str(folder), "-o", str(out)])
    assert bad_row.exit_code == 2 and "rows.jsonl:2" in bad_row.output and "positive" in bad_row.output
    assert not out.exists()
    good = write_jsonl(tmp_path / "good.jsonl", [{"query": "q", "positive": "p"}])
    unknown = CliRunner().invoke(app, ["decontaminate", str(good), "--against", "no-such-set", "-o", str(out)])
    assert unknown.exit_code == 2 and "no-such-set" in unknown.output
    assert not out.exists()
