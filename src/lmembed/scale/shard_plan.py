"""The shard plan: which texts a job encodes, in which order, and which shard each one lands in.

One process (:meth:`lmembed.encoding.engine.EncodingEngine.encode_raw`) computes every distinct text once,
sorts the texts by token count (longest first, ties in input order) and cuts that order into batches of
``batch_size``. The plan reproduces that order for the whole corpus and cuts it into shards of
``shard_rows`` texts, a multiple of ``batch_size``, so every shard is a run of whole batches of the
single-process run. A worker that encodes a shard therefore forms exactly the batches one process
would form (same texts, same padding), and its vectors are bit for bit the same whatever the number of
shards or workers, on the same kind of device with the same number of threads.

Arrays (``N`` rows, ``U`` distinct texts):

* ``order`` (U): the row of each distinct text's first occurrence, in encoding order; position = *slot*;
* ``slot_of_row`` (N): the slot holding each row's vector (repeated texts share one);
* ``stage_of_row`` / ``offset_of_row`` (N): where the plan pass staged each row's text;
* ``keys`` (U × 16 bytes) and ``lengths`` (U): text digests and token counts in slot order;
* ``ids`` (N): row ids (from the data, or row numbers).

``plan.json``, written last, records the sha256 of every array file (``files``); a plan is loaded only when its
``plan.json`` has the shape :class:`PlanFile` says, every array hashes to its record and the arrays' lengths agree
with the counts it records (:meth:`ShardPlan.load`); a job whose plan fails is planned again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from lmembed.atomic import atomic_write, atomic_write_json
from lmembed.errors import ConfigError
from lmembed.io import check_recorded_files, sha256_file
from lmembed.scale.errors import BadRowError, ScaleError
from lmembed.scale.sources import locate
from lmembed.schema import RecordModel, read_checked_json

PLAN_FILE = "plan.json"
ARRAYS = ("order", "slot_of_row", "stage_of_row", "offset_of_row", "keys", "lengths")
IDS_FILE = "ids.arrow"

#: Columns the plan pass returns for every row.
PLAN_COLUMNS = ("row", "k0", "k1", "length", "stage", "offset", "id", "line", "origin")


def keys_from_halves(k0: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """16-byte digests (N × 16 uint8) from their two little-endian uint64 halves."""
    halves = np.stack([np.asarray(k0, dtype="<u8"), np.asarray(k1, dtype="<u8")], axis=1)
    return np.ascontiguousarray(halves).view(np.uint8).reshape(-1, 16)


def halves_from_key(key: bytes) -> tuple[int, int]:
    """The two little-endian uint64 halves of a 16-byte digest."""
    k0, k1 = np.frombuffer(key, dtype="<u8")
    return int(k0), int(k1)


@dataclass
class ShardPlan:
    """See the module doc."""

    n_rows: int
    shard_rows: int
    order: np.ndarray
    slot_of_row: np.ndarray
    stage_of_row: np.ndarray
    offset_of_row: np.ndarray
    keys: np.ndarray
    lengths: np.ndarray
    ids: pa.Array

    @property
    def n_unique(self) -> int:
        return len(self.order)

    @property
    def n_shards(self) -> int:
        return -(-self.n_unique // self.shard_rows)

    def shard_slots(self, shard: int) -> tuple[int, int]:
        """The slots ``[start, stop)`` of shard ``shard``."""
        if not 0 <= shard < self.n_shards:
            raise IndexError(f"shard {shard} of {self.n_shards}")
        start = shard * self.shard_rows
        return start, min(start + self.shard_rows, self.n_unique)

    def shard_size(self, shard: int) -> int:
        start, stop = self.shard_slots(shard)
        return stop - start

    def rows_by_shard(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row grouped by shard: ``(rows, bounds)`` with the rows of shard ``i`` at
        ``rows[bounds[i]:bounds[i + 1]]`` (repeated texts included)."""
        rows = np.argsort(self.slot_of_row, kind="stable")
        edges = np.arange(self.n_shards + 1, dtype=np.int64) * self.shard_rows
        return rows, np.searchsorted(self.slot_of_row[rows], edges)

    def id_list(self) -> list[str]:
        return self.ids.to_pylist()

    # ------------------------------------------------------------------ persistence
    def save(self, folder: Path, meta: dict) -> None:
        """Write the arrays, then ``plan.json`` last: a plan is complete when its ``plan.json`` exists."""
        folder.mkdir(parents=True, exist_ok=True)
        for name in ARRAYS:
            array = getattr(self, name)
            atomic_write(folder / f"{name}.npy", lambda handle, a=array: np.save(handle, a))
        table = pa.table({"id": self.ids})
        atomic_write(folder / IDS_FILE, lambda handle: _write_ipc(handle, table))
        info = {"n_rows": self.n_rows, "n_unique": self.n_unique, "shard_rows": self.shard_rows}
        files = {name: sha256_file(folder / name) for name in plan_files()}
        atomic_write_json(folder / PLAN_FILE, {**meta, **info, "n_shards": self.n_shards, "files": files})

    @classmethod
    def load(cls, folder: Path, *, memory_map: bool = True) -> ShardPlan:
        """The plan in ``folder``, once ``plan.json`` has its shape, every array file its recorded sha256 and every
        array the length ``plan.json`` records; :class:`ScaleError` names the file and field otherwise."""
        path = folder / PLAN_FILE
        info = read_checked_json(path, PlanFile, ScaleError, "a job's shard plan")
        check_recorded_files(folder, path, info["files"], plan_files(), key="files", error=ScaleError)
        mode = "r" if memory_map else None
        try:
            arrays = {name: np.load(folder / f"{name}.npy", mmap_mode=mode, allow_pickle=False) for name in ARRAYS}
            with pa.memory_map(str(folder / IDS_FILE)) as source:
                ids = pa.ipc.open_file(source).read_all().column("id").combine_chunks()
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise ScaleError(f"{folder}: a plan array cannot be read ({exc})") from exc
        rows, unique = info["n_rows"], info["n_unique"]
        wanted = {"order": unique, "keys": unique, "lengths": unique, "slot_of_row": rows}
        wanted |= {"stage_of_row": rows, "offset_of_row": rows}
        for name, count in wanted.items():
            if len(arrays[name]) != count:
                raise ScaleError(f"{folder / name}.npy: {len(arrays[name])} entries; {path} records {count}")
        if len(ids) != rows:
            raise ScaleError(f"{folder / IDS_FILE}: {len(ids)} ids; {path} records {rows} rows")
        _check_values(folder, arrays, rows)
        return cls(n_rows=rows, shard_rows=info["shard_rows"], ids=ids, **arrays)

    @staticmethod
    def exists(folder: Path) -> bool:
        return (folder / PLAN_FILE).is_file()


