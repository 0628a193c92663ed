"""lmembed.serving.batcher: the scheduler, driven by a fake engine that records every forward pass, so what
is checked is the order and make-up of the passes (counted in passes and tokens, never in wall time).

First come first served: the tokens of later requests run before a request is answered are at most one
budget (its window), however many later requests flood in; the batcher before it (the oldest text plus
the texts nearest it in length) ran several budgets of them ahead of an early request of mixed lengths.
Padding stays small: inside a window, texts are sorted by length and cut into the cheapest passes (checked against every
partition of small windows). The bounded wait: a free worker waits for its window to fill, never longer
than its bound, and not at all once a budget of tokens is queued."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from lmembed.errors import ConfigError
from lmembed.serving.batcher import (
    PASS_COST_TOKENS,
    WAIT_CAP,
    WINDOW_FLOOR_TOKENS,
    TokenBudgetBatcher,
    forward_workers,
    plan_passes,
)
from lmembed.serving.limits import Limits
from lmembed.serving.metrics import ServerMetrics

BUDGET = 64


class FakeEngine:
    """Records each pass's texts; a text's vector is its own name's number, so answers can be checked. The
    first pass waits at ``gate`` (set it to let passes run), so requests can be lined up behind it."""

    def __init__(self) -> None:
        self.passes: list[list[str]] = []
        self.features: list[list | None] = []  # each pass's features, as the engine received them
        self.gate = threading.Event()
        self.entered = threading.Event()

    def output_dim(self, config) -> int:
        return 1

    def encode_raw(
        self, texts: Sequence[str], configs, *, instruction=None, batch_size=32, features=None
    ) -> list[np.ndarray]:
        self.entered.set()
        self.gate.wait(30)
        self.passes.append(list(texts))
        self.features.append(None if features is None else list(features))
        return [np.array([[float(t.split("/")[1])] for t in texts], dtype=np.float32)]


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


async def line_up(batcher: TokenBudgetBatcher, engine: FakeEngine, requests: list[list[int]]) -> list[np.ndarray]:
    """Hold the engine on a one-text blocker pass, queue ``requests`` (token lengths of their texts; text
    ``r{i}/{n}`` is request i's text number n) behind it in this order, then let every pass run."""
    await batcher.start()
    blocker = asyncio.ensure_future(batcher.embed(["blocker/0"], [4], None))
    while not engine.entered.is_set():
        await asyncio.sleep(0.001)
    named = iter(names(requests))
    tasks = []
    for lengths in requests:
        texts = [next(named)[0] for _ in lengths]
        tasks.append(asyncio.ensure_future(batcher.embed(texts, lengths, None)))
    total = sum(map(len, requests))
    while batcher.waiting < total:
        await asyncio.sleep(0.001)
    engine.gate.set()
    results = await asyncio.gather(*tasks)
    await blocker
    await batcher.stop()
    return results


def names(requests: list[list[int]]) -> list[tuple[str, int]]:
    """Each text's name (``r{request}/{serial}``) and token length, in arrival order."""
    serial = itertools.count()
    return [(f"r{i}/{next(serial)}", n) for i, lengths in enumerate(requests) for n in lengths]


def later_tokens_before_answered(passes: list[list[str]], requests: list[list[int]]) -> list[int]:
    """For each request: the tokens of texts of later requests that ran in passes up to the one that answered
    it (the work it waited for that came after it)."""
    length = dict(names(requests))
    owner = {name: int(name[1:].split("/")[0]) for name in length}
    ran = [[t for t in p if t in owner] for p in passes]
    out = []
    for i in range(len(requests)):
        last = max(k for k, texts in enumerate(ran) if any(owner[t] == i for t in texts))
        out.append(sum(length[t] for texts in ran[: last + 1] for t in texts if owner[t] > i))
    return out


def test_an_early_request_is_not_held_behind_a_flood_of_later_ones():
    """An early request of 8 texts of mixed lengths, then 60 one-text requests of every length in between.
    The work spent on later requests before the early one is answered is at most one budget; the old batcher
    (the oldest text plus the texts nearest it in length, wherever they came from) ran the early request's
    texts with passes full of later ones: 304 tokens, almost 5 budgets."""
    early = [4, 8, 12, 16, 20, 24, 28, 32]
    flood = [[4 + k % 29] for k in range(60)]
    engine = FakeEngine()
    batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET, metrics=ServerMetrics())
    results = []

    async def scenario() -> None:
        results.extend(await line_up(batcher, engine, [early, *flood]))

    run(scenario)
    waited = later_tokens_before_answered(engine.passes, [early, *flood])
    assert waited[0] < BUDGET, f"the early request waited for {waited[0]} tokens of later requests"
    assert max(waited) < BUDGET  # and so did every request
    assert [r[:, 0].tolist() for r in results[:2]] == [list(range(8)), [8.0]]  # each text got its own vector


