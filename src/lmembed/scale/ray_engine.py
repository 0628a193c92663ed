"""The Ray engine: the plan pass and the encode pass as Ray Data pipelines on a local or remote cluster.

* Plan pass: ``read_datasource`` streams the corpus part by part (one read task per part; a JSON-lines
  file is one part read as a stream of blocks, Parquet row groups are read in parallel), and
  ``map_batches`` runs :class:`~lmembed.scale.work.Planner` (a callable class: the tokenizer is set up
  once per actor) over whole blocks.
* Encode pass: a dataset of the missing shard numbers, one per block, and ``map_batches`` with
  :class:`~lmembed.scale.work.ShardEncoder` on an actor pool: each actor loads the Embedder once (on its
  own GPU with ``num_gpus=1``, or with a fixed thread budget on CPUs) and writes each shard it finishes to
  the cache. The driver reads one small record per finished shard, which drives the progress report.
  The same actor-pool pass runs any sharded work (:meth:`RayEngine.map_shards`): synthesis shards too,
  each actor building its generator once and landing each shard it finishes in the run's folder.

Workers read the staging files and write the cache (or a synthesis run's ``.parts`` folder), so on a multi-node
cluster the cache folder (``$LMEMBED_CACHE``; for synthesis, the output's folder) must be on storage every node
mounts; on one machine nothing is needed.

A worker that dies (killed, out of memory, node lost) is replaced and the shards it did not finish run
again, up to ``worker_restarts`` times; after that the job fails with :class:`~lmembed.scale.errors.WorkerLostError`
and the shards already written stay in the cache for the next run. An exception raised on purpose by
the work (a bad row) is not retried: it reaches the caller once, as the lmembed error it is.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from lmembed.embedder import Embedder
from lmembed.errors import ConfigError, LmembedError
from lmembed.models.loading import weights_fingerprint
from lmembed.options import EngineOptions
from lmembed.paths import verbose_from_env
from lmembed.protocols import ShardWorker
from lmembed.scale.errors import ScaleError, WorkerLostError
from lmembed.scale.sources import BLOCK_SCHEMA, CorpusSource
from lmembed.scale.staging import PlanSettings, plan_block
from lmembed.scale.work import EmbedderSpec, ModelProvider, ShardEncoder, ShardSettings, Snapshot

log = logging.getLogger(__name__)

#: Largest block of the plan pass (about a few thousand passages).
PLAN_BLOCK_BYTES = 2 << 20
#: CPU share of a read task (reading is light next to tokenising; see RayEngine.plan).
READ_CPUS = 0.5
#: The start of what Ray Data appends to the message of an exception raised in a map function.
RAY_RETRY_NOTE = "\nFailed to apply UDF transform"

#: Ray's own errors that mean a process or its objects are gone (as opposed to an error raised by our code).
LOST = (
    ray.exceptions.RayActorError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.OutOfMemoryError,
)


class CorpusDatasource(Datasource):
    """A :class:`~lmembed.scale.sources.CorpusSource` as a Ray Data source: one read task per part."""

    def __init__(self, source: CorpusSource) -> None:
        super().__init__()
        self.source = source

    def get_name(self) -> str:
        return "LmembedCorpus"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        return [
            ReadTask(
                part.read_arrow,  # a method of a torch-free module: read tasks start fast
                BlockMetadata(num_rows=part.row_count, size_bytes=None, input_files=part.files, exec_stats=None),
                schema=BLOCK_SCHEMA,
                per_task_row_limit=per_task_row_limit,
            )
            for part in self.source.parts
        ]


@dataclass
class Shipped:
    """A :class:`~lmembed.scale.work.Snapshot` of an Embedder put in Ray's object store once; each worker
    rebuilds its own copy on its device."""

    ref: Any  # ray.ObjectRef

    def load(self, device: str) -> Embedder:
        return ray.get(self.ref).load(device)


class RayEngine:
    """See the module doc; ``options``: see :class:`~lmembed.options.EngineOptions`."""

    name = "ray"

    def __init__(self, options: EngineOptions | None = None) -> None:
        options = options or EngineOptions(engine=self.name)
        if options.workers is not None and options.workers < 1:
            raise ConfigError(f"workers={options.workers} must be >= 1")
        if options.gpus_per_worker is not None and not options.gpus_per_worker >= 0:
            raise ConfigError(f"gpus_per_worker={options.gpus_per_worker} must be >= 0")
        if options.threads_per_worker < 1:
            raise ConfigError(f"threads_per_worker={options.threads_per_worker} must be >= 1")
        if options.worker_restarts < 0:
            raise ConfigError(f"worker_restarts={options.worker_restarts} must be >= 0")
        self.options = options
        self.started_here = False
        self._shipped: dict[str, Shipped] = {}

    # ------------------------------------------------------------------ cluster
    def start(self) -> None:
        """Join the cluster at ``address``, or start a local one (Ray has no ``local_mode`` any more: a
        local cluster is real worker processes on this machine)."""
        if ray.is_initialized():
            return
        verbose = _verbose()
        # Ray's own log (its start-up notices, its workers' output) only with --verbose: without, an error
        # raised by our code on a worker reaches the user once, as the lmembed error it is
        logging_options: dict[str, Any] = {
            "logging_level": logging.WARNING if verbose else logging.ERROR,
            "log_to_driver": verbose,
        }
        # Ray's core installs a handler of its own for SIGTERM that dumps a stack and aborts (exit 134): the
        # handler in place (lmembed's, which stops the job as Ctrl-C does, its finished shards kept) is put back
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        if self.options.ray_address:
            ray.init(address=self.options.ray_address, **logging_options)
        else:
            cpus = self.options.num_cpus or os.cpu_count() or 1
            ray.init(num_cpus=cpus, include_dashboard=False, **logging_options)
            self.started_here = True
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)

    def shutdown(self) -> None:
        """Stop the local cluster this engine started (a joined cluster is left running)."""
        if self.started_here and ray.is_initialized():
            ray.shutdown()
        self.started_here = False
        self._shipped.clear()

    def uses_gpus(self) -> bool:
        if self.options.gpus_per_worker is not None:
            return self.options.gpus_per_worker > 0
        self.start()
        return ray.cluster_resources().get("GPU", 0) >= 1

    def threads(self) -> int | None:
        return None if self.uses_gpus() else self.options.threads_per_worker

    def worker_count(self) -> int:
        if self.options.workers is not None:
            return self.options.workers
        self.start()
        resources = ray.cluster_resources()
        if self.uses_gpus():
            return max(1, int(resources.get("GPU", 0) // (self.options.gpus_per_worker or 1)))
        return max(1, int(resources.get("CPU", 1) // self.options.threads_per_worker))

    def _resources(self) -> dict[str, Any]:
        if self.uses_gpus():
            return {"num_gpus": self.options.gpus_per_worker or 1, "num_cpus": 1}
        return {"num_cpus": self.options.threads_per_worker}

    # ------------------------------------------------------------------ work
    def model_provider(self, embedder: Embedder, spec: EmbedderSpec | None) -> ModelProvider:
        """``spec`` when given (every worker loads the weights itself), else one shared copy of ``embedder``."""
        if isinstance(spec, EmbedderSpec):
            return spec.bind(embedder)  # a source alone takes the rest of its load spec from the driver
        if spec is not None:
            return spec
        self.start()
        head = embedder.pooling_head
        key = embedder.backbone.fingerprint() + ("" if head is None else "-" + weights_fingerprint(head))
        shipped = self._shipped.get(key)
        if shipped is None:
            shipped = self._shipped[key] = Shipped(ray.put(Snapshot.of(embedder)))
        return shipped

    def plan(self, source: CorpusSource, settings: PlanSettings) -> Iterator[pa.Table]:
        self.start()
        if not source.parts:
            return
        # Reading (one task per part, streaming blocks of BLOCK_ROWS rows) and planning (plain tasks: planning
        # needs only the tokenizer) run as separate operators: their different CPU requests keep Ray Data from
        # fusing them, so the blocks of one large JSON-lines file are tokenised on every worker, not on the
        # one that reads. override_num_blocks: one read task per part (Ray would split small reads further).
        dataset = ray.data.read_datasource(
            CorpusDatasource(source), override_num_blocks=len(source.parts), num_cpus=READ_CPUS
        )
        planned = dataset.map_batches(
            plan_block,
            fn_args=(settings,),
            batch_size=None,  # whole blocks: one staging file per block
            batch_format="pyarrow",
            num_cpus=1,
        )
        planned = _configured(planned)
        # Ray Data merges what a read task yields into blocks of up to 128 MiB; smaller blocks keep the plan
        # tasks (and the staging files) small and many, so that every worker has some to take.
        planned.context.target_max_block_size = PLAN_BLOCK_BYTES
        with _quiet_ray_data(), _translated_errors("plan pass"):
            yield from planned.iter_batches(batch_size=None, batch_format="pyarrow")

    def encode(
        self, shards: Sequence[int], model: ModelProvider, settings: ShardSettings
    ) -> Iterator[dict[str, np.ndarray]]:
        return self.map_shards(ShardEncoder, (model, settings), shards, stage="encode pass")

    def map_shards(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int], *, stage: str
    ) -> Iterator[dict[str, np.ndarray]]:
        """Each shard number one block; ``worker(*args)`` built once per actor of a pool of
        ``min(workers, shards)`` (each on its own GPU, or with ``threads_per_worker`` CPUs), called once per shard.
        An lmembed error raised by the work reaches the caller once, as itself (see the module doc).

        A worker that dies fails the pass; the shards whose records did not come back then run again on a new
        pool, up to ``worker_restarts`` times (a shard lands atomically, so running one twice is harmless). The
        restarts are ours, not Ray's: an actor that Ray may restart makes Ray's C++ core print a notice on the
        driver's stderr for every actor it starts (its constructor arguments live in the object store)."""
        self.start()
        if not shards:
            return
        left = [int(s) for s in shards]
        restarts = self.options.worker_restarts
        for attempt in range(restarts + 1):
            finished: set[int] = set()
            try:
                with _quiet_ray_data(), _translated_errors(stage, restarts=restarts):
                    for record in self._pass(worker, args, left):
                        finished.update(int(s) for s in np.asarray(record["shard"]).ravel())
                        yield record
                return
            except WorkerLostError:
                if attempt == restarts:
                    raise
                left = [s for s in left if s not in finished]
                log.info("%s: a worker died; %d shard(s) run again on new workers", stage, len(left))

    def _pass(
        self, worker: Callable[..., ShardWorker], args: tuple[Any, ...], shards: Sequence[int]
    ) -> Iterator[dict[str, np.ndarray]]:
        dataset = ray.data.from_items([{"shard": s} for s in shards], override_num_blocks=len(shards))
        with warnings.catch_warnings():
            # Ray 2.60 takes max_restarts / max_task_retries only as (deprecated) ray_remote_args.
            warnings.simplefilter("ignore", DeprecationWarning)
            done = dataset.map_batches(
                worker,
                fn_constructor_args=args,
                batch_size=1,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=min(self.worker_count(), len(shards))),
                max_restarts=0,  # see map_shards: a lost worker is handled there
                max_task_retries=0,
                **self._resources(),
            )
        return _configured(done).iter_batches(batch_size=1, batch_format="numpy")


