"""Work kept when killed: ``encode`` writes cache shards as batches finish, so a run killed part-way
leaves its finished batches on disk and the next run computes only the rest."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.cache import EmbeddingCache

TESTS = Path(__file__).resolve().parent
WORDS = ["cat", "dog", "mat", "rug", "man", "food", "horse", "movie", "gene", "cell"]
TEXTS = [f"the {a} and the {b} sat on {c}" for a in WORDS for b in WORDS[:4] for c in ("a", "the")][:48]
BATCH = 4
HANG_AT_BATCH = 6  # the child finishes 5 batches (20 texts), then hangs in the 6th until it is killed

CHILD = """
import sys, time
sys.path[:0] = [sys.argv[2], str(__import__('pathlib').Path(sys.argv[2]).parent)]  # this folder, then tests/ (conftest)
from conftest import build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from test_encode_resume import BATCH, HANG_AT_BATCH, TEXTS

tok = build_tokenizer()
emb = Embedder.from_model(tiny_model("llama", len(tok)), tok, EmbeddingConfig(), cache_dir=sys.argv[1],
                          show_progress=False)
emb.engine.cache_flush_rows = 1  # a shard after every batch
calls = []
original = emb.engine.forward_pool

def forward_pool(ids, *args, **kwargs):
    calls.append(1)
    if len(calls) == HANG_AT_BATCH:
        print("hanging", flush=True)
        time.sleep(600)
    return original(ids, *args, **kwargs)

emb.engine.forward_pool = forward_pool
emb.encode(TEXTS, batch_size=BATCH)
print("finished", flush=True)
"""


def make_embedder(tokenizer, cache_dir: Path | None) -> Embedder:
    return Embedder.from_model(
        tiny_model("llama", len(tokenizer)),
        tokenizer,
        EmbeddingConfig(),
        use_cache=cache_dir is not None,
        cache_dir=cache_dir,
        show_progress=False,
    )


def count_computed(emb: Embedder, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    rows: list[int] = []
    original = emb.engine.forward_pool
    monkeypatch.setattr(
        emb.engine, "forward_pool", lambda ids, *a, **k: rows.append(ids.shape[0]) or original(ids, *a, **k)
    )
    return rows


def test_killed_encode_keeps_finished_batches(tokenizer, tmp_path, monkeypatch, one_torch_thread):
    cache_dir = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache_dir), str(TESTS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()  # blocks until the child hangs in batch 6 (or exits)
    child.send_signal(signal.SIGKILL)
    _, errors = child.communicate(timeout=60)
    assert line.strip() == "hanging", f"the child did not reach batch {HANG_AT_BATCH}: {line!r}\n{errors}"
    assert child.returncode == -signal.SIGKILL

    done = (HANG_AT_BATCH - 1) * BATCH
    shards = [p for p in cache_dir.rglob("*.npz") if not p.name.startswith(".tmp-")]
    assert len(shards) == HANG_AT_BATCH - 1  # one complete shard per finished batch

    emb = make_embedder(tokenizer, cache_dir)
    computed = count_computed(emb, monkeypatch)
    resumed = emb.encode(TEXTS, batch_size=BATCH)
    assert sum(computed) == len(TEXTS) - done  # only what the killed run had not written
    fresh = make_embedder(tokenizer, None).encode(TEXTS, batch_size=BATCH)
    np.testing.assert_allclose(resumed, fresh, rtol=0, atol=1e-6)
    # and a third run computes nothing
    emb_again = make_embedder(tokenizer, cache_dir)
    computed_again = count_computed(emb_again, monkeypatch)
    np.testing.assert_array_equal(emb_again.encode(TEXTS, batch_size=BATCH), resumed)
    assert computed_again == []


def test_shards_are_written_while_the_call_runs(tokenizer, tmp_path, monkeypatch, one_torch_thread):
    """Default thresholds: shards by row count and by elapsed time, then the remainder at the end."""
    emb = make_embedder(tokenizer, tmp_path)
    emb.engine.cache_flush_rows = 10
    seen_on_disk: list[int] = []
    original = emb.engine.forward_pool

    def forward_pool(ids, *args, **kwargs):
        seen_on_disk.append(len(list(tmp_path.rglob("*.npz"))))
        return original(ids, *args, **kwargs)

    monkeypatch.setattr(emb.engine, "forward_pool", forward_pool)
    emb.encode(TEXTS, batch_size=BATCH)  # 12 batches of 4: a shard after batches 3, 6, 9, 12
    assert seen_on_disk == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    cache = EmbeddingCache(tmp_path, emb.engine.cache_model_key(emb.config), emb.config.fingerprint())
    assert len(cache) == len(TEXTS)

    timed = make_embedder(tokenizer, tmp_path / "timed")
    timed.engine.cache_flush_seconds = 0.0  # every finished batch is due
    timed.encode(TEXTS[:8], batch_size=BATCH)
    assert len(list((tmp_path / "timed").rglob("*.npz"))) == 2


def test_an_error_mid_call_keeps_the_finished_batches(tokenizer, tmp_path, monkeypatch, one_torch_thread):
    emb = make_embedder(tokenizer, tmp_path)
    calls: list[int] = []
    original = emb.engine.forward_pool

    def failing(ids, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("out of memory")  # or Ctrl-C: the finished batches are written either way
        return original(ids, *args, **kwargs)

    monkeypatch.setattr(emb.engine, "forward_pool", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        emb.encode(TEXTS, batch_size=BATCH)
    cache = EmbeddingCache(tmp_path, emb.engine.cache_model_key(emb.config), emb.config.fingerprint())
    assert len(cache) == 2 * BATCH
