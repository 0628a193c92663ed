"""Stage machinery of the pipelined encoding engine (:class:`lmembed.encoding.engine.EncodingEngine` with
``pipelined=True``).

Two pieces, both free of any model knowledge:

* :class:`Prefetcher` runs a producer (tokenising, then collating batch after batch) on one named daemon thread
  and hands its items to the caller through a bounded queue, so the next batch is ready while the current one
  computes and no more than ``depth`` batches wait in memory. An exception in the producer reaches the caller as
  that exception, with a note naming the thread; when the caller stops early (its own error, an interrupt, an
  early :meth:`Prefetcher.close`) the producer is told to stop and joined before control returns.
* :class:`ReadBack` brings pooled vectors home. On CUDA each batch's vectors are copied into pinned host buffers
  without blocking and an event marks the copy's end; a batch is written into the outputs (and its ``on_done``
  called) once the next batch has been sent to the device, so the copy runs while the device computes. On the CPU
  the vectors are written at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch

log = logging.getLogger(__name__)

T = TypeVar("T")

COLLATE_THREAD = "lmembed-collate"  # the name of the producer thread (tokenising and collating)
TOKENISE_THREAD = "lmembed-tokenise"  # the producer's helper, tokenising the next window ahead (plan_window)
QUEUE_DEPTH = 2  # batches collated ahead of the one computing: bounds the host memory the pipeline holds
_POLL_SECONDS = 0.05  # how often a blocked queue operation looks at the stop flag / the producer's health


@dataclass
class _Item:
    value: Any


@dataclass
class _Failure:
    error: BaseException


_END = object()


class Prefetcher(Generic[T]):
    """Iterate over ``produce(stop)``'s items, produced on a daemon thread named ``name``, at most ``depth`` ahead.

    ``produce`` receives a :class:`threading.Event` that is set when the consumer stops; a producer with long
    steps between its items (tokenising many texts) should look at it between steps. Use it as a context manager
    (or call :meth:`close`): leaving it stops and joins the thread, whatever happened."""

    def __init__(
        self, produce: Callable[[threading.Event], Iterable[T]], *, depth: int = QUEUE_DEPTH, name: str = COLLATE_THREAD
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(produce,), name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer side
    def _run(self, produce: Callable[[threading.Event], Iterable[T]]) -> None:
        items = produce(self._stop)
        try:
            for value in items:
                if not self._put(_Item(value)):
                    return
            self._put(_END)
        except BaseException as error:  # handed to the consumer, who raises it
            self._put(_Failure(error))
        finally:  # a generator stopped early runs its own clean-up (helper threads) here, before the thread ends
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _put(self, message: Any) -> bool:
        """Queue ``message``, waiting for room unless the consumer stops; False when it stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    # ------------------------------------------------------------------ consumer side
    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        while True:
            try:
                message = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():  # a producer that left no word: never wait
                    self.close()
                    raise RuntimeError(f"the {self.name} thread ended without finishing its batches") from None
        if message is _END:
            self.close()
            raise StopIteration
        if isinstance(message, _Failure):
            self.close()
            error = message.error
            error.add_note(f"(raised in the {self.name} thread, which tokenises and collates lmembed's batches)")
            raise error
        return message.value

    def close(self) -> None:
        """Tell the producer to stop, drop what it queued and wait for its thread to end."""
        self._finished = True
        self._stop.set()
        while True:  # a producer blocked on a full queue sees the room, then the stop flag
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class _Pending:
    rows: list[int]
    vectors: list[Any]  # numpy arrays (ready) or pinned host tensors (ready once ``event`` is)
    event: Any = None  # a torch.cuda.Event recorded after the copies


class ReadBack:
    """Pooled vectors of finished batches on their way into ``outputs`` (one array per strategy), in batch order.

    :meth:`push` starts a batch's read-back; :meth:`settle` writes every batch but the ``lag`` newest into the
    outputs and calls ``on_done(rows)`` for each, once its rows are there. On CUDA (``lag=1``) the copies go into
    pinned host memory with ``non_blocking=True`` and an event, so a batch is read back while the next computes;
    elsewhere (``lag=0``) a batch is written at once. :meth:`drain` writes the rest; :meth:`salvage` does the same
    after another stage failed, quietly, so the finished batches still reach ``on_done`` (the cache)."""

    def __init__(self, outputs: Sequence[np.ndarray], on_done: Callable[[list[int]], None], device: torch.device):
        self.outputs = outputs
        self.on_done = on_done
        self.cuda = device.type == "cuda"
        self.lag = 1 if self.cuda else 0
        self.pending: deque[_Pending] = deque()
        self.failed = False  # an on_done or a write raised: nothing more is finished

    def push(self, rows: list[int], vectors: Sequence[torch.Tensor]) -> None:
        if self.cuda and all(v.device.type == "cuda" for v in vectors):
            host = []
            for v in vectors:
                v = v.float()
                buffer = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                buffer.copy_(v, non_blocking=True)
                host.append(buffer)
            event = torch.cuda.Event()
            event.record()
            self.pending.append(_Pending(rows, host, event))
        else:
            self.pending.append(_Pending(rows, [v.float().cpu().numpy() for v in vectors]))

    def settle(self) -> None:
        while len(self.pending) > self.lag:
            self._finish()

    def drain(self) -> None:
        while self.pending:
            self._finish()

    def salvage(self) -> None:
        if self.failed:
            return
        try:
            self.drain()
        except Exception as exc:  # the first error matters more; the batches left are lost, as serially
            log.warning("could not read back the batches finished before the failure: %s", exc)

    def _finish(self) -> None:
        batch = self.pending.popleft()
        try:
            if batch.event is not None:
                batch.event.synchronize()
            for out, vectors in zip(self.outputs, batch.vectors, strict=True):
                out[batch.rows] = vectors.numpy() if isinstance(vectors, torch.Tensor) else vectors
            self.on_done(batch.rows)
        except BaseException:
            self.failed = True
            raise
