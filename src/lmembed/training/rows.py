"""Training data for contrastive embedding training: turning files into examples, mixing, batching.

A training example is a query with one or more relevant texts and optional hard negatives. Two
sources are understood:

* JSON-lines files, one object per line::

      {"query": "...", "positive": "..." | ["...", ...], "negatives": ["...", ...],
       "instruction": "...", "task": "...", "symmetric": false}

  Other tools' spellings are accepted too: ``anchor``/``question`` for the query, ``pos``/``positives``
  for the positive, ``negative``/``neg``/``hard_negatives`` for the negatives. ``symmetric: true`` marks
  a row whose two sides are the same kind of text (an STS pair): its documents get the instruction too.
  ``teacher_scores`` (for the distillation losses) holds a teacher's score of every candidate, either as
  ``{"positive": s | [s, ...], "negatives": [s, ...]}`` (what ``lmembed synthesize`` writes) or as one list,
  the positives' scores first, then the negatives' in their order; the counts must match the texts.
* BEIR folders (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``): each judged query becomes
  one example whose positives are its relevant documents (``(title + " " + text).strip()``, as MTEB
  builds them) and whose negatives are documents judged not relevant (score 0), if any.

Bad rows (missing fields, empty texts, unknown ids) raise :class:`TrainingDataError` naming the file
and line, unless ``skip_invalid`` is set, in which case they are dropped and counted.

Mixing and order: :class:`MixtureSampler` draws every global batch as a pure function of the seed
and the step number, so a run can restart at any step and see exactly the batches it would have
seen. Datasets are mixed row by row (blended batches) with probabilities given by their weights;
uniform across datasets unless told otherwise. Inside a dataset, examples are visited in a fresh
random permutation each epoch.

The files themselves are read by :mod:`lmembed.io` (JSON lines, BEIR folders, qrels); this module
decides what a row means for training. It only needs numpy (no torch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.config import unknown_options
from lmembed.datasets import resolve_local
from lmembed.errors import ConfigError, LmembedError
from lmembed.io import (
    CORPUS_FILE,
    NEGATIVE_KEYS,
    POSITIVE_KEYS,
    QUERIES_FILE,
    QUERY_KEYS,
    DataFormatError,
    find_file,
    iter_jsonl,
    iter_qrels,
    qrels_file,
    qrels_splits,
    read_corpus,
    read_queries,
    row_key,
)
from lmembed.schema import Where, check_fields
from lmembed.synthesis.decontaminate import DecontaminationReport, DecontaminationSettings, decontaminate

log = logging.getLogger(__name__)

MIXING_MODES = ("uniform", "proportional")
BATCHING_MODES = ("blended", "homogeneous", "round_robin")
_STREAM_MIX, _STREAM_PERM, _STREAM_ROW = 0, 1, 2
_REPLAY_CHUNK_STEPS = 2048


class TrainingDataError(LmembedError, ValueError):
    """A training file is malformed; the message names the file and, where it applies, the line."""


@dataclass(frozen=True)
class TrainExample:
    """One query with its relevant texts and optional hard negatives."""

    query: str
    positives: tuple[str, ...]
    negatives: tuple[str, ...] = ()
    instruction: str | None = None
    task: str | None = None
    symmetric: bool = False  # the instruction goes on the documents too (same kind of text on both sides)
    teacher_scores: tuple[float, ...] | None = None  # one per positive, then one per negative (distillation)


@dataclass
class DataSource:
    """Where one training dataset comes from and how it takes part in the mixture.

    ``path`` is a JSON-lines file or a BEIR folder (``kind="auto"`` tells them apart). ``weight`` is the
    dataset's share of the mixture before normalisation (``None``: decided by the mixing mode).
    ``instruction`` is used for rows that carry none; ``symmetric`` marks every row of the source as
    symmetric (documents instructed too). ``split`` and ``min_score`` apply to BEIR folders: a judgment
    counts as relevant when its score is at least ``min_score``.
    """

    path: str
    weight: float | None = None
    instruction: str | None = None
    name: str | None = None
    split: str = "train"
    kind: str = "auto"
    min_score: int = 1
    symmetric: bool = False

    @classmethod
    def parse(cls, spec: str | dict[str, Any] | DataSource) -> DataSource:
        """Build from a path string, a mapping (YAML) or an existing source."""
        if isinstance(spec, DataSource):
            return spec
        if isinstance(spec, str):
            return cls(path=spec)
        if isinstance(spec, dict):
            unknown = unknown_options(cls, spec)
            if unknown:
                raise TrainingDataError(f"unknown data source option(s): {', '.join(unknown)}")
            if "path" not in spec:
                raise TrainingDataError(f"data source {spec!r} has no 'path'")
            check_fields(cls, spec, Where(f"data source {spec['path']}", error=TrainingDataError))  # plain types
            return cls(**spec)
        raise TrainingDataError(f"a data source must be a path or a mapping, got {type(spec).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @property
    def label(self) -> str:
        return self.name or Path(self.path).stem or str(self.path)


@dataclass
class TrainDataset:
    """The loaded examples of one source plus a pool of its texts (to draw extra negatives from)."""

    name: str
    examples: list[TrainExample]
    documents: list[str]
    weight: float | None = None
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.examples)


@dataclass
class TrainBatch:
    """A batch of examples, ready to embed.

    ``negatives`` holds ``num_negatives`` texts per row; ``flat_negatives`` lists them query-major
    (row ``i``'s negatives first), the layout the losses and GradCache expect. ``teacher_scores`` holds, per
    row, the teacher's score of its positive then of each of its negatives, or ``None`` where the row has none
    (or where a negative was drawn from the dataset's pool, which no teacher scored).
    """

    queries: list[str]
    instructions: list[str | None]
    positives: list[str]
    negatives: list[list[str]]
    sources: list[str] = field(default_factory=list)
    symmetric: list[bool] = field(default_factory=list)
    teacher_scores: list[list[float] | None] = field(default_factory=list)
    #: ``[rows, global rows × (1 + num_negatives)]``: True where a document column of the (global) batch is another
    #: copy of the row's own positive text (two queries sharing a document, a row met twice at an epoch's turn):
    #: an in-batch loss leaves those columns out instead of pushing the query away from its own document
    false_negatives: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.queries)

    def mark_false_negatives(self) -> None:
        """Set :attr:`false_negatives` for this whole batch (documents: the positives, then ``flat_negatives``)."""
        documents = self.positives + self.flat_negatives
        where: dict[str, list[int]] = {}
        for column, text in enumerate(documents):
            where.setdefault(text, []).append(column)
        marks = np.zeros((len(self), len(documents)), dtype=bool)
        for row, text in enumerate(self.positives):
            columns = [c for c in where[text] if c != row]
            marks[row, columns] = True
        self.false_negatives = marks if marks.any() else None

    @property
    def num_negatives(self) -> int:
        return len(self.negatives[0]) if self.negatives else 0

    @property
    def flat_negatives(self) -> list[str]:
        return [text for row in self.negatives for text in row]

    def shard(self, rank: int, world_size: int) -> TrainBatch:
        """The contiguous slice of rows that process ``rank`` of ``world_size`` works on."""
        if len(self) % world_size:
            raise ConfigError(f"batch of {len(self)} rows does not split evenly over {world_size} processes")
        size = len(self) // world_size
        part = slice(rank * size, (rank + 1) * size)
        return TrainBatch(
            self.queries[part],
            self.instructions[part],
            self.positives[part],
            self.negatives[part],
            self.sources[part],
            self.symmetric[part],
            self.teacher_scores[part],
            None if self.false_negatives is None else self.false_negatives[part],
        )


# ---------------------------------------------------------------------------------------------- reading
class _Rejects:
    """Raise on a bad row, or count it when skipping is allowed."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.count = 0
        self.examples: list[str] = []

    def reject(self, where: str, message: str) -> None:
        if not self.skip:
            raise TrainingDataError(f"{where}: {message} (pass skip_invalid=True / --skip-invalid to drop such rows)")
        self.count += 1
        if len(self.examples) < 3:
            self.examples.append(f"{where}: {message}")

    def reject_format(self, error: DataFormatError) -> None:
        """``on_error`` for the :mod:`lmembed.io` readers: a malformed line is rejected like a bad row."""
        self.reject(error.where, error.reason)


def _texts(value: Any, key: str) -> tuple[str, ...]:
    """A string or a list of strings, each non-empty; raises ValueError with the reason."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError(f"field {key!r} must be a string or a list of strings, got {type(value).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"field {key!r} item {i} is {type(item).__name__}, not a string")
        if not item.strip():
            raise ValueError(f"field {key!r} has an empty text" + (f" (item {i})" if len(items) > 1 else ""))
    return tuple(items)


def _optional_string(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _score_list(value: Any, key: str) -> list[float]:
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError(f"field {key!r} item {i} is {item!r}, not a number")
        if not math.isfinite(item):
            raise ValueError(f"field {key!r} item {i} is {item!r}, not a finite number")
    return [float(item) for item in items]


def parse_teacher_scores(value: Any, positives: int, negatives: int) -> tuple[float, ...] | None:
    """A row's ``teacher_scores`` as one tuple (positives' scores, then negatives'), checked against the number
    of texts; raises ValueError saying what does not match."""
    if value is None:
        return None
    if isinstance(value, dict):
        if unknown := sorted(set(value) - {"positive", "negatives"}):
            raise ValueError(f"field 'teacher_scores' has unknown key(s) {', '.join(unknown)}; use positive, negatives")
        if "positive" not in value:
            raise ValueError("field 'teacher_scores' has no 'positive' score")
        pos = _score_list(value["positive"], "teacher_scores.positive")
        neg = _score_list(value.get("negatives") or [], "teacher_scores.negatives")
        if len(pos) != positives or len(neg) != negatives:
            raise ValueError(
                f"field 'teacher_scores' has {len(pos)} positive and {len(neg)} negative score(s) for "
                f"{positives} positive(s) and {negatives} negative(s)"
            )
        return tuple(pos + neg)
    if not isinstance(value, list):
        raise ValueError(f"field 'teacher_scores' must be a mapping or a list, got {type(value).__name__}")
    scores = _score_list(value, "teacher_scores")
    if len(scores) != positives + negatives:
        raise ValueError(
            f"field 'teacher_scores' has {len(scores)} score(s) for {positives} positive(s) + {negatives} "
            "negative(s) (one per text: the positives first, then the negatives)"
        )
    return tuple(scores)


def parse_row(row: dict[str, Any], default_instruction: str | None = None) -> TrainExample:
    """Turn one JSON object into an example; raises ValueError saying what is wrong."""
    query_key = row_key(row, QUERY_KEYS, "query")
    if query_key is None:
        raise ValueError(f"missing the query (one of {', '.join(QUERY_KEYS)})")
    positive_key = row_key(row, POSITIVE_KEYS, "positive")
    if positive_key is None:
        raise ValueError(f"missing the positive (one of {', '.join(POSITIVE_KEYS)})")
    query = row[query_key]
    if not isinstance(query, str):
        raise ValueError(f"field {query_key!r} must be a string, got {type(query).__name__}")
    if not query.strip():
        raise ValueError(f"field {query_key!r} is empty")
    positives = _texts(row[positive_key], positive_key)
    if not positives:
        raise ValueError(f"field {positive_key!r} is an empty list")
    negative_key = row_key(row, NEGATIVE_KEYS, "negatives")
    negatives = _texts(row[negative_key], negative_key) if negative_key else ()
    instruction = _optional_string(row, "instruction") or default_instruction
    symmetric = row.get("symmetric", False)
    if not isinstance(symmetric, bool):
        raise ValueError(f"field 'symmetric' must be true or false, got {symmetric!r}")
    teacher = parse_teacher_scores(row.get("teacher_scores"), len(positives), len(negatives))
    return TrainExample(query, positives, negatives, instruction, _optional_string(row, "task"), symmetric, teacher)


def read_jsonl_examples(
    path: str | Path, *, skip_invalid: bool = False, instruction: str | None = None
) -> tuple[list[TrainExample], int]:
    """Read a JSON-lines training file; returns the examples and the number of rows skipped."""
    path = Path(path)
    rejects = _Rejects(skip_invalid)
    examples: list[TrainExample] = []
    for line_no, row in iter_jsonl(path, on_error=rejects.reject_format):
        try:
            examples.append(parse_row(row, instruction))
        except ValueError as exc:
            rejects.reject(f"{path}:{line_no}", str(exc))
    _log_skips(path, rejects)
    return examples, rejects.count


def _log_skips(path: Path, rejects: _Rejects) -> None:
    if rejects.count:
        log.warning("%s: skipped %d invalid row(s), e.g. %s", path, rejects.count, "; ".join(rejects.examples))


def _beir_file(folder: Path, name: str) -> Path:
    try:
        return find_file(folder, name)
    except FileNotFoundError:
        raise TrainingDataError(
            f"{folder}: no {name} (a BEIR folder needs corpus.jsonl, queries.jsonl, qrels/)"
        ) from None


def read_beir(
    folder: str | Path,
    split: str = "train",
    *,
    min_score: int = 1,
    skip_invalid: bool = False,
    instruction: str | None = None,
) -> tuple[list[TrainExample], list[str], int]:
    """Turn a BEIR folder's judgments into examples.

    Returns the examples (one per query with at least one relevant document, in qrels order), the
    corpus texts (a pool for extra negatives) and the number of judgments skipped.
    """
    folder = Path(folder)
    try:
        doc_ids, doc_texts = read_corpus(_beir_file(folder, CORPUS_FILE))
        queries = read_queries(_beir_file(folder, QUERIES_FILE))
    except DataFormatError as exc:
        raise TrainingDataError(str(exc)) from exc
    docs = dict(zip(doc_ids, doc_texts, strict=True))
    try:
        qrels_path = qrels_file(folder, split)
    except FileNotFoundError:
        splits = ", ".join(qrels_splits(folder)) or "none"
        raise TrainingDataError(f"{folder}: no qrels/{split}.tsv (splits here: {splits})") from None
    rejects = _Rejects(skip_invalid)
    judged: dict[str, tuple[list[str], list[str]]] = {}
    for line_no, query_id, doc_id, score in iter_qrels(qrels_path, on_error=rejects.reject_format):
        try:
            _check_judgment(query_id, doc_id, queries, docs)
        except ValueError as exc:
            rejects.reject(f"{qrels_path}:{line_no}", str(exc))
            continue
        positives, negatives = judged.setdefault(query_id, ([], []))
        (positives if score >= min_score else negatives).append(docs[doc_id])
    _log_skips(qrels_path, rejects)
    examples = [
        TrainExample(queries[qid], tuple(pos), tuple(neg), instruction) for qid, (pos, neg) in judged.items() if pos
    ]
    return examples, doc_texts, rejects.count


def _check_judgment(query_id: str, doc_id: str, queries: dict[str, str], docs: dict[str, str]) -> None:
    if query_id not in queries:
        raise ValueError(f"query id {query_id!r} is not in queries.jsonl")
    if not queries[query_id].strip():
        raise ValueError(f"query {query_id!r} has an empty text")
    if doc_id not in docs:
        raise ValueError(f"document id {doc_id!r} is not in corpus.jsonl")
    if not docs[doc_id]:
        raise ValueError(f"document {doc_id!r} has an empty title and text")


def _resolve_path(path: str) -> Path:
    """An existing path, or a dataset name (or ``NAME/file``) that :mod:`lmembed.datasets` finds locally."""
    try:
        return resolve_local(path)
    except Exception as exc:  # the name is unknown (or the lookup failed): report the path
        raise TrainingDataError(f"training data {path!r} does not exist ({exc})") from exc


def load_source(source: DataSource | str, *, skip_invalid: bool = False) -> TrainDataset:
    """Read one source into a :class:`TrainDataset`."""
    source = DataSource.parse(source)
    path = _resolve_path(source.path)
    kind = source.kind
    if kind == "auto":
        kind = "beir" if path.is_dir() else "jsonl"
    if kind == "beir":
        examples, documents, skipped = read_beir(
            path, source.split, min_score=source.min_score, skip_invalid=skip_invalid, instruction=source.instruction
        )
    elif kind == "jsonl":
        examples, skipped = read_jsonl_examples(path, skip_invalid=skip_invalid, instruction=source.instruction)
        documents = _document_pool(examples)
    else:
        raise TrainingDataError(f"data source kind {source.kind!r} is unknown; use auto, jsonl or beir")
    if not examples:
        raise TrainingDataError(f"{path}: no usable training rows")
    if source.symmetric:
        examples = [replace(example, symmetric=True) for example in examples]
    return TrainDataset(source.label, examples, documents, source.weight, skipped)


def _document_pool(examples: Sequence[TrainExample]) -> list[str]:
    """Every distinct positive and negative text, in first-seen order."""
    seen: dict[str, None] = {}
    for example in examples:
        for text in (*example.positives, *example.negatives):
            seen.setdefault(text, None)
    return list(seen)


def load_sources(sources: Sequence[DataSource | str], *, skip_invalid: bool = False) -> list[TrainDataset]:
    """Read several sources; dataset names are made unique."""
    datasets = [load_source(s, skip_invalid=skip_invalid) for s in sources]
    seen: dict[str, int] = {}
    for ds in datasets:
        count = seen.get(ds.name, 0)
        seen[ds.name] = count + 1
        if count:
            ds.name = f"{ds.name}#{count + 1}"
    return datasets


def decontaminate_datasets(
    datasets: Sequence[TrainDataset], against: Sequence[str], settings: DecontaminationSettings | None = None
) -> tuple[list[TrainDataset], DecontaminationReport]:
    """Drop every example whose query or a positive repeats an item of the evaluation sets ``against``
    (:mod:`lmembed.synthesis.decontaminate`); the report numbers rows across all datasets in order."""
    # lazy: reading evaluation sets pulls in the evaluation package, which plain training-data reading never needs
    from lmembed.synthesis.eval_texts import evaluation_texts

    examples = [example for ds in datasets for example in ds.examples]
    report = decontaminate([(e.query, *e.positives) for e in examples], evaluation_texts(against), settings)
    kept = set(report.kept)
    cleaned, start = [], 0
    for ds in datasets:
        rows = range(start, start + len(ds.examples))
        start += len(ds.examples)
        cleaned.append(replace(ds, examples=[examples[r] for r in rows if r in kept]))
    for ds, before in zip(cleaned, datasets, strict=True):
        if not ds.examples:
            raise TrainingDataError(
                f"decontamination against {', '.join(against)} dropped all {len(before.examples)} rows of {ds.name}"
            )
    return cleaned, report


def mixture_weights(datasets: Sequence[TrainDataset], mixing: str = "uniform") -> np.ndarray:
    """Sampling probability of each dataset.

    Explicit weights win; datasets without one get 1 (``uniform``) or their size (``proportional``).
    """
    if mixing not in MIXING_MODES:
        raise ConfigError(f"mixing={mixing!r} is unknown; choose one of {', '.join(MIXING_MODES)}")
    raw = []
    for ds in datasets:
        if ds.weight is not None:
            if ds.weight < 0:
                raise ConfigError(f"dataset {ds.name!r} has a negative weight {ds.weight}")
            raw.append(float(ds.weight))
        else:
            raw.append(1.0 if mixing == "uniform" else float(len(ds)))
    total = sum(raw)
    if total <= 0:
        raise ConfigError("the dataset weights sum to zero")
    return np.asarray(raw, dtype=np.float64) / total


# ---------------------------------------------------------------------------------------------- sampling
def _candidate_scores(example: TrainExample, positive: int, negatives: Sequence[str | int]) -> list[float] | None:
    """The teacher's scores of a batch row's positive and negatives; ``None`` when the example has none or a
    negative came from the pool."""
    scores = example.teacher_scores
    if scores is None or not all(isinstance(n, int) for n in negatives):
        return None
    first = len(example.positives)
    return [scores[positive], *(scores[first + int(n)] for n in negatives)]


def check_teacher_scores(datasets: Sequence[TrainDataset], num_negatives: int, loss: str) -> None:
    """Every example can give a batch row its teacher's scores: it has them, and ``num_negatives`` scored
    negatives of its own (a negative drawn from the pool has no score). Raises naming the dataset and row."""
    for ds in datasets:
        for number, example in enumerate(ds.examples, 1):
            if example.teacher_scores is None:
                problem = "has no teacher_scores"
            elif len(example.negatives) < num_negatives:
                problem = f"has {len(example.negatives)} scored negative(s), fewer than num_negatives={num_negatives}"
            else:
                continue
            raise TrainingDataError(
                f"loss={loss} distils the rows' teacher_scores, but row {number} of {ds.name} "
                f"({example.query[:60]!r}) {problem}"
            )


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *stream]))


class MixtureSampler:
    """Deterministic global batches: ``batch(step)`` depends only on the seed and ``step``.

    Each row of a batch picks its dataset at random with the mixture weights; each dataset is read
    in a new random order every epoch. ``num_negatives`` texts are attached to every row: a random
    subset of the example's own hard negatives, topped up with random texts from the same dataset
    when it has too few (the example's own positives are never used as its negatives).

    Where each dataset's cursor stands at a given step depends on all earlier draws; the sampler
    recomputes it from the seed (a fast numpy replay) when asked for a step out of sequence, and
    keeps it incrementally when steps are asked in order.
    """

    def __init__(
        self,
        datasets: Sequence[TrainDataset],
        *,
        batch_size: int,
        num_negatives: int = 0,
        seed: int = 0,
        mixing: str = "uniform",
    ) -> None:
        if not datasets:
            raise ConfigError("no training datasets")
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size} must be >= 1")
        if num_negatives < 0:
            raise ConfigError(f"num_negatives={num_negatives} must be >= 0")
        self.datasets = list(datasets)
        self.batch_size = batch_size
        self.num_negatives = num_negatives
        self.seed = seed
        self.weights = mixture_weights(self.datasets, mixing)
        self._cdf = np.cumsum(self.weights)
        self._cdf[-1] = 1.0
        self._cursor_step = 0
        self._cursors = np.zeros(len(self.datasets), dtype=np.int64)
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    # ------------------------------------------------------------------ dataset choice per row
    def _choices(self, first_step: int, num_steps: int) -> np.ndarray:
        """Dataset index of every row of steps ``first_step .. first_step + num_steps - 1``."""
        bit_generator = np.random.PCG64(np.random.SeedSequence([self.seed, _STREAM_MIX]))
        bit_generator.advance(first_step * self.batch_size)  # one 64-bit draw per uniform double
        uniforms = np.random.Generator(bit_generator).random(num_steps * self.batch_size)
        choices = np.searchsorted(self._cdf, uniforms, side="right")
        return np.minimum(choices, len(self.datasets) - 1).reshape(num_steps, self.batch_size)

    def _seek(self, step: int) -> None:
        """Set the per-dataset cursors to where they stand before ``step``."""
        if step < self._cursor_step:
            self._cursor_step, self._cursors = 0, np.zeros_like(self._cursors)
        while self._cursor_step < step:
            span = min(_REPLAY_CHUNK_STEPS, step - self._cursor_step)
            chosen = self._choices(self._cursor_step, span)
            self._cursors += np.bincount(chosen.ravel(), minlength=len(self.datasets))
            self._cursor_step += span

    # ------------------------------------------------------------------ within a dataset
    def _permutation(self, dataset: int, epoch: int) -> np.ndarray:
        key = (dataset, epoch)
        if key not in self._perms:
            stale = [k for k in self._perms if k[0] == dataset and k[1] < epoch - 1]
            for k in stale:
                del self._perms[k]
            self._perms[key] = _rng(self.seed, _STREAM_PERM, dataset, epoch).permutation(len(self.datasets[dataset]))
        return self._perms[key]

    def example_at(self, dataset: int, position: int) -> TrainExample:
        """The example a dataset yields at a position of its endless, epoch-wise shuffled stream."""
        size = len(self.datasets[dataset])
        epoch, offset = divmod(position, size)
        return self.datasets[dataset].examples[int(self._permutation(dataset, epoch)[offset])]

    def _negatives(self, example: TrainExample, pool: list[str], rng: np.random.Generator) -> list[str | int]:
        """``num_negatives`` negatives: an ``int`` is the index of one of the example's own, a ``str`` a text
        drawn from the pool."""
        n = self.num_negatives
        own = len(example.negatives)
        if own >= n:
            return [int(i) for i in rng.choice(own, size=n, replace=False)] if n else []
        chosen: list[str | int] = list(range(own))
        rng.shuffle(chosen)
        banned = set(example.positives)
        if n - own > len(pool):  # more draws than texts to draw from: no amount of drawing finds them
            raise TrainingDataError(
                f"num_negatives={n}: query {example.query[:60]!r} has {own} negatives of its own and its dataset "
                f"{len(pool)} other texts to draw from"
            )
        for _ in range(100 * n):
            if len(chosen) == n or not pool:
                break
            text = pool[int(rng.integers(len(pool)))]
            if text not in banned:
                chosen.append(text)
        if len(chosen) < n:
            raise TrainingDataError(
                f"cannot find {n} negatives for query {example.query[:60]!r}: its dataset has too few other texts"
            )
        return chosen

    # ------------------------------------------------------------------ batches
    def batch(self, step: int) -> TrainBatch:
        """The global batch of training step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        self._seek(step)
        chosen = self._choices(step, 1)[0]
        positions = self._cursors.copy()
        batch = TrainBatch([], [], [], [])
        for dataset in chosen:
            dataset = int(dataset)
            position = int(positions[dataset])
            positions[dataset] += 1
            self._append_row(batch, dataset, position)
        self._cursors, self._cursor_step = positions, step + 1
        batch.mark_false_negatives()
        return batch

    def _append_row(self, batch: TrainBatch, dataset: int, position: int) -> None:
        example = self.example_at(dataset, position)
        rng = _rng(self.seed, _STREAM_ROW, dataset, position)
        positive = int(rng.integers(len(example.positives)))
        negatives = self._negatives(example, self.datasets[dataset].documents, rng)
        batch.queries.append(example.query)
        batch.instructions.append(example.instruction)
        batch.positives.append(example.positives[positive])
        batch.negatives.append([example.negatives[n] if isinstance(n, int) else n for n in negatives])
        batch.sources.append(self.datasets[dataset].name)
        batch.symmetric.append(example.symmetric)
        batch.teacher_scores.append(_candidate_scores(example, positive, negatives))

    def describe(self) -> list[dict[str, Any]]:
        """Per dataset: name, number of examples, sampling probability, rows skipped while reading."""
        return [
            {"name": ds.name, "examples": len(ds), "probability": round(float(w), 6), "skipped": ds.skipped}
            for ds, w in zip(self.datasets, self.weights, strict=True)
        ]


class TaskHomogeneousSampler(MixtureSampler):
    """Every global batch is drawn from a single dataset (task-homogeneous batching).

    The dataset of step ``s`` is picked with the mixture weights from a generator seeded by
    ``(seed, s)``, so ``batch(step)`` stays a pure function of the seed and the step (restarts are
    exact). Within a dataset, rows follow the same epoch-wise shuffled stream as in
    :class:`MixtureSampler`; hard negatives are attached the same way.
    """

    _STREAM_TASK = 7

    def __init__(self, datasets: Sequence[TrainDataset], **kwargs: Any) -> None:
        super().__init__(datasets, **kwargs)
        self._step_datasets = np.empty(0, dtype=np.int64)

    def dataset_of_step(self, step: int) -> int:
        """Index of the dataset that fills batch ``step``."""
        self._extend(step + 1)
        return int(self._step_datasets[step])

    def _extend(self, steps: int) -> None:
        have = len(self._step_datasets)
        if have >= steps:
            return
        new = [self._draw(s) for s in range(have, max(steps, 2 * have))]
        self._step_datasets = np.concatenate([self._step_datasets, np.asarray(new, dtype=np.int64)])

    def _draw(self, step: int) -> int:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self._STREAM_TASK, step]))
        return int(min(np.searchsorted(self._cdf, rng.random(), side="right"), len(self.datasets) - 1))

    def batch(self, step: int) -> TrainBatch:
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        dataset = self.dataset_of_step(step)
        start = int((self._step_datasets[:step] == dataset).sum()) * self.batch_size
        batch = TrainBatch([], [], [], [])
        for position in range(start, start + self.batch_size):
            self._append_row(batch, dataset, position)
        return batch


class RoundRobinSampler(TaskHomogeneousSampler):
    """Task-homogeneous batches taken from the datasets in turn: step ``s`` reads dataset ``s mod D``, so after
    ``k·D`` steps every dataset has filled exactly ``k`` batches (a joint multi-task run at equal steps per
    task). The mixture weights are not used; rows within a dataset follow :class:`TaskHomogeneousSampler`."""

    def _draw(self, step: int) -> int:
        return step % len(self.datasets)


def datasets_digest(datasets: Sequence[TrainDataset]) -> str:
    """The sha256 of what a run trains on: each source's name and weight, its examples (every field) and its pool of
    texts, in order. A checkpoint records it, so a resumed run notices data that changed while it was stopped."""
    digest = hashlib.sha256()
    for dataset in datasets:
        head = {"name": dataset.name, "weight": dataset.weight, "rows": len(dataset.examples)}
        digest.update(json.dumps(head, sort_keys=True).encode())
        for example in dataset.examples:
            digest.update(json.dumps(dataclasses.astuple(example), ensure_ascii=False).encode("utf-8", "surrogatepass"))
        digest.update(json.dumps(dataset.documents, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