def test_first_come_first_served_for_random_requests():
    """Random requests (1-6 texts of 3-40 tokens): no request waits for more than a budget of later work,
    every text runs exactly once, and no pass is over the budget."""
    rng = random.Random(7)
    requests = [[rng.randint(3, 40) for _ in range(rng.randint(1, 6))] for _ in range(80)]
    engine = FakeEngine()
    batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET, metrics=ServerMetrics())
    run(lambda: line_up(batcher, engine, requests))
    assert max(later_tokens_before_answered(engine.passes, requests)) < BUDGET
    lengths = dict(names(requests))
    assert sorted(t for p in engine.passes[1:] for t in p) == sorted(lengths)  # each text once
    assert all(len(p) * max(lengths[t] for t in p) <= BUDGET for p in engine.passes[1:])


def test_a_window_sorts_by_length_so_padding_stays_small():
    """Short and long texts admitted together go to different passes (12 + 180 padded tokens, not 360), in
    the order of the oldest text each holds; one request gets both its vectors."""
    engine = FakeEngine()
    batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=1000, metrics=ServerMetrics())
    requests = [[60, 4], [4, 60], [60, 4]]
    results = []

    async def scenario() -> None:
        results.extend(await line_up(batcher, engine, requests))

    run(scenario)
    assert engine.passes[1:] == [["r0/0", "r1/3", "r2/4"], ["r0/1", "r1/2", "r2/5"]]
    assert batcher.windows == 2 and batcher.passes == 3  # the blocker's window, then one for all three
    assert [r[:, 0].tolist() for r in results] == [[0, 1], [2, 3], [4, 5]]


def test_the_engine_runs_on_the_features_queued_with_the_texts():
    """Features given with a request's texts reach the engine with them, in the pass's order (the server's
    tokenisation is the pass's); a request without features leaves the engine to tokenise."""
    engine = FakeEngine()
    engine.gate.set()

    async def scenario() -> None:
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=1000, metrics=ServerMetrics(), max_wait_s=0.05)
        await batcher.start()
        built = asyncio.ensure_future(batcher.embed(["a/0", "a/1", "a/2"], [60, 4, 60], None, ["fa0", "fa1", "fa2"]))
        await asyncio.gather(built, batcher.embed(["b/3"], [4], None))
        with pytest.raises(ValueError, match="2 features for 1 texts"):
            await batcher.embed(["c/4"], [4], None, ["x", "y"])
        await batcher.stop()

    run(scenario)
    runs = {tuple(p): f for p, f in zip(engine.passes, engine.features, strict=True)}
    assert runs == {("a/0", "a/2"): ["fa0", "fa2"], ("a/1", "b/3"): None}


def test_the_next_pass_of_a_window_is_handed_over_while_one_runs():
    """A window of two passes (a short text, a long one): the second is queued on the worker thread while the
    first runs, so it starts as soon as the first ends, even while the event loop is busy (here: blocked) and
    has not yet answered the first pass's callers."""
    engine = FakeEngine()
    second = threading.Event()
    encode_raw = engine.encode_raw

    def counted(texts, configs, **kwargs):
        if engine.passes:
            second.set()
        return encode_raw(texts, configs, **kwargs)

    engine.encode_raw = counted
    outcome = {}

    async def scenario() -> None:
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=1000, metrics=ServerMetrics(), max_wait_s=0.05)
        await batcher.start()
        task = asyncio.ensure_future(batcher.embed(["a/0", "a/1"], [4, 200], None))
        while not engine.entered.is_set():
            await asyncio.sleep(0.001)
        engine.gate.set()
        outcome["started while the loop was blocked"] = second.wait(10)  # blocks the event loop
        outcome["vectors"] = (await task)[:, 0].tolist()
        await batcher.stop()

    run(scenario)
    assert outcome == {"started while the loop was blocked": True, "vectors": [0.0, 1.0]}
    assert engine.passes == [["a/0"], ["a/1"]] and all(f is None for f in engine.features)


