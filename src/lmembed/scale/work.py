"""The encode pass's unit of work, the same on every engine: *encode shard i of n into the cache*.

(The plan pass's unit, :class:`~lmembed.scale.staging.Planner`, lives in :mod:`lmembed.scale.staging`,
which does not import torch, so planning workers start fast.)

:class:`ShardEncoder` (one call per shard): loads the Embedder once (per actor on Ray,
once in-process locally), reads the shard's texts from the staging files in plan order, encodes them
with the engine's public ``encode_raw`` (no cache of its own), and writes one named cache shard per
strategy, atomically (:meth:`lmembed.encoding.cache.EmbeddingCache.store_shard`). A shard that is on disk
is complete; a job that resumes skips it.

It is a plain callable over NumPy batches, so the local engine calls it directly and the Ray engine hands
it to Ray Data's ``map_batches`` as a callable class (an actor pool).
"""

from __future__ import annotations

import copy
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder
from lmembed.encoding.cache import EmbeddingCache, key_array, text_key
from lmembed.load_spec import LoadSpec
from lmembed.pooling.terms import TermChannel
from lmembed.scale.errors import BadRowError, ScaleError
from lmembed.scale.shard_plan import ShardPlan
from lmembed.scale.sources import locate
from lmembed.scale.staging import describe_error, staging_file

OPEN_STAGING_FILES = 64


def model_fingerprint(embedder: Embedder, config: EmbeddingConfig) -> str:
    """The model part of the cache folder for ``config``, as the encoding engine names it (weights, pooling head,
    backend): workers and the driver read and write the same cache as local encoding."""
    return embedder.engine.cache_model_key(config)


def shard_name(job_id: str, shard: int) -> str:
    """The cache-file name (without ``.npz``) of shard ``shard`` of job ``job_id``."""
    return f"shard-{job_id}-{shard:06d}"


# ---------------------------------------------------------------------------------------------- models
class ModelProvider(Protocol):
    """Gives a worker its Embedder on the device it was given."""

    def load(self, device: str) -> Embedder: ...


@dataclass(frozen=True)
class EmbedderSpec:
    """How a worker loads the model itself: the driver's :class:`~lmembed.load_spec.LoadSpec` (source, strategy,
    dtype, backend, precision, RoPE factor ...), read by :meth:`Embedder.from_spec` on the worker's own device. Use
    it for large models: each worker reads the weights from disk instead of receiving a pickled copy.

    ``EmbedderSpec.of(embedder)`` takes an Embedder's spec whole. ``EmbedderSpec("folder")`` names only where the
    workers read the weights (a copy of the driver's model every worker can reach); the rest of the spec is the
    driver's, bound when the job starts (:meth:`bind`)."""

    spec: LoadSpec | str

    @classmethod
    def of(cls, embedder: Embedder) -> EmbedderSpec:
        return cls(embedder.load_spec)

    def bind(self, driver: Embedder) -> EmbedderSpec:
        """A spec that names a source only takes everything else from ``driver``'s own spec."""
        if isinstance(self.spec, LoadSpec):
            return self
        return EmbedderSpec(driver.load_spec.with_source(self.spec))

    def load(self, device: str) -> Embedder:
        if not isinstance(self.spec, LoadSpec):
            raise ScaleError(f"EmbedderSpec({self.spec!r}) is not bound to a driver Embedder (EmbedderSpec.bind)")
        return Embedder.from_spec(self.spec, device=device, cache=False, show_progress=False)


@dataclass
class InProcess:
    """The caller's own Embedder, used as it is (the local engine)."""

    embedder: Embedder

    def load(self, device: str) -> Embedder:
        return self.embedder


