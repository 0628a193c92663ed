"""Hybrid retrieval: BM25 scores equal bm25s's own, fusion of a hand-made pair of runs (RRF and min-max, worked
out by hand), and Index's bm25/hybrid modes (persisted beside the vectors, reused, rebuilt after an add)."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest

from helpers import TOY_DOCS
from lmembed.errors import ConfigError
from lmembed.index import Index
from lmembed.lexical.bm25 import LEXICAL_DIR, LexicalIndex
from lmembed.lexical.fusion import fuse, fuse_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOCS = TOY_DOCS
QUERIES = ["cat on a mat", "protein cell", "language model retrieval", "zebra", "horse riding movie"]


def test_bm25_scores_equal_bm25s():
    ours = LexicalIndex.build(DOCS, [f"d{i}" for i in range(len(DOCS))])
    scores, rows = ours.search(QUERIES, k=len(DOCS))
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize(DOCS, stopwords="en", show_progress=False), show_progress=False)
    for q, query in enumerate(QUERIES):
        expected = reference.get_scores(bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0])
        hits = rows[q] >= 0
        assert set(rows[q][hits]) == set(np.flatnonzero(expected > 0))  # every matching document, no other
        np.testing.assert_allclose(scores[q][hits], expected[rows[q][hits]], rtol=1e-6)
        assert np.all(np.diff(scores[q][hits]) <= 0)
    assert np.all(rows[3] == -1)  # "zebra": no document shares a word


def test_a_document_of_stop_words_has_length_zero_as_bm25s_tokenize_counts_it():
    """bm25s's Tokenizer gives a document with no indexed word the empty word, which lmembed counted as one word:
    every document's length normalisation moved (scores up to 0.034 off bm25s's own pipeline)."""
    docs = [*DOCS, "it is not", "a", "of the"]
    ours = LexicalIndex.build(docs, [f"d{i}" for i in range(len(docs))])
    reference = bm25s.BM25(method=ours.params.method, k1=ours.params.k1, b=ours.params.b)
    reference.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    for query in QUERIES[:3]:
        words = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
        np.testing.assert_allclose(ours.scores(query), reference.get_scores(words), rtol=1e-6, atol=1e-7)


def test_a_query_without_a_known_word_hits_nothing_even_beside_a_stopword_only_document():
    """bm25s gives a document of stop words only, and every word it does not know, the same empty word; and an
    emptied query in a batch still scores. Neither may produce a hit, and the other queries' hits stay theirs."""
    docs = [*DOCS, "it is not", "no, it was not"]
    ours = LexicalIndex.build(docs, [f"d{i}" for i in range(len(docs))])
    batch = ["zebra lydians", "cat on a mat", "persians and lydians", "protein cell"]
    scores, rows = ours.search(batch, k=3)
    assert np.all(rows[0] == -1) and np.all(rows[2] == -1) and np.all(scores[[0, 2]] == 0)
    for q in (1, 3):
        alone_scores, alone_rows = ours.search([batch[q]], k=3)
        np.testing.assert_array_equal(rows[q], alone_rows[0])
        np.testing.assert_allclose(scores[q], alone_scores[0])


def test_scores_of_every_document_equal_search_and_bm25s():
    docs = DOCS
    ours = LexicalIndex.build(docs, [f"d{i}" for i in range(len(docs))])
    reference = bm25s.BM25()
    reference.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    for query in QUERIES:
        every = ours.scores(query)
        assert every.shape == (len(docs),)
        scores, rows = ours.search([query], k=len(docs))
        hits = rows[0] >= 0
        np.testing.assert_allclose(every[rows[0][hits]], scores[0][hits], rtol=1e-6)
        assert np.all(np.delete(every, rows[0][hits]) == 0)  # a document that shares no word scores 0
        words = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
        if words and any(w in reference.vocab_dict for w in words):
            expected = reference.get_scores([w for w in words if w in reference.vocab_dict])
            np.testing.assert_allclose(every, expected, rtol=1e-6, atol=1e-9)
    assert not ours.scores("zebra").any() and not ours.scores("").any()


# a hand-made pair of runs for one query: dense cosines and BM25 scores
DENSE = {"a": 0.9, "b": 0.8, "c": 0.1}
LEXICAL = {"c": 12.0, "d": 7.0, "a": 3.0}


def test_reciprocal_rank_fusion_by_hand():
    fused = fuse([DENSE, LEXICAL], "rrf")
    # a: 1/(60+1) + 1/(60+3); c: 1/(60+3) + 1/(60+1); b: 1/62; d: 1/62 — ties go to the first seen
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]
    np.testing.assert_allclose([s for _, s in fused], [1 / 61 + 1 / 63, 1 / 61 + 1 / 63, 1 / 62, 1 / 62])
    weighted = dict(fuse([DENSE, LEXICAL], "rrf", weights=[1.0, 0.0]))
    assert weighted["d"] == 0.0 and weighted["a"] == pytest.approx(1 / 61)


def test_minmax_fusion_by_hand():
    fused = fuse([DENSE, LEXICAL], "minmax")
    # dense → a 1, b (0.8-0.1)/0.8 = 0.875, c 0; BM25 → c 1, d (7-3)/9, a 0
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]
    np.testing.assert_allclose([s for _, s in fused], [1.0, 1.0, 0.875, 4 / 9])
    weighted = fuse([DENSE, LEXICAL], "minmax", weights=[0.7, 0.3])
    assert [key for key, _ in weighted] == ["a", "b", "c", "d"]
    np.testing.assert_allclose([s for _, s in weighted], [0.7, 0.6125, 0.3, 0.3 * 4 / 9])
    assert fuse([{"x": 2.0, "y": 2.0}], "minmax") == [("x", 1.0), ("y", 1.0)]  # one score: all map to 1
    with pytest.raises(ConfigError, match="fusion='max'"):
        fuse([DENSE], "max")
    with pytest.raises(ConfigError, match="weights"):
        fuse([DENSE, LEXICAL], "rrf", weights=[1.0])