def _configured(dataset: ray.data.Dataset) -> ray.data.Dataset:
    """This job's Ray Data settings, on the dataset's own copy of the context (the global one is left alone)."""
    context = dataset.context
    context.enable_progress_bars = False  # the job reports its own progress (shards, texts/s, ETA)
    # Our errors (a bad row ...) must reach the driver as themselves, not as a UserCodeException whose cause
    # is lost in pickling.
    context.raise_original_map_exception = True
    return dataset


def _without_ray_notes(error: BaseException) -> BaseException:
    """Our error as we raised it: Ray Data appends retry advice to the message of a failed map's exception."""
    message = str(error)
    cut = message.find(RAY_RETRY_NOTE)
    if cut > 0:
        error.args = (message[:cut].rstrip(),)
    return error


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything it wraps (``cause`` of Ray task errors, ``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for inner in (getattr(current, "cause", None), current.__cause__, current.__context__):
            if isinstance(inner, BaseException):
                stack.append(inner)


def _verbose() -> bool:
    """True when lmembed's step log is on (``--verbose`` or ``LMEMBED_VERBOSE``)."""
    return logging.getLogger("lmembed").isEnabledFor(logging.INFO) or verbose_from_env()


class _quiet_ray_data:
    """Without ``--verbose``, Ray Data's driver-side log (its execution plan, and the traceback it logs before
    raising a failed task's error, which :class:`_translated_errors` turns into one message) is silenced for
    the duration of a pass, and so is its warning that "your read function" is large (the read function is
    lmembed's, carrying an in-memory corpus to the workers: nothing the user can act on); the logger's level and
    the warning filters are restored afterwards."""

    LOGGERS = ("ray.data", "ray.util.debug")
    WARNINGS = "The serialized size of your read function"

    def __enter__(self) -> None:
        self.levels = {name: logging.getLogger(name).level for name in self.LOGGERS}
        self.filters = warnings.catch_warnings()
        self.filters.__enter__()
        if not _verbose():
            for name in self.LOGGERS:
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
            warnings.filterwarnings("ignore", message=self.WARNINGS)

    def __exit__(self, *exc: object) -> None:
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
        self.filters.__exit__()


class _translated_errors:
    """Turn what Ray raises into one lmembed error: the error our code raised on a worker (a bad row,
    a changed model ...), or :class:`WorkerLostError` when a worker died too often."""

    def __init__(self, stage: str, *, restarts: int = 0) -> None:
        self.stage = stage
        self.restarts = restarts

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        if isinstance(exc, LmembedError) and not isinstance(exc, ray.exceptions.RayError):
            return False  # already ours (raised in this process)
        causes = list(_causes(exc))
        ours = [c for c in causes if isinstance(c, LmembedError) and not isinstance(c, ray.exceptions.RayError)]
        if ours:
            raise _without_ray_notes(ours[-1]) from None
        lost = next((c for c in causes if isinstance(c, LOST)), None)
        if lost is not None:
            reason = str(lost).strip().splitlines()[0] if str(lost).strip() else type(lost).__name__
            raise WorkerLostError(
                f"{self.stage}: a Ray worker died and did not come back after {self.restarts} restart(s) "
                f"({type(lost).__name__}: {reason}); the shards already finished are kept: run the same "
                "job again to resume"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ScaleError(f"{self.stage} failed on Ray: {type(exc).__name__}: {first}") from exc
