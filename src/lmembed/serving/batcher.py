"""Dynamic batching by a token budget: texts from many callers share forward passes.

Requests put their texts in a queue, grouped by forward configuration (texts with different instructions
cannot share a pass). One worker thread runs the passes, one at a time; while it runs, new texts queue
up, so the next pass takes everything that fits. A pass is bounded by ``max_batch_tokens`` *padded*
tokens (texts x the longest of them), not by a number of requests or texts.

Which texts form the next pass: the oldest waiting text always goes (so none waits forever), with the
group's other texts closest to it in length, as many as the budget allows while at least ``MIN_FILL``
(90 %) of the pass's padded tokens are real ones, or it pads at most ``PAD_SLACK`` tokens a text: texts of
very different lengths go to different passes, so little compute goes to padding. A single text longer
than the budget goes alone.

Each pass is one call of the encoding engine, ``encode_raw(texts, [strategy], instruction=...)`` with the
pass's texts in arrival order and one forward batch, the call ``Embedder.encode`` makes: a served vector
is, bit for bit, the vector ``Embedder.encode(texts_of_its_pass, batch_size=len(texts_of_its_pass))``
gives (for a request whose texts form a pass alone, that is ``Embedder.encode`` of the request). Against
the same text encoded in another batch it differs by float rounding only: CPU and GPU matrix kernels are
not batch-invariant (a row's result depends on how many rows share the multiplication), so no server that
shares passes can promise more. Vectors are returned raw (before normalisation and Matryoshka
truncation), so requests asking for different ``dimensions`` share passes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count

import numpy as np

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import EncodingEngine
from lmembed.serving.errors import ApiError
from lmembed.serving.metrics import ServerMetrics

log = logging.getLogger(__name__)

#: A pass keeps at least this share of its padded tokens real (texts of very different lengths go to
#: different passes: the compute of a pass grows with texts x longest, padding included). Measured with
#: bench/serve_load.py (minilm, 64 clients, 2 cores): 0.75 gave 0.82x in-process throughput, 0.9 gave 0.94x.
MIN_FILL = 0.9
#: ... or at most this many padding tokens per text (short texts: a few padded tokens cost less than a pass).
PAD_SLACK = 8


@dataclass(eq=False)
class _Job:
    """One request's texts for one instruction, and where their vectors go."""

    texts: Sequence[str]
    future: asyncio.Future
    out: np.ndarray
    remaining: int


@dataclass(eq=False)
class _Item:
    job: _Job
    row: int
    length: int
    seq: int


@dataclass
class _Group:
    """Waiting texts that can share a forward pass (same instruction), in arrival order."""

    instruction: str | None
    items: list[_Item] = field(default_factory=list)


def select_window(lengths: Sequence[int], oldest: int, budget: int, min_fill: float = MIN_FILL) -> list[int]:
    """Positions (into ``lengths``) of the next pass: ``oldest`` plus the texts nearest to it in length, as
    many as keep ``len(chosen) * max(length) <= budget`` (the token budget) and ``sum(length) >= min_fill *
    len(chosen) * max(length)`` or at most ``PAD_SLACK`` padding tokens per text (little padding); ``oldest``
    alone if nothing else fits."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    lo = hi = order.index(oldest)
    target = lengths[oldest]
    total = target

    def fits(count: int, longest: int, tokens: int) -> bool:
        padded = count * longest
        return padded <= budget and (tokens >= min_fill * padded or padded - tokens <= PAD_SLACK * count)

    while True:
        count, longest = hi - lo + 2, lengths[order[hi]]
        left = lo - 1 if lo > 0 and fits(count, longest, total + lengths[order[lo - 1]]) else None
        right = None
        if hi + 1 < len(order) and fits(count, lengths[order[hi + 1]], total + lengths[order[hi + 1]]):
            right = hi + 1
        if left is None and right is None:
            break
        if right is None or (left is not None and target - lengths[order[left]] <= lengths[order[right]] - target):
            lo = left
            total += lengths[order[lo]]
        else:
            hi = right
            total += lengths[order[hi]]
    return order[lo : hi + 1]


class TokenBudgetBatcher:
    """Queues texts and runs them through the engine in token-budgeted forward passes (see the module doc)."""

    def __init__(
        self,
        engine: EncodingEngine,
        config: EmbeddingConfig,
        *,
        max_batch_tokens: int,
        metrics: ServerMetrics,
        width: int | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.max_batch_tokens = max_batch_tokens
        self.metrics = metrics
        self.hidden = engine.output_dim(config) if width is None else width  # columns of each item's output
        self._groups: dict[str | None, _Group] = {}
        self._waiting = 0
        self._seq = count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-forward")
        self.passes = 0

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
        return self._waiting

    # ------------------------------------------------------------------ requests
    async def embed(self, texts: Sequence[str], lengths: Sequence[int], instruction: str | None) -> np.ndarray:
        """Raw vectors ``(len(texts), hidden)`` of ``texts`` (whose token counts are ``lengths``)."""
        if self._stopping or self._wake is None:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        future = asyncio.get_running_loop().create_future()
        job = _Job(texts, future, np.empty((len(texts), self.hidden), dtype=np.float32), len(texts))
        if not texts:
            return job.out
        group = self._groups.setdefault(instruction, _Group(instruction))
        group.items.extend(_Item(job, row, n, next(self._seq)) for row, n in enumerate(lengths))
        self._waiting += len(texts)
        self.metrics.queue_depth.set(self._waiting)
        self._wake.set()
        return await future

    # ------------------------------------------------------------------ the worker
    def _take(self) -> tuple[str | None, list[_Item]]:
        """Remove and return the next pass's texts (see :func:`select_window`)."""
        for key in list(self._groups):  # drop texts whose caller has gone away
            group = self._groups[key]
            live = [item for item in group.items if not item.job.future.done()]
            self._waiting -= len(group.items) - len(live)
            group.items = live
            if not live:
                del self._groups[key]
        if not self._groups:
            return None, []
        group = min(self._groups.values(), key=lambda g: g.items[0].seq)
        chosen = set(select_window([item.length for item in group.items], 0, self.max_batch_tokens))
        batch = [item for i, item in enumerate(group.items) if i in chosen]
        group.items = [item for i, item in enumerate(group.items) if i not in chosen]
        if not group.items:
            del self._groups[group.instruction]
        self._waiting -= len(batch)
        return group.instruction, batch

    def _forward(self, texts: list[str], instruction: str | None) -> np.ndarray:
        return self.engine.encode_raw(texts, [self.config], instruction=instruction, batch_size=len(texts))[0]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            instruction, batch = self._take()
            self.metrics.queue_depth.set(self._waiting)
            if not batch:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            texts = [item.job.texts[item.row] for item in batch]
            self.metrics.batch_texts.observe(len(batch))
            self.metrics.batch_tokens.observe(len(batch) * max(item.length for item in batch))
            start = time.perf_counter()
            try:
                raw = await loop.run_in_executor(self._executor, self._forward, texts, instruction)
            except Exception as exc:
                log.exception("forward pass of %d texts failed", len(batch))
                for item in batch:
                    if not item.job.future.done():
                        item.job.future.set_exception(exc)
                continue
            self.passes += 1
            self.metrics.forward_seconds.observe(time.perf_counter() - start)
            self.metrics.texts.inc(len(batch))
            for item, vector in zip(batch, raw, strict=True):
                job = item.job
                job.out[item.row] = vector
                job.remaining -= 1
                if job.remaining == 0 and not job.future.done():
                    job.future.set_result(job.out)
