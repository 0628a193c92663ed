"""Helpers shared by the non-retrieval task classes (reading data, encoding, timing)
and :class:`TaskBase`, the loading / timing / result-building part every task class has in common.

Encoding convention (E5-mistral / NV-Embed): in symmetric tasks (STS, classification, clustering,
pair classification, summarization) every text plays the "query" role, so a task instruction, when
given, goes on *all* texts through ``encode_queries(..., instruction=...)``. Without an instruction
the texts are embedded as they are: through ``encode`` when the encoder has it (a plain
:class:`~lmembed.protocols.TextEncoder`), otherwise through ``encode_corpus``, which never adds a
prompt. ``encode_queries(texts, instruction=None)`` is avoided there on purpose: an encoder may add
its default retrieval prompt to queries (BGE does), and MTEB gives non-retrieval texts no prompt.

A symmetric task declares the texts it embeds with ``texts()``; :meth:`TaskBase.embedded_texts` reports them
(each distinct text once, as :meth:`TaskBase._embed` passes them). A task whose items are parallel lists
names them in ``item_fields``, and :meth:`TaskBase.shrink` samples the same positions of each.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from lmembed.errors import LmembedError
from lmembed.evaluation.base import ItemScores, ShrinkLimits, TaskResult, TextsToEmbed
from lmembed.io import DataFormatError, iter_jsonl
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

DEFAULT_SEED = 42


class TaskDataError(LmembedError, ValueError):
    """A task's data file is missing or does not have the expected fields."""


def read_numbered_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of every row of a task's ``.jsonl`` file, in order (read by
    :func:`lmembed.io.iter_jsonl`; blank lines are skipped). A missing or empty file, or a malformed line, is a
    :class:`TaskDataError`."""
    path = Path(path)
    if not path.is_file():
        raise TaskDataError(f"data file not found: {path}")
    try:
        rows = list(iter_jsonl(path))
    except DataFormatError as exc:
        raise TaskDataError(str(exc)) from exc
    if not rows:
        raise TaskDataError(f"{path} holds no rows")
    return rows


def row_error(path: str | Path, line_no: int, reason: str) -> TaskDataError:
    """A :class:`TaskDataError` for one row, its message starting ``<file>:<line>:`` as :mod:`lmembed.io`'s do."""
    return TaskDataError(f"{path}:{line_no}: {reason}")


def text_value(value: Any, name: str, path: str | Path, line_no: int) -> str:
    """``value`` (the field ``name`` of a row), which must be a string: ``null`` or a number is not a text."""
    if not isinstance(value, str):
        raise row_error(path, line_no, f"{name} must be a string, got {_json_kind(value)}")
    return value


def finite_number(value: Any, name: str, path: str | Path, line_no: int) -> float:
    """``value`` (the field ``name`` of a row) as a float: a JSON number, or a string holding one; ``NaN`` and
    infinities are refused (a score that is none would poison every correlation)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise row_error(path, line_no, f"{name} must be a number, got {_json_kind(value)}")
    try:
        number = float(value)
    except ValueError:
        raise row_error(path, line_no, f"{name} must be a number, got {value!r:.40}") from None
    if not math.isfinite(number):
        raise row_error(path, line_no, f"{name} must be a finite number, got {value!r:.40}")
    return number


def _json_kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "a boolean"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    names = {list: "an array", dict: "an object", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def require_fields(row: Mapping[str, Any], fields: Sequence[str], path: str | Path, line_no: int) -> None:
    """Raise :class:`TaskDataError` at ``<file>:<line>`` naming the first of ``fields`` missing from ``row``."""
    missing = [name for name in fields if name not in row]
    if missing:
        raise row_error(path, line_no, f"missing field {missing[0]!r} (rows need {', '.join(fields)})")


def require_same_length(task_name: str, **columns: Sequence[Any]) -> None:
    """Raise :class:`TaskDataError` unless all ``columns`` have one length (message names them)."""
    if len({len(values) for values in columns.values()}) > 1:
        *first, last = columns
        raise TaskDataError(f"{task_name}: {', '.join(first)} and {last} differ in length")


def split_file(path: str | Path, split: str) -> Path:
    """The jsonl file for ``split``: ``path`` itself when it is a file, else ``path/<split>.jsonl``."""
    path = Path(path)
    return path if path.is_file() else path / f"{split}.jsonl"


def as_matrix(array: Any) -> np.ndarray:
    """An encoder's output as a 2-D float32 numpy array."""
    matrix = np.asarray(array, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"an encoder returned an array of shape {matrix.shape}, expected 2-D")
    return matrix


def encode_symmetric(
    encoder: RetrievalEncoder,
    texts: Sequence[str],
    *,
    instruction: str | None = None,
    batch_size: int = ENCODE_BATCH_SIZE,
) -> np.ndarray:
    """Embed texts that all play the same role (see the module docstring for the convention)."""
    texts = list(texts)
    if instruction:
        return as_matrix(encoder.encode_queries(texts, instruction=instruction, batch_size=batch_size))
    plain = getattr(encoder, "encode", None)
    if callable(plain):
        return as_matrix(plain(texts, batch_size=batch_size))
    return as_matrix(encoder.encode_corpus(texts, batch_size=batch_size))


def unique_texts(texts: Sequence[str]) -> list[str]:
    """Each distinct text once, in the order of first appearance (what :func:`encode_unique` embeds)."""
    return list(dict.fromkeys(texts))


def paired_cosine(first: np.ndarray, second: np.ndarray) -> list[float]:
    """Cosine of row i of ``first`` with row i of ``second``, for every i."""
    return (
        np.einsum("ij,ij->i", unit_rows(first, dtype=None), unit_rows(second, dtype=None)).astype(np.float64).tolist()
    )