@dataclass
class Snapshot:
    """A picklable copy of an in-memory Embedder: model class, config and weights, tokenizer, strategy and
    pooling head. (transformers models themselves do not pickle: they carry local hook functions.) A
    worker rebuilds the model from it with the same weights, which the job checks by fingerprint."""

    model_class: type
    model_config: Any
    state: dict[str, torch.Tensor]
    dtype: torch.dtype
    tokenizer: Any
    config: EmbeddingConfig
    pooling_head: torch.nn.Module | None
    name: str
    terms: TermChannel | None = None

    @classmethod
    def of(cls, embedder: Embedder) -> Snapshot:
        model = embedder.backbone.model
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        head = embedder.pooling_head
        return cls(
            model_class=type(model),
            model_config=model.config,
            state=state,
            dtype=embedder.backbone.dtype,
            tokenizer=embedder.backbone.tokenizer,
            config=embedder.config,
            pooling_head=None if head is None else copy.deepcopy(head).to("cpu"),
            name=embedder.backbone.name,
            terms=None if embedder.engine.terms is None else copy.deepcopy(embedder.engine.terms).to("cpu"),
        )

    def load(self, device: str) -> Embedder:
        model = self.model_class(self.model_config)
        try:
            model.load_state_dict(self.state, strict=True)
        except RuntimeError as exc:
            raise ScaleError(
                f"the in-memory model ({self.model_class.__name__}) cannot be rebuilt on a worker from its config "
                "and weights (injected adapters?): save it (Embedder.save, or train with --keep-adapter) and pass "
                f"spec=EmbedderSpec(<folder>) so that workers load it themselves ({str(exc).splitlines()[0]})"
            ) from None
        model.to(dtype=self.dtype).eval()
        embedder = Embedder.from_model(
            model,
            self.tokenizer,
            self.config,
            pooling_head=self.pooling_head,
            terms=self.terms,
            use_cache=False,
            show_progress=False,
        )
        embedder.backbone.name = self.name
        return move_to(embedder, device)


def move_to(embedder: Embedder, device: str) -> Embedder:
    """Put a (worker's own copy of an) Embedder on ``device``."""
    target = torch.device(device)
    if embedder.backbone.device == target:
        return embedder
    embedder.backbone.model.to(target)
    embedder.backbone.device = target
    if embedder.pooling_head is not None:
        embedder.pooling_head.to(target)
    if embedder.engine.terms is not None:
        embedder.engine.terms.to(target)
    return embedder


# ---------------------------------------------------------------------------------------------- encode pass
@dataclass(frozen=True)
class ShardSettings:
    """What the encode pass needs besides the model."""

    job_id: str
    plan_dir: str
    staging_dir: str
    configs: tuple[EmbeddingConfig, ...]
    cache_root: str
    model_fingerprints: tuple[str, ...]  # one per config: the model part of its cache folder
    instruction: str | None
    batch_size: int
    device: str = "cpu"
    threads: int | None = None


