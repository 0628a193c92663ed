"""``lmembed adapt``'s library side: query sources, the copied-span filter, mining and labels on hand-made data,
bad corpora, the recipe file, and a whole run (with a resume after an interruption) on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from helpers import save_tiny_cross_encoder, write_jsonl
from lmembed.training.adapt import (
    AdaptError,
    Document,
    PseudoQuery,
    copied_reason,
    crop_queries,
    filter_queries,
    generated_queries,
    hold_back,
    label_rows,
    mine_rows,
    read_adapt_corpus,
    reranker_scale_to_student,
    split_check,
    title_queries,
)
from lmembed.training.adapt_recipe import AdaptRecipe, AdaptRecipeError, load_adapt_recipe

REPO = Path(__file__).resolve().parents[2]
BODIES = [
    "the cat sat on the mat and the dog sat on the rug in the cell of the man",
    "protein folding in the cell is a study of the gene and the protein result",
    "a man was riding a horse on the rug and the woman was eating food there",
    "the movie was great and the movie was bad for the man and the woman friend",
    "language model embedding vector search is retrieval with a language model text",
    "gene expression study of the cell and the protein result in science text",
    "the dog was eating food on the mat and the cat was riding the horse first",
    "retrieval of the document for the query is search with an embedding vector",
]
TITLES = ["cat and dog", "protein folding", "riding a horse", "great movie", "vector search", "", "dog food", ""]


def corpus_file(tmp_path: Path) -> Path:
    rows = [{"_id": f"d{i}", "title": t, "text": b} for i, (t, b) in enumerate(zip(TITLES, BODIES, strict=True))]
    return write_jsonl(tmp_path / "corpus.jsonl", rows)


def docs() -> list[Document]:
    return [Document(f"d{i}", t, b, i + 1) for i, (t, b) in enumerate(zip(TITLES, BODIES, strict=True))]


# ---------------------------------------------------------------------------------------------- sources
def test_titles_query_their_own_bodies_and_untitled_documents_give_none():
    queries = title_queries(docs())
    assert [q.query for q in queries] == [t for t in TITLES if t]
    assert all(q.positive == BODIES[q.doc] and q.source == "title" for q in queries)


def test_crops_are_cut_out_of_their_positive_and_short_documents_give_none():
    short = Document("s", "", "the cat sat on the mat", 9)
    queries = crop_queries([*docs(), short], per_document=2, min_words=3, max_words=6, min_rest_words=5, seed=1)
    assert len(queries) == 2 * len(BODIES)  # the short document gives none
    for q in queries:
        words, body = q.query.split(), BODIES[q.doc].split()
        assert 3 <= len(words) <= 6
        start = q.extra["start_word"]
        assert body[start : start + len(words)] == words
        assert q.positive.endswith(" ".join(body[:start] + body[start + len(words) :]))
    again = crop_queries(docs(), per_document=2, min_words=3, max_words=6, min_rest_words=5, seed=1)
    assert [q.query for q in again] == [q.query for q in queries[: len(again)]]  # seeded


def test_a_title_shared_by_several_documents_is_no_query_for_any_of_them():
    shared = [*docs(), Document("x", "Cat and DOG", "a different body about cats and dogs at home", 9)]
    assert "cat and dog" not in [q.query.lower() for q in title_queries(shared)]
    assert len(title_queries(shared)) == len(title_queries(docs())) - 1
    assert [q.query for q in title_queries(shared, unique=False)].count("cat and dog") == 1  # and "Cat and DOG"
    assert len(title_queries(shared, unique=False)) == len(title_queries(docs())) + 1


def test_crops_skip_the_documents_they_are_told_to():
    queries = crop_queries(docs(), per_document=1, min_words=3, max_words=6, min_rest_words=5, seed=1, skip={0, 2})
    assert sorted(q.doc for q in queries) == [1, 3, 4, 5, 6, 7]


def test_by_default_only_untitled_documents_are_cropped(tmp_path):
    from lmembed.training.adapt_run import make_queries

    short = {"min_words": 3, "max_words": 6, "min_rest_words": 5}  # the bodies here are short
    made, report = make_queries(docs(), AdaptRecipe.model_validate({"sources": {"crops": short}}), None, tmp_path, None)
    titled = {i for i, t in enumerate(TITLES) if t}
    assert {q.doc for q in made if q.source == "title"} == titled
    assert {q.doc for q in made if q.source == "crop"} == set(range(len(BODIES))) - titled
    assert report == {"titles": {"made": len(titled)}, "crops": {"made": len(BODIES) - len(titled)}}
    recipe = AdaptRecipe.model_validate({"sources": {"crops": {**short, "only_untitled": False}}})
    assert {q.doc for q in make_queries(docs(), recipe, None, tmp_path, None)[0] if q.source == "crop"} == set(
        range(len(BODIES))
    )


def test_merge_interpolates_weights_and_scales_a_lora_update_exactly():
    import torch

    from lmembed.training.adapt_run import merge_states

    start = {"w": torch.zeros(2, 2), "b": torch.ones(2)}
    adapted = {"w": torch.full((2, 2), 4.0), "b": torch.full((2,), 3.0)}
    merged = merge_states(start, adapted, 0.25, lora=False)
    assert torch.equal(merged["w"], torch.ones(2, 2)) and torch.equal(merged["b"], torch.full((2,), 1.5))
    assert torch.equal(merge_states(start, adapted, 1.0, lora=False)["w"], adapted["w"])
    a0, a1, b1 = torch.randn(3, 5), torch.randn(3, 5), torch.randn(4, 3)
    lora_start = {"x.lora_A.weight": a0, "x.lora_B.weight": torch.zeros(4, 3)}
    lora = merge_states(lora_start, {"x.lora_A.weight": a1, "x.lora_B.weight": b1}, 0.5, lora=True)
    update = lora["x.lora_B.weight"] @ lora["x.lora_A.weight"]
    assert torch.allclose(update, 0.5 * (b1 @ a1))  # the update B·A is halved, not quartered
    with pytest.raises(AdaptError, match=r"start_state\.safetensors"):
        merge_states({"w": start["w"]}, adapted, 0.5, lora=False)
    with pytest.raises(AdaptError, match=r"start_state\.safetensors: w has shape \(3,\)"):
        merge_states({**start, "w": torch.zeros(3)}, adapted, 0.5, lora=False)


def test_a_state_of_the_wrong_shape_is_refused_naming_the_tensor(make_embedder):
    from lmembed.errors import ConfigError
    from lmembed.training.trainable import TrainableEmbedder

    trainable = TrainableEmbedder(make_embedder("bert", pooling="mean"))
    state = trainable.trainable_state_dict()
    name = next(iter(state))
    state[name] = torch.zeros(3)
    with pytest.raises(ConfigError, match=rf"{name} has shape \(3,\)"):
        trainable.load_trainable_state_dict(state)


def test_training_cuts_texts_at_its_own_length_and_the_model_keeps_its_window(make_embedder):
    from lmembed.training.trainable import TrainableEmbedder

    embedder = make_embedder("bert", pooling="mean")
    trainable = TrainableEmbedder(embedder)
    text = " ".join(BODIES)
    window = embedder.engine.input_builder(embedder.config).max_length
    full = trainable.tokenize([text])["input_ids"].shape[1]
    trainable.train_max_length, trainable._builder = 8, None
    assert trainable.tokenize([text])["input_ids"].shape[1] == 8 < full <= window
    assert embedder.engine.input_builder(embedder.config).max_length == window  # encoding is not cut


def test_generator_queries_come_through_the_corpus_only_recipe(tmp_path):
    from lmembed.synthesis.generators import TinyGenerator

    def encode(texts, side):  # a bag-of-words encoder: the round trip finds the seed passage
        vocab = sorted({w for t in BODIES for w in t.split()})
        return np.array([[t.split().count(w) for w in vocab] for t in texts], dtype=np.float32) + 1e-3

    queries, stats = generated_queries(
        docs(),
        TinyGenerator(),
        encode,
        tmp_path / "generated.jsonl",
        recipe=str(REPO / "recipes/synthesis/corpus-only-plain.yaml"),
    )
    assert stats["attempted"] == len(BODIES)
    assert queries and all(q.source == "generator" and q.positive == docs()[q.doc].full for q in queries)


# ---------------------------------------------------------------------------------------------- filters
def test_copied_spans_are_caught():
    passage = "Protein folding in the cell is a study of the gene"
    assert copied_reason("protein folding in the", passage) == "prefix"
    assert copied_reason("PROTEIN, folding!", passage) == "prefix"  # case and punctuation do not hide it
    assert copied_reason("a study of the gene", passage) == "copy"
    assert copied_reason("how do genes fold proteins", passage) is None
    assert copied_reason("study gene", passage) is None  # two words: no trigram to copy


def test_filter_drops_copies_duplicates_and_short_queries():
    qs = [
        PseudoQuery("the cat sat", "the cat sat on the mat", 0, "crop"),  # prefix
        PseudoQuery("dog rug cell", "the cat sat on the mat", 0, "crop"),
        PseudoQuery("Cell rug DOG", "a dog", 1, "crop"),  # same words as the one kept
        PseudoQuery("cat", "the dog", 1, "title"),  # too short
    ]
    kept, dropped = filter_queries(qs)
    assert [q.query for q in kept] == ["dog rug cell"]
    assert dropped == {"prefix": 1, "duplicate": 1, "too_short": 1}


def test_hold_back_is_seeded_and_refuses_too_few_queries():
    qs = [PseudoQuery(f"q {i}", "p", i, "crop") for i in range(20)]
    train, held = hold_back(qs, 0.25, 3, seed=0)
    assert len(held) == 3 and len(train) == 17 and not {q.query for q in held} & {q.query for q in train}
    assert [q.query for q in hold_back(qs, 0.25, 3, seed=0)[1]] == [q.query for q in held]
    with pytest.raises(AdaptError, match="at least two"):
        hold_back(qs[:1], 0.5, 3, seed=0)


def test_hold_back_holds_whole_documents_and_the_check_half_others_again():
    """A split by query held back a document's crop while its title trained (the held-back score measured what was
    trained on); whole documents are held back now, and the check half, which never picks a step, is again a
    split by document."""
    qs = [PseudoQuery(f"q {d} {k}", f"p {d}", d, "crop" if k else "title") for d in range(12) for k in range(3)]
    train, held = hold_back(qs, 0.3, 100, seed=1)
    assert {q.doc for q in train}.isdisjoint({q.doc for q in held})
    assert 9 <= len(held) <= 12 and len(held) % 3 == 0 and len(train) + len(held) == len(qs)
    assert hold_back(qs, 0.3, 100, seed=1) == (train, held)
    selecting, checking = split_check(held, seed=1)
    assert selecting and checking and {q.doc for q in selecting}.isdisjoint({q.doc for q in checking})
    assert split_check(held[:3], seed=1) == (held[:3], [])  # one document: nothing to check with
    with pytest.raises(AdaptError, match="at least two"):
        hold_back([PseudoQuery("a b", "p", 0, "crop"), PseudoQuery("c d", "p", 0, "title")], 0.5, 3, seed=0)


def test_a_held_back_query_is_scored_against_the_text_it_would_train_on():
    """A held-back crop was scored against its whole document, which holds it word for word (nDCG 1 before any
    training); its own target is now the document with the span cut out, and the slice's other variant of the
    same document (another query's positive) is no rival to it."""
    from lmembed.training.adapt import HeldOut

    docs = [Document("a", "", "alpha beta gamma delta", 1), Document("b", "", "epsilon zeta eta theta", 2)]
    held = [PseudoQuery("beta gamma", "alpha delta", 0, "crop"), PseudoQuery("alpha", "beta gamma delta", 0, "crop")]
    slice_ = HeldOut.build(held, docs, max_documents=10, seed=0)
    assert slice_.documents == ["alpha delta", "beta gamma delta", "epsilon zeta eta theta"]
    assert slice_.targets == [0, 1] and slice_.columns == [0, 0, 1]
    table = {
        "beta gamma": [1.0, 0.0],
        "alpha": [0.0, 1.0],
        "alpha delta": [0.6, 0.8],  # query 0's target
        "beta gamma delta": [1.0, 0.0],  # query 1's target: query 0's twin, but the same document's variant
        "epsilon zeta eta theta": [0.8, 0.6],
    }
    scores = slice_.score(Axes(table))
    # query 0: its target (0.6) below the other document (0.8), the variant (1.0) left out: rank 2
    # query 1: its target (0.0) below "alpha delta"'s variant? no: left out; below the other document (0.6): rank 2
    assert scores["ndcg_at_10"] == pytest.approx(1 / np.log2(3))
    assert scores["mrr_at_10"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------- mining, labels
class Axes:
    """A hand-made embedder: each text's vector is given by a table (queries and documents alike)."""

    def __init__(self, table: dict[str, list[float]]):
        self.table = table

    def encode_queries(self, texts, instruction=None, batch_size=32):
        return np.array([self.table[t] for t in texts], dtype=np.float32)

    def encode_corpus(self, texts, batch_size=32):
        return np.array([self.table[t] for t in texts], dtype=np.float32)


def test_mining_never_takes_the_own_document_and_drops_likely_false_negatives():
    d = [
        Document("a", "", "own doc", 1),
        Document("b", "", "twin doc", 2),
        Document("c", "", "hard doc", 3),
        Document("e", "", "easy doc", 4),
    ]
    table = {
        "q": [1.0, 0.0, 0.0],
        "own doc": [0.9, 0.1, 0.0],
        "own": [0.8, 0.2, 0.0],  # the training positive (the document with its span cut out)
        "twin doc": [1.0, 0.02, 0.0],  # closer to the query than its own document: a likely false negative
        "hard doc": [0.6, 0.8, 0.0],
        "easy doc": [0.0, 0.0, 1.0],
    }
    rows, stats = mine_rows(Axes(table), [PseudoQuery("q", "own", 0, "crop")], d, k=2, method="perc_pos", margin=0.95)
    assert rows[0]["negatives"] == ["hard doc", "easy doc"]
    provenance = rows[0]["provenance"]
    assert rows[0]["positive"] == "own" and provenance.pop("mined_scores") == {
        "positive": pytest.approx(0.9 / np.hypot(0.9, 0.1)),  # the miner's cosines, of the whole own document
        "negatives": [pytest.approx(0.6), pytest.approx(0.0)],
    }
    assert provenance == {"source": "crop", "doc_id": "a", "line": 1}
    assert stats.queries == 1


def test_only_the_named_sources_are_mined_and_the_rows_keep_their_order():
    d = [Document("a", "", "own doc", 1), Document("c", "", "hard doc", 3), Document("e", "", "easy doc", 4)]
    table = {
        "q": [1.0, 0.0, 0.0],
        "own doc": [0.9, 0.1, 0.0],
        "hard doc": [0.6, 0.8, 0.0],
        "easy doc": [0.0, 0.0, 1.0],
    }
    queries = [PseudoQuery("q", "own doc", 0, "title"), PseudoQuery("q", "own doc", 0, "crop")]
    rows, stats = mine_rows(Axes(table), queries, d, k=1, method="perc_pos", margin=0.95, sources={"crop"})
    assert [r["provenance"]["source"] for r in rows] == ["title", "crop"]
    assert rows[0]["negatives"] == [] and "mined_scores" not in rows[0]["provenance"]
    assert rows[1]["negatives"] == ["hard doc"] and stats.queries == 1
    rows, stats = mine_rows(Axes(table), queries, d, k=1, sources=set())  # nothing to mine: no model call
    assert [r["negatives"] for r in rows] == [[], []] and stats.queries == 0
    rows, _ = mine_rows(Axes(table), queries, d, k=1)  # None: every source
    assert [r["negatives"] for r in rows] == [["hard doc"], ["hard doc"]]


def test_labels_from_an_embedder_teacher_and_from_a_reranker():
    table = {"q": [1.0, 0.0], "p": [1.0, 0.0], "n1": [0.0, 1.0], "n2": [1.0, 1.0]}
    rows = [
        {"query": "q", "positive": "p", "negatives": ["n1", "n2"]},
        {"query": "q", "positive": "p", "negatives": []},
    ]
    labelled = label_rows([dict(r) for r in rows], Axes(table), num_negatives=1)
    assert len(labelled) == 1  # the row without a negative cannot be distilled
    assert labelled[0]["negatives"] == ["n1"]
    assert labelled[0]["teacher_scores"]["positive"] == pytest.approx(1.0)
    assert labelled[0]["teacher_scores"]["negatives"] == [pytest.approx(0.0)]

    class Reranker:
        def score(self, query, documents):
            return [len(doc) for doc in documents]

    labelled = label_rows([dict(rows[0])], Reranker(), num_negatives=2)
    assert labelled[0]["teacher_scores"] == {"positive": 1.0, "negatives": [2.0, 2.0]}


def test_a_rerankers_logits_are_put_on_the_students_cosine_scale():
    """A cross-encoder's margins run past 10, a cosine student's never past 2: MarginMSE on the raw logits asked for
    margins the student cannot reach. ``auto`` scales them to the spread of the starting model's own margins (the
    miner's cosines), keeping their order; a number scales by itself."""
    start = [(0.8, [0.5, 0.6]), (0.7, [0.65, 0.2]), (0.9, [0.1, 0.4])]  # the miner's cosines: positive, negatives
    rows = [
        {"query": f"q{i}", "positive": f"p{i}", "negatives": [f"n{i}a", f"n{i}b"],
         "provenance": {"mined_scores": {"positive": pos, "negatives": negs}}}
        for i, (pos, negs) in enumerate(start)
    ]  # fmt: skip
    logits = {f"p{i}": 10 * pos + 3 for i, (pos, _) in enumerate(start)}
    logits |= {f"n{i}{c}": 10 * n + 3 for i, (_, negs) in enumerate(start) for c, n in zip("ab", negs, strict=True)}

    class Reranker:
        def score(self, query, documents):
            return [logits[d] for d in documents]

    labelled = label_rows(json.loads(json.dumps(rows)), Reranker(), num_negatives=2)
    for row, (pos, negs) in zip(labelled, start, strict=True):
        scores = row["teacher_scores"]
        margins = [scores["positive"] - n for n in scores["negatives"]]
        assert margins == pytest.approx([pos - n for n in negs])  # the start's margins, 10x smaller than the logits'
        assert row["provenance"]["teacher_scale"] == pytest.approx(0.1)
    raw = label_rows(json.loads(json.dumps(rows)), Reranker(), num_negatives=2, reranker_scale=1)
    assert raw[0]["teacher_scores"]["positive"] == pytest.approx(11.0)
    assert reranker_scale_to_student(rows[:1], np.ones((1, 3))) == 1.0  # margins that do not vary: left as given


# documents for the hybrid teacher: only a and b hold the query's words ("kinase inhibitors")
KINASE = [
    Document("a", "Kinase", "tyrosine kinase inhibitors in leukaemia", 1),
    Document("b", "", "kinase activity of enzymes", 2),
    Document("c", "", "weather and the sea", 3),
    Document("e", "", "the sea and its weather", 4),
]


def test_the_hybrid_teacher_adds_bm25_scaled_by_the_querys_best_document():
    pytest.importorskip("bm25s")
    from lmembed.lexical.bm25 import LexicalIndex
    from lmembed.training.adapt import HybridTeacher

    d, fulls = KINASE, [x.full for x in KINASE]
    # the dense part alone cannot tell b from c: only BM25 (b shares "kinase") can
    table = {"kinase inhibitors": [1.0, 0.0], fulls[0]: [1.0, 0.0], fulls[1]: [0.0, 1.0], fulls[2]: [0.0, 1.0]}
    teacher = HybridTeacher(Axes(table), d, weight=0.5)
    bm25 = LexicalIndex.build(fulls, [x.id for x in d]).scores("kinase inhibitors")
    assert bm25[0] > bm25[1] > 0 == bm25[2]
    row = {"query": "kinase inhibitors", "positive": "tyrosine kinase inhibitors in leukaemia"}
    rows = [{**row, "negatives": [fulls[1], fulls[2]], "provenance": {"doc_id": "a"}}]
    labelled = label_rows(rows, teacher, num_negatives=2)
    scores = labelled[0]["teacher_scores"]
    assert scores["positive"] == pytest.approx(1.0 + 0.5)  # cos 1, and the query's best BM25 document
    assert scores["negatives"] == [pytest.approx(0.5 * bm25[1] / bm25[0]), pytest.approx(0.0)]
    # a query without an indexed word: the dense part alone
    table["zzz"] = [1.0, 0.0]
    rows = [{"query": "zzz", "positive": "x", "negatives": [fulls[1]], "provenance": {"doc_id": "a"}}]
    assert label_rows(rows, teacher, 1)[0]["teacher_scores"] == {"positive": 1.0, "negatives": [0.0]}
    # rows mined by the teacher's own model carry its cosines: they are the dense part, not computed again
    mined = {"doc_id": "a", "mined_scores": {"positive": 0.25, "negatives": [0.5, 0.75]}}
    rows = [{**row, "negatives": [fulls[1], fulls[2]], "provenance": mined}]
    reusing = HybridTeacher(Axes({}), d, weight=0.5, mined_by_embedder=True)  # an empty table: nothing is encoded
    scores = label_rows(rows, reusing, num_negatives=1)[0]["teacher_scores"]
    assert scores["positive"] == pytest.approx(0.25 + 0.5)
    assert scores["negatives"] == [pytest.approx(0.5 + 0.5 * bm25[1] / bm25[0])]


def test_the_teacher_draws_its_own_best_documents_as_candidates_never_the_querys_own():
    pytest.importorskip("bm25s")
    from lmembed.training.adapt import HybridTeacher

    d, fulls = KINASE, [x.full for x in KINASE]
    # by cosine c and e beat b; BM25 (b shares "kinase") lifts b above them
    table = {"kinase inhibitors": [1.0, 0.0], fulls[0]: [1.0, 0.0], fulls[1]: [0.0, 1.0]}
    table |= {fulls[2]: [0.6, 0.8], fulls[3]: [0.5, 0.866]}
    query = PseudoQuery("kinase inhibitors", "tyrosine kinase inhibitors in leukaemia", 0, "title")
    dense_only = HybridTeacher(Axes(table), d, weight=0.0)
    assert dense_only.lexical is None  # weight 0: no BM25 index is built
    row = dense_only.candidate_rows([query], k=2)[0]
    assert row["negatives"] == [fulls[2], fulls[3]] and row["provenance"]["doc_id"] == "a"
    assert row["teacher_scores"]["positive"] == pytest.approx(1.0)
    assert row["teacher_scores"]["negatives"] == [pytest.approx(0.6), pytest.approx(0.5, abs=1e-4)]
    hybrid = HybridTeacher(Axes(table), d, weight=2.0)
    row = hybrid.candidate_rows([query], k=2)[0]
    assert row["negatives"] == [fulls[1], fulls[2]]  # BM25 brought b in; the own document is never a candidate
    assert row["teacher_scores"]["positive"] == pytest.approx(3.0)
    scores = row["teacher_scores"]["negatives"]
    assert scores[0] > scores[1] == pytest.approx(0.6)
    with pytest.raises(AdaptError, match=r"mining\.k is 4"):
        hybrid.candidate_rows([query], k=4)


# ---------------------------------------------------------------------------------------------- bad corpora
@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "the corpus is empty"),
        (
            [{"_id": "a", "title": "", "text": "the cat"}, {"_id": "b", "title": "  ", "text": ""}],
            r"corpus.jsonl:2: .*neither",
        ),
        ([{"_id": "a", "text": "the cat"}, {"_id": "b", "text": 7}], r"corpus.jsonl:2: text: must be a string"),
        ([{"_id": "a", "text": "the cat"}], "one distinct document"),
        ([{"_id": "a", "text": "the cat"}, {"_id": "a", "text": "the dog"}], r"corpus.jsonl:2: document id .a. is rep"),
    ],
)
def test_bad_corpora_are_refused_naming_file_and_line(tmp_path, lines, message):
    path = write_jsonl(tmp_path / "corpus.jsonl", lines)
    with pytest.raises(AdaptError, match=message):
        read_adapt_corpus(path)