def _check_values(folder: Path, arrays: dict[str, np.ndarray], rows: int) -> None:
    """What the arrays hold, beyond their lengths: whole numbers where they index, each distinct text's first row in
    range and once, every row's slot in range and each first row in its own slot (a slot out of range gave a row
    an all-zero vector; one in range, another text's vector), digests of 16 bytes; :class:`ScaleError` names the
    array otherwise."""
    for name in ("order", "slot_of_row", "stage_of_row", "offset_of_row", "lengths"):
        array = arrays[name]
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ScaleError(f"{folder / name}.npy: {array.dtype} of shape {list(array.shape)}, not whole numbers")
        if len(array) and int(array.min()) < 0:
            raise ScaleError(f"{folder / name}.npy: holds {int(array.min())}, below 0")
    keys = arrays["keys"]
    if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != 16:
        raise ScaleError(f"{folder / 'keys'}.npy: {keys.dtype} of shape {list(keys.shape)}, not 16-byte digests")
    order, slots = arrays["order"], arrays["slot_of_row"]
    unique = len(order)
    if len(order) and (int(order.max()) >= rows or len(np.unique(order)) != unique):
        raise ScaleError(f"{folder / 'order'}.npy: not {unique} distinct rows below {rows}")
    if len(slots) and int(slots.max()) >= unique:
        raise ScaleError(f"{folder / 'slot_of_row'}.npy: holds slot {int(slots.max())}; the plan has {unique}")
    if unique and not np.array_equal(slots[order], np.arange(unique)):
        raise ScaleError(f"{folder / 'slot_of_row'}.npy: a text's first row is not in its own slot")


