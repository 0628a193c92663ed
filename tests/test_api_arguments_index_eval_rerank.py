"""Bad arguments to the index, the evaluation tasks and the rerankers: each is refused with an lmembed error that
names the argument (never a raw TypeError from numpy or faiss, a process killed inside pytrec_eval, an allocation
sized by a huge ``k``, or a result read character by character)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import tiny_model
from helpers import TOY_DOCS, random_beir, save_tiny_cross_encoder
from lmembed import Embedder, EmbeddingConfig
from lmembed.errors import ConfigError, InputError, LmembedError
from lmembed.evaluation.metrics import check_k_values, evaluate_run
from lmembed.evaluation.tasks import load_task
from lmembed.evaluation.tasks.pair_classification import PairClassificationTask
from lmembed.evaluation.tasks.sts import STSTask, sts_scores
from lmembed.index import Document, Index
from lmembed.index.manifest import MANIFEST_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = ["cat", "dog", "gene", "cell", "horse", "movie", "model", "vector"]


@pytest.fixture(scope="module")
def bert(tokenizer):
    model = tiny_model("bert", len(tokenizer))
    return Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)


@pytest.fixture(scope="module")
def index(bert):
    return Index.build(bert, [(f"d{i}", text) for i, text in enumerate(TOY_DOCS[:3])])


# ---------------------------------------------------------------------------------------------- k of a search
@pytest.mark.parametrize("k", [0, -1, 2.5, True, "3", None])
@pytest.mark.parametrize("method", ["search", "search_batch", "search_rows"])
def test_search_refuses_k_that_is_not_a_whole_number(index, method, k):
    query = "cat" if method == "search" else ["cat"]
    with pytest.raises(ConfigError, match=r"\bk="):
        getattr(index, method)(query, k)


@pytest.mark.parametrize("k", [0, 2.5, False])
def test_search_vectors_refuses_bad_k(index, k):
    with pytest.raises(ConfigError, match=r"\bk="):
        index.search_vectors(np.ones((1, index.dim), dtype=np.float32), k)


def test_search_refuses_bad_candidates(index):
    with pytest.raises(ConfigError, match="candidates="):
        index.search_batch(["cat"], 2, mode="hybrid", candidates=1.5)


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_a_huge_k_is_searched_as_the_number_of_documents(index, mode):
    """k = 10**9 on a 3-document index returns its 3 documents, as k = 3 does, without a k-sized allocation."""
    huge = index.search_batch(["the cat", "a protein"], 10**9, mode=mode, candidates=10**9)
    assert huge == index.search_batch(["the cat", "a protein"], 3, mode=mode)
    scores, rows = index.search_rows(["the cat"], 10**9, mode=mode)
    assert rows.shape == scores.shape == (1, 3)
    scores, rows = index.search_vectors(index.embed_queries(["the cat"]), 10**9)
    assert rows.shape == (1, 3)


def test_a_huge_k_on_an_empty_index(bert):
    empty = Index.build(bert, [])
    assert empty.search("cat", 10**9) == []
    assert empty.search_rows(["cat"], 10**9)[1].shape == (1, 1)


# ---------------------------------------------------------------------------------------------- queries
@pytest.mark.parametrize("queries", ["cat", None, {"q": "cat"}, [None], ["cat", 3], 7])
def test_search_batch_refuses_what_is_not_a_list_of_strings(index, queries):
    with pytest.raises(InputError, match="queries"):
        index.search_batch(queries, 1)


def test_search_refuses_a_query_that_is_not_a_str(index):
    with pytest.raises(InputError, match="query must be a str"):
        index.search(None)


# ---------------------------------------------------------------------------------------------- query vectors
def test_search_vectors_refuses_a_wrong_width_naming_the_expected_one(index):
    with pytest.raises(InputError, match=rf"\(n, {index.dim}\)"):
        index.search_vectors(np.zeros((1, index.dim + 1)), 2)
    with pytest.raises(InputError, match=rf"\(n, {index.dim}\)"):
        index.search_vectors(np.zeros(index.dim), 2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_search_vectors_refuses_non_finite_queries(index, bad):
    vectors = np.ones((2, index.dim), dtype=np.float32)
    vectors[1, 3] = bad
    with pytest.raises(InputError, match=r"vectors\[1\].*finite"):
        index.search_vectors(vectors, 2)


def test_search_vectors_refuses_what_is_not_numbers(index):
    with pytest.raises(InputError, match="vectors"):
        index.search_vectors([["a"] * index.dim], 2)


# ---------------------------------------------------------------------------------------------- corpus
@pytest.mark.parametrize(
    ("corpus", "named"),
    [
        ([Document(1, "cats purr")], r"corpus\[0\]\.id"),
        ([Document("a", "cats"), Document("b", None)], r"corpus\[1\]\.text"),
        ([Document("a", 5)], r"corpus\[0\]\.text"),
        ([(1, "cats purr")], r"corpus\[0\]\.id"),
        ([("a", None)], r"corpus\[0\]\.text"),
        (["cats", None], r"corpus\[1\]"),
        ([{"id": "a", "text": "x"}], r"corpus\[0\]"),
        ([Document("a", "x", metadata=[1])], r"corpus\[0\]\.metadata"),
        ([Document("a", "x", metadata={"when": object()})], r"corpus\[0\]\.metadata"),
        (None, "corpus is None"),
        ({"a": "cats purr", "b": "dogs bark"}, r"corpus is a dict.*\(id, text\) pairs or Documents"),
        ({"cats purr", "dogs bark"}, "corpus is a set"),
        (42, "corpus is int"),
    ],
)
def test_build_refuses_a_bad_corpus_before_writing(bert, tmp_path, corpus, named):
    folder = tmp_path / "idx"
    with pytest.raises(InputError, match=named):
        Index.build(bert, corpus, folder)
    assert not (folder / MANIFEST_FILE).exists()


def test_add_refuses_non_str_ids_and_leaves_the_index_as_it_was(bert, tmp_path):
    folder = tmp_path / "idx"
    built = Index.build(bert, [("a", "cats purr")], folder)
    generation = built.manifest.generation
    for bad, named in ([Document(2, "dogs")], r"corpus\[0\]\.id"), (None, "corpus is None"):
        with pytest.raises(InputError, match=named):
            built.add(bad)
    assert built.count == 1 and built.manifest.generation == generation
    assert Index.open(folder, bert).count == 1


def test_list_pairs_are_accepted(bert):
    built = Index.build(bert, [["a", "cats purr"], ("b", "dogs bark")])
    assert built.store.ids == ["a", "b"]


# ---------------------------------------------------------------------------------------------- build options
@pytest.mark.parametrize("chunk_size", ["x", 0, 1.5, True])
def test_build_and_add_refuse_a_bad_chunk_size(bert, index, chunk_size):
    with pytest.raises(ConfigError, match="chunk_size="):
        Index.build(bert, ["x"], chunk_size=chunk_size)
    with pytest.raises(ConfigError, match="chunk_size="):
        index.add(["x"], chunk_size=chunk_size)


@pytest.mark.parametrize("embedder", [None, "minilm"])
def test_build_refuses_what_is_not_an_embedder(embedder):
    with pytest.raises(ConfigError, match="embedder is"):
        Index.build(embedder, ["x"])


def test_build_refuses_a_bad_dim(bert):
    with pytest.raises(ConfigError, match="dim="):
        Index.build(bert, ["x"], dim="8")


def test_an_index_without_an_embedder_says_so(index):
    bare = Index(index.manifest, index.vectors, index.store)
    with pytest.raises(ConfigError, match="no Embedder"):
        bare.search("cat")


# ---------------------------------------------------------------------------------------------- k_values
@pytest.mark.parametrize("k_values", [[0], [10, -1], "10", [2.5], [True], [], None, 10])
def test_retrieval_task_refuses_bad_k_values(tmp_path, k_values):
    folder = random_beir(tmp_path / "beir", WORDS, docs=6, queries=2, relevant=1, seed=0)
    with pytest.raises(ConfigError, match="k_values"):
        load_task(folder, k_values=k_values)


@pytest.mark.parametrize("top_k", [0, 1.5, None])
def test_retrieval_task_refuses_bad_top_k(tmp_path, top_k):
    folder = random_beir(tmp_path / "beir", WORDS, docs=6, queries=2, relevant=1, seed=0)
    with pytest.raises(ConfigError, match="top_k="):
        load_task(folder, top_k=top_k)


def test_good_k_values_are_kept(tmp_path):
    folder = random_beir(tmp_path / "beir", WORDS, docs=6, queries=2, relevant=1, seed=0)
    assert load_task(folder, k_values=[1, np.int64(5)]).k_values == (1, 5)
    assert check_k_values(range(1, 4)) == (1, 2, 3)


def test_evaluate_run_with_a_zero_cut_off_is_an_error_not_an_abort():
    """pytrec_eval ends the whole process on ``ndcg_cut.0``; a child process shows the error comes first."""
    code = textwrap.dedent(
        """
        from lmembed.errors import ConfigError
        from lmembed.evaluation.metrics import evaluate_run
        try:
            evaluate_run({"q": {"d": 1}}, {"q": {"d": 1.0}}, [0])
        except ConfigError as exc:
            print("refused:", exc)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "refused: k_values[0]=0" in run.stdout
    with pytest.raises(ConfigError, match="k_values"):
        evaluate_run({"q": {"d": 1}}, {"q": {"d": 1.0}}, "10")


