"""The pipelined encoding engine (issue 40): the same vectors as the serial engine, bit for bit, on encoder and
decoder shapes; a failure on its worker thread surfaces in the caller (never a hang); whatever stops a call, no
thread of the pipeline outlives it; the cache still receives every finished row."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import lmembed.encoding.engine as engine_module
from conftest import WORDS, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.inputs import InputBuilder
from lmembed.encoding.pipeline import COLLATE_THREAD, TOKENISE_THREAD, Prefetcher, ReadBack
from lmembed.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCH = 4
CALL_TIMEOUT = 60.0  # seconds; a tiny model's call takes well under one


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt (which pytest itself would act on)."""


def texts_of(n: int, seed: int = 0) -> list[str]:
    """Texts of 1 to 40 words (so batches are padded), a repeated one and an empty one."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=k)) for k in rng.integers(1, 40, size=n)]
    return [*texts, texts[0], ""]


def pipeline_threads() -> list[threading.Thread]:
    """The pipeline's threads alive: the producer, and its helper tokenising the next window."""
    return [t for t in threading.enumerate() if t.name == COLLATE_THREAD or t.name.startswith(TOKENISE_THREAD)]


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result or exception, failing the test if it has neither after ``seconds`` (a hang)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as error:
            box["error"] = error

    runner = threading.Thread(target=target, name="test-call", daemon=True)
    runner.start()
    runner.join(seconds)
    assert not runner.is_alive(), f"the call did not return within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def spy_forward(engine, monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[dict]:
    """Record each forward pass (its batch rows, whether it was padded, the threads alive); raise at ``fail_at``."""
    calls: list[dict] = []
    original = engine.forward_pool

    def forward_pool(ids, attention_mask, *args, **kwargs):
        calls.append(
            {
                "rows": ids.shape[0],
                "padded": bool((attention_mask == 0).any()),
                "threads": {t.name for t in threading.enumerate()},
            }
        )
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("forward failed")
        return original(ids, attention_mask, *args, **kwargs)

    monkeypatch.setattr(engine, "forward_pool", forward_pool)
    return calls


# ---------------------------------------------------------------------------- same vectors
@pytest.mark.parametrize(
    ("family", "padding_side", "max_batch_tokens", "plan_window"),
    [
        ("bert", None, None, None),  # right padding (the encoder's own)
        ("bert", None, 120, None),
        ("llama", None, None, None),  # left padding (the decoder's own)
        ("llama", None, 120, None),
        ("llama", "right", None, None),
        ("bert", None, None, 7),  # planned 7 texts at a time
        ("llama", None, 120, 10),
    ],
)
def test_pipelined_vectors_equal_serial_bit_for_bit(
    make_embedder, monkeypatch, family, padding_side, max_batch_tokens, plan_window
):
    emb = make_embedder(family)
    engine = emb.engine
    engine.padding_side = padding_side or engine.padding_side
    engine.max_batch_tokens = max_batch_tokens
    engine.plan_window = plan_window
    second = "cls" if family == "bert" else "last"
    configs = [emb.config, emb.config.with_options(pooling=second)]  # two strategies, one forward pass
    texts = texts_of(29)
    calls = spy_forward(engine, monkeypatch)

    engine.pipelined = False
    serial = engine.encode_raw(texts, configs, batch_size=BATCH)
    serial_calls, calls[:] = list(calls), []
    engine.pipelined = True
    pipelined = engine.encode_raw(texts, configs, batch_size=BATCH)

    assert [c["rows"] for c in calls] == [c["rows"] for c in serial_calls]  # the same batches
    assert any(c["padded"] for c in calls)  # padding is in play
    if max_batch_tokens is not None:
        assert min(c["rows"] for c in calls) < BATCH  # the token budget shaped the batches
    assert COLLATE_THREAD in calls[0]["threads"]  # really pipelined (the bounded queue holds the producer) ...
    assert not any(COLLATE_THREAD in c["threads"] for c in serial_calls)  # ... and really serial
    for a, b in zip(serial, pipelined, strict=True):
        assert np.array_equal(a, b)
    assert pipeline_threads() == []


