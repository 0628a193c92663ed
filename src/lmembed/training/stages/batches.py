"""The data of a pre-training stage: items read from the configured sources, served in seeded batches.

A stage declares the kind of item it trains on (``data_kind``): ``texts`` (the queries and positives of
trainer data sources, or the lines of ``.txt`` files), ``pairs`` (query, first positive), ``examples``
(whole trainer rows: query, instruction, positives, negatives) or ``scored_pairs`` (JSON lines of
``{sentence1, sentence2, score}``). :func:`load_items` reads them; :class:`BatchStream` serves them in a
fresh seeded permutation per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.evaluation.tasks.sts import load_sts_pairs
from lmembed.io import read_text_lines
from lmembed.training.rows import DataSource, TrainExample, load_source
from lmembed.training.train_config import ObjectiveConfigError

__all__ = ["BatchStream", "load_items"]


class BatchStream:
    """Batches of items in a fresh seeded permutation per epoch; ``batch(step)`` is deterministic."""

    def __init__(self, items: Sequence[Any], batch_size: int, seed: int = 0) -> None:
        if not items:
            raise ObjectiveConfigError("no training items for the objective")
        self.items = list(items)
        self.batch_size = batch_size
        self.seed = seed
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.items))}
        return self._orders[epoch]

    def batch(self, step: int) -> list[Any]:
        out = []
        for position in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(position, len(self.items))
            out.append(self.items[int(self._order(epoch)[offset])])
        return out


def _read_scored_pairs(path: Path) -> list[tuple[str, str, float]]:
    """STS rows (``sentence1``, ``sentence2``, ``score``), read as the STS task reads them (file:line refusals)."""
    return list(zip(*load_sts_pairs(path), strict=True))


def _source_path(spec: Any) -> Path:
    if isinstance(spec, str | Path):
        return Path(spec)
    if isinstance(spec, dict):
        return Path(spec.get("path", ""))
    return Path(getattr(spec, "path", ""))


def _examples(spec: Any) -> list[TrainExample]:
    return load_source(DataSource.parse(spec)).examples


def load_items(kind: str, sources: Sequence[Any], *, max_items: int | None = None, seed: int = 0) -> list[Any]:
    """The training items of ``kind`` (``texts``, ``pairs``, ``examples`` or ``scored_pairs``) from ``sources``."""
    items: list[Any] = []
    for spec in sources:
        path = _source_path(spec)
        if kind == "scored_pairs":
            items += _read_scored_pairs(path)
        elif kind == "texts" and path.suffix == ".txt":
            items += read_text_lines(path, strip=True)
        elif kind == "texts":
            items += [t for ex in _examples(spec) for t in (ex.query, *ex.positives)]
        elif kind == "examples":
            items += _examples(spec)
        else:
            items += [(ex.query, ex.positives[0]) for ex in _examples(spec)]
    if kind == "texts":
        items = list(dict.fromkeys(items))
    if max_items and len(items) > max_items:
        keep = np.sort(np.random.default_rng(seed).choice(len(items), size=max_items, replace=False))
        items = [items[int(i)] for i in keep]
    return items
