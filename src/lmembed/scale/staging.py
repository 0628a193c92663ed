"""Staging, the plan pass's unit of work: check, key, token-count and stage one block of rows.

:class:`Planner` takes a block (Arrow: ``row``, ``line``, ``id``, ``text``, ``origin``), checks that every
text can be encoded, computes its cache key and its token count (exactly as the encoding engine will
tokenise it), and writes the block to a staging file (Arrow IPC) under the job folder, from which any
worker later reads any row by position without reading the corpus again. It returns the plan columns
(:data:`lmembed.scale.shard_plan.PLAN_COLUMNS`). A text that cannot be encoded raises one
:class:`~lmembed.scale.errors.BadRowError` naming its row (file:line, row number and id).

This module does not import torch: planning workers need only the tokenizer, and start in a moment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lmembed.atomic import atomic_write
from lmembed.config import EmbeddingConfig
from lmembed.encoding.cache import text_key
from lmembed.encoding.inputs import InputBuilder, check_encodable
from lmembed.errors import LmembedError
from lmembed.scale.errors import BadRowError
from lmembed.scale.shard_plan import halves_from_key
from lmembed.scale.sources import locate

STAGING_DIR = "staging"


def staging_file(folder: str | Path, stage: int) -> Path:
    """The staging file of the block whose first row is ``stage``."""
    return Path(folder) / f"{stage:012d}.arrow"


@dataclass(frozen=True)
class PlanSettings:
    """What the plan pass needs (small and picklable: the tokenizer, not the model)."""

    tokenizer: Any
    config: EmbeddingConfig
    is_decoder: bool
    max_length: int
    instruction: str | None
    staging_dir: str


class Planner:
    """Plan-pass callable: one block of rows (Arrow: row, line, id, text, origin) in, its plan columns out."""

    def __init__(self, settings: PlanSettings) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.settings = settings
        self.builder = InputBuilder(
            settings.tokenizer, settings.config, is_decoder=settings.is_decoder, max_length=settings.max_length
        )

    def __call__(self, block: pa.Table) -> pa.Table:
        rows = block.column("row").to_numpy()
        lines = block.column("line").to_numpy()
        texts = block.column("text").to_pylist()
        ids = block.column("id").to_pylist()
        origins = block.column("origin").to_pylist()
        n = len(texts)
        k0 = np.empty(n, dtype=np.uint64)
        k1 = np.empty(n, dtype=np.uint64)
        lengths = np.empty(n, dtype=np.int32)
        instruction = self.settings.instruction
        for i, text in enumerate(texts):
            try:
                if not isinstance(text, str):
                    raise TypeError(f"text is {type(text).__name__}, not a str")
                check_encodable(text, "text")
                k0[i], k1[i] = halves_from_key(text_key(text, instruction))
                lengths[i] = len(self.builder.build(text, instruction))
            except Exception as exc:
                place = locate(origins[i], int(rows[i]), int(lines[i]))
                raise BadRowError(f"{place} (row {int(rows[i])}, id {ids[i]!r}): {describe_error(exc)}") from None
        stage = int(rows.min()) if n else 0
        staged = block.select(["row", "line", "id", "text", "origin"])
        atomic_write(staging_file(self.settings.staging_dir, stage), lambda handle: _write_ipc(handle, staged))
        return pa.table(
            {
                "row": pa.array(rows, pa.int64()),
                "k0": pa.array(k0, pa.uint64()),
                "k1": pa.array(k1, pa.uint64()),
                "length": pa.array(lengths, pa.int32()),
                "stage": pa.array(np.full(n, stage, dtype=np.int64), pa.int64()),
                "offset": pa.array(np.arange(n, dtype=np.int32), pa.int32()),
                "id": pa.array(ids, pa.string()),
                "line": pa.array(lines, pa.int64()),
                "origin": block.column("origin"),
            }
        )


def _write_ipc(handle, table: pa.Table) -> None:
    with pa.ipc.new_file(handle, table.schema) as writer:
        writer.write_table(table)


def describe_error(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, LmembedError) else f"{type(exc).__name__}: {exc}"


_planners: dict[str, Planner] = {}


def plan_block(block: pa.Table, settings: PlanSettings) -> pa.Table:
    """:class:`Planner` as a plain function (a Ray task): one Planner per worker process and job, reused."""
    planner = _planners.get(settings.staging_dir)
    if planner is None:
        _planners.clear()
        planner = _planners[settings.staging_dir] = Planner(settings)
    return planner(block)