def test_a_text_file_is_one_document_per_line(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("the cat sat\n\nthe dog ran\n")
    assert [(d.id, d.text) for d in read_adapt_corpus(path)] == [("1", "the cat sat"), ("3", "the dog ran")]


# ---------------------------------------------------------------------------------------------- recipe
def test_the_recipe_file_holds_the_defaults():
    assert load_adapt_recipe(REPO / "recipes" / "adapt" / "default.yaml") == AdaptRecipe()
    assert load_adapt_recipe("lora").training.lr == pytest.approx(1e-4)  # a recipe by its name
    with pytest.raises(AdaptRecipeError, match=r"no such recipe file, nor one of the adapt recipes .*default"):
        load_adapt_recipe("nonesuch")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("training:\n  steps: 10\n  stpes: 5\n", r"r.yaml:3: training.stpes: .* known: steps, batch_size, lr"),
        ("sources:\n  crops:\n    min_words: 0\n", r"r.yaml:3: sources.crops.min_words"),
        ("training:\n  merge: 0\n", r"r.yaml:2: training.merge"),
        ("training:\n  hybrid_weight: -1\n", r"r.yaml:2: training.hybrid_weight"),
        ("mining:\n  candidates: bogus\n", r"r.yaml:2: mining.candidates: .*'model' or 'teacher'"),
        ("selection:\n  metric: 3\n", r"r.yaml:2: selection.metric: .*'own' or 'teacher'"),
        ("sources:\n  titles:\n    unique: maybe\n", r"r.yaml:3: sources.titles.unique"),
        ("mining:\n  sources: [crop, titles]\n", r"r.yaml:2: mining.sources.1: .*'title', 'crop' or 'generator'"),
        ("terms:\n  dims: 3\n", r"r.yaml:2: terms.dims"),
        ("terms:\n  weight: 0\n", r"r.yaml:2: terms.weight"),
    ],
)
def test_a_recipe_with_a_bad_key_names_file_line_and_key(tmp_path, text, where):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(AdaptRecipeError, match=where):
        load_adapt_recipe(path)