class ShardEncoder:
    """Encode-pass callable: a batch of shard numbers in, one record per finished shard out."""

    def __init__(self, model: ModelProvider, settings: ShardSettings) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.settings = settings
        if settings.device.startswith("cuda") and not torch.cuda.is_available():
            raise ScaleError(
                f"this worker ({socket.gethostname()}) was given a GPU, but its torch {torch.__version__} cannot use "
                "CUDA (torch.cuda.is_available() is False): install a CUDA build of torch where the workers run, or "
                "encode on the workers' CPUs with --gpus-per-worker 0"
            )
        embedder = model.load(settings.device)
        found = tuple(model_fingerprint(embedder, cfg) for cfg in settings.configs)
        if found != settings.model_fingerprints:
            raise ScaleError(
                f"this worker loaded weights {found[0][:16]} but the job was planned for "
                f"{settings.model_fingerprints[0][:16]}: the model changed on disk, or workers see another copy of it"
            )
        self.engine = embedder.engine.uncached()  # its backend too (ONNX ...), as the driver keyed the cache
        self.plan = ShardPlan.load(Path(settings.plan_dir))
        self.caches = [
            EmbeddingCache(Path(settings.cache_root), fp, cfg.fingerprint(), width=self.engine.output_dim(cfg))
            for fp, cfg in zip(settings.model_fingerprints, settings.configs, strict=True)
        ]
        self._staged: OrderedDict[int, pa.Table] = OrderedDict()

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        shards = [int(s) for s in np.asarray(batch["shard"]).ravel()]
        seconds = [self.encode_shard(shard) for shard in shards]
        return {
            "shard": np.asarray(shards, dtype=np.int64),
            "rows": np.asarray([self.plan.shard_size(s) for s in shards], dtype=np.int64),
            "seconds": np.asarray(seconds, dtype=np.float64),
            "worker": np.full(len(shards), os.getpid(), dtype=np.int64),
        }

    def encode_shard(self, shard: int) -> float:
        """Encode shard ``shard`` and write it to the cache; returns the seconds it took."""
        start_time = time.perf_counter()
        start, stop = self.plan.shard_slots(shard)
        rows = np.asarray(self.plan.order[start:stop])
        texts, places, ids = self._texts(rows)
        keys = key_array([text_key(t, self.settings.instruction) for t in texts])
        if not np.array_equal(keys, self.plan.keys[start:stop]):
            raise ScaleError(f"shard {shard}: staged texts do not match the plan (was the job folder changed?)")
        try:
            raws = self.engine.encode_raw(
                texts, self.settings.configs, instruction=self.settings.instruction, batch_size=self.settings.batch_size
            )
        except Exception as exc:
            self._name_bad_row(shard, rows, texts, places, ids, exc)
            raise
        name = shard_name(self.settings.job_id, shard)
        for cache, raw in zip(self.caches, raws, strict=True):
            cache.store_shard(name, keys, raw)
        return time.perf_counter() - start_time

    def _name_bad_row(
        self,
        shard: int,
        rows: np.ndarray,
        texts: Sequence[str],
        places: Sequence[str],
        ids: Sequence[str],
        error: Exception,
    ) -> None:
        """A shard failed: find the first row that fails on its own and raise one error naming it."""
        for row, text, place, doc_id in zip(rows, texts, places, ids, strict=True):
            try:
                self.engine.encode_raw([text], self.settings.configs, instruction=self.settings.instruction)
            except Exception as exc:
                raise BadRowError(
                    f"{place} (row {int(row)}, id {doc_id!r}): encoding failed: {describe_error(exc)}"
                ) from None
        raise ScaleError(
            f"shard {shard} failed ({describe_error(error)}), though each of its rows encodes on its own"
        ) from None

    def _texts(self, rows: np.ndarray) -> tuple[list[str], list[str], list[str]]:
        stages = np.asarray(self.plan.stage_of_row[rows])
        offsets = np.asarray(self.plan.offset_of_row[rows])
        texts: list[str] = [""] * len(rows)
        places: list[str] = [""] * len(rows)
        ids: list[str] = [""] * len(rows)
        for stage in np.unique(stages):
            where = np.flatnonzero(stages == stage)
            taken = self._staging(int(stage)).take(pa.array(offsets[where]))
            if not np.array_equal(taken.column("row").to_numpy(), rows[where]):
                raise ScaleError(
                    f"staging file {staging_file(self.settings.staging_dir, int(stage))} does not match the plan"
                )
            lines = taken.column("line").to_pylist()
            origins = taken.column("origin").to_pylist()
            for j, text, doc_id, line, origin in zip(
                where, taken.column("text").to_pylist(), taken.column("id").to_pylist(), lines, origins, strict=True
            ):
                texts[j] = text
                ids[j] = doc_id
                places[j] = locate(origin, int(rows[j]), line)
        return texts, places, ids

    def _staging(self, stage: int) -> pa.Table:
        table = self._staged.pop(stage, None)
        if table is None:
            path = staging_file(self.settings.staging_dir, stage)
            if not path.is_file():
                raise ScaleError(
                    f"staging file {path} is missing: plan the job again (delete {self.settings.plan_dir})"
                )
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            while len(self._staged) >= OPEN_STAGING_FILES:
                self._staged.popitem(last=False)
        self._staged[stage] = table
        return table