@pytest.mark.parametrize(
    ("share", "windows"),
    [(0.5, [20, 16, 4]), (0.25, [16, 16, 8]), (1.0, [40])],
)
def test_a_window_admits_its_share_of_the_queue_oldest_first(share, windows):
    """40 one-text requests of 64 tokens queued (2560 tokens). Share 0.5: the first window takes the oldest 20
    (half the queued tokens), the next 16 (the floor of 1024 tokens: half of what is left is less), then the last
    4. Share 0.25 (the server's default): the floor twice, then 8. Share 1: all 40 at once. Each window here is
    one pass, in arrival order."""
    assert WINDOW_FLOOR_TOKENS == 1024
    engine = FakeEngine()
    batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=100_000, metrics=ServerMetrics(), window_share=share)
    requests = [[64]] * 40
    run(lambda: line_up(batcher, engine, requests))
    assert [len(p) for p in engine.passes[1:]] == windows
    assert [t for p in engine.passes[1:] for t in p] == [name for name, _ in names(requests)]


def test_the_server_default_window_is_a_quarter_of_the_queue():
    batcher = TokenBudgetBatcher(FakeEngine(), None, max_batch_tokens=64, metrics=ServerMetrics())
    assert batcher.window_share == Limits().window_share == 0.25


@pytest.mark.parametrize("share", [0, -0.5, 1.5, True, float("nan")])
def test_a_window_share_outside_0_1_is_refused(share):
    with pytest.raises(ConfigError, match=r"window_share=.* must be a share of the queue in \(0, 1\]"):
        Limits(window_share=share)


def cost(passes: list[list[int]], lengths: list[int]) -> int:
    return sum(PASS_COST_TOKENS + len(p) * max(lengths[i] for i in p) for p in passes)


def partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for tail in partitions(rest):
        yield [[first], *tail]
        for k in range(len(tail)):
            yield [*tail[:k], [first, *tail[k]], *tail[k + 1 :]]


@pytest.mark.parametrize("seed", range(40))
def test_plan_passes_is_the_cheapest_partition(seed):
    """Against every partition of up to 7 texts: plan_passes costs least (a pass: PASS_COST_TOKENS plus texts x
    longest), keeps every pass within the budget (a text over it alone), uses each text once, and orders
    the passes by their oldest text."""
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(2, 12), rng.randint(40, 200)]) for _ in range(rng.randint(1, 7))]
    budget = rng.choice([100, 256, 1000])
    plan = plan_passes(lengths, budget)
    assert sorted(i for p in plan for i in p) == list(range(len(lengths)))
    assert all(len(p) * max(lengths[i] for i in p) <= budget or len(p) == 1 for p in plan)
    assert [p[0] for p in plan] == sorted(p[0] for p in plan) and all(p == sorted(p) for p in plan)
    feasible = [
        c
        for c in partitions(list(range(len(lengths))))
        if all(len(p) * max(lengths[i] for i in p) <= budget or len(p) == 1 for p in c)
    ]
    assert cost(plan, lengths) == min(cost(c, lengths) for c in feasible)


def test_plan_passes_separates_lengths_and_merges_near_ones():
    long = [256, 150, 250, 100, 252]
    assert plan_passes(long, 10_000) == [[0, 2, 4], [1, 3]]  # 100 and 150 share: 50 x 2 padding < a pass
    assert plan_passes([6, 14, 9, 200], 10_000) == [[0, 1, 2], [3]]
    assert plan_passes([10] * 50, 100) == [list(range(k, k + 10)) for k in range(0, 50, 10)]
    assert plan_passes([500, 3], 100) == [[0], [1]]  # over the budget: alone


