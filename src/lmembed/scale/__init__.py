"""Beyond one process: corpus encoding as resumable sharded jobs, run locally or on a Ray cluster.

The unit of work is engine-agnostic: *shard i of n → the embedding cache*. A job plans once (every text
keyed and token-counted, the encoding order fixed exactly as one process would fix it, the texts staged),
then encodes the shards that are not in the cache yet; each finished shard lands there atomically, so a
killed job, or one that lost a worker, resumes without encoding a finished shard again. Vectors come
back in input order with their ids, bit for bit those of ``Embedder.encode`` with the same strategy.

* :mod:`~lmembed.scale.sharded`: the API: :func:`encode_corpus`, :func:`scaled` and :class:`ShardedExecutor`;
* :mod:`~lmembed.scale.job`: :class:`EncodeJob` (plan, run, resume, assemble) and its :class:`JobReport`;
* :mod:`~lmembed.scale.staging`: the plan pass (each block of rows checked, keyed, token-counted and staged);
  :mod:`~lmembed.scale.shard_plan`: the shard plan built from it; :mod:`~lmembed.scale.work`: the shards' work;
* :mod:`~lmembed.scale.sources`: corpora read in parts (JSON lines, BEIR, text lines, Parquet, memory);
* :mod:`~lmembed.scale.engines`: the ``local`` engine and :func:`make_engine`;
  :mod:`~lmembed.scale.ray_engine`: the ``ray`` engine (Ray Data; needs ``pip install 'lmembed[scale]'``);
* :mod:`~lmembed.scale.progress`: texts/s, shards done and ETA across workers; :mod:`~lmembed.scale.errors`.

Training does not go through here: it stays on ``accelerate``/torchrun (``configs/accelerate/``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public names and the module that defines each. They load on first use, so that a worker process that
#: only plans (:mod:`lmembed.scale.staging`) never imports torch.
_EXPORTS = {
    "ENGINES": "engines",
    "JobEngine": "engines",
    "LocalEngine": "engines",
    "make_engine": "engines",
    "BadRowError": "errors",
    "EngineUnavailableError": "errors",
    "ScaleError": "errors",
    "WorkerLostError": "errors",
    "DEFAULT_SHARD_ROWS": "job",
    "EncodeJob": "job",
    "JobReport": "job",
    "Progress": "progress",
    "EncodedCorpus": "sharded",
    "ShardedExecutor": "sharded",
    "as_source": "sharded",
    "encode_corpus": "sharded",
    "scaled": "sharded",
    "CorpusSource": "sources",
    "memory_source": "sources",
    "open_source": "sources",
    "open_texts": "sources",
    "parquet_source": "sources",
    "EmbedderSpec": "work",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy: see _EXPORTS
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lmembed.scale' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lmembed.scale.{module}"), name)
