"""The scheduler: texts of many callers share forward passes, first come first served, by a token budget.

Requests put their texts in one queue, in arrival order. ``workers`` threads (``--workers``: two on a CPU, one on
an accelerator) run the forward passes, each one pass at a time, in *windows*:

1. **Admission, by age.** When a worker is free and no admitted pass waits for one, the oldest waiting texts
   are admitted, in arrival order, until their tokens reach the window: ``window_share`` (a quarter,
   ``--window-share``) of the tokens queued, shared by the workers (so the texts in passes at once stay that
   share of the queue, whatever their number), at least ``WINDOW_FLOOR_TOKENS``, at most ``max_batch_tokens``
   (the oldest text always goes, even alone over the budget). A text is never admitted before one that arrived
   ahead of it, so a request's texts are never held behind later arrivals: the work done on texts that came
   after a request, before that request is answered, is at most one window per worker (at most one budget of
   tokens each). Windows of a share of the queue, not all of it, keep the tail short at saturation: inside a
   window texts run by length, not by age, so a window as long as the whole queue would let a text wait up to
   two queues' worth. A smaller share shortens the tail and costs throughput (more, smaller passes).
2. **Bounded wait.** Before admitting, the scheduler waits while the whole queue fits in the window with room to
   spare (so a text arriving now would join it) and texts keep arriving: until none has come for
   ``max_wait_s`` (a few milliseconds), at most ``WAIT_CAP`` times that in all. Clients answered by the last
   window send their next request in that time, and join this window instead of waiting a whole window for
   the next; a lone request waits ``max_wait_s`` only. Once the queue holds more than a window takes, nothing
   waits: texts arriving then would not join this window (it is full of older ones), and the workers
   would idle for nothing (``bench/serve_sim.py`` measures that idle time in a closed loop:
   bench/results/serve_sim/).
3. **Passes, by length inside the window.** The window's texts are split by instruction (texts with
   different instructions cannot share a pass), sorted by length and cut into passes by
   :func:`plan_passes`: the cut that costs least, counting a pass as its *padded* tokens (texts x longest,
   at most ``max_batch_tokens``) plus a fixed ``PASS_COST_TOKENS``. Short and long texts go to different
   passes, so little compute goes to padding, and short texts of similar lengths share one. The window's
   passes run in order of the oldest text each holds.

When the worker has been idle for ``IDLE_RELEASE_S`` after passes, it gives the heap memory they freed back
to the system (glibc's ``malloc_trim``): a burst of large requests leaves the allocator holding hundreds of
megabytes it would otherwise keep for good. Never under load: only after a second with nothing to do.

Tokenisation happens once, before a text is queued, off the event loop (:mod:`lmembed.serving.tokens`): the
features built there to count its tokens are queued with the text and are what its pass runs on. Forward passes
run on worker threads, so the event loop only parses, queues and answers. Admitted passes are handed to the
workers one more than there are of them: while passes run, the next waits behind them, so a worker goes from one
to the next without waiting for the event loop to hand out the answers of the first (a caller gone away by then
still leaves the passes not yet handed over); a caller is answered when its pass ends, whatever the loop is
waiting for.

**Workers.** On a CPU each worker runs its passes on an equal share of torch's intra-op threads (torch keeps the
count per thread): two one-thread passes side by side keep two cores busier than one pass split over both (the
small passes of a server under load do not split well); ``bench/serve_load.py --variant one-worker="--workers 1"``
compares two workers with one in the same run (bench/results/serve_load/). Matrix kernels give the same bits on one
thread as on two here (tested), so a vector is still the one ``Embedder.encode`` of its pass gives.

Each pass is one call of the encoding engine, ``encode_raw(texts, [strategy], instruction=..., features=...)``
with the pass's texts in arrival order and one forward batch, the call ``Embedder.encode`` makes: a served vector
is, bit for bit, the vector ``Embedder.encode(texts_of_its_pass, batch_size=len(texts_of_its_pass))``
gives (for a request whose texts form a pass alone, that is ``Embedder.encode`` of the request). Against
the same text encoded in another batch it differs by float rounding only: CPU and GPU matrix kernels are
not batch-invariant (a row's result depends on how many rows share the multiplication), so no server that
shares passes can promise more. Vectors are returned raw (before normalisation and Matryoshka
truncation), so requests asking for different ``dimensions`` share passes.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count
from typing import Any

import numpy as np
import torch

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import EncodingEngine
from lmembed.errors import ConfigError
from lmembed.serving.errors import ApiError
from lmembed.serving.limits import Limits
from lmembed.serving.metrics import ServerMetrics

log = logging.getLogger(__name__)

#: The fixed cost of one forward pass, in padded tokens: what a pass costs beyond its texts (kernel launches,
#: thread hand-offs, pooling, Python). A text joins a pass of longer texts when the padding it takes costs
#: less than a pass of its own. A judgement for small encoders on CPU, where a one-text pass costs about as
#: much as a hundred tokens of a full one; larger, it merges more lengths into a pass.
PASS_COST_TOKENS = 64
#: ... but never fewer tokens than this: below it, the fixed cost of passes would dominate a window.
WINDOW_FLOOR_TOKENS = 16 * PASS_COST_TOKENS
#: The wait for a window to fill lasts until no text has arrived for ``max_wait_s``, at most this many times it.
WAIT_CAP = 10

#: Seconds of idleness after which the worker releases freed heap memory.
IDLE_RELEASE_S = 1.0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_memory() -> bool:
    """Return the heap memory that ``free`` has kept to the system (glibc only; elsewhere nothing happens and
    this returns False)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _pin_threads(threads: int) -> None:
    """(Each worker thread, once.) The intra-op threads of this thread's passes: torch keeps the count per thread."""
    torch.set_num_threads(threads)