class PlanFile(RecordModel):
    """What :meth:`ShardPlan.load` reads of ``plan.json`` (the job's identity beside it is the job's to compare)."""

    n_rows: int = Field(ge=0)
    n_unique: int = Field(ge=0)
    shard_rows: int = Field(ge=1)
    files: dict[str, str]  # each array file -> its sha256


def plan_files() -> list[str]:
    """The files of a plan that ``plan.json`` records digests of."""
    return [*(f"{name}.npy" for name in ARRAYS), IDS_FILE]


def _write_ipc(handle, table: pa.Table) -> None:
    with pa.ipc.new_file(handle, table.schema) as writer:
        writer.write_table(table)


def build_plan(table: pa.Table, shard_rows: int, *, unique_ids: bool) -> ShardPlan:
    """The plan for the rows the plan pass returned (``PLAN_COLUMNS``, any order); ``unique_ids``: refuse
    a repeated id, naming both rows."""
    if shard_rows < 1:
        raise ConfigError(f"shard_rows={shard_rows} must be >= 1")
    table = table.sort_by("row")
    n = table.num_rows
    rows = table.column("row").to_numpy()
    if n and not np.array_equal(rows, np.arange(n)):
        raise ScaleError(f"the plan pass returned {n} rows that are not rows 0..{n - 1}: a read lost or repeated rows")
    ids = table.column("id").combine_chunks()
    if unique_ids and n:
        lines, origins = table.column("line"), table.column("origin")
        _check_unique_ids(ids, lambda r: locate(origins[r].as_py(), r, lines[r].as_py()))
    keys = keys_from_halves(table.column("k0").to_numpy(), table.column("k1").to_numpy())
    lengths = table.column("length").to_numpy().astype(np.int32)
    if n:
        _, first, inverse = np.unique(keys.view("V16").ravel(), return_index=True, return_inverse=True)
    else:
        first, inverse = np.empty(0, np.int64), np.empty(0, np.int64)
    distinct = np.sort(first)  # first occurrences, in input order (what the engine computes)
    order = distinct[np.argsort(-lengths[distinct], kind="stable")]  # longest first, ties in input order
    slot_of_first = np.full(n, -1, dtype=np.int64)
    slot_of_first[order] = np.arange(len(order), dtype=np.int64)
    slot_of_row = slot_of_first[first[inverse.ravel()]] if n else np.empty(0, np.int64)
    return ShardPlan(
        n_rows=n,
        shard_rows=shard_rows,
        order=order.astype(np.int64),
        slot_of_row=slot_of_row.astype(np.int64),
        stage_of_row=table.column("stage").to_numpy().astype(np.int64),
        offset_of_row=table.column("offset").to_numpy().astype(np.int32),
        keys=np.ascontiguousarray(keys[order]),
        lengths=lengths[order],
        ids=ids,
    )


def _check_unique_ids(ids: pa.Array, where: Callable[[int], str]) -> None:
    counts = pc.value_counts(ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    if len(repeated) == 0:
        return
    doc_id = repeated[0]["values"].as_py()
    positions = np.flatnonzero(pc.equal(ids, doc_id).to_numpy(zero_copy_only=False))
    first, second = (int(p) for p in positions[:2])
    raise BadRowError(f"{where(second)}: duplicate document id {doc_id!r} (first at {where(first)})")