def test_a_recipe_names_only_what_it_changes(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("training:\n  steps: 7\n")
    assert load_adapt_recipe(path).training.steps == 7


# ---------------------------------------------------------------------------------------------- a whole run
def tiny_recipe(mining: dict | None = None, **training) -> AdaptRecipe:
    data = {
        "sources": {"crops": {"per_document": 3, "min_words": 3, "max_words": 6, "min_rest_words": 4}},
        "selection": {"fraction": 0.2, "every": 2},
        "mining": {"k": 2, **(mining or {})},
        "training": {"steps": 4, "batch_size": 4, "warmup_steps": 1, "lr": 1e-3, "max_length": 32, **training},
    }
    return AdaptRecipe.model_validate(data)


def adapt_tiny(make_embedder, tmp_path: Path, out: Path, recipe: AdaptRecipe | None = None, **options):
    """``run_adapt`` of a tiny BERT on the test corpus, with :func:`tiny_recipe` unless another is given."""
    from lmembed.training.adapt_run import run_adapt

    return run_adapt(
        make_embedder("bert", pooling="mean"),
        corpus_file(tmp_path),
        out,
        recipe=recipe or tiny_recipe(),
        device="cpu",
        progress=False,
        **options,
    )


def test_in_batch_only_skips_mining(tmp_path, make_embedder, one_torch_thread):
    out = tmp_path / "out"
    adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(num_negatives=0, steps=2))
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["report"]["mining"] == {"skipped": "training.num_negatives is 0"}
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["negatives"] == [] and r["provenance"]["doc_id"] for r in rows)


