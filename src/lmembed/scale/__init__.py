"""Beyond one process: corpus encoding as resumable sharded jobs, run locally or on a Ray cluster.

The unit of work is engine-agnostic: *shard i of n → the embedding cache*. A job plans once (every text
keyed and token-counted, the encoding order fixed exactly as one process would fix it, the texts staged),
then encodes the shards that are not in the cache yet; each finished shard lands there atomically, so a
killed job, or one that lost a worker, resumes without encoding a finished shard again. Vectors come
back in input order with their ids, bit for bit those of ``Embedder.encode`` with the same strategy.

* :mod:`~lmembed.scale.sharded`: the API: :func:`encode_corpus`, :func:`scaled` and :class:`ShardedEmbedder`;
* :mod:`~lmembed.scale.job`: :class:`EncodeJob` (plan, run, resume, assemble) and its :class:`JobReport`;
* :mod:`~lmembed.scale.plan`: the shard plan; :mod:`~lmembed.scale.work`: the units of work;
* :mod:`~lmembed.scale.sources`: corpora read in parts (JSON lines, BEIR, text lines, Parquet, memory);
* :mod:`~lmembed.scale.engines`: the ``local`` engine and :func:`make_engine`;
  :mod:`~lmembed.scale.ray_engine`: the ``ray`` engine (Ray Data; needs ``pip install 'lmembed[scale]'``);
* :mod:`~lmembed.scale.progress`: texts/s, shards done and ETA across workers; :mod:`~lmembed.scale.errors`.

Training does not go through here: it stays on ``accelerate``/torchrun (``configs/accelerate/``).
"""

from lmembed.scale.engines import ENGINES, Engine, LocalEngine, make_engine
from lmembed.scale.errors import BadRowError, EngineUnavailableError, ScaleError, WorkerLostError
from lmembed.scale.job import DEFAULT_SHARD_ROWS, EncodeJob, JobReport
from lmembed.scale.progress import Progress
from lmembed.scale.sharded import EncodedCorpus, ShardedEmbedder, as_source, encode_corpus, scaled
from lmembed.scale.sources import CorpusSource, memory_source, open_source, parquet_source
from lmembed.scale.work import EmbedderSpec

__all__ = [
    "DEFAULT_SHARD_ROWS",
    "ENGINES",
    "BadRowError",
    "CorpusSource",
    "EmbedderSpec",
    "EncodeJob",
    "EncodedCorpus",
    "Engine",
    "EngineUnavailableError",
    "JobReport",
    "LocalEngine",
    "Progress",
    "ScaleError",
    "ShardedEmbedder",
    "WorkerLostError",
    "as_source",
    "encode_corpus",
    "make_engine",
    "memory_source",
    "open_source",
    "parquet_source",
    "scaled",
]