def sample_indices(n: int, keep: int | None, rng: np.random.Generator) -> list[int] | None:
    """Sorted positions of ``keep`` of ``n`` items drawn by ``rng``, or ``None`` when all are kept."""
    if keep is None or keep >= n:
        return None
    return sorted(rng.choice(n, size=keep, replace=False).tolist())


def encode_unique(encode: Callable[[list[str]], np.ndarray], texts: Sequence[str]) -> np.ndarray:
    """Call ``encode(unique_texts)`` once per distinct text and expand back to ``texts``' order."""
    index: dict[str, int] = {}
    unique: list[str] = []
    positions = []
    for text in texts:
        if text not in index:
            index[text] = len(unique)
            unique.append(text)
        positions.append(index[text])
    if not unique:
        return np.zeros((0, 0), dtype=np.float32)
    embeddings = as_matrix(encode(unique))
    return embeddings[np.asarray(positions, dtype=np.int64)]


def model_name_of(encoder: object) -> str:
    """A best-effort display name for an encoder (empty when it has none)."""
    for attribute in ("model_name", "name", "name_or_path"):
        value = getattr(encoder, attribute, None)
        if isinstance(value, str) and value:
            return value
    return ""


@contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """Time a block; the yielded dict gets ``seconds`` when the block ends."""
    record = {"seconds": 0.0}
    start = time.perf_counter()
    try:
        yield record
    finally:
        record["seconds"] = time.perf_counter() - start


class TaskBase:
    """What every non-retrieval task class shares; the subclasses are dataclasses.

    A subclass declares the fields ``name`` (first), its data fields, ``split``, its settings,
    ``instruction`` and ``subset``, plus the class variables ``task_type``, ``main_metric`` and
    ``item_fields``; it implements :meth:`_read` (the data fields from one jsonl file), :meth:`_scores`
    and :meth:`texts` (or :meth:`embedded_texts` when its texts are not symmetric).
    :meth:`evaluate` times :meth:`_scores` and wraps its output in a :class:`TaskResult`.
    """

    name: str
    split: str
    instruction: str | None
    subset: str
    task_type: ClassVar[str]
    main_metric: ClassVar[str]
    #: The fields holding one value per item (parallel lists; the first one's length counts), for :meth:`shrink`.
    item_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _read(cls, file: Path) -> tuple[Any, ...]:
        """The data fields following ``name``, in order, read from one jsonl file."""
        raise NotImplementedError

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        name: str | None = None,
        split: str = "test",
        instruction: str | None = None,
        **settings: Any,
    ) -> Self:
        """Load from a jsonl file, or a directory holding ``<split>.jsonl``."""
        data = cls._read(split_file(path, split))
        label = name or Path(path).name.removesuffix(".jsonl")
        return cls(label, *data, split=split, instruction=instruction, **settings)  # type: ignore[call-arg]

    def with_instruction(self, instruction: str | None) -> Self:
        """This task, bound to another instruction."""
        return dataclasses.replace(self, instruction=instruction)  # type: ignore[type-var]

    def texts(self) -> list[str]:
        """The symmetric texts this task embeds, in the order its scoring expects their embeddings."""
        raise NotImplementedError

    def embedded_texts(self) -> list[TextsToEmbed]:
        """What :meth:`evaluate` embeds: each distinct text of :meth:`texts` once, with the instruction."""
        texts = unique_texts(self.texts())
        return [TextsToEmbed(texts, "text", self.instruction or None)] if texts else []

    def shrink(self, limits: ShrinkLimits) -> Self:
        """This task on ``max_items`` items drawn by ``default_rng(seed)`` (the same positions of every
        ``item_fields`` list), named ``Name[40 items]``; itself when all are kept."""
        if not self.item_fields:
            return self
        rng = np.random.default_rng(limits.seed)
        index = sample_indices(len(getattr(self, self.item_fields[0])), limits.max_items, rng)
        if index is None:
            return self
        picked = {field: [getattr(self, field)[i] for i in index] for field in self.item_fields}
        return dataclasses.replace(self, name=f"{self.name}[{len(index)} items]", **picked)  # type: ignore[type-var]

    def _scores(
        self, encoder: RetrievalEncoder, batch_size: int
    ) -> tuple[dict[str, float], dict[str, Any], ItemScores | None]:
        """(scores with ``main_score``, extra details for the result, the per-item values or ``None``);
        ``instruction`` is added to the details."""
        raise NotImplementedError

    def evaluate(self, encoder: RetrievalEncoder, *, batch_size: int = ENCODE_BATCH_SIZE) -> TaskResult:
        """Score ``encoder`` on this task (what is computed: the subclass's ``_scores``)."""
        with stopwatch() as clock:
            scores, extra, items = self._scores(encoder, batch_size)
        return TaskResult(
            task_name=self.name,
            task_type=self.task_type,
            split=self.split,
            scores=scores,
            main_metric=self.main_metric,
            subset=self.subset,
            evaluation_time=clock["seconds"],
            model_name=model_name_of(encoder),
            extra={**extra, "instruction": self.instruction},
            items=items,
        )

    def _embed(self, encoder: RetrievalEncoder, texts: Sequence[str], batch_size: int) -> np.ndarray:
        """Embed symmetric texts with the task's instruction, each distinct text once."""

        def embed(unique: list[str]) -> np.ndarray:
            return encode_symmetric(encoder, unique, instruction=self.instruction, batch_size=batch_size)

        return encode_unique(embed, texts)

    def _embed_pairs(
        self, encoder: RetrievalEncoder, first: Sequence[str], second: Sequence[str], batch_size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Embeddings of both sides of sentence pairs (row i of each is pair i)."""
        embeddings = self._embed(encoder, [*first, *second], batch_size)
        return embeddings[: len(first)], embeddings[len(first) :]