def test_by_default_title_rows_get_no_mined_negative_and_crop_rows_do(tmp_path, make_embedder, one_torch_thread):
    out = tmp_path / "out"
    summary = adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(steps=2)).summary
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    titles = [r for r in rows if r["provenance"]["source"] == "title"]
    crops = [r for r in rows if r["provenance"]["source"] == "crop"]
    assert titles and crops and all(r["negatives"] == [] for r in titles)
    assert all("mined_scores" in r["provenance"] for r in crops) and any(r["negatives"] for r in crops)
    assert summary["report"]["mining"]["unmined"] == len(titles)
    assert summary["report"]["mining"]["queries"] == len(crops)
    made = summary["report"]["sources"]
    assert made["titles"]["made"] >= len(titles) and made["crops"]["made"] >= len(crops)
    # every source named: titles are mined too (the v2 defaults)
    out2 = tmp_path / "out2"
    adapt_tiny(make_embedder, tmp_path, out2, tiny_recipe({"sources": ["title", "crop"]}, steps=2))
    rows = [json.loads(line) for line in (out2 / "rows.jsonl").read_text().splitlines()]
    assert all("mined_scores" in r["provenance"] for r in rows)


def test_the_hybrid_teacher_labels_a_run_from_the_corpus_alone(tmp_path, make_embedder, one_torch_thread):
    pytest.importorskip("bm25s")
    out = tmp_path / "out"
    recipe = tiny_recipe(steps=2, hybrid_weight=100.0)
    adapt_tiny(make_embedder, tmp_path, out, recipe, teacher="hybrid")
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(len(r["teacher_scores"]["negatives"]) == 1 for r in rows)
    # the recipe's weight reaches the teacher: a cosine is at most 1, so only its BM25 part lifts a score past 2
    assert max(r["teacher_scores"]["positive"] for r in rows) > 2.0
    assert json.loads((out / "adapt_summary.json").read_text())["teacher"] == "hybrid"