def test_a_plan_window_plans_each_window_apart_and_computes_before_the_last_is_tokenised(make_embedder, monkeypatch):
    """``plan_window``: batches never mix texts of two windows; on the pipelined path the first forward pass runs
    before the last window is tokenised (the producer tokenises window after window, behind the bounded queue)."""
    emb = make_embedder("bert")
    engine = emb.engine
    engine.plan_window = 6
    texts = [f"text {i} " + " ".join(WORDS[: 1 + (7 * i) % 30]) for i in range(36)]
    events: list[tuple[str, Any]] = []
    real_build = InputBuilder.build_all

    def build_all(self, wanted, *args, **kwargs):
        events.append(("tokenise", len(wanted)))
        return real_build(self, wanted, *args, **kwargs)

    real_forward = engine.forward_pool

    def forward_pool(ids, *args, **kwargs):
        events.append(("forward", ids.shape[0]))
        return real_forward(ids, *args, **kwargs)

    monkeypatch.setattr(InputBuilder, "build_all", build_all)
    monkeypatch.setattr(engine, "forward_pool", forward_pool)
    rows: list[list[int]] = []
    out = [np.zeros((len(texts), engine.output_dim(emb.config)), dtype=np.float32)]
    engine._compute(texts, list(range(len(texts))), [emb.config], out, None, BATCH, on_batch=rows.append)
    assert [n for kind, n in events if kind == "tokenise"] == [6] * 6  # one window at a time
    first_forward = next(i for i, (kind, _) in enumerate(events) if kind == "forward")
    last_tokenise = max(i for i, (kind, _) in enumerate(events) if kind == "tokenise")
    assert first_forward < last_tokenise
    assert all(len({r // 6 for r in batch}) == 1 for batch in rows), rows  # each batch inside one window
    assert sorted(r for batch in rows for r in batch) == list(range(36))
    engine.pipelined = False  # the serial path plans the same windows: the same vectors, bit for bit
    np.testing.assert_array_equal(out[0], engine.encode_raw(texts, [emb.config], batch_size=BATCH)[0])


def test_the_next_window_is_tokenised_beside_the_forward_passes(make_embedder, monkeypatch):
    """With ``plan_window``, window k+1 is tokenised on the helper thread while window k's batches compute, not
    after the bounded queue has taken them: the first forward pass waits (at most 5 s) for the second window's
    tokenising to begin, which a producer tokenising behind its queue would not begin until that pass ended."""
    emb = make_embedder("bert")
    engine = emb.engine
    engine.plan_window = 12
    texts = [f"text {i} " + " ".join(WORDS[: 1 + (7 * i) % 30]) for i in range(36)]
    second_window = threading.Event()
    tokenised_on: list[str] = []
    waited: list[bool] = []
    real_build = InputBuilder.build_all

    def build_all(self, wanted, *args, **kwargs):
        tokenised_on.append(threading.current_thread().name)
        if len(tokenised_on) == 2:
            second_window.set()
        return real_build(self, wanted, *args, **kwargs)

    real_forward = engine.forward_pool

    def forward_pool(ids, *args, **kwargs):
        if not waited:
            waited.append(second_window.wait(5))
        return real_forward(ids, *args, **kwargs)

    monkeypatch.setattr(InputBuilder, "build_all", build_all)
    monkeypatch.setattr(engine, "forward_pool", forward_pool)
    vectors = within(30, lambda: engine.encode_raw(texts, [emb.config], batch_size=2)[0])
    assert waited == [True]
    assert len(tokenised_on) == 3 and all(name.startswith(TOKENISE_THREAD) for name in tokenised_on)
    assert pipeline_threads() == []
    engine.pipelined = False
    np.testing.assert_array_equal(vectors, engine.encode_raw(texts, [emb.config], batch_size=2)[0])


def test_a_plan_window_of_no_texts_is_refused_by_name(make_embedder):
    emb = make_embedder("bert")
    emb.engine.plan_window = 0
    for pipelined in (True, False):
        emb.engine.pipelined = pipelined
        with pytest.raises(ConfigError, match=r"plan_window=0 must be a number of texts"):
            emb.engine.encode_raw(texts_of(9), [emb.config], batch_size=BATCH)
    assert pipeline_threads() == []


def test_the_last_run_says_what_it_did_on_either_path(make_embedder):
    """``engine.last_run``: the real tokens of the texts, the padded tokens of the batches that ran, the seconds of
    each stage; the same counts from both paths (the same batches)."""
    emb = make_embedder("llama")
    engine = emb.engine
    texts = texts_of(29)
    assert engine.last_run is None
    builder = InputBuilder(emb.backbone.tokenizer, emb.config, is_decoder=True, max_length=emb.config.max_length)
    tokens = sum(len(f) for f in builder.build_all(list(dict.fromkeys(texts)), None))  # a repeat is encoded once
    runs = []
    for pipelined in (False, True):
        engine.pipelined = pipelined
        engine.encode_raw(texts, [emb.config], batch_size=BATCH)
        runs.append(engine.last_run)
    for run in runs:
        assert run.tokens == tokens and run.padded > run.tokens  # texts of 1-40 words pad their batches
        assert run.seconds > 0 and run.tokenise_seconds > 0 and run.prepare_seconds >= 0
    assert (runs[0].tokens, runs[0].padded) == (runs[1].tokens, runs[1].padded)


def test_one_batch_runs_in_series_and_uncached_keeps_the_switch(make_embedder, monkeypatch):
    emb = make_embedder("llama")
    engine = emb.engine
    calls = spy_forward(engine, monkeypatch)
    engine.encode_raw(texts_of(2), [emb.config], batch_size=BATCH)  # 4 texts, one batch: nothing to overlap
    assert len(calls) == 1 and COLLATE_THREAD not in calls[0]["threads"]
    assert engine.pipelined is True and engine.uncached().pipelined is True
    engine.pipelined = False
    assert engine.uncached().pipelined is False


# ---------------------------------------------------------------------------- failures and shutdown
@pytest.mark.parametrize("plan_window", [None, 4])  # windows: the poison is in the third, tokenised ahead
def test_a_failing_tokeniser_surfaces_in_the_caller(make_embedder, monkeypatch, plan_window):
    emb = make_embedder("llama")
    emb.engine.plan_window = plan_window
    original = InputBuilder._encode

    def encode(self, texts, **kwargs):
        if any("poison" in t for t in texts):
            raise RuntimeError("the tokenizer choked on a poison text")
        return original(self, texts, **kwargs)

    monkeypatch.setattr(InputBuilder, "_encode", encode)
    texts = [*texts_of(10), "a poison text"]
    with pytest.raises(RuntimeError, match="poison") as info:
        within(CALL_TIMEOUT, lambda: emb.engine.encode_raw(texts, [emb.config], batch_size=BATCH))
    assert any(COLLATE_THREAD in note for note in getattr(info.value, "__notes__", []))
    assert pipeline_threads() == []


def test_a_failing_collate_surfaces_after_the_batches_before_it(make_embedder, monkeypatch):
    emb = make_embedder("bert")
    original = engine_module.collate_host
    collated: list[int] = []

    def collate_host(features, *args, **kwargs):
        collated.append(len(features))
        if len(collated) == 3:
            raise ValueError("collate broke on batch 3")
        return original(features, *args, **kwargs)

    monkeypatch.setattr(engine_module, "collate_host", collate_host)
    texts = texts_of(20)
    outputs = [np.full((len(texts), emb.engine.output_dim(emb.config)), np.nan, dtype=np.float32)]
    done: list[list[int]] = []
    with pytest.raises(ValueError, match="batch 3"):
        within(
            CALL_TIMEOUT,
            lambda: emb.engine._compute(
                texts, list(range(len(texts))), [emb.config], outputs, None, BATCH, on_batch=done.append
            ),
        )
    assert len(done) == 2  # the two batches collated before the failure were computed and handed on
    written = sorted(r for rows in done for r in rows)
    assert not np.isnan(outputs[0][written]).any()
    assert pipeline_threads() == []


@pytest.mark.parametrize("plan_window", [None, 6])  # windows: the helper may be tokenising the next one
def test_an_interrupt_in_on_batch_stops_the_worker(make_embedder, plan_window):
    emb = make_embedder("llama")
    emb.engine.plan_window = plan_window
    texts = texts_of(30)
    outputs = [np.zeros((len(texts), emb.engine.output_dim(emb.config)), dtype=np.float32)]
    seen: list[list[int]] = []

    def on_batch(rows: list[int]) -> None:
        seen.append(rows)
        if len(seen) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        within(
            CALL_TIMEOUT,
            lambda: emb.engine._compute(
                texts, list(range(len(texts))), [emb.config], outputs, None, BATCH, on_batch=on_batch
            ),
        )
    assert len(seen) == 2  # no batch is handed on after the interrupt
    assert pipeline_threads() == []


def make_cached(tokenizer, cache_dir) -> Embedder:
    emb = Embedder.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, EmbeddingConfig(), cache_dir=cache_dir, show_progress=False
    )
    emb.engine.cache_flush_rows = 1  # a shard after every batch
    return emb


def test_a_failing_forward_keeps_finished_batches_in_the_cache(tokenizer, tmp_path, monkeypatch):
    texts = [t for t in dict.fromkeys(texts_of(22)) if t]  # distinct: each text is computed once
    failing = make_cached(tokenizer, tmp_path)
    calls = spy_forward(failing.engine, monkeypatch, fail_at=4)
    with pytest.raises(RuntimeError, match="forward failed"):
        within(CALL_TIMEOUT, lambda: failing.encode(texts, batch_size=BATCH))
    assert COLLATE_THREAD in calls[0]["threads"]
    assert pipeline_threads() == []

    resumed = make_cached(tokenizer, tmp_path)
    computed = spy_forward(resumed.engine, monkeypatch)
    vectors = resumed.encode(texts, batch_size=BATCH)
    assert sum(c["rows"] for c in computed) == len(texts) - 3 * BATCH  # the 3 finished batches were kept

    again = make_cached(tokenizer, tmp_path)  # every row of the resumed run was written too
    recomputed = spy_forward(again.engine, monkeypatch)
    assert np.array_equal(again.encode(texts, batch_size=BATCH), vectors)
    assert recomputed == []
    fresh = make_cached(tokenizer, None)
    fresh.engine.use_cache = False
    fresh.engine.pipelined = False
    np.testing.assert_allclose(vectors, fresh.encode(texts, batch_size=BATCH), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------- the stage machinery itself
def test_the_queue_is_bounded_and_closing_early_joins_the_thread():
    produced: list[int] = []

    def produce(stop: threading.Event):
        n = 0
        while True:  # endless: only the consumer's stop ends it
            produced.append(n)
            yield n
            n += 1

    before = set(threading.enumerate())
    feed = Prefetcher(produce, depth=2)
    thread = next(t for t in pipeline_threads() if t not in before)
    assert thread.daemon
    assert next(feed) == 0
    time.sleep(0.3)  # the producer runs ahead until the queue is full
    assert len(produced) <= 1 + 2 + 1  # the one taken, two queued, one waiting to be queued
    within(10, feed.close)
    assert not thread.is_alive()
    assert pipeline_threads() == []


def test_a_generator_closed_early_joins_the_thread():
    def produce(stop: threading.Event):
        yield from range(1000)

    def consumer():
        with Prefetcher(produce) as items:
            yield from items

    gen = consumer()
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    assert len(pipeline_threads()) == 1
    gen.close()
    assert pipeline_threads() == []


def test_a_producer_error_reaches_the_consumer_after_its_items():
    def produce(stop: threading.Event):
        yield 1
        yield 2
        raise KeyError("broken producer")

    got = []
    with pytest.raises(KeyError, match="broken producer"), Prefetcher(produce) as items:
        got.extend(items)
    assert got == [1, 2]
    assert pipeline_threads() == []


def test_readback_on_the_cpu_writes_each_batch_before_handing_it_on():
    out = np.zeros((4, 2), dtype=np.float32)
    order: list[list[int]] = []

    def done(rows: list[int]) -> None:
        assert (out[rows] != 0).all()  # the rows are there when on_done runs
        order.append(rows)

    readback = ReadBack([out], done, torch.device("cpu"))
    readback.push([2, 0], [torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float16)])
    readback.settle()
    assert order == [[2, 0]]  # lag 0 on the CPU
    readback.push([1, 3], [torch.ones(2, 2)])
    readback.drain()
    assert order == [[2, 0], [1, 3]]
    assert out.tolist() == [[3.0, 4.0], [1.0, 1.0], [1.0, 2.0], [1.0, 1.0]]


# ---------------------------------------------------------------------------- CUDA: pinned memory, non-blocking
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("family", "dtype"), [("bert", torch.float32), ("llama", torch.float32), ("llama", torch.float16)]
)
def test_gpu_pipelined_pinned_copies_equal_serial(tokenizer, monkeypatch, family, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_model(family, len(tokenizer)).to("cuda", dtype)
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    engine = emb.engine
    engine.max_batch_tokens = 200
    texts = texts_of(40)
    pinned_inputs: list[bool] = []
    pinned_outputs: list[bool] = []
    collate_host = engine_module.collate_host

    def spy_collate(*args, **kwargs):
        tensors = collate_host(*args, **kwargs)
        pinned_inputs.append(all(t.is_pinned() for t in tensors))
        return tensors

    finish = ReadBack._finish

    def spy_finish(self):
        pinned_outputs.append(all(isinstance(v, torch.Tensor) and v.is_pinned() for v in self.pending[0].vectors))
        assert self.lag == 1
        return finish(self)

    monkeypatch.setattr(engine_module, "collate_host", spy_collate)
    monkeypatch.setattr(ReadBack, "_finish", spy_finish)
    engine.pipelined = False
    serial = engine.encode_raw(texts, [emb.config], batch_size=8)[0]
    assert pinned_inputs and not any(pinned_inputs)  # the serial path copies from pageable memory
    pinned_inputs.clear()
    engine.pipelined = True
    pipelined = engine.encode_raw(texts, [emb.config], batch_size=8)[0]
    torch.cuda.synchronize()
    assert pinned_inputs and all(pinned_inputs)
    assert pinned_outputs and all(pinned_outputs)
    assert np.array_equal(serial, pipelined)
    pinned_inputs.clear()
    engine.pin_inputs = False  # pageable, still copied without blocking
    pageable = engine.encode_raw(texts, [emb.config], batch_size=8)[0]
    torch.cuda.synchronize()
    assert pinned_inputs and not any(pinned_inputs)
    assert np.array_equal(serial, pageable)
    assert pipeline_threads() == []


def test_readback_salvage_hands_on_finished_batches_unless_on_done_failed():
    out = np.zeros((4, 1), dtype=np.float32)
    done: list[list[int]] = []
    readback = ReadBack([out], done.append, torch.device("cpu"))
    readback.lag = 1  # as on CUDA: a batch is finished once the next one is under way
    readback.push([0, 1], [torch.ones(2, 1)])
    readback.settle()
    assert done == []  # still in flight
    readback.push([2, 3], [torch.full((2, 1), 2.0)])
    readback.settle()
    assert done == [[0, 1]]
    readback.salvage()  # a later stage failed: the batch in flight still reaches on_done
    assert done == [[0, 1], [2, 3]] and out[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0]

    def stop(rows: list[int]) -> None:
        raise Interrupt

    stopping = ReadBack([out], stop, torch.device("cpu"))
    stopping.lag = 1
    stopping.push([0], [torch.zeros(1, 1)])
    stopping.push([1], [torch.zeros(1, 1)])
    with pytest.raises(Interrupt):
        stopping.settle()
    stopping.salvage()  # on_done itself failed: nothing more is handed on (no second Interrupt)
    assert len(stopping.pending) == 1
