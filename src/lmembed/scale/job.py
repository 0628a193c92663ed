"""A sharded encoding job: plan once, encode the shards still missing, assemble the vectors in input order.

A job is named by everything that decides its vectors (the corpus, the model's weights, the strategies,
the instruction, ``batch_size``, ``shard_rows``); its folder sits in the embedding cache, under the first
strategy's entry::

    <cache>/<model>/<strategy>/shard-<job>-000000.npz ...   # the shards (ordinary cache shards)
    <cache>/<model>/<strategy>/jobs/<job>/plan.json ...     # the plan, the staged texts, assembled matrices

Running the same job again (after a kill, a lost worker, or to read its vectors) skips the plan pass when
the plan is complete and encodes only the shards that are not on disk. When every shard is written, the
staged texts are deleted; the plan stays, since assembling the vectors needs it.

Runs of one job by several processes (two commands over the same corpus, a worker retried) take turns: a run
holds the job's lock (``jobs/<job>.lock``) from its plan to its last shard, and a second run waits for it (said in
the log), then finds the shards done. Reading the vectors shares the lock; removing a job (an uncached run's last
step) takes it only if no other process holds it, else leaves the job to that process.

Vectors come back in input order, one row per input row (repeated texts share one computation), as
:func:`lmembed.embedder.postprocess` makes them (Matryoshka truncation, normalisation), in memory or
as a memory-mapped ``.npy`` in the job folder (float32, or float16 to halve the disk and the reads).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lmembed.atomic import FILE_MODE, atomic_write_text, file_lock, remove_lock, sweep_leftovers, temp_path
from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder, check_strategy, postprocess
from lmembed.encoding.cache import EmbeddingCache, read_shard
from lmembed.encoding.engine import resolve_max_length
from lmembed.errors import ConfigError
from lmembed.index.kinds import all_finite
from lmembed.io import sha256_file
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.scale.engines import JobEngine, describe
from lmembed.scale.errors import ScaleError
from lmembed.scale.progress import ProgressCallback, ProgressTracker
from lmembed.scale.shard_plan import ShardPlan, build_plan
from lmembed.scale.sources import CorpusSource
from lmembed.scale.staging import STAGING_DIR, PlanSettings, staging_file
from lmembed.scale.work import EmbedderSpec, ShardSettings, model_fingerprint, shard_name
from lmembed.schema import RecordModel, read_checked_json

log = logging.getLogger(__name__)

JOB_FORMAT = 1
DEFAULT_SHARD_ROWS = 4096
JOBS_DIR = "jobs"
STORAGE_DTYPES = {"float32": np.float32, "float16": np.float16}


@dataclass
class JobReport:
    """What a run of a job did."""

    job_id: str
    rows: int
    distinct_texts: int
    shards: int
    shards_skipped: list[int]
    shards_encoded: list[int]
    planned: bool
    engine: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    workers_seen: int = 0
    busy_s: float = 0.0  # seconds workers spent inside shards (the rest of encode_s is start-up and overhead)
    startup_s: float | None = None  # encode pass start → first shard done, less that shard's own time

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "rows": self.rows,
            "distinct_texts": self.distinct_texts,
            "shards": self.shards,
            "shards_skipped": len(self.shards_skipped),
            "shards_encoded": len(self.shards_encoded),
            "planned": self.planned,
            "engine": self.engine,
            "timings": self.timings,
            "workers_seen": self.workers_seen,
            "busy_s": self.busy_s,
            "startup_s": self.startup_s,
        }


def round_shard_rows(shard_rows: int, batch_size: int) -> int:
    """``shard_rows`` rounded up to a multiple of ``batch_size`` (a shard is a run of whole batches)."""
    if shard_rows < 1 or batch_size < 1:
        raise ConfigError(f"shard_rows={shard_rows} and batch_size={batch_size} must be >= 1")
    return -(-shard_rows // batch_size) * batch_size


class EncodeJob:
    """One corpus × one set of strategies that share their forward passes (see the module doc)."""

    def __init__(
        self,
        embedder: Embedder,
        source: CorpusSource,
        configs: Sequence[EmbeddingConfig] | None = None,
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
        shard_rows: int = DEFAULT_SHARD_ROWS,
        cache_root: str | Path | None = None,
    ) -> None:
        configs = tuple(configs or (embedder.config,))
        if not configs:
            raise ConfigError("a job needs at least one strategy")
        forward = {json.dumps(c.forward_key(), sort_keys=True) for c in configs}
        if len(forward) > 1:
            raise ConfigError("the strategies of one job must share their forward passes (attention, echo, truncation)")
        for config in configs:
            check_strategy(embedder.backbone, config)
        self.embedder = embedder
        self.source = source
        self.configs = configs
        self.instruction = instruction
        self.batch_size = batch_size
        self.shard_rows = round_shard_rows(shard_rows, batch_size)
        self.cache_root = Path(cache_root) if cache_root is not None else Path(embedder.engine.cache_dir)
        self.model_fingerprints = tuple(model_fingerprint(embedder, c) for c in configs)
        self.caches = [
            EmbeddingCache(self.cache_root, fp, c.fingerprint(), width=embedder.engine.output_dim(c))
            for fp, c in zip(self.model_fingerprints, configs, strict=True)
        ]
        identity = {
            "format": JOB_FORMAT,
            "source": source.identity,
            "models": self.model_fingerprints,
            "strategies": [c.fingerprint() for c in configs],
            "instruction": instruction,
            "batch_size": batch_size,
            "shard_rows": self.shard_rows,
        }
        self.job_id = hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=8).hexdigest()
        self.folder = self.caches[0].dir / JOBS_DIR / self.job_id
        self.staging = self.folder / STAGING_DIR
        self.lock_file = self.folder.with_name(f"{self.job_id}.lock")

    @contextlib.contextmanager
    def _turn(self, *, shared: bool = False) -> Iterator[None]:
        """Hold the job's lock (see the module doc), saying so when another process has it first."""
        with file_lock(self.lock_file, shared=shared, wait=False) as held:
            if held:
                yield
                return
        log.info("job %s is being run by another process; waiting for it to finish", self.job_id)
        with file_lock(self.lock_file, shared=shared):
            yield

    # ------------------------------------------------------------------ running
    def run(
        self,
        engine: JobEngine,
        *,
        spec: EmbedderSpec | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> JobReport:
        """Plan (unless a complete plan exists), then encode every missing shard on ``engine``; another process's
        run of the same job is waited for."""
        with self._turn():
            return self._run(engine, spec=spec, on_progress=on_progress)

    def _run(self, engine: JobEngine, *, spec: EmbedderSpec | None, on_progress: ProgressCallback | None) -> JobReport:
        timings: dict[str, float] = {}
        start = time.perf_counter()
        engine.start()
        timings["start_s"] = time.perf_counter() - start
        planned = False
        plan = self._load_plan()
        if plan is not None and self.pending(plan) and not self._staged_complete(plan):
            log.info("job %s: shards are missing and staged texts are gone; planning again", self.job_id)
            plan = None
        if plan is None:
            mark = time.perf_counter()
            plan = self._plan(engine)
            planned = True
            timings["plan_s"] = time.perf_counter() - mark
        pending = self.pending(plan)
        skipped = [s for s in range(plan.n_shards) if s not in set(pending)]
        tracker = ProgressTracker(
            shards_total=plan.n_shards,
            rows_total=plan.n_unique,
            shards_done=len(skipped),
            rows_done=sum(plan.shard_size(s) for s in skipped),
            workers=min(engine.worker_count(), max(1, len(pending))),
            callback=on_progress,
        )
        mark = time.perf_counter()
        encoded: list[int] = []
        busy = 0.0
        startup = None
        if pending:
            settings = self._shard_settings(engine)
            provider = engine.model_provider(self.embedder, spec)
            for record in engine.encode(pending, provider, settings):
                for shard, rows, worker, seconds in zip(
                    record["shard"], record["rows"], record["worker"], record["seconds"], strict=True
                ):
                    encoded.append(int(shard))
                    busy += float(seconds)
                    if startup is None:  # worker start-up (model load) and scheduling before the first result
                        startup = time.perf_counter() - mark - float(seconds)
                    tracker.shard_finished(int(rows), int(worker))
        timings["encode_s"] = time.perf_counter() - mark
        still = self.pending(plan)
        if still:
            raise ScaleError(f"job {self.job_id}: shards {still[:5]} are still missing after the encode pass")
        if self.staging.is_dir():
            shutil.rmtree(self.staging, ignore_errors=True)
        timings["total_s"] = time.perf_counter() - start
        return JobReport(
            job_id=self.job_id,
            rows=plan.n_rows,
            distinct_texts=plan.n_unique,
            shards=plan.n_shards,
            shards_skipped=skipped,
            shards_encoded=sorted(encoded),
            planned=planned,
            engine=describe(engine),
            timings=timings,
            workers_seen=len(tracker.worker_ids),
            busy_s=busy,
            startup_s=startup,
        )

    def pending(self, plan: ShardPlan) -> list[int]:
        """Shards not yet in the cache for every strategy of the job."""
        return [
            s for s in range(plan.n_shards) if not all(c.has_shard(shard_name(self.job_id, s)) for c in self.caches)
        ]

    def _staged_complete(self, plan: ShardPlan) -> bool:
        """Whether every staged text file the plan names is on disk (a run removes them all once it is done)."""
        return self.staging.is_dir() and all(
            staging_file(self.staging, int(stage)).is_file() for stage in np.unique(plan.stage_of_row)
        )

    def _load_plan(self) -> ShardPlan | None:
        """The job's plan when it has one that passes its checks; None (planned again, said) otherwise."""
        if not ShardPlan.exists(self.folder):
            return None
        try:
            return ShardPlan.load(self.folder)
        except ScaleError as exc:  # the plan is made again from the source, the same one: shards already made match it
            log.warning("%s; the job is planned again", exc)
            return None

    def _plan(self, engine: JobEngine) -> ShardPlan:
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        backbone = self.embedder.backbone
        settings = PlanSettings(
            tokenizer=backbone.tokenizer,
            config=self.configs[0],
            is_decoder=backbone.is_decoder,
            max_length=resolve_max_length(backbone, self.configs[0].max_length),
            instruction=self.instruction,
            staging_dir=str(self.staging),
        )
        tables = list(engine.plan(self.source, settings))
        table = pa.concat_tables(tables) if tables else _empty_plan_table()
        plan = build_plan(table, self.shard_rows, unique_ids=self.source.unique_ids)
        meta = {
            "job_id": self.job_id,
            "source": self.source.description,
            "strategies": [c.to_dict() for c in self.configs],
            "instruction": self.instruction,
            "batch_size": self.batch_size,
        }
        plan.save(self.folder, meta)
        return ShardPlan.load(self.folder)

    def _shard_settings(self, engine: JobEngine) -> ShardSettings:
        return ShardSettings(
            job_id=self.job_id,
            plan_dir=str(self.folder),
            staging_dir=str(self.staging),
            configs=self.configs,
            cache_root=str(self.cache_root),
            model_fingerprints=self.model_fingerprints,
            instruction=self.instruction,
            batch_size=self.batch_size,
            device="cuda" if engine.uses_gpus() else str(self.embedder.backbone.device),
            threads=engine.threads(),
        )

    # ------------------------------------------------------------------ results
    def plan(self) -> ShardPlan:
        plan = self._load_plan()
        if plan is None:
            raise ScaleError(f"job {self.job_id} has not been planned yet: run it first")
        return plan

    def ids(self) -> list[str]:
        """Row ids in input order (from the data, or row numbers)."""
        return self.plan().id_list()

    def vectors(
        self, index: int = 0, *, dtype: str = "float32", memory_map: bool = False, output: str | Path | None = None
    ) -> np.ndarray:
        """The vectors of strategy ``index`` in input order, post-processed as ``Embedder.encode`` does.

        ``memory_map``: a read-only memory map of ``<job>/vectors-<strategy>-<dtype>.npy`` (written once);
        ``output``: write that ``.npy`` to ``output`` instead (atomically) and return its memory map.
        Otherwise an in-memory array."""
        if dtype not in STORAGE_DTYPES:
            raise ConfigError(f"dtype={dtype!r}: use one of {', '.join(STORAGE_DTYPES)}")
        with self._turn(shared=True):
            return self._vectors(index, dtype=dtype, memory_map=memory_map, output=output)

    def _vectors(self, index: int, *, dtype: str, memory_map: bool, output: str | Path | None) -> np.ndarray:
        config = self.configs[index]
        plan = self.plan()
        if self.pending(plan):
            raise ScaleError(f"job {self.job_id} is not finished: run it again to encode its missing shards")
        if output is None and not memory_map:
            out = np.empty((plan.n_rows, self._dim(config)), dtype=STORAGE_DTYPES[dtype])
            self._fill(out, plan, index)
            return out
        name = f"vectors-{config.fingerprint()[:16]}-{dtype}.npy"
        if output is not None:
            self._write_matrix(Path(output), plan, index, dtype)
            return np.load(output, mmap_mode="r")
        target = self.folder / name
        shape = (plan.n_rows, self._dim(config))
        if not _matrix_as_recorded(target, shape, dtype):
            digest = self._write_matrix(target, plan, index, dtype)
            record = {"sha256": digest, "shape": list(shape), "dtype": dtype}
            atomic_write_text(_matrix_record(target), json.dumps(record))
        return np.load(target, mmap_mode="r")

    def _dim(self, config: EmbeddingConfig) -> int:
        return config.dim or self.embedder.engine.output_dim(config)

    def _fill(self, out: np.ndarray, plan: ShardPlan, index: int) -> None:
        config, cache = self.configs[index], self.caches[index]
        rows, bounds = plan.rows_by_shard()
        slots = np.asarray(plan.slot_of_row)
        for shard in range(plan.n_shards):
            start, _ = plan.shard_slots(shard)
            keys, raw = read_shard(cache.shard_path(shard_name(self.job_id, shard)), cache.width)
            if not np.array_equal(keys, plan.keys[start : start + len(keys)]) or len(keys) != plan.shard_size(shard):
                raise ScaleError(f"cache shard {shard} of job {self.job_id} does not match its plan")
            vectors = postprocess(raw, config)
            group = rows[bounds[shard] : bounds[shard + 1]]
            out[group] = vectors[slots[group] - start]

    def _write_matrix(self, target: Path, plan: ShardPlan, index: int, dtype: str) -> str:
        """Write the vectors of strategy ``index`` to ``target`` atomically; returns the file's sha256."""
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(target)
        tmp = str(temp_path(target))
        try:
            shape = (plan.n_rows, self._dim(self.configs[index]))
            matrix = np.lib.format.open_memmap(tmp, mode="w+", dtype=STORAGE_DTYPES[dtype], shape=shape)
            self._fill(matrix, plan, index)
            matrix.flush()
            del matrix
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            digest = sha256_file(Path(tmp))
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def remove(self) -> None:
        """Delete this job's folder and shards from the cache (what an uncached run does when it is done), unless
        another process is running the job or reading its vectors: then it is left to that process."""
        with file_lock(self.lock_file, wait=False) as held:
            if not held:
                log.info("job %s is in use by another process; its files are left to it", self.job_id)
                return
            plan = self._load_plan()
            if plan is not None:
                for cache in self.caches:
                    for shard in range(plan.n_shards):
                        cache.shard_path(shard_name(self.job_id, shard)).unlink(missing_ok=True)
            shutil.rmtree(self.folder, ignore_errors=True)
            remove_lock(self.lock_file)


class MatrixRecord(RecordModel):
    """``vectors-*.npy.json``: what a job's finished vectors matrix was written as."""

    sha256: str
    shape: list[int]
    dtype: str


def _matrix_record(target: Path) -> Path:
    return target.with_name(target.name + ".json")


def _matrix_as_recorded(target: Path, shape: tuple[int, int], dtype: str) -> bool:
    """True when ``target`` (a job's vectors matrix, memory-mapped as it stands) is a plain file of the ``shape`` and
    ``dtype`` asked for whose sha256 its record holds; one that is not is said (naming it) and written again."""
    record = _matrix_record(target)
    if not target.exists() and not target.is_symlink():
        return False
    try:
        if target.is_symlink() or not target.is_file():
            raise ScaleError(f"{target}: not a plain file")
        data = read_checked_json(record, MatrixRecord, ScaleError, "a vectors matrix's record")
        if data["shape"] != list(shape) or data["dtype"] != dtype:
            raise ScaleError(
                f"{record}: records shape {data['shape']} {data['dtype']}, the job's is {list(shape)} {dtype}"
            )
        if sha256_file(target) != data["sha256"]:
            raise ScaleError(
                f"{target}: its sha256 is not the one {record} records: changed or damaged after it was written"
            )
        if not all_finite(np.load(target, mmap_mode="r", allow_pickle=False)):  # a record can be rewritten to match
            raise ScaleError(f"{target}: holds NaN or infinite values")
    except (ScaleError, ValueError, OSError) as exc:
        log.warning("%s; the vectors are written again from the job's shards", exc)
        return False
    return True


def _empty_plan_table() -> pa.Table:
    return pa.table(
        {
            "row": pa.array([], pa.int64()),
            "k0": pa.array([], pa.uint64()),
            "k1": pa.array([], pa.uint64()),
            "length": pa.array([], pa.int32()),
            "stage": pa.array([], pa.int64()),
            "offset": pa.array([], pa.int32()),
            "id": pa.array([], pa.string()),
            "line": pa.array([], pa.int64()),
            "origin": pa.array([], pa.string()),
        }
    )
