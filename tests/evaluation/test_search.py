"""Exact search: chunking must not change results, identical ids, padding, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lmembed.evaluation.search import exact_search, identical_id_positions, search


def reference_topk(q: np.ndarray, c: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Full-matrix ranking: score descending, corpus index ascending on ties."""
    scores = q.astype(np.float32) @ c.astype(np.float32).T
    order = np.lexsort((np.broadcast_to(np.arange(len(c)), scores.shape), -scores), axis=1)[:, :k]
    return order, np.take_along_axis(scores, order, 1)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 99, 100, 101, 1000, None])
@pytest.mark.parametrize("top_k", [1, 10, 100])
def test_chunked_equals_full_matrix(chunk_size: int | None, top_k: int) -> None:
    # Small integer vectors make dot products exact in float32, with many ties.
    rng = np.random.default_rng(0)
    q = rng.integers(-3, 4, size=(37, 8)).astype(np.float32)
    c = rng.integers(-3, 4, size=(500, 8)).astype(np.float32)
    ref_idx, ref_scores = reference_topk(q, c, top_k)
    result = exact_search(q, c, top_k=top_k, similarity="dot", chunk_size=chunk_size, query_batch_size=16)
    np.testing.assert_array_equal(result.indices, ref_idx)
    np.testing.assert_array_equal(result.scores, ref_scores)
    assert result.scores.dtype == np.float32


@pytest.mark.parametrize("chunk_size", [50, 333, None])
def test_cosine_matches_full_matrix(chunk_size: int | None) -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((20, 32)) * 5  # float64 input, unnormalised
    c = rng.standard_normal((700, 32)) * rng.uniform(0.1, 10, size=(700, 1))
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    cn = c / np.linalg.norm(c, axis=1, keepdims=True)
    full = qn @ cn.T
    result = exact_search(q, c, top_k=50, chunk_size=chunk_size)
    expected = -np.sort(-full, axis=1)[:, :50]
    np.testing.assert_allclose(result.scores, expected, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, result.indices, 1), result.scores, atol=1e-5)


def test_top_k_larger_than_corpus_is_padded() -> None:
    q = np.eye(3, dtype=np.float32)
    c = np.eye(3, dtype=np.float32)[:2]
    result = exact_search(q, c, top_k=4, similarity="dot")
    assert result.indices.shape == (3, 4)
    assert (result.indices[:, 2:] == -1).all() and np.isneginf(result.scores[:, 2:]).all()
    assert result.hits(0)[0].tolist() == [0, 1]


def test_identical_ids_are_dropped_before_top_k() -> None:
    rng = np.random.default_rng(2)
    c = rng.standard_normal((30, 6)).astype(np.float32)
    corpus_ids = [f"d{i}" for i in range(30)]
    query_ids = ["d3", "d17", "q-other"]
    q = c[[3, 17, 5]] + 0.01  # each query is closest to its own-id document (or to d5)
    run = search(q, c, query_ids, corpus_ids, top_k=5, ignore_identical_ids=True)
    assert "d3" not in run["d3"] and "d17" not in run["d17"]
    assert all(len(docs) == 5 for docs in run.values())  # still top_k hits each
    assert next(iter(run["q-other"])) == "d5"  # no identical id: nothing dropped
    kept = search(q, c, query_ids, corpus_ids, top_k=5)
    assert next(iter(kept["d3"])) == "d3"
    # The dropped run is the kept run's ranking minus the self hit, extended by one.
    assert list(run["d3"])[:4] == [d for d in kept["d3"] if d != "d3"][:4]


def test_identical_id_on_small_corpus_leaves_padding() -> None:
    c = np.eye(3, dtype=np.float32)
    result = exact_search(c, c, top_k=3, exclude=identical_id_positions(["a", "b", "z"], ["a", "b", "c"]))
    assert result.hits(0)[0].tolist() == [1, 2] and result.indices[0, 2] == -1
    assert len(result.hits(2)[0]) == 3


def test_run_ids_and_order() -> None:
    c = np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32)
    run = search(np.array([[1, 0]], dtype=np.float32), c, ["q"], ["a", "b", "c"], top_k=2)
    assert list(run["q"]) == ["a", "b"]
    assert all(isinstance(v, float) for v in run["q"].values())


def test_nan_scores_become_minus_one_and_zero_vectors_are_safe() -> None:
    c = np.array([[1, 0], [0, 0], [np.nan, 1]], dtype=np.float32)
    result = exact_search(np.array([[1, 0]], dtype=np.float32), c, top_k=3)
    assert result.indices[0].tolist() == [0, 1, 2]
    assert result.scores[0].tolist() == [1.0, 0.0, -1.0]


def test_torch_backend_agrees() -> None:
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q = rng.integers(-3, 4, size=(10, 8)).astype(np.float32)
    c = rng.integers(-3, 4, size=(300, 8)).astype(np.float32)
    a = exact_search(q, c, top_k=20, similarity="dot", chunk_size=64)
    b = exact_search(q, c, top_k=20, similarity="dot", chunk_size=64, backend="torch")
    np.testing.assert_array_equal(a.indices, b.indices)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="dimension"):
        exact_search(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ValueError, match="similarity"):
        exact_search(np.ones((2, 3)), np.ones((4, 3)), similarity="l2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one to one"):
        search(np.ones((2, 3)), np.ones((4, 3)), ["q"], ["a", "b", "c", "d"])


def test_300_queries_by_5k_docs_is_fast() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((300, 384)).astype(np.float32)
    c = rng.standard_normal((5000, 384)).astype(np.float32)
    ids = [str(i) for i in range(5000)]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        search(q, c, ids[:300], ids, top_k=1000)
        best = min(best, time.perf_counter() - start)
    assert best < 1.0, f"search took {best:.3f}s"


def test_few_queries_do_not_copy_a_large_corpus_whole(monkeypatch) -> None:
    """The corpus chunk was sized by the score matrix alone: with 10 queries, 1.67M rows, each chunk normalised into
    a copy as large as the corpus. It is bounded by the chunk's own floats too."""
    from lmembed.evaluation import search as module

    seen = []
    real = module._search_block

    def spy(q, corpus, k, chunk_size, *rest):
        seen.append(chunk_size)
        return real(q, corpus, k, chunk_size, *rest)

    monkeypatch.setattr(module, "_search_block", spy)
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(3000, 2048)).astype(np.float32)
    module.exact_search(rng.normal(size=(4, 2048)).astype(np.float32), corpus, top_k=5, max_block_elements=1 << 20)
    assert (seen and max(seen) * 2048 <= 1 << 20) or max(seen) == 1024