def forward_workers(workers: int | None, device: Any, backend: str = "torch") -> dict[str, int | None]:
    """The batcher's ``workers`` and ``threads`` (torch's intra-op threads of each worker, shared equally, at
    least one each; ``None``: all, as set). ``workers=None`` chooses: two for torch on a CPU with two threads or
    more (small passes use the cores better side by side than split over intra-op threads: bench/serve_load.py),
    else one (an accelerator runs one pass at a time; ONNX Runtime keeps its own threads, which torch's count does
    not share out)."""
    threads = torch.get_num_threads()
    if workers is None:
        on_cpu = torch.device(device).type == "cpu" and backend == "torch"
        workers = 2 if on_cpu and threads >= 2 else 1
    return {"workers": workers, "threads": None if workers == 1 else max(1, threads // workers)}


@dataclass(eq=False)
class _Job:
    """One request's texts for one instruction (and their features, when built), and where their vectors go."""

    texts: Sequence[Any]
    features: Sequence[Any] | None
    future: asyncio.Future
    out: np.ndarray
    remaining: int


@dataclass(eq=False)
class _Item:
    job: _Job
    row: int
    length: int
    seq: int
    instruction: str | None


def plan_passes(lengths: Sequence[int], budget: int, pass_cost: int = PASS_COST_TOKENS) -> list[list[int]]:
    """Positions (into ``lengths``, in arrival order) of the passes that run an admitted window's texts of
    one instruction: sorted by length and cut where it costs least, a pass costing ``pass_cost`` plus its
    padded tokens (texts x longest, at most ``budget``; a text longer than the budget goes alone). Each pass
    lists its positions in arrival order; the passes come in order of the oldest text each holds."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    # runs of equal length, each cut to what fits the budget: a pass is a sequence of whole runs
    runs: list[list[int]] = []
    for i in order:
        run = runs[-1] if runs else None
        if run and lengths[run[0]] == lengths[i] and (len(run) + 1) * lengths[i] <= budget:
            run.append(i)
        else:
            runs.append([i])
    best = [0] * (len(runs) + 1)  # best[j]: the least cost of the first j runs
    cut = [0] * (len(runs) + 1)  # where the last pass of that best plan starts
    for j in range(1, len(runs) + 1):
        longest, texts, best[j] = lengths[runs[j - 1][0]], 0, -1
        for start in range(j - 1, -1, -1):
            texts += len(runs[start])
            if texts * longest > budget and start < j - 1:
                break
            cost = best[start] + pass_cost + texts * longest
            if best[j] < 0 or cost < best[j]:
                best[j], cut[j] = cost, start
    passes, j = [], len(runs)
    while j > 0:
        passes.append(sorted(i for run in runs[cut[j] : j] for i in run))
        j = cut[j]
    return sorted(passes, key=lambda positions: positions[0])


class TokenBudgetBatcher:
    """Queues texts and runs them through the engine in first-come-first-served windows of token-budgeted
    forward passes (see the module doc)."""

    def __init__(
        self,
        engine: EncodingEngine,
        config: EmbeddingConfig,
        *,
        max_batch_tokens: int,
        metrics: ServerMetrics,
        width: int | None = None,
        max_wait_s: float = Limits.batch_wait_s,
        window_share: float = Limits.window_share,
        workers: int = 1,
        threads: int | None = None,
    ) -> None:
        self.window_share = window_share
        self.workers = workers
        self.engine = engine
        self.config = config
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.metrics = metrics
        self.hidden = engine.output_dim(config) if width is None else width  # columns of each item's output
        self._queue: deque[_Item] = deque()  # arrival order, every instruction
        self._queued_tokens = 0
        self._seq = count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._executor = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="lmembed-forward",
            initializer=None if threads is None else _pin_threads,
            initargs=() if threads is None else (threads,),
        )
        self._running = 0  # passes handed to the workers and not yet ended
        self._arrivals = 0  # requests queued so far
        self.passes = 0
        self.windows = 0
        self.releases = 0  # times idle memory was given back
        self._released = True  # nothing has run since the last release

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="lmembed-batcher")

    async def stop(self) -> None:
        """Finish every queued text, then stop the worker."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    @property
    def waiting(self) -> int:
        """Texts queued and not yet admitted into a window."""
        return len(self._queue)

    # ------------------------------------------------------------------ requests
    async def embed(
        self,
        texts: Sequence[Any],
        lengths: Sequence[int],
        instruction: str | None,
        features: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """Raw vectors ``(len(texts), hidden)`` of ``texts`` (whose token counts are ``lengths``; ``features``,
        their tokenisation, one per text, is what the pass runs on when given)."""
        if self._stopping or self._wake is None:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        if features is not None and len(features) != len(texts):
            raise ConfigError(f"{len(features)} features for {len(texts)} texts")
        future = asyncio.get_running_loop().create_future()
        job = _Job(texts, features, future, np.empty((len(texts), self.hidden), dtype=np.float32), len(texts))
        if not texts:
            return job.out
        self._queue.extend(_Item(job, row, n, next(self._seq), instruction) for row, n in enumerate(lengths))
        self._queued_tokens += sum(lengths)
        self._arrivals += 1
        self.metrics.queue_depth.set(len(self._queue))
        self._wake.set()
        return await future

    # ------------------------------------------------------------------ the worker
    def _admit(self) -> list[_Item]:
        """Remove and return the next window: the oldest live texts, in arrival order, up to ``window_share`` of
        the queued tokens (at least ``WINDOW_FLOOR_TOKENS``, at most the budget)."""
        window: list[_Item] = []
        tokens = 0
        limit = self._window_tokens()
        while self._queue:
            item = self._queue[0]
            if item.job.future.done():  # the caller has gone away
                self._queue.popleft()
                self._queued_tokens -= item.length
                continue
            if window and tokens + item.length > limit:
                break
            self._queue.popleft()
            self._queued_tokens -= item.length
            window.append(item)
            tokens += item.length
        return window

    def _window_tokens(self) -> float:
        """The tokens the next window admits: ``window_share`` of those queued, shared by the workers (each runs a
        window's passes beside the others'), at least ``WINDOW_FLOOR_TOKENS``, at most the budget."""
        share = self.window_share / self.workers
        return min(self.max_batch_tokens, max(WINDOW_FLOOR_TOKENS, share * self._queued_tokens))

    async def _fill(self) -> None:
        """Wait while the whole queue fits in the next window with room to spare (a text arriving now would join
        it), until no text has arrived for ``max_wait_s`` (at most ``WAIT_CAP`` x ``max_wait_s``)."""
        now = time.monotonic()
        cap, deadline = now + WAIT_CAP * self.max_wait_s, now + self.max_wait_s
        arrivals = self._arrivals
        while self._queued_tokens < self._window_tokens() and not self._stopping:
            left = min(deadline, cap) - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return
            if self._arrivals != arrivals:  # texts are still arriving (not a pass ending): wait for the next
                arrivals = self._arrivals
                deadline = time.monotonic() + self.max_wait_s

    async def _idle(self) -> None:
        """Wait for work; after ``IDLE_RELEASE_S`` of none, release the memory the passes freed (once)."""
        if self._released:
            await self._wake.wait()
            return
        try:
            await asyncio.wait_for(self._wake.wait(), IDLE_RELEASE_S)
        except TimeoutError:
            await asyncio.get_running_loop().run_in_executor(self._executor, release_memory)
            self._released = True
            self.releases += 1

    def _forward(self, texts: list[Any], instruction: str | None, features: list[Any] | None) -> np.ndarray:
        """One pass (on the worker thread): raw vectors of ``texts``, from ``features`` when they are built."""
        return self.engine.encode_raw(
            texts, [self.config], instruction=instruction, batch_size=len(texts), features=features
        )[0]

    def _timed(self, texts: list[Any], instruction: str | None, features: list[Any] | None) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        raw = self._forward(texts, instruction, features)
        return raw, time.perf_counter() - start

    async def _run(self) -> None:
        planned: deque[list[_Item]] = deque()  # passes of admitted windows, not yet handed to a worker
        while True:
            # hand over the admitted passes, one more than there are workers: none waits for this loop
            while planned and self._running <= self.workers:
                live = [item for item in planned.popleft() if not item.job.future.done()]
                if live:
                    self._hand_over(live)
            if not planned and self._running < self.workers and self._queue:
                await self._fill()  # a worker is free and no admitted pass waits for one: the next window
                self._plan(self._admit(), planned)
                self.metrics.queue_depth.set(len(self._queue))
                continue
            if not planned and not self._running and not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._idle()
                continue
            self._wake.clear()  # nothing to do until a pass ends or texts arrive
            await self._wake.wait()

    def _plan(self, window: list[_Item], planned: deque[list[_Item]]) -> None:
        """Cut an admitted window into passes (by instruction, then :func:`plan_passes`), oldest text first."""
        if not window:
            return
        self.windows += 1
        by_instruction: dict[str | None, list[_Item]] = {}
        for item in window:
            by_instruction.setdefault(item.instruction, []).append(item)
        passes = [
            [items[i] for i in positions]
            for items in by_instruction.values()
            for positions in plan_passes([item.length for item in items], self.max_batch_tokens)
        ]
        planned.extend(sorted(passes, key=lambda batch: batch[0].seq))

    def _hand_over(self, batch: list[_Item]) -> None:
        """Queue ``batch``'s pass on a worker thread; its callers get their vectors when it ends."""
        texts = [item.job.texts[item.row] for item in batch]
        features = None
        if all(item.job.features is not None for item in batch):
            features = [item.job.features[item.row] for item in batch]
        self.metrics.batch_texts.observe(len(batch))
        self.metrics.batch_tokens.observe(len(batch) * max(item.length for item in batch))
        loop = asyncio.get_running_loop()
        pass_ = loop.run_in_executor(self._executor, self._timed, texts, batch[0].instruction, features)
        self._running += 1
        pass_.add_done_callback(functools.partial(self._finish, batch))

    def _finish(self, batch: list[_Item], pass_: asyncio.Future) -> None:
        """(On the event loop, when ``batch``'s pass ends.) Give each caller its vectors, or the pass's error."""
        self._running -= 1
        self._wake.set()
        error = pass_.exception() if not pass_.cancelled() else asyncio.CancelledError()
        if error is not None:
            log.error("forward pass of %d texts failed", len(batch), exc_info=error)
            for item in batch:
                if not item.job.future.done():
                    item.job.future.set_exception(error)
            return
        raw, seconds = pass_.result()
        self.passes += 1
        self._released = False
        self.metrics.forward_seconds.observe(seconds)
        self.metrics.texts.inc(len(batch))
        for item, vector in zip(batch, raw, strict=True):
            job = item.job
            job.out[item.row] = vector
            job.remaining -= 1
            if job.remaining == 0 and not job.future.done():
                job.future.set_result(job.out)
