"""Interfaces shared across the pipeline, as structural types.

Evaluation, mining and serving code depend on these protocols, never on a concrete class, so any
object with the right methods (an lmembed ``Embedder``, a test double, a wrapped third-party model)
can be plugged in. A sharded job's work (synthesis shards, encoding shards) runs through a
:class:`ShardMapper`: :class:`LocalShards` here, or one of ``lmembed.scale``'s engines on a Ray cluster, handed
in from above so that the job's own layer never imports the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: texts per forward pass where a caller names no batch size (every encode, search, task and job)
ENCODE_BATCH_SIZE = 32


@runtime_checkable
class TextEncoder(Protocol):
    """Anything that turns texts into a float32 matrix, one row per text, in input order."""

    def encode(self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE) -> np.ndarray: ...


@runtime_checkable
class RetrievalEncoder(Protocol):
    """An encoder that treats queries and documents asymmetrically.

    ``instruction`` is a task description given to the query side only; implementations keep it
    out of the pooled representation where they can.
    """

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = ENCODE_BATCH_SIZE
    ) -> np.ndarray: ...

    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE) -> np.ndarray: ...


#: A unit of sharded work: called with a batch of shard numbers (``{"shard": int64 array}``), it does those shards
#: (writing what they make, atomically) and returns one record per shard (NumPy columns of equal length).
ShardWorker = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class ShardMapper(Protocol):
    """Where a sharded job's shards run: ``worker(*args)`` is built once per worker (a model or a generator loads
    once), then called once per shard; the records come back as shards finish (in any order). ``stage`` names
    the work in errors."""

    def map_shards(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int], *, stage: str
    ) -> Iterator[dict[str, np.ndarray]]: ...


class LocalShards:
    """The :class:`ShardMapper` of this process: one worker, the shards one after another, in order."""

    name = "local"

    def map_shards(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int], *, stage: str
    ) -> Iterator[dict[str, np.ndarray]]:
        if not shards:
            return
        work = worker(*args)
        for shard in shards:
            yield work({"shard": np.asarray([shard], dtype=np.int64)})