def test_teacher_candidates_train_a_listwise_distillation(tmp_path, make_embedder, one_torch_thread):
    pytest.importorskip("bm25s")
    out = tmp_path / "out"
    recipe = tiny_recipe({"candidates": "teacher", "k": 3}, steps=2, num_negatives=3, teacher_loss="distill_kl")
    adapt_tiny(make_embedder, tmp_path, out, recipe, teacher="hybrid")
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    corpus = {x.full: x.id for x in docs()}
    assert rows and all(len(r["negatives"]) == len(r["teacher_scores"]["negatives"]) == 3 for r in rows)
    assert all(r["provenance"]["doc_id"] not in {corpus[n] for n in r["negatives"]} for r in rows)
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["report"]["mining"] == {"candidates": "teacher", "k": 3, "rows": len(rows)}
    assert yaml.safe_load((out / "train_config.yaml").read_text())["loss"] == "distill_kl"


@pytest.mark.parametrize(
    ("recipe", "teacher", "message"),
    [
        ({"mining": {"k": 2, "candidates": "teacher"}}, None, r"mining\.candidates is 'teacher' but no --teacher"),
        ({"selection": {"metric": "teacher"}}, None, r"selection\.metric is 'teacher' but no --teacher"),
        ({"selection": {"metric": "teacher"}}, "reranker:x", r"selection\.metric .* 'reranker:x' \(a reranker\)"),
    ],
)
def test_what_needs_a_teacher_ranking_the_corpus_is_refused_before_anything_is_written(
    tmp_path, make_embedder, recipe, teacher, message
):
    out = tmp_path / "out"
    with pytest.raises(AdaptError, match=message):
        adapt_tiny(make_embedder, tmp_path, out, AdaptRecipe.model_validate(recipe), teacher=teacher)
    assert not out.exists()