def test_the_wait_is_bounded_and_ends_when_a_budget_is_queued():
    """A free worker waits for more texts (a request 50 ms after the first joins its pass with a 0.5 s bound;
    with no wait it gets a pass of its own), and does not wait once a budget of tokens is queued."""

    async def two_requests(wait: float) -> list[list[str]]:
        engine = FakeEngine()
        engine.gate.set()
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET, metrics=ServerMetrics(), max_wait_s=wait)
        await batcher.start()
        first = asyncio.ensure_future(batcher.embed(["a/0"], [4], None))
        await asyncio.sleep(0.05)
        await asyncio.gather(first, batcher.embed(["b/1"], [4], None))
        await batcher.stop()
        return engine.passes

    assert asyncio.run(two_requests(0.5)) == [["a/0", "b/1"]]
    assert asyncio.run(two_requests(0.0)) == [["a/0"], ["b/1"]]

    async def full_budget() -> float:
        engine = FakeEngine()
        engine.gate.set()
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET, metrics=ServerMetrics(), max_wait_s=30)
        await batcher.start()
        start = time.monotonic()
        await batcher.embed(["a/0", "a/1"], [BUDGET // 2, BUDGET // 2], None)
        took = time.monotonic() - start
        await batcher.stop()
        return took

    assert asyncio.run(full_budget()) < 10  # not the 30 s bound


def test_no_wait_once_the_queue_holds_more_than_a_window():
    """With a large budget, two texts of 600 tokens (over WINDOW_FLOOR_TOKENS together, so the window is the
    floor, which the first fills): the first pass starts at once, as a text arriving now could not join its
    window; the 30 s wait does not start. The second, then alone and under the floor, waits for company (until
    the batcher stops), as a lone request does."""

    async def over_the_floor() -> tuple[float, list[float]]:
        engine = FakeEngine()
        engine.gate.set()
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=100_000, metrics=ServerMetrics(), max_wait_s=30)
        await batcher.start()
        start = time.monotonic()
        task = asyncio.ensure_future(batcher.embed(["a/0", "a/1"], [600, 600], None))
        while not engine.entered.is_set():
            await asyncio.sleep(0.001)
        took = time.monotonic() - start
        await batcher.stop()
        return took, (await task)[:, 0].tolist()

    assert WINDOW_FLOOR_TOKENS < 2 * 600
    took, vectors = asyncio.run(over_the_floor())
    assert took < 10 and vectors == [0.0, 1.0]


def test_the_wait_lasts_while_texts_keep_arriving_up_to_its_cap():
    """Texts arriving 50 ms apart keep a 200 ms wait going: 12 of them share one pass; a stream longer than the
    cap (WAIT_CAP x 200 ms) does not hold the first pass back for good."""

    async def stream(seconds: float) -> list[list[str]]:
        engine = FakeEngine()
        engine.gate.set()
        metrics = ServerMetrics()
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET * 100, metrics=metrics, max_wait_s=0.2)
        await batcher.start()
        tasks = []
        for k in range(round(seconds / 0.05)):
            tasks.append(asyncio.ensure_future(batcher.embed([f"s/{k}"], [4], None)))
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        await batcher.stop()
        return engine.passes

    assert len(asyncio.run(stream(0.6))) == 1
    assert WAIT_CAP * 0.2 < 3.0 and len(asyncio.run(stream(3.0))) >= 2


@pytest.mark.parametrize("wait", [-0.001, True, float("nan")])
def test_a_wait_that_is_not_a_duration_is_refused(wait):
    with pytest.raises(ConfigError, match=r"batch_wait_s=.* must be a number of seconds >= 0"):
        Limits(batch_wait_s=wait)


def test_memory_is_released_once_the_worker_is_idle(monkeypatch):
    """After passes and IDLE_RELEASE_S with nothing to do the worker releases freed memory, once; not before
    any pass has run, and not again until more passes have."""
    from lmembed.serving import batcher as module

    calls: list[int] = []
    monkeypatch.setattr(module, "IDLE_RELEASE_S", 0.05)
    monkeypatch.setattr(module, "release_memory", lambda: calls.append(1) or True)

    async def scenario() -> None:
        engine = FakeEngine()
        engine.gate.set()
        batcher = TokenBudgetBatcher(engine, None, max_batch_tokens=BUDGET, metrics=ServerMetrics(), max_wait_s=0)
        await batcher.start()
        await asyncio.sleep(0.3)
        assert calls == []  # nothing has run
        await batcher.embed(["a/0"], [4], None)
        await asyncio.sleep(0.5)
        assert calls == [1]  # once, however long it stays idle
        await batcher.embed(["b/1"], [4], None)
        await asyncio.sleep(0.5)
        assert calls == [1, 1] and batcher.releases == 2
        await batcher.stop()

    run(scenario)


