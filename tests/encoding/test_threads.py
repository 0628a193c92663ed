"""Embedders made from one model with ``with_config`` share its attention flags and its tokenizer; threads that
use them at once must each get their own strategy's vectors (a causal and a bidirectional sibling gave each other's,
and a strategy cut at another's length)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lmembed.encoding.inputs import tokenizer_lock
from lmembed.models.attention import AttentionError, ModeGate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _hammer(jobs, rounds: int) -> tuple[int, list[str]]:
    wrong, errors = [], []

    def run(embedder, texts, expected):
        for k in range(rounds):
            i = k % len(texts)
            try:
                if np.abs(embedder.encode([texts[i]])[0] - expected[i]).max() > 1e-5:
                    wrong.append(i)
            except Exception as exc:  # every failure is counted and shown
                errors.append(repr(exc)[:120])

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(wrong), errors


def test_siblings_of_either_attention_mode_keep_their_own_vectors_across_threads(make_embedder):
    causal = make_embedder("llama", pooling="mean")
    both = causal.with_config(causal.config.with_options(attention="bidirectional"))
    texts = [f"the cat sat on the mat number {i} " * (1 + i % 3) for i in range(6)]
    jobs = [(e, texts, [e.encode([t])[0] for t in texts]) for e in (causal, both, causal, both)]
    wrong, errors = _hammer(jobs, rounds=30)
    assert (wrong, errors) == (0, [])


def test_siblings_of_other_lengths_keep_their_own_cut_across_threads(make_embedder):
    full = make_embedder("bert", pooling="mean")
    short = full.with_config(full.config.with_options(max_length=8))
    texts = [" ".join(["the cat sat on the mat"] * (3 + i)) for i in range(5)]
    jobs = [(e, texts, [e.encode([t])[0] for t in texts]) for e in (full, short, full, short)]
    wrong, errors = _hammer(jobs, rounds=30)
    assert (wrong, errors) == (0, [])


def test_the_mode_gate_lets_one_mode_in_at_a_time_and_refuses_a_nested_switch():
    gate, order = ModeGate(), []
    inside = threading.Event()

    def causal():
        with gate.hold("causal"):
            order.append("causal in")
            inside.set()
            time.sleep(0.2)
            order.append("causal out")

    def bidirectional():
        inside.wait()
        with gate.hold("bidirectional"):
            order.append("bidirectional in")

    threads = [threading.Thread(target=causal), threading.Thread(target=bidirectional)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert order == ["causal in", "causal out", "bidirectional in"]
    refused = pytest.raises(AttentionError, match="asked for bidirectional")
    with gate.hold("causal"), gate.hold("causal"), refused, gate.hold("bidirectional"):  # the same mode: fine
        pass


def test_a_tokenizer_has_one_lock_whoever_asks(make_embedder):
    emb = make_embedder("bert", pooling="mean")
    sibling = emb.with_config(emb.config.with_options(max_length=8))
    tokenizer = emb.backbone.tokenizer
    assert tokenizer_lock(tokenizer) is tokenizer_lock(sibling.backbone.tokenizer)