def test_agreement_with_the_teacher_by_hand():
    from lmembed.training.adapt import agreement

    teacher = np.array([[3.0, 2.0, 1.0, 0.0]])
    assert agreement(teacher, teacher, 1.0, depth=2) == pytest.approx(1.0)
    # the student puts the teacher's second best first and its third second: gains e^0 = 1 and e^-1 (teacher's best
    # two, temperature 1); the student's top two earn e^-1 at rank 1 and nothing at rank 2
    student = np.array([[0.0, 3.0, 2.0, 1.0]])
    ideal = 1.0 + np.exp(-1.0) / np.log2(3)
    assert agreement(student, teacher, 1.0, depth=2) == pytest.approx(np.exp(-1.0) / ideal)


def test_selection_can_follow_the_teachers_ranking(tmp_path, make_embedder, one_torch_thread):
    pytest.importorskip("bm25s")
    out = tmp_path / "out"
    recipe = AdaptRecipe.model_validate(
        {**tiny_recipe(steps=2).model_dump(), "selection": {"fraction": 0.2, "every": 1, "metric": "teacher"}}
    )
    result = adapt_tiny(make_embedder, tmp_path, out, recipe, teacher="hybrid")
    selection = json.loads((out / "selection.json").read_text())
    assert selection["metric"] == "teacher_ndcg_at_10"
    history = result.summary["selection"]["history"]
    assert [h["step"] for h in history] == [0, 1, 2] and all(0 < h["teacher_ndcg_at_10"] <= 1 for h in history)
    best = max(history, key=lambda h: (h["teacher_ndcg_at_10"], -h["step"]))
    assert selection["best_step"] == best["step"] == result.summary["selection"]["best_step"]


def test_adapt_trains_selects_and_saves_a_loadable_model(tmp_path, make_embedder, one_torch_thread):
    from lmembed import Embedder

    out = tmp_path / "out"
    recipe = AdaptRecipe.model_validate({**tiny_recipe().model_dump(), "selection": {"fraction": 0.4, "every": 2}})
    result = adapt_tiny(make_embedder, tmp_path, out, recipe)
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert [h["step"] for h in summary["selection"]["history"]] == [0, 2, 4]
    assert summary["selection"]["after"]["ndcg_at_10"] >= summary["selection"]["before"]["ndcg_at_10"]
    check = summary["selection"]["check"]  # the half that picked nothing: measured before and on the saved model
    assert check["queries"] > 0 and check["documents"] >= 1
    assert set(check["before"]) == set(check["saved"]) == {"ndcg_at_10", "mrr_at_10"}
    held = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    trained = {json.loads(line)["provenance"]["doc_id"] for line in (out / "rows.jsonl").read_text().splitlines()}
    assert held and all(h["positive"] for h in held) and trained.isdisjoint({h["doc_id"] for h in held})
    assert summary["report"]["by_source"].keys() <= {"title", "crop"} and summary["report"]["train_rows"] > 0
    assert summary["peak_memory_mb"] > 0 and summary["seconds"] > 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert all(r["provenance"]["source"] in ("title", "crop") for r in rows)
    assert any(r["negatives"] for r in rows)
    assert (out / "heldout.jsonl").exists() and (out / "adapt.log").read_text()
    model = Embedder.from_pretrained(result.model_dir, show_progress=False)
    assert model.encode(["the cat"]).shape[0] == 1
    # the saved weights are the merge of the start and the kept step (recipe default 0.5), the window the model's own
    from safetensors.torch import load_file

    start, best = load_file(str(out / "start_state.safetensors")), load_file(str(out / "best_state.safetensors"))
    saved = model.backbone.model.state_dict()
    step = summary["selection"]["best_step"]
    for name in ("model.embeddings.word_embeddings.weight", "model.encoder.layer.0.attention.self.query.weight"):
        expected = start[name] + 0.5 * (best[name] - start[name]) if step > 0 else start[name]
        assert torch.allclose(saved[name.removeprefix("model.")], expected, atol=1e-6)
    assert step == 0 or not torch.allclose(start[name], best[name])
    assert summary["selection"]["saved"]["step"] == step
    with pytest.raises(AdaptError, match="already holds an adapt run"):
        adapt_tiny(make_embedder, tmp_path, out)