# ---------------------------------------------------------------------------------------------- STS
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("abc", "def", [1, 2, 3]), "sentence1"),
        ((["a", "b"], "cd", [1, 2]), "sentence2"),
        ((["a", None], ["c", "d"], [1, 2]), r"sentence1\[1\]"),
        ((["a", "b"], ["c", "d"], [1, float("nan")]), r"scores\[1\]"),
        ((["a", "b"], ["c", "d"], "12"), "scores must be a list"),
        ((["a", "b"], ["c", "d"], [1, "2"]), r"scores\[1\]"),
        ((["a", "b"], ["c", "d"], [True, False]), r"scores\[0\]"),
    ],
)
def test_sts_task_refuses_bad_data(args, named):
    with pytest.raises(InputError, match=named):
        STSTask("x", *args)


class NeverCalled:
    def encode(self, texts, **kwargs):
        raise AssertionError("nothing is embedded for a task that cannot be scored")


@pytest.mark.parametrize(
    ("args", "named"), [((["a"], ["c"], [1.0]), "at least 2"), ((["a", "b"], ["c", "d"], [3, 3]), "constant")]
)
def test_sts_task_that_cannot_be_correlated_is_refused_before_embedding(args, named):
    task = STSTask("x", *args)  # it loads (a 1-pair file is a valid file), but is not scored as NaN
    with pytest.raises(InputError, match=rf"scores.*{named}|{named}"):
        task.evaluate(NeverCalled())


