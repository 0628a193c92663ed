"""Sharded encoding without Ray: the plan, the units of work, resume, sources, assembly and large-corpus search.

The unit of work (shard i of n → the cache) is the same on every engine, so what is checked here on the local
engine (exact vectors for every strategy and any sharding, resume, ids and order) holds for the Ray engine too;
tests/test_scale.py repeats the essentials on a real Ray cluster.
"""

from __future__ import annotations

import json
import pickle
import random
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import WORDS, build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.atomic import file_lock
from lmembed.evaluation.large_corpus import search_corpus, storage_of
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.runner import evaluate_strategies
from lmembed.evaluation.search import exact_search
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.io import DataFormatError, read_corpus, read_text_lines, read_texts_field
from lmembed.scale import (
    BadRowError,
    EncodeJob,
    LocalEngine,
    ScaleError,
    ShardedExecutor,
    encode_corpus,
    memory_source,
    open_source,
    open_texts,
)
from lmembed.scale.progress import ProgressTracker
from lmembed.scale.work import Snapshot, shard_name
from lmembed.training.trainable import LoraSettings, TrainableEmbedder

INSTRUCTION = "Given a query, retrieve documents"


def corpus_texts(n: int = 150, seed: int = 0) -> list[str]:
    """Texts of 0-40 words (an empty one too), with repeats, so lengths tie and batches pad."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(n)]
    texts[7] = ""
    return [*texts, texts[3], texts[10], texts[3]]


def cached(emb: Embedder, cache_dir) -> Embedder:
    """The same model and strategy, with an embedding cache in ``cache_dir``."""
    return Embedder.from_model(
        emb.backbone.model, emb.backbone.tokenizer, emb.config, pooling_head=emb.pooling_head, cache_dir=cache_dir
    )


def uncached(family: str = "llama", **strategy) -> Embedder:
    tok = build_tokenizer()
    return Embedder.from_model(
        tiny_model(family, len(tok)), tok, EmbeddingConfig(**strategy), use_cache=False, show_progress=False
    )


def lora_embedder(**strategy) -> Embedder:
    """A tiny decoder with injected LoRA adapters whose weights are not zero (so they change the vectors)."""
    trainable = TrainableEmbedder(uncached("llama", **strategy), lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for name, param in trainable.named_trainable_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    trainable.eval()
    return trainable.embedder


STRATEGIES = {
    "mean": ("llama", {}),
    "last+bidirectional": ("qwen2", {"pooling": "last", "attention": "bidirectional"}),
    "weighted_mean+fused+final_norm": ("llama", {"pooling": "weighted_mean", "layer": (1, 2), "final_norm": True}),
    "echo": ("mistral", {"echo": True}),
    "cls+encoder+dim": ("bert", {"pooling": "cls", "dim": 16}),
    "latent_attention": ("qwen2", {"pooling": "latent_attention", "latent": {"num_latents": 8, "num_heads": 4}}),
}


# ---------------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_vectors_equal_single_process_whatever_the_sharding(name, tmp_path, one_torch_thread):
    family, strategy = STRATEGIES[name]
    emb = uncached(family, **strategy)
    texts = corpus_texts(80)
    for instruction in (None, INSTRUCTION):
        expected = emb.encode(texts, batch_size=8, instruction=instruction)
        for shard_rows in (8, 24):  # a shard per batch; three batches per shard (the last one short)
            done = encode_corpus(
                cached(emb, tmp_path / f"cache-{shard_rows}"),
                texts,
                instruction=instruction,
                batch_size=8,
                shard_rows=shard_rows,
            )
            assert np.array_equal(done.vectors, expected), f"{name}, shard_rows={shard_rows}, {instruction=}"
            assert done.ids == [str(i) for i in range(len(texts))]


def test_lora_adapters_in_memory_give_the_same_vectors(tmp_path, one_torch_thread):
    emb = lora_embedder()
    texts = corpus_texts(60)
    expected = emb.encode(texts, batch_size=4)
    assert not np.array_equal(expected, uncached().encode(texts, batch_size=4))  # the adapters matter
    done = encode_corpus(cached(emb, tmp_path), texts, batch_size=4, shard_rows=12)
    assert np.array_equal(done.vectors, expected)


def test_several_strategies_share_one_job_per_forward_group(tmp_path, one_torch_thread):
    emb = uncached("llama")
    configs = [
        emb.config,
        emb.config.with_options(pooling="last"),
        emb.config.with_options(layer=1, final_norm=True),
        emb.config.with_options(echo=True),
    ]
    texts = corpus_texts(40)
    expected = emb.encode_strategies(texts, configs, batch_size=8, instruction=INSTRUCTION)
    sharded = cached(emb, tmp_path).with_executor(ShardedExecutor(LocalEngine(), shard_rows=16))
    got = sharded.encode_strategies(texts, configs, batch_size=8, instruction=INSTRUCTION)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    # mean and layer 1 share forward passes (one job); last-token pooling (an EOS is appended) and echo do not
    assert len(sharded.executor.reports) == 3


def test_snapshot_rebuilds_the_same_model_and_refuses_injected_adapters(tmp_path, one_torch_thread):
    emb = uncached("qwen2", pooling="latent_attention", latent={"num_latents": 8, "num_heads": 4})
    copy = pickle.loads(pickle.dumps(Snapshot.of(emb))).load("cpu")
    texts = corpus_texts(30)
    assert np.array_equal(copy.encode(texts), emb.encode(texts))
    with pytest.raises(ScaleError, match="EmbedderSpec"):
        Snapshot.of(lora_embedder()).load("cpu")


def test_snapshot_carries_a_term_channel(one_torch_thread):
    texts = [t for t in corpus_texts(30) if t]
    emb = uncached("bert", pooling="mean").fit_terms(texts, dims=64)
    copy = pickle.loads(pickle.dumps(Snapshot.of(emb))).load("cpu")
    assert copy.config.terms == emb.config.terms
    assert np.array_equal(copy.encode_queries(texts), emb.encode_queries(texts))
    assert np.array_equal(copy.encode_corpus(texts), emb.encode_corpus(texts))


# ---------------------------------------------------------------------------------------------- plan and cache
def test_plan_follows_the_engine_order_and_shares_repeated_texts(tmp_path):
    emb = uncached("llama")
    texts = corpus_texts(40)
    job = EncodeJob(cached(emb, tmp_path), memory_source(texts), batch_size=4, shard_rows=10)
    assert job.shard_rows == 12  # rounded up to whole batches
    job.run(LocalEngine())
    plan = job.plan()
    assert plan.n_rows == len(texts) and plan.n_unique == len(set(texts))
    lengths = plan.lengths
    assert np.all(lengths[:-1] >= lengths[1:])  # longest first
    ties = lengths[:-1] == lengths[1:]
    assert np.all(plan.order[:-1][ties] < plan.order[1:][ties])  # ties in input order
    assert plan.slot_of_row[40] == plan.slot_of_row[3] == plan.slot_of_row[42]  # repeats share a vector
    assert not (job.folder / "staging").exists()  # staged texts are gone once every shard is written


def test_shards_are_ordinary_cache_entries(tmp_path, monkeypatch, one_torch_thread):
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(40)
    done = encode_corpus(emb, texts, batch_size=8, shard_rows=16)
    batches: list[int] = []
    forward = emb.engine.forward_pool
    monkeypatch.setattr(emb.engine, "forward_pool", lambda *a, **k: batches.append(1) or forward(*a, **k))
    assert np.array_equal(emb.encode(texts, batch_size=8), done.vectors)
    assert batches == []  # Embedder.encode found every text in the job's shards


def test_a_rerun_encodes_only_missing_shards(tmp_path, one_torch_thread):
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(60)
    first = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    job = first.job
    plan = job.plan()
    for shard in (1, 4):
        for cache in job.caches:
            cache.shard_path(shard_name(job.job_id, shard)).unlink()
    kept = {s: job.caches[0].shard_path(shard_name(job.job_id, s)).stat().st_ino for s in (0, 2, 3)}
    again = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    assert again.report.planned  # the staged texts were gone, so the job planned again ...
    assert again.report.shards_encoded == [1, 4]  # ... and encoded only what was missing
    assert len(again.report.shards_skipped) == plan.n_shards - 2
    assert all(job.caches[0].shard_path(shard_name(job.job_id, s)).stat().st_ino == i for s, i in kept.items())
    assert np.array_equal(again.vectors, first.vectors)
    third = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    assert not third.report.planned and third.report.shards_encoded == []


PLAN_DAMAGE = {
    "an array changed": lambda folder: np.save(folder / "order.npy", np.load(folder / "order.npy")[::-1].copy()),
    "an array cut short": lambda folder: np.save(folder / "lengths.npy", np.load(folder / "lengths.npy")[:3]),
    "no digests": lambda folder: (folder / "plan.json").write_text(
        json.dumps({k: v for k, v in json.loads((folder / "plan.json").read_text()).items() if k != "files"})
    ),
    "plan.json a list": lambda folder: (folder / "plan.json").write_text("[1]"),
    # resealed: the digests rewritten to match, as whoever can write the folder can (these were served: a slot out
    # of range gave a row an all-zero vector, one in range another text's; a float array an internal IndexError)
    "a slot out of range, resealed": lambda folder: _resealed(folder, "slot_of_row", lambda a: a.__setitem__(0, 10**9)),
    "a first row in another slot, resealed": lambda folder: _resealed(
        folder, "slot_of_row", lambda a: a.__setitem__(int(np.load(folder / "order.npy")[0]), 1)
    ),
    "slots as floats, resealed": lambda folder: _resealed(folder, "slot_of_row", None, dtype=np.float64),
    "a negative length, resealed": lambda folder: _resealed(folder, "lengths", lambda a: a.__setitem__(0, -1)),
}


def _resealed(folder, name: str, change, dtype=None) -> None:
    """Change ``name``.npy and record its new sha256 in plan.json."""
    from lmembed.io import sha256_file

    array = np.load(folder / f"{name}.npy")
    if change is not None:
        change(array)
    np.save(folder / f"{name}.npy", array.astype(dtype) if dtype is not None else array)
    plan = json.loads((folder / "plan.json").read_text())
    plan["files"][f"{name}.npy"] = sha256_file(folder / f"{name}.npy")
    (folder / "plan.json").write_text(json.dumps(plan))


@pytest.mark.parametrize("damage", PLAN_DAMAGE)
def test_a_damaged_plan_is_said_and_made_again(tmp_path, one_torch_thread, caplog, damage):
    """plan.json records the sha256 of every array of the plan; a plan that fails its checks (it was read as it
    stood: a reordered array put vectors in other rows, a list ended in an internal error) is planned again."""
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(30)
    first = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    plan = json.loads((first.job.folder / "plan.json").read_text())
    assert set(plan["files"]) == {
        "order.npy",
        "slot_of_row.npy",
        "stage_of_row.npy",
        "offset_of_row.npy",
        "keys.npy",
        "lengths.npy",
        "ids.arrow",
    }
    PLAN_DAMAGE[damage](first.job.folder)
    with caplog.at_level("WARNING", logger="lmembed.scale.job"):
        again = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    assert any("the job is planned again" in r.getMessage() for r in caplog.records)
    assert again.report.planned and np.array_equal(again.vectors, first.vectors)


def test_memory_mapped_and_float16_outputs(tmp_path, one_torch_thread):
    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(30)
    expected = emb.encode(texts, batch_size=8)
    out = encode_corpus(emb, texts, batch_size=8, output=tmp_path / "vectors.npy").vectors
    assert isinstance(out, np.memmap) and np.array_equal(out, expected)
    assert np.array_equal(np.load(tmp_path / "vectors.npy"), expected)
    half = encode_corpus(emb, texts, batch_size=8, memory_map=True, dtype="float16").vectors
    assert half.dtype == np.float16 and np.array_equal(half, expected.astype(np.float16))
    assert storage_of(half)["memory_mapped"] and storage_of(half)["dtype"] == "float16"


@pytest.mark.parametrize(
    "damage", ["flipped", "truncated", "record gone", "record of another shape", "a link", "NaN, resealed"]
)
def test_a_finished_vectors_matrix_is_read_again_only_as_it_was_written(tmp_path, one_torch_thread, caplog, damage):
    """The memory-mapped ``vectors-*.npy`` of a finished job was served as it stood when read again: a flipped byte
    gave other vectors, a truncated file an internal error. Its record holds its sha256, shape and dtype."""
    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(30)
    first = encode_corpus(emb, texts, batch_size=8, memory_map=True)
    expected = np.array(first.vectors)
    (matrix,) = first.job.folder.glob("vectors-*.npy")
    record = matrix.with_name(matrix.name + ".json")
    if damage == "flipped":
        data = bytearray(matrix.read_bytes())
        data[-3] ^= 0x40
        matrix.write_bytes(bytes(data))
    elif damage == "truncated":
        matrix.write_bytes(matrix.read_bytes()[:200])
    elif damage == "record gone":
        record.unlink()
    elif damage == "record of another shape":
        record.write_text(json.dumps({**json.loads(record.read_text()), "shape": [3, 3]}))
    elif damage == "NaN, resealed":  # its record rewritten to match: it was served
        from lmembed.io import sha256_file

        nan = np.load(matrix)
        nan[0, 0] = np.nan
        np.save(matrix, nan)
        record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": sha256_file(matrix)}))
    else:
        elsewhere = tmp_path / "elsewhere.npy"
        elsewhere.write_bytes(matrix.read_bytes())
        matrix.unlink()
        matrix.symlink_to(elsewhere)
    with caplog.at_level("WARNING", logger="lmembed.scale.job"):
        again = encode_corpus(emb, texts, batch_size=8, memory_map=True)
    assert np.array_equal(again.vectors, expected) and not matrix.is_symlink()
    said = [r.getMessage() for r in caplog.records if "the vectors are written again" in r.getMessage()]
    assert len(said) == 1 and matrix.name in said[0]


def test_uncached_embedder_leaves_nothing_behind(tmp_path, one_torch_thread):
    emb = uncached("llama")
    emb.engine.cache_dir = tmp_path  # where an uncached Embedder's jobs would go
    sharded = emb.with_executor(ShardedExecutor(LocalEngine(), shard_rows=8))
    assert np.array_equal(sharded.encode(corpus_texts(20)), emb.encode(corpus_texts(20)))
    assert not any(tmp_path.rglob("*.npz"))


def test_progress_counts_resumed_shards_as_done():
    seen = []
    tracker = ProgressTracker(
        shards_total=4, rows_total=400, shards_done=1, rows_done=100, workers=2, callback=seen.append
    )
    tracker.shard_finished(100, worker=7)
    snap = seen[-1]
    assert (snap.shards_done, snap.rows_done, snap.workers) == (2, 200, 2)
    assert snap.eta_s is not None and snap.rows_per_s > 0
    assert "2/4 shards" in snap.line() and "200/400 texts" in snap.line() and "ETA" in snap.line()


# ---------------------------------------------------------------------------------------------- sources
def write_beir(folder, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_beir_source_reads_what_read_corpus_reads(tmp_path):
    rows = [{"_id": f"d{i}", "title": "T" if i % 2 else "", "text": f"text {i}"} for i in range(9)]
    rows.append({"_id": 42, "text": "numeric id"})
    write_beir(tmp_path, rows)
    (tmp_path / "corpus.jsonl").write_text((tmp_path / "corpus.jsonl").read_text().replace("\n", "\n\n", 1))
    ids, texts = read_corpus(tmp_path / "corpus.jsonl")
    blocks = list(open_source(tmp_path).iter_blocks())
    assert [i for b in blocks for i in b.ids] == ids and [t for b in blocks for t in b.texts] == texts
    assert [int(x) for b in blocks for x in b.lines][:3] == [1, 3, 4]  # file lines (a blank one skipped)


def test_encode_sources_match_the_encode_command_rules(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"text": "a b"}\n\n{"text": "c", "x": 1}\n')
    lines = tmp_path / "t.txt"
    lines.write_text("one\n\nthree\r\n")
    assert [t for b in open_texts(jsonl).iter_blocks() for t in b.texts] == read_texts_field(jsonl, "text")
    assert [t for b in open_texts(lines).iter_blocks() for t in b.texts] == read_text_lines(lines)
    jsonl.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(DataFormatError, match=r"t\.jsonl:2"):
        list(open_texts(jsonl).iter_blocks())


def test_parquet_source_reads_row_groups_in_parts(tmp_path, monkeypatch):
    monkeypatch.setattr("lmembed.scale.sources.BLOCK_ROWS", 5)
    folder = tmp_path / "pq"
    folder.mkdir()
    for part in range(2):
        table = pa.table(
            {
                "_id": [f"p{part}-{i}" for i in range(30)],
                "title": ["t"] * 30,
                "text": [f"row {i}" for i in range(30)],
            }
        )
        pq.write_table(table, folder / f"part-{part}.parquet", row_group_size=10)
    source = open_source(folder)
    assert len(source.parts) == 4 and source.row_count == 60 and source.unique_ids
    assert [p.first_row for p in source.parts] == [0, 20, 30, 50]
    blocks = list(source.iter_blocks())
    rows = np.concatenate([b.rows for b in blocks])
    assert np.array_equal(rows, np.arange(60))
    assert blocks[0].texts[0] == "t row 0" and blocks[-1].ids[-1] == "p1-29"


def test_bad_rows_are_named(tmp_path):
    emb = cached(uncached("llama"), tmp_path / "cache")
    write_beir(tmp_path / "beir", [{"_id": "a", "text": "fine"}, {"_id": "b", "text": "bad \ud800 text"}])
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl:2: field 'text' holds a lone surrogate"):
        encode_corpus(emb, tmp_path / "beir")
    with pytest.raises(BadRowError, match=r"texts\[1\] \(row 1, id '1'\)"):
        encode_corpus(emb, ["fine", "bad \ud800"])
    write_beir(tmp_path / "dup", [{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"}, {"_id": "a", "text": "z"}])
    with pytest.raises(BadRowError, match=r"corpus\.jsonl:3: duplicate document id 'a' \(first at .*corpus\.jsonl:1\)"):
        encode_corpus(emb, tmp_path / "dup")


def test_empty_corpus(tmp_path):
    done = encode_corpus(cached(uncached("llama"), tmp_path), [])
    assert done.vectors.shape == (0, 32) and done.ids == [] and done.report.shards == 0


# ---------------------------------------------------------------------------------------------- large corpus
def same_scores(a: dict[str, float], b: dict[str, float]) -> bool:
    """Equal metric by metric (NaN equal to NaN: nAUC is undefined on toy data)."""
    return a.keys() == b.keys() and np.array_equal([a[k] for k in a], [b[k] for k in a], equal_nan=True)


@pytest.fixture
def retrieval_data() -> RetrievalData:
    rng = np.random.default_rng(0)
    n_docs, n_queries = 900, 40
    qrels = {f"q{i}": {f"d{j}": 1 for j in rng.choice(n_docs, 3, replace=False)} for i in range(n_queries)}
    return RetrievalData(
        name="toy",
        split="test",
        query_ids=[f"q{i}" for i in range(n_queries)],
        query_texts=[""] * n_queries,
        corpus_ids=[f"d{j}" for j in range(n_docs)],
        corpus_texts=[""] * n_docs,
        qrels=qrels,
    )


def test_memory_mapped_corpus_scores_equal_the_in_memory_path(retrieval_data, tmp_path):
    rng = np.random.default_rng(1)
    corpus = rng.standard_normal((900, 24)).astype(np.float32)
    corpus[5] = corpus[9]  # an exact tie
    queries = rng.standard_normal((40, 24)).astype(np.float32)
    np.save(tmp_path / "c.npy", corpus)
    mapped = np.load(tmp_path / "c.npy", mmap_mode="r")
    task = RetrievalTask(retrieval_data, top_k=50)
    in_memory = task.score_embeddings(queries, corpus)
    large = task.score_embeddings(queries, mapped)
    assert same_scores(large.scores, in_memory.scores)
    assert large.extra["corpus_embeddings"]["memory_mapped"] and "corpus_embeddings" not in in_memory.extra
    reference = exact_search(queries, corpus, top_k=50)
    same = search_corpus(queries, mapped, top_k=50)  # the in-memory path's chunking: the same floats
    assert np.array_equal(same.indices, reference.indices) and np.array_equal(same.scores, reference.scores)
    capped = search_corpus(queries, mapped, top_k=50, chunk_bytes=24 * 4 * 64)  # 64 rows per chunk
    np.testing.assert_allclose(capped.scores, reference.scores, rtol=0, atol=1e-6)
    assert (capped.indices == reference.indices).mean() > 0.99
    with_faiss = search_corpus(queries, mapped, top_k=50, method="faiss", chunk_bytes=24 * 4 * 64)
    np.testing.assert_allclose(with_faiss.scores, reference.scores, rtol=0, atol=1e-6)
    assert (with_faiss.indices[:, :10] == reference.indices[:, :10]).mean() > 0.99
    excluded = np.arange(40)
    a = search_corpus(queries, mapped, top_k=5, exclude=excluded, method="faiss", chunk_bytes=24 * 4 * 64)
    b = exact_search(queries, corpus, top_k=5, exclude=excluded)
    assert not (a.indices == excluded[:, None]).any()
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)


def test_float16_storage_is_stated_and_close(retrieval_data, tmp_path):
    rng = np.random.default_rng(2)
    corpus = rng.standard_normal((900, 24)).astype(np.float32)
    queries = rng.standard_normal((40, 24)).astype(np.float32)
    np.save(tmp_path / "c16.npy", corpus.astype(np.float16))
    task = RetrievalTask(retrieval_data, top_k=100, search_method="faiss")
    result = task.score_embeddings(queries, np.load(tmp_path / "c16.npy", mmap_mode="r"))
    stated = result.extra["corpus_embeddings"]
    assert stated["dtype"] == "float16" and stated["memory_mapped"] and stated["search"] == "faiss"
    exact = RetrievalTask(retrieval_data, top_k=100).score_embeddings(queries, corpus)
    assert abs(result.scores["ndcg_at_10"] - exact.scores["ndcg_at_10"]) < 0.02


def test_evaluation_through_sharded_jobs_scores_as_in_memory(tmp_path, one_torch_thread):
    folder = tmp_path / "toy"
    write_beir(folder, [{"_id": f"d{i}", "text": t} for i, t in enumerate(corpus_texts(60))])
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": WORDS[i]}) + "\n" for i in range(9))
    )
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"q{i}\td{3 * i}\t1\n" for i in range(9)))
    task = RetrievalTask.from_path(folder, name="toy")
    emb = uncached("llama")
    plain = evaluate_strategies(emb, [task], [emb.config])[0].result
    sharded = cached(emb, tmp_path / "cache").with_executor(
        ShardedExecutor(LocalEngine(), shard_rows=16, memory_map=True)
    )
    scaled = evaluate_strategies(sharded, [task], [emb.config])[0].result
    assert same_scores(scaled.scores, plain.scores)
    stated = scaled.extra["corpus_embeddings"]
    assert stated["memory_mapped"] and stated["dtype"] == "float32" and stated["file"].endswith(".npy")


def test_a_file_rewritten_with_its_size_and_time_kept_is_encoded_again(tmp_path, one_torch_thread):
    """A job over a file is named by the file's content, not its size and time alone: a line changed in place with
    the time put back (``cp -p``, ``rsync -t``) gave the old line's vector, from the finished job's shards."""
    import os

    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(24)
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts) + "\n")
    first = encode_corpus(emb, path, batch_size=4, shard_rows=8)
    stat = path.stat()
    changed = list(texts)
    changed[5] = texts[5][::-1]  # the same length
    assert changed[5] != texts[5]
    path.write_text("\n".join(changed) + "\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    again = encode_corpus(emb, path, batch_size=4, shard_rows=8)
    np.testing.assert_allclose(again.vectors[5], emb.encode_corpus([changed[5]])[0], atol=1e-6)
    assert not np.allclose(again.vectors[5], first.vectors[5])


def test_runs_of_one_job_take_turns_and_a_job_in_use_is_not_removed(tmp_path, one_torch_thread):
    """Two commands over one corpus are one job: the second run waits for the first (it deleted the first's staged
    texts, and both failed, or the job stayed broken), and removing the job leaves it to a process still using it."""
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(40)
    job = EncodeJob(emb, memory_source(texts), batch_size=4, shard_rows=8)
    done: list = []
    with file_lock(job.lock_file):  # another process's run of the job
        worker = threading.Thread(target=lambda: done.append(encode_corpus(emb, texts, batch_size=4, shard_rows=8)))
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and not job.folder.exists()  # waiting: nothing planned, nothing staged
    worker.join(timeout=60)
    assert np.array_equal(done[0].vectors, emb.encode(texts))
    with file_lock(job.lock_file, shared=True):  # another process reading the job's vectors
        job.remove()
        assert job.folder.is_dir() and any(tmp_path.rglob("shard-*.npz"))
    job.remove()
    assert not job.folder.exists() and not job.lock_file.exists() and not any(tmp_path.rglob("shard-*.npz"))


def test_concurrent_runs_of_one_job_both_finish_with_its_vectors(tmp_path, one_torch_thread, monkeypatch):
    monkeypatch.setattr("lmembed.scale.sources.BLOCK_ROWS", 1)  # one staged file a text: the runs overlap longer
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(60)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = encode_corpus(emb, texts, batch_size=4, shard_rows=8).vectors
        except Exception as exc:  # the assertion below shows it
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    expected = emb.encode(texts)
    assert all(isinstance(results[i], np.ndarray) for i in range(2)), results
    assert all(np.array_equal(results[i], expected) for i in range(2))


def test_a_job_whose_staged_texts_are_partly_gone_plans_again(tmp_path, one_torch_thread, monkeypatch):
    """A staged text file removed while a job was stopped made every later run fail ('plan the job again (delete
    ...)'): the run sees it and plans again."""
    monkeypatch.setattr("lmembed.scale.sources.BLOCK_ROWS", 8)
    emb = cached(uncached("llama"), tmp_path)
    texts = corpus_texts(60)

    def stop(progress) -> None:
        if progress.shards_done >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        encode_corpus(emb, texts, batch_size=4, shard_rows=8, on_progress=stop)
    job = EncodeJob(emb, memory_source(texts), batch_size=4, shard_rows=8)
    staged = sorted(job.staging.glob("*.arrow"))
    assert len(staged) > 2 and job.pending(job.plan())
    staged[-1].unlink()
    again = encode_corpus(emb, texts, batch_size=4, shard_rows=8)
    assert again.report.planned and np.array_equal(again.vectors, emb.encode(texts))


def test_a_worker_given_a_gpu_its_torch_cannot_use_is_refused_before_it_loads_the_model(monkeypatch, tmp_path):
    """A cluster that reports GPUs while the workers' torch is a CPU build: the worker says so in one ScaleError
    (it was an AssertionError from torch's guts, raised while moving the model)."""
    from lmembed.scale.work import ShardEncoder, ShardSettings

    class NeverLoaded:
        def load(self, device: str) -> Embedder:
            raise AssertionError("the model must not be loaded onto a device torch cannot use")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings = ShardSettings(
        job_id="j",
        plan_dir=str(tmp_path),
        staging_dir=str(tmp_path),
        configs=(EmbeddingConfig(),),
        cache_root=str(tmp_path),
        model_fingerprints=("f",),
        instruction=None,
        batch_size=8,
        device="cuda",
    )
    with pytest.raises(ScaleError, match=r"was given a GPU, but its torch .* cannot use CUDA.*--gpus-per-worker 0"):
        ShardEncoder(NeverLoaded(), settings)