def test_the_saved_model_carries_the_corpus_term_channel(tmp_path, make_embedder, one_torch_thread):
    from lmembed import Embedder
    from lmembed.training.adapt import read_adapt_corpus

    out = tmp_path / "out"
    result = adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(steps=2))
    summary = json.loads((out / "adapt_summary.json").read_text())
    terms = summary["terms"]
    assert terms["dims"] == 4096 and terms["weight"] == 0.5  # the recipe's defaults
    assert terms["documents"] == len(read_adapt_corpus(corpus_file(tmp_path)))
    assert 0 <= terms["saved_scores"]["ndcg_at_10"] <= 1 and summary["timings"]["terms_s"] >= 0
    model = Embedder.from_pretrained(result.model_dir, show_progress=False, cache=False)
    assert model.config.terms is not None and model.config.terms.sha256 == terms["sha256"]
    assert model.encode_corpus(["the cat"]).shape == (1, model.backbone.hidden_size + 4096)
    assert not (Path(result.model_dir) / "modules.json").exists()  # sentence-transformers cannot read the channel
    card = (Path(result.model_dir) / "README.md").read_text()  # the card tells the adaptation and cites GPL and BM25
    assert "| adapted with | lmembed adapt" in card and "| term channel | 4096 buckets, weight 0.5 |" in card
    assert "@misc{wang2022gpl," in card and "@misc{robertson2009bm25," in card
    assert "@misc{lee2019ict," in card  # its queries were cropped from the documents: the inverse cloze task
    assert f"# {Path(result.model_dir).name}\n" in card and ".tmp" not in card
    assert "| steps trained | 2 |" in card and "| kept step |" in card  # which weights these are

    plain = tmp_path / "plain"
    no_terms = AdaptRecipe().terms.model_copy(update={"enabled": False})
    recipe = tiny_recipe(steps=2).model_copy(update={"terms": no_terms})
    result = adapt_tiny(make_embedder, tmp_path, plain, recipe)
    assert json.loads((plain / "adapt_summary.json").read_text())["terms"] is None
    assert not (Path(result.model_dir) / "terms.safetensors").exists()
    assert Embedder.from_pretrained(result.model_dir, show_progress=False, cache=False).config.terms is None


def test_a_decoder_adapts_with_lora_and_keeps_its_channel(tmp_path, make_embedder, one_torch_thread):
    from lmembed import Embedder
    from lmembed.training.adapt_run import run_adapt

    out = tmp_path / "out"
    result = run_adapt(
        make_embedder("llama", pooling="last"),
        corpus_file(tmp_path),
        out,
        recipe=tiny_recipe(steps=2),
        device="cpu",
        progress=False,
        lora=True,
    )
    summary = json.loads((out / "adapt_summary.json").read_text())
    assert summary["lora"] is True and summary["terms"]["dims"] == 4096
    model = Embedder.from_pretrained(result.model_dir, show_progress=False, cache=False)
    assert model.backbone.is_decoder and model.config.pooling == "last" and model.config.terms is not None
    vectors = model.encode_queries(["the cat"])
    assert vectors.shape == (1, model.backbone.hidden_size + 4096) and np.isfinite(vectors).all()


def _stop_before(monkeypatch, step: int):
    """Make the adapt trainer stop (KeyboardInterrupt) when it reaches ``step``; returns what lets it run on."""
    from lmembed.training import adapt_run

    real_step = adapt_run._SelectingTrainer.train_step

    def interrupted(self):
        if self.step == step:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(adapt_run._SelectingTrainer, "train_step", interrupted)
    return lambda: monkeypatch.setattr(adapt_run._SelectingTrainer, "train_step", real_step)


def test_adapt_resumes_after_an_interruption(tmp_path, make_embedder, one_torch_thread, monkeypatch):
    out = tmp_path / "out"
    resume = _stop_before(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out)
    assert not (out / "model").exists() and not (out / "adapt_summary.json").exists()
    rows_before = (out / "rows.jsonl").read_text()
    resume()
    result = adapt_tiny(make_embedder, tmp_path, out, resume=True)
    assert (out / "rows.jsonl").read_text() == rows_before  # the rows are read back, not made again
    assert [h["step"] for h in result.summary["selection"]["history"]] == [0, 2, 4]
    assert result.model_dir.is_dir()
    with pytest.raises(AdaptError, match="another recipe"):
        adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(lr=1e-4), resume=True)


def test_a_run_begun_before_check_halves_resumes_without_one(tmp_path, make_embedder, one_torch_thread, monkeypatch):
    """A run begun by a version without the check half has no start scores for it in its selection history; resumed,
    it finishes without a check half (it would have ended in a KeyError)."""
    out = tmp_path / "out"
    recipe = AdaptRecipe.model_validate({**tiny_recipe().model_dump(), "selection": {"fraction": 0.4, "every": 2}})
    resume = _stop_before(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out, recipe)
    selection = json.loads((out / "selection.json").read_text())
    assert any(k.startswith("check_") for k in selection["history"][0])  # this version wrote them
    selection["history"][0] = {k: v for k, v in selection["history"][0].items() if not k.startswith("check_")}
    (out / "selection.json").write_text(json.dumps(selection))
    resume()
    result = adapt_tiny(make_embedder, tmp_path, out, recipe, resume=True)
    assert result.summary["selection"]["check"] is None and result.model_dir.is_dir()


def test_a_run_killed_before_its_first_checkpoint_resumes_and_merges(
    tmp_path, make_embedder, one_torch_thread, monkeypatch
):
    """Killed after the start state was kept but before any checkpoint, a resumed run starts over from step 0: it
    keeps the start state again with its digest, so the merge at the end reads it (it trained to the end, then
    refused every time, before)."""
    from lmembed.training.adapt_run import _SelectingTrainer

    out = tmp_path / "out"
    resume = _stop_before(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(merge=0.5))
    assert (out / "start_state.safetensors").is_file() and not list((out / "checkpoints").glob("step-*"))
    resume()
    monkeypatch.setattr(_SelectingTrainer, "best", lambda self: self.history[-1])  # a later step: the merge runs
    result = adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(merge=0.5), resume=True)
    assert result.model_dir.is_dir()
    states = json.loads((out / "selection.json").read_text())["states"]
    assert "start_state.safetensors" in states