# ---------------------------------------------------------------------------------------------- workers
class MeetingEngine(FakeEngine):
    """Each pass waits (up to ``patience`` seconds) for another pass to be running beside it; records the most
    passes that ran at once and each pass's torch threads."""

    def __init__(self, patience: float) -> None:
        super().__init__()
        self.gate.set()
        self.patience = patience
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.threads: list[int] = []
        self.met = threading.Event()

    def encode_raw(self, texts, configs, **kwargs):
        import torch

        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            if self.running == 2:
                self.met.set()
            self.threads.append(torch.get_num_threads())
        self.entered.set()
        self.met.wait(self.patience)
        try:
            return super().encode_raw(texts, configs, **kwargs)
        finally:
            with self.lock:
                self.running -= 1


@pytest.mark.parametrize("workers", [1, 2])
def test_with_two_workers_a_request_runs_beside_the_pass_before_it(workers):
    """A request arrives while a pass runs. Two workers: it gets a window and a pass at once, on the other worker
    (the two passes meet). One worker: it waits for the first pass to end (they never meet). Each worker's passes
    run on its share of torch's threads (one here); the caller's thread keeps its own."""
    import torch

    engine = MeetingEngine(patience=10 if workers == 2 else 0.3)
    before = torch.get_num_threads()

    async def scenario() -> list[float]:
        batcher = TokenBudgetBatcher(
            engine, None, max_batch_tokens=1000, metrics=ServerMetrics(), max_wait_s=0.001, workers=workers, threads=1
        )
        await batcher.start()
        first = asyncio.ensure_future(batcher.embed(["a/0"], [4], None))
        while not engine.entered.is_set():
            await asyncio.sleep(0.001)
        second = await batcher.embed(["b/1"], [4], None)
        vectors = [(await first)[0, 0], second[0, 0]]
        await batcher.stop()
        return vectors

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == [0.0, 1.0]
    assert engine.passes == [["a/0"], ["b/1"]] or engine.passes == [["b/1"], ["a/0"]]
    assert engine.most == workers and engine.met.is_set() == (workers == 2)
    assert engine.threads == [1, 1] and torch.get_num_threads() == before


def test_a_window_is_the_share_of_the_queue_divided_among_the_workers():
    """The texts in passes at once stay ``window_share`` of the queue: each of two workers' windows takes half."""
    one = TokenBudgetBatcher(FakeEngine(), None, max_batch_tokens=100_000, metrics=ServerMetrics(), window_share=0.5)
    two = TokenBudgetBatcher(
        FakeEngine(), None, max_batch_tokens=100_000, metrics=ServerMetrics(), window_share=0.5, workers=2
    )
    one._queued_tokens = two._queued_tokens = 8000
    assert (one._window_tokens(), two._window_tokens()) == (4000, 2000)
    two._queued_tokens = 100  # never below the floor
    assert two._window_tokens() == WINDOW_FLOOR_TOKENS


def test_the_default_is_two_workers_for_torch_on_a_cpu_with_two_threads_else_one():
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert forward_workers(None, "cpu") == {"workers": 2, "threads": 1}
        assert forward_workers(None, "cuda") == forward_workers(1, "cpu") == {"workers": 1, "threads": None}
        assert forward_workers(3, torch.device("cpu")) == {"workers": 3, "threads": 1}
        assert forward_workers(None, "cpu", "onnx") == {"workers": 1, "threads": None}
        torch.set_num_threads(1)
        assert forward_workers(None, "cpu") == {"workers": 1, "threads": None}
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("workers", [0, -1, True, 1.5])
def test_workers_that_are_not_a_positive_count_are_refused(workers):
    with pytest.raises(ConfigError, match=r"workers=.* must be a positive integer"):
        Limits(workers=workers)
