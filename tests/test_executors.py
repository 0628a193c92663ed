"""An Embedder delegates encoding to an executor: the local engine, or sharded jobs. Views made by
``with_config`` and ``with_executor`` share the backbone and engine; nothing is copied from one to the other."""

from __future__ import annotations

import inspect

import numpy as np

from lmembed import Embedder
from lmembed.embedder import LOCAL, LocalExecutor
from lmembed.scale import LocalEngine, ShardedExecutor, scaled

TEXTS = [f"text number {i} about topic {i % 3}" for i in range(12)]


class Recording:
    """An executor that records its calls and runs them locally."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def run(self, embedder, texts, configs, *, instruction, batch_size, corpus=False):
        self.calls.append((len(configs), corpus))
        return LocalExecutor().run(embedder, texts, configs, instruction=instruction, batch_size=batch_size)


def test_with_config_shares_the_engine_and_copies_no_state(make_embedder):
    emb = make_embedder("llama")
    emb.note = "set on the original only"  # an attribute a __dict__ copy would carry over
    other = emb.config.with_options(pooling="last")
    view = emb.with_config(other)
    assert type(view) is Embedder and view is not emb
    assert view.engine is emb.engine and view.backbone is emb.backbone and view.executor is emb.executor is LOCAL
    assert view.config == other and emb.config.pooling != "last"
    assert not hasattr(view, "note")
    assert np.array_equal(view.encode(TEXTS), emb.encode_strategies(TEXTS, [other])[0])


def test_no_state_is_copied_by_dict(make_embedder):
    import lmembed.embedder
    import lmembed.scale.sharded

    for module in (lmembed.embedder, lmembed.scale.sharded):
        assert "__dict__" not in inspect.getsource(module), module.__name__


def test_every_encode_goes_through_the_executor(make_embedder):
    recording = Recording()
    emb = make_embedder("llama")
    routed = emb.with_executor(recording)
    assert np.array_equal(routed.encode(TEXTS), emb.encode(TEXTS))
    assert np.array_equal(routed.encode_corpus(TEXTS), emb.encode_corpus(TEXTS))
    routed.encode_queries(TEXTS[:2], instruction="find")
    routed.encode_strategies(TEXTS, [emb.config, emb.config.with_options(pooling="last")])
    routed.with_config(emb.config.with_options(dim=8)).encode(TEXTS[:3])
    assert recording.calls == [(1, False), (1, True), (1, False), (2, False), (1, False)]


def test_a_sharded_embedder_is_an_embedder_with_another_executor(make_embedder, tmp_path, one_torch_thread):
    emb = make_embedder("llama")
    emb.engine.cache_dir = tmp_path
    sharded = scaled(emb, LocalEngine(), shard_rows=8)
    assert type(sharded) is Embedder and isinstance(sharded.executor, ShardedExecutor)
    assert sharded.engine is emb.engine and sharded.backbone is emb.backbone and sharded.config == emb.config
    assert emb.executor is LOCAL  # the original still encodes in this process
    assert np.array_equal(sharded.encode(TEXTS), emb.encode(TEXTS))
    other = emb.config.with_options(pooling="last")
    view = sharded.with_config(other)
    assert view.executor is sharded.executor and view.engine is emb.engine
    assert np.array_equal(view.encode(TEXTS), emb.with_config(other).encode(TEXTS))
    assert len(sharded.executor.reports) == 2  # one job per encode, on the shared executor
    assert scaled(emb, "local") is emb
