"""Engines run the two passes of a sharded job: ``local`` in this process, ``ray`` on a Ray cluster.

Both run the same units of work (:mod:`lmembed.scale.work`): the plan pass over blocks of rows, then
the encode pass over the shards still missing from the cache. An engine only decides *where* they run;
what they compute, and the files they write, are the same, so a job started on one engine may be
finished on the other.

The encode pass is one use of :meth:`JobEngine.map_shards` (a :class:`~lmembed.protocols.ShardMapper`: a worker
built once per actor, called once per shard); synthesis runs its shards through the same method
(``lmembed.synthesis.synthesize(..., engine=make_engine("ray"))``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from lmembed.embedder import Embedder
from lmembed.options import ENGINES, EngineOptions
from lmembed.protocols import LocalShards, ShardWorker
from lmembed.scale.errors import EngineUnavailableError
from lmembed.scale.sources import CorpusSource
from lmembed.scale.staging import Planner, PlanSettings
from lmembed.scale.work import EmbedderSpec, InProcess, ModelProvider, ShardEncoder, ShardSettings


class JobEngine(Protocol):
    """Where a sharded job's work runs (``--engine local|ray``). Not the encoding engine
    (:class:`~lmembed.encoding.engine.EncodingEngine`), which turns texts into vectors inside each worker."""

    name: str

    def start(self) -> None: ...

    def worker_count(self) -> int: ...

    def uses_gpus(self) -> bool: ...

    def threads(self) -> int | None: ...

    def model_provider(self, embedder: Embedder, spec: EmbedderSpec | None) -> ModelProvider: ...

    def plan(self, source: CorpusSource, settings: PlanSettings) -> Iterator[pa.Table]: ...

    def encode(
        self, shards: Sequence[int], model: ModelProvider, settings: ShardSettings
    ) -> Iterator[dict[str, np.ndarray]]: ...

    def map_shards(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int], *, stage: str
    ) -> Iterator[dict[str, np.ndarray]]: ...


class LocalEngine:
    """Runs every unit of work in this process, one after another, with the caller's own Embedder."""

    name = "local"

    def start(self) -> None:
        return None

    def worker_count(self) -> int:
        return 1

    def uses_gpus(self) -> bool:
        return False

    def threads(self) -> int | None:
        return None  # keep this process's torch thread count

    def model_provider(self, embedder: Embedder, spec: EmbedderSpec | None) -> ModelProvider:
        return InProcess(embedder)

    def plan(self, source: CorpusSource, settings: PlanSettings) -> Iterator[pa.Table]:
        planner = Planner(settings)
        for block in source.iter_blocks():
            yield planner(block.to_arrow())

    def encode(
        self, shards: Sequence[int], model: ModelProvider, settings: ShardSettings
    ) -> Iterator[dict[str, np.ndarray]]:
        return self.map_shards(ShardEncoder, (model, settings), shards, stage="encode pass")

    def map_shards(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int], *, stage: str
    ) -> Iterator[dict[str, np.ndarray]]:
        return LocalShards().map_shards(worker, args, shards, stage=stage)


def make_engine(engine: str | JobEngine | EngineOptions = "local", **options: Any) -> JobEngine:
    """An engine from its :class:`~lmembed.options.EngineOptions` (or from a name, ``local`` or ``ray``, and
    those options as keywords: ``make_engine("ray", workers=2)``), or ``engine`` itself when it is one already.
    The options are described on :class:`~lmembed.options.EngineOptions`."""
    if not isinstance(engine, str | EngineOptions):
        return engine
    chosen = engine_options(engine, **options)
    if chosen.engine == "local":
        if chosen.ray_address is not None:
            raise EngineUnavailableError("--ray-address is an option of --engine ray; the local engine has no cluster")
        return LocalEngine()
    if chosen.engine != "ray":
        raise EngineUnavailableError(f"unknown engine {chosen.engine!r}; choose one of {', '.join(ENGINES)}")
    try:
        from lmembed.scale.ray_engine import RayEngine  # lazy: ray is optional (the scale extra) and slow to import
    except ImportError as exc:
        raise EngineUnavailableError(
            f"--engine ray needs Ray Data ({exc.name or exc}): pip install 'lmembed[scale]'"
        ) from exc
    return RayEngine(chosen)


def engine_options(engine: str | EngineOptions, **options: Any) -> EngineOptions:
    """``engine`` with ``options`` as an :class:`~lmembed.options.EngineOptions` (a name and keywords, or
    options with some replaced)."""
    if isinstance(engine, EngineOptions):
        return replace(engine, **options)
    return EngineOptions(engine=engine, **options)


def describe(engine: JobEngine) -> dict[str, Any]:
    """What ran a job, for its report."""
    return {
        "engine": engine.name,
        "workers": engine.worker_count(),
        "gpus": engine.uses_gpus(),
        "threads_per_worker": engine.threads(),
    }