def test_a_resumed_run_reads_back_its_rows_only_as_they_were_made(
    tmp_path, make_embedder, one_torch_thread, monkeypatch
):
    """adapt_plan.json records the sha256 of rows.jsonl and heldout.jsonl; a resumed run checks both before it
    trains on them: a row edited while the run was stopped is refused naming the file and ``files.rows.jsonl``."""
    out = tmp_path / "out"
    resume = _stop_before(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out)
    plan = json.loads((out / "adapt_plan.json").read_text())
    assert set(plan["files"]) == {"rows.jsonl", "heldout.jsonl"}
    rows = (out / "rows.jsonl").read_text().splitlines()
    (out / "rows.jsonl").write_text("\n".join([rows[0].replace('"query": "', '"query": "x'), *rows[1:]]) + "\n")
    resume()
    with pytest.raises(AdaptError, match=r"rows\.jsonl: its sha256 is not the one .*\(files\.rows\.jsonl\)"):
        adapt_tiny(make_embedder, tmp_path, out, resume=True)


def test_the_kept_states_are_checked_before_a_resumed_run_reads_them(
    tmp_path, make_embedder, one_torch_thread, monkeypatch
):
    """selection.json records the sha256 of best_state and start_state; a resumed run checks each before reading it
    back: a file changed while the run was stopped is refused naming it and ``states.NAME``."""
    from lmembed.io import sha256_file

    out = tmp_path / "out"
    resume = _stop_before(monkeypatch, 3)  # after step 2's selection: a best state and a checkpoint are on disk
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(merge=0.5))
    states = json.loads((out / "selection.json").read_text())["states"]
    for name in ("best_state.safetensors", "start_state.safetensors"):
        assert states[name] == [sha256_file(out / name)], name
    data = bytearray((out / "start_state.safetensors").read_bytes())
    data[-1] ^= 0x01
    (out / "start_state.safetensors").write_bytes(bytes(data))
    resume()
    # the run keeps a later step than 0 only if one scores better; force it so the start state is read (the merge)
    from lmembed.training.adapt_run import _SelectingTrainer

    monkeypatch.setattr(_SelectingTrainer, "best", lambda self: self.history[-1])
    with pytest.raises(AdaptError, match=r"start_state\.safetensors: its sha256 is not the one .*states\.start_state"):
        adapt_tiny(make_embedder, tmp_path, out, tiny_recipe(merge=0.5), resume=True)


RESUME_DAMAGE = {
    # a protection switched off by deleting its record: the rows read back unchecked, a swapped state believed
    "the plan's digests deleted": ("adapt_plan.json", lambda d: d.pop("files"), r"adapt_plan.json: files: Field"),
    "the states' digests deleted": ("selection.json", lambda d: d.pop("states"), r"selection.json: states: Field"),
    "a state's digest deleted": (
        "selection.json",
        lambda d: d["states"].pop("best_state.safetensors"),
        r"selection.json: states has no sha256 for best_state.safetensors",
    ),
    # shapes that ended in internal errors (AttributeError, KeyError, ValueError)
    "the plan a list": ("adapt_plan.json", None, r"adapt_plan.json: the whole file: Input should be a valid dict"),
    "a step as text": (
        "selection.json",
        lambda d: d["history"][0].update(step="x"),
        r"selection.json: history.0.step: Input should be a valid number",
    ),
    # believed before: a NaN score picked as best, a step as text, a state or a planned file outside the run folder
    "a score not a number": (
        "selection.json",
        lambda d: d["history"][0].update({d["metric"]: float("nan")}),
        r"selection.json: history.0.\S+: Input should be a finite number",
    ),
    "the best step as text": (
        "selection.json",
        lambda d: d.update(best_step="0"),
        r"selection.json: best_step: Input should be a valid integer",
    ),
    "a state named outside the run folder": (
        "selection.json",
        lambda d: d["states"].update({"../../start_state.safetensors": ["0" * 64]}),
        r"selection.json: states: .*'../../start_state.safetensors' is not the name of a file of the run folder",
    ),
    "a planned file outside the run folder": (
        "adapt_plan.json",
        lambda d: d["files"].update({"../rows.jsonl": "0" * 64}),
        r"adapt_plan.json: files: .*'../rows.jsonl' is not the name of a file of the run folder",
    ),
    "no metric in the history": (
        "selection.json",
        lambda d: [h.pop(d["metric"]) for h in d["history"]],
        r"selection.json: history: an entry without",
    ),
}


@pytest.mark.parametrize("case", RESUME_DAMAGE)
def test_a_resumed_run_refuses_run_files_of_another_shape_or_without_digests(
    tmp_path, make_embedder, one_torch_thread, monkeypatch, case
):
    out = tmp_path / "out"
    resume = _stop_before(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        adapt_tiny(make_embedder, tmp_path, out)
    name, change, said = RESUME_DAMAGE[case]
    data = json.loads((out / name).read_text())
    if change is None:
        data = [data]
    else:
        change(data)
    (out / name).write_text(json.dumps(data))
    resume()
    with pytest.raises(AdaptError, match=said):
        adapt_tiny(make_embedder, tmp_path, out, resume=True)


def test_a_teacher_labels_the_rows_and_the_loss_distils(tmp_path, make_embedder, one_torch_thread):
    from lmembed.training.adapt_run import run_adapt

    out = tmp_path / "out"
    embedder = make_embedder("bert", pooling="mean")
    result = run_adapt(
        embedder, corpus_file(tmp_path), out, recipe=tiny_recipe(steps=2), teacher="self", device="cpu", progress=False
    )
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(len(r["teacher_scores"]["negatives"]) == 1 for r in rows)
    assert yaml.safe_load((out / "train_config.yaml").read_text())["loss"] == "margin_mse"
    assert result.model_dir.is_dir()


def test_a_reranker_teacher_labels_on_the_students_scale_and_says_so(tmp_path, make_embedder, one_torch_thread):
    from lmembed.training.adapt_run import run_adapt

    out = tmp_path / "out"
    folder = save_tiny_cross_encoder(tmp_path / "ce", seed=3)
    embedder = make_embedder("bert", pooling="mean")
    run_adapt(
        embedder,
        corpus_file(tmp_path),
        out,
        recipe=tiny_recipe(steps=2),
        teacher=f"reranker:{folder}",
        device="cpu",
        progress=False,
    )
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    scale = json.loads((out / "adapt_plan.json").read_text())["report"]["teacher_scale"]
    assert rows and scale > 0 and all(r["provenance"]["teacher_scale"] == scale for r in rows)