def test_fuse_rows_pads_misses():
    dense = (np.array([[0.9, 0.5, 0.0]], dtype=np.float32), np.array([[3, 1, -1]]))
    lexical = (np.array([[4.0, 0.0, 0.0]], dtype=np.float32), np.array([[1, -1, -1]]))
    scores, rows = fuse_rows([dense, lexical], k=4)
    assert rows.tolist() == [[1, 3, -1, -1]]
    np.testing.assert_allclose(scores[0, :2], [1 / 62 + 1 / 61, 1 / 61])


@pytest.fixture
def bert(make_embedder):
    return make_embedder("bert")


def test_index_bm25_and_hybrid_modes(bert, tmp_path, monkeypatch):
    folder = tmp_path / "idx"
    index = Index.build(bert, [(f"d{i}", t) for i, t in enumerate(DOCS)], folder)
    bm25 = index.search_batch(QUERIES, k=3, mode="bm25")
    expected_scores, expected_rows = LexicalIndex.build(DOCS, [f"d{i}" for i in range(len(DOCS))]).search(QUERIES, 3)
    for hits, rows, scores in zip(bm25, expected_rows, expected_scores, strict=True):
        assert [h.id for h in hits] == [f"d{r}" for r in rows if r >= 0]
        np.testing.assert_allclose([h.score for h in hits], scores[: len(hits)], rtol=1e-6)
    assert (folder / LEXICAL_DIR).is_dir()

    hybrid = index.search_batch(QUERIES, k=4, mode="hybrid", fusion="minmax", candidates=5)
    dense = index.search_rows(QUERIES, 5)
    lexical = index.lexical.search(QUERIES, 5)
    for q, hits in enumerate(hybrid):
        runs = [
            {f"d{r}": float(s) for s, r in zip(run[0][q], run[1][q], strict=True) if r >= 0} for run in (dense, lexical)
        ]
        by_hand = fuse(runs, "minmax")[:4]
        assert [(h.id, pytest.approx(h.score)) for h in hits] == by_hand

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the saved BM25 index should have been reused")

    monkeypatch.setattr(LexicalIndex, "build", no_rebuild)
    reopened = Index.open(folder, bert)
    assert [h.id for h in reopened.search("protein cell", 3, mode="bm25")] == [h.id for h in bm25[1]]
    monkeypatch.undo()
    reopened.add([("new", "zebra zebra crossing")])
    assert [h.id for h in reopened.search("zebra", 3, mode="bm25")] == ["new"]  # rebuilt over every document
    assert [h.id for h in Index.open(folder, bert).search("zebra", 3, mode="bm25")] == ["new"]
    with pytest.raises(ConfigError, match="mode='sparse'"):
        index.search("cat", mode="sparse")


def test_bm25_without_bm25s_says_which_extra_installs_it(monkeypatch, tmp_path):
    import sys

    from lmembed.lexical.bm25 import LexicalIndexError

    saved = LexicalIndex.build(DOCS, [f"d{i}" for i in range(len(DOCS))]).save(tmp_path)
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if it were not installed: its import raises ImportError
    with pytest.raises(LexicalIndexError, match=r"needs the bm25s package .*pip install 'lmembed\[hybrid\]'"):
        LexicalIndex.build(DOCS, [f"d{i}" for i in range(len(DOCS))])
    with pytest.raises(LexicalIndexError, match="needs the bm25s package"):
        LexicalIndex.load(saved.parent)


def test_equal_fused_scores_are_served_in_the_order_trec_eval_scores_them():
    """RRF ties are common (ranks 1 and 3 make what 3 and 1 make); they were served by first appearance while
    trec_eval, which re-sorts a run by score and then id descending, scored another order (19 of 300 SciFact
    queries had a different top 10, nDCG@10 0.687 served against 0.692 evaluated). With the ids as tie key the
    served order is trec_eval's, for id-keyed runs and for index rows alike."""
    from lmembed.evaluation.metrics import trec_order

    dense = {"d1": 0.9, "d2": 0.8, "d3": 0.7}
    lexical = {"d3": 9.0, "d2": 8.0, "d1": 7.0}
    fused = fuse([dense, lexical], "rrf", tie_key=str)
    assert fused[0][1] == fused[1][1]  # d1 and d3 tie
    assert [doc for doc, _ in fused] == trec_order(dict(fused)) == ["d3", "d1", "d2"]
    ids = ["d1", "d2", "d3"]
    rows = lambda run: (np.array([list(run.values())]), np.array([[ids.index(d) for d in run]]))  # noqa: E731
    _, served = fuse_rows([rows(dense), rows(lexical)], 3, "rrf", tie_key=ids.__getitem__)
    assert [ids[r] for r in served[0]] == ["d3", "d1", "d2"]
    _, first_seen = fuse_rows([rows(dense), rows(lexical)], 3, "rrf")
    assert [ids[r] for r in first_seen[0]] == ["d1", "d3", "d2"]  # without a key: first appearance, as before
