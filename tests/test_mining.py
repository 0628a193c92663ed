"""Hard-negative mining: the positive-aware filters, on a toy corpus with an exact toy encoder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed.mining import (
    MiningError,
    MiningStats,
    canonical_method,
    keep_mask,
    load_corpus,
    mine_hard_negatives,
    read_rows,
    write_rows,
)

VOCAB = ["cat", "sat", "mat", "dog", "ran", "park", "fish", "swim", "sea", "bird", "fly", "sky", "the", "on", "a", "in"]


class BagOfWords:
    """Deterministic teacher: L2-normalised word counts over a fixed vocabulary."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, int]] = []

    def _encode(self, texts) -> np.ndarray:
        out = np.zeros((len(texts), len(VOCAB)), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                if word in VOCAB:
                    out[i, VOCAB.index(word)] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    def encode_queries(self, texts, *, instruction=None, batch_size=32) -> np.ndarray:
        self.calls.append(("queries", instruction, len(texts)))
        return self._encode(texts)

    def encode_corpus(self, texts, *, batch_size=32) -> np.ndarray:
        self.calls.append(("corpus", None, len(texts)))
        return self._encode(texts)


POSITIVE = "the cat sat on the mat"
NEAR_DUPLICATE = "the cat sat on a mat"  # a false negative: as relevant as the positive
CORPUS = {
    "d0": POSITIVE,
    "d1": NEAR_DUPLICATE,
    "d2": "the cat ran in the park",
    "d3": "a dog ran in the park",
    "d4": "fish swim in the sea",
    "d5": "a bird can fly in the sky",
}
ROWS = [{"query": "cat sat mat", "positive": POSITIVE, "task": "toy"}]


def _scores(query: str, texts: list[str]) -> np.ndarray:
    enc = BagOfWords()
    return enc.encode_corpus(texts) @ enc.encode_queries([query])[0]


def test_toy_scores_make_the_near_duplicate_a_false_negative():
    pos, dup, cat_park = _scores("cat sat mat", [POSITIVE, NEAR_DUPLICATE, CORPUS["d2"]])
    assert dup > 0.95 * pos  # above the 95% ceiling
    assert cat_park < 0.95 * pos


def test_perc_pos_removes_the_planted_false_negative_and_naive_keeps_it():
    naive = mine_hard_negatives(BagOfWords(), ROWS, CORPUS, k=3, method="naive")[0]
    perc = mine_hard_negatives(BagOfWords(), ROWS, CORPUS, k=3, method="perc_pos", margin=0.95)[0]
    assert naive["negatives"][0] == NEAR_DUPLICATE
    assert NEAR_DUPLICATE not in perc["negatives"]
    assert perc["negatives"][0] == CORPUS["d2"]
    for row in (naive, perc):
        assert POSITIVE not in row["negatives"]
        assert row["task"] == "toy" and row["positive"] == POSITIVE  # other fields copied


def test_negatives_are_ranked_by_teacher_score():
    row = mine_hard_negatives(BagOfWords(), ROWS, CORPUS, k=4, method="naive", with_scores=True)[0]
    scores = row["teacher_scores"]["negatives"]
    assert scores == sorted(scores, reverse=True) and len(scores) == len(row["negatives"])
    assert row["teacher_scores"]["positive"] == pytest.approx([float(_scores("cat sat mat", [POSITIVE])[0])])


def test_scored_rows_feed_the_distillation_losses_as_they_are(tmp_path):
    """``mine --scores`` writes ``teacher_scores`` in the form training reads (it wrote ``positive_score`` and
    ``negative_scores``, which ``--loss margin_mse`` refused as rows without teacher scores); kept negatives are
    scored too, so the scores still match the negatives one for one."""
    from lmembed.training.rows import parse_row

    rows = [{**ROWS[0], "negatives": [CORPUS["d4"]]}]
    row = mine_hard_negatives(BagOfWords(), rows, CORPUS, k=3, method="naive", with_scores=True, keep_existing=True)[0]
    assert row["negatives"][0] == CORPUS["d4"] and len(row["teacher_scores"]["negatives"]) == len(row["negatives"])
    assert row["teacher_scores"]["negatives"][0] == pytest.approx(float(_scores("cat sat mat", [CORPUS["d4"]])[0]))
    example = parse_row(row)
    assert example.teacher_scores == pytest.approx(
        (*row["teacher_scores"]["positive"], *row["teacher_scores"]["negatives"])
    )


@pytest.mark.parametrize(
    ("method", "margin", "kept"),
    [
        ("abs", 0.5, [False, True, True]),  # score < 0.5
        ("margin_pos", 0.4, [False, False, True]),  # score < 0.8 - 0.4
        ("perc_pos", 0.95, [False, True, True]),  # score < 0.76
        ("naive", 0.0, [True, True, True]),
    ],
)
def test_keep_mask_rules(method, margin, kept):
    scores = np.array([0.79, 0.45, 0.2])
    assert keep_mask(scores, 0.8, method, margin).tolist() == kept


def test_perc_pos_keeps_its_gap_below_a_negative_positive_score():
    """With the positive at -0.2, ``score < pos * 0.95`` (-0.19) kept candidates at -0.195 and -0.1999, closer to
    the query than its own document; the 5% gap is now taken below the positive whatever its sign."""
    scores = np.array([-0.195, -0.1999, -0.205, -0.3])
    assert keep_mask(scores, -0.2, "perc_pos", 0.95).tolist() == [False, False, False, True]  # below -0.21
    assert keep_mask(np.array([0.79, 0.75]), 0.8, "perc_pos", 0.95).tolist() == [False, True]  # as before: < 0.76


def test_margin_pos_and_abs_also_drop_the_duplicate():
    for method, margin in (("margin_pos", 0.05), ("abs", 0.5)):
        row = mine_hard_negatives(BagOfWords(), ROWS, CORPUS, k=2, method=method, margin=margin)[0]
        assert NEAR_DUPLICATE not in row["negatives"], method


def test_skip_top_ignores_the_best_ranks():
    row = mine_hard_negatives(BagOfWords(), ROWS, CORPUS, k=2, method="naive", skip_top=1)[0]
    assert NEAR_DUPLICATE not in row["negatives"]
    assert row["negatives"][0] == CORPUS["d2"]


def test_positives_missing_from_the_corpus_are_still_excluded_and_stats_count():
    corpus = [t for t in CORPUS.values() if t != POSITIVE]
    stats = MiningStats()
    row = mine_hard_negatives(BagOfWords(), ROWS, corpus, k=10, method="perc_pos", stats=stats)[0]
    assert POSITIVE not in row["negatives"]
    assert stats.queries == 1 and stats.removed_positives == 1
    assert stats.removed_by_threshold >= 1  # the near duplicate
    assert stats.short_rows == 1  # only 4 documents can pass
    assert stats.negatives == len(row["negatives"]) == 4


def test_several_positives_use_the_lowest_positive_score_and_are_all_excluded():
    rows = [{"query": "cat sat mat", "positive": [POSITIVE, CORPUS["d2"]]}]
    row = mine_hard_negatives(BagOfWords(), rows, CORPUS, k=5, method="perc_pos", with_scores=True)[0]
    assert CORPUS["d2"] not in row["negatives"] and POSITIVE not in row["negatives"]
    assert row["teacher_scores"]["positive"] == pytest.approx(
        [float(_scores("cat sat mat", [p])[0]) for p in (POSITIVE, CORPUS["d2"])]
    )


def test_queries_are_grouped_by_instruction_and_never_their_own_negative():
    teacher = BagOfWords()
    rows = [
        {"query": "fish swim in the sea", "positive": "a bird can fly in the sky", "instruction": "A"},
        {"query": "cat sat mat", "positive": POSITIVE},
    ]
    mined = mine_hard_negatives(teacher, rows, CORPUS, k=3, method="naive", query_instruction="B")
    assert "fish swim in the sea" not in mined[0]["negatives"]
    assert sorted(c[1] for c in teacher.calls if c[0] == "queries") == ["A", "B"]
    assert sum(1 for c in teacher.calls if c[0] == "corpus") == 1


def test_without_a_corpus_other_rows_positives_are_the_pool():
    rows = [{"query": "cat sat mat", "positive": POSITIVE}, {"query": "dog park", "positive": CORPUS["d3"]}]
    mined = mine_hard_negatives(BagOfWords(), rows, None, k=1, method="naive")
    assert mined[0]["negatives"] == [CORPUS["d3"]]
    assert mined[1]["negatives"] == [POSITIVE]


def test_keep_existing_negatives():
    rows = [{"query": "cat sat mat", "positive": POSITIVE, "negatives": [CORPUS["d5"]], "teacher_scores": [0.9, 0.1]}]
    row = mine_hard_negatives(BagOfWords(), rows, CORPUS, k=2, method="perc_pos", keep_existing=True)[0]
    assert row["negatives"] == [CORPUS["d5"], CORPUS["d2"]]
    assert "teacher_scores" not in row  # they scored the old negatives only


def test_a_rows_own_negative_under_another_name_is_kept_in_the_one_list():
    """A row's ``negative`` stayed beside the mined ``negatives``; training reads one name only, so it was lost."""
    rows = [{"query": "cat sat mat", "positive": POSITIVE, "negative": CORPUS["d5"]}]
    row = mine_hard_negatives(BagOfWords(), rows, CORPUS, k=2, method="perc_pos", keep_existing=True)[0]
    assert row["negatives"] == [CORPUS["d5"], CORPUS["d2"]] and "negative" not in row
    fresh = mine_hard_negatives(BagOfWords(), rows, CORPUS, k=1, method="perc_pos")[0]
    assert fresh["negatives"] == [CORPUS["d2"]] and "negative" not in fresh
    with pytest.raises(MiningError, match="fields 'query' and 'anchor' both give the query"):
        mine_hard_negatives(BagOfWords(), [{**rows[0], "anchor": "x"}], CORPUS, k=1)


def test_bad_options_are_rejected():
    assert canonical_method("TopK-PercPos") == "perc_pos"
    with pytest.raises(MiningError, match="unknown"):
        mine_hard_negatives(BagOfWords(), ROWS, CORPUS, method="fancy")
    with pytest.raises(MiningError, match="perc_pos"):
        mine_hard_negatives(BagOfWords(), ROWS, CORPUS, method="perc_pos", margin=1.5)
    with pytest.raises(MiningError, match="no positive"):
        mine_hard_negatives(BagOfWords(), [{"query": "x"}], CORPUS)


def test_rows_and_corpus_files_round_trip(tmp_path):
    path = write_rows(ROWS, tmp_path / "sub" / "rows.jsonl")
    assert read_rows(path) == ROWS
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text(
        "\n".join(json.dumps({"_id": k, "title": "", "text": v}) for k, v in CORPUS.items()) + "\n"
    )
    assert load_corpus(beir) == list(CORPUS.values())
    plain = tmp_path / "docs.txt"
    plain.write_text("one\n\ntwo\n")
    assert load_corpus(plain) == ["one", "two"]


def test_mine_command(tmp_path, monkeypatch):
    import lmembed
    from lmembed.cli.app import app

    data = write_rows(ROWS, tmp_path / "train.jsonl")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(CORPUS.values()))

    class FakeEmbedder:
        @staticmethod
        def from_pretrained(name, **kwargs):
            assert name == "toy"
            return BagOfWords()

    monkeypatch.setattr(lmembed, "Embedder", FakeEmbedder, raising=False)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app,
        ["mine", "--teacher", "toy", "--data", str(data), "--corpus", str(corpus), "--k", "2", "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    (row,) = read_rows(out)
    assert NEAR_DUPLICATE not in row["negatives"] and len(row["negatives"]) == 2