def test_sts_task_refuses_an_empty_scale():
    with pytest.raises(ConfigError, match="max_score"):
        STSTask("x", ["a", "b"], ["c", "d"], [1, 2], min_score=5.0, max_score=5.0)


def test_sts_scores_refuses_constant_gold_scores():
    embeddings = np.eye(3, dtype=np.float32)
    with pytest.raises(InputError, match="gold_scores"):
        sts_scores(embeddings, embeddings[::-1], [2.0, 2.0, 2.0])


def test_pair_classification_refuses_a_str_of_sentences():
    with pytest.raises(InputError, match="sentence1"):
        PairClassificationTask("x", "ab", ["c", "d"], [0, 1])


# ---------------------------------------------------------------------------------------------- rerankers
@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    from lmembed.rerank import load_reranker

    return load_reranker(str(save_tiny_cross_encoder(tmp_path_factory.mktemp("ce"))))


@pytest.mark.parametrize("documents", ["cats purr", None, {"a": "cats"}, ["cats", None], 3])
@pytest.mark.parametrize("method", ["score", "rank"])
def test_reranker_refuses_documents_that_are_not_a_list_of_strings(reranker, method, documents):
    with pytest.raises(InputError, match="documents"):
        getattr(reranker, method)("cat", documents)


@pytest.mark.parametrize("pairs", [None, "x", {"a": "b"}, 5, [("a",)], ["a", None]])
def test_reranker_predict_refuses_bad_pairs(reranker, pairs):
    with pytest.raises(InputError, match="pairs"):
        reranker.predict(pairs)


@pytest.mark.parametrize("top_k", [0, 2.5, "2", True])
def test_reranker_rank_refuses_a_bad_top_k(reranker, top_k):
    with pytest.raises(ConfigError, match="top_k="):
        reranker.rank("cat", ["a", "b", "c"], top_k=top_k)


def test_reranker_accepts_good_arguments(reranker):
    assert reranker.score("cat", ("cats purr", "dogs bark")).shape == (2,)
    assert len(reranker.rank("cat", ["a", "b", "c"], top_k=10**9)) == 3
    assert len(reranker.rank("cat", ["a", "b", "c"], top_k=np.int64(2))) == 2


def test_every_refusal_is_an_lmembed_error():
    assert issubclass(ConfigError, LmembedError) and issubclass(InputError, LmembedError)
