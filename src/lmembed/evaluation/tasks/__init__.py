"""Every MTEB task type lmembed implements, the registry of types, and loading tasks from data.

Each module here is one task type: a class implementing :class:`lmembed.evaluation.base.Task`, with
the scoring it follows. ``TASK_TYPES`` maps an MTEB task-type name to its class; every class is built
the same way, ``from_path(path, name=, split=, instruction=, **settings)``. :func:`load_task` builds a
task from a file or folder (what ``lmembed eval --data DIR [--task-type TYPE]`` needs) and
:func:`detect_task_type` guesses the type from the files when none is given; :func:`build_task`
builds a known task (a :class:`~lmembed.task_registry.TaskSpec`) with its MTEB settings:

===================  ==========================================================================
type                 what is looked for
===================  ==========================================================================
Retrieval            ``corpus.jsonl`` and ``queries.jsonl`` (BEIR layout, ``qrels/<split>.tsv``)
Classification       ``train.jsonl`` next to the evaluation split; rows ``{"text", "label"}``
STS                  rows ``{"sentence1", "sentence2", "score"}``
PairClassification   rows ``{"sentence1", "sentence2", "labels"|"label"}``
Clustering           rows ``{"sentences": [...], "labels": [...]}``
Reranking            rows ``{"query", "positive", "negative"}``
Summarization        rows ``{"text", "human_summaries", "machine_summaries", "relevance"}``
===================  ==========================================================================

The facts of each known MTEB task (data location, split, settings, instruction) are not here: they
are one :class:`~lmembed.task_registry.TaskSpec` each in :mod:`lmembed.task_registry`. Adding a
dataset: one ``TaskSpec`` entry in ``lmembed.task_registry``; adding a task type: a class here and
:func:`register_task_type`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmembed.errors import UnknownNameError
from lmembed.evaluation.base import Task, TaskType
from lmembed.evaluation.tasks._common import TaskDataError, split_file
from lmembed.evaluation.tasks.classification import ClassificationTask
from lmembed.evaluation.tasks.clustering import ClusteringTask
from lmembed.evaluation.tasks.pair_classification import PairClassificationTask
from lmembed.evaluation.tasks.reranking import RerankingTask
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.evaluation.tasks.sts import STSTask
from lmembed.evaluation.tasks.summarization import SummarizationTask
from lmembed.io import CORPUS_FILE, QUERIES_FILE, DataFormatError, iter_jsonl
from lmembed.task_registry import TaskSpec

__all__ = [
    "TASK_TYPES",
    "ClassificationTask",
    "ClusteringTask",
    "PairClassificationTask",
    "RerankingTask",
    "RetrievalTask",
    "STSTask",
    "SummarizationTask",
    "TaskDataError",
    "build_task",
    "canonical_task_type",
    "detect_task_type",
    "load_task",
    "register_task_type",
    "task_class",
]

#: Task-type name → the class implementing it.
TASK_TYPES: dict[str, TaskType] = {
    cls.task_type: cls
    for cls in (
        RetrievalTask,
        RerankingTask,
        ClusteringTask,
        PairClassificationTask,
        ClassificationTask,
        STSTask,
        SummarizationTask,
    )
}

_ALIASES = {task_type.lower(): task_type for task_type in TASK_TYPES}


def canonical_task_type(name: str) -> str:
    """Map spellings like ``pair-classification`` or ``sts`` to MTEB's type name."""
    key = name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key not in _ALIASES:
        raise UnknownNameError(f"unknown task type {name!r}; known: {', '.join(sorted(TASK_TYPES))}")
    return _ALIASES[key]


def register_task_type(name: str, cls: TaskType) -> None:
    """Add (or replace) a task type; ``cls`` needs ``from_path(path, name=, split=, instruction=, **settings)``."""
    TASK_TYPES[name] = cls
    _ALIASES[name.lower().replace("-", "").replace("_", "")] = name


def task_class(task_type: str) -> TaskType:
    """The class implementing ``task_type`` (any spelling :func:`canonical_task_type` accepts)."""
    return TASK_TYPES[canonical_task_type(task_type)]


def _first_row(path: Path) -> dict[str, Any]:
    try:
        for _, row in iter_jsonl(path):
            return row
    except DataFormatError as exc:
        raise TaskDataError(str(exc)) from exc
    raise TaskDataError(f"{path} is empty")


def _type_from_row(row: Mapping[str, Any], has_train: bool) -> str | None:
    keys = set(row)
    if {"human_summaries", "machine_summaries"} <= keys:
        return "Summarization"
    if {"query", "positive", "negative"} <= keys:
        return "Reranking"
    if {"sentences", "labels"} <= keys:
        return "Clustering"
    if {"sentence1", "sentence2"} <= keys:
        if "score" in keys:
            return "STS"
        if keys & {"labels", "label"}:
            return "PairClassification"
    if {"text", "label"} <= keys and has_train:
        return "Classification"
    return None


def _data_file(path: Path, split: str) -> Path:
    """The jsonl file whose first row identifies the format."""
    candidate = split_file(path, split)
    if candidate.is_file():
        return candidate
    jsonl = sorted(p for p in path.glob("*.jsonl") if p.name != "train.jsonl") if path.is_dir() else []
    if not jsonl:
        raise TaskDataError(f"no {split}.jsonl (or other .jsonl file) in {path}")
    return jsonl[0]


def detect_task_type(path: str | Path, *, split: str = "test") -> str:
    """Guess the MTEB task type of the data at ``path`` (a folder or a jsonl file)."""
    path = Path(path)
    if not path.exists():
        raise TaskDataError(f"no such file or folder: {path}")
    if path.is_dir() and (path / CORPUS_FILE).is_file() and (path / QUERIES_FILE).is_file():
        return "Retrieval"
    file = _data_file(path, split)
    has_train = (file.parent / "train.jsonl").is_file() and file.name != "train.jsonl"
    detected = _type_from_row(_first_row(file), has_train)
    if detected is None:
        fields = sorted(_first_row(file))
        hint = " (classification needs a train.jsonl beside it)" if {"text", "label"} <= set(fields) else ""
        raise TaskDataError(f"cannot tell the task type of {file} from its fields {fields}{hint}")
    return detected


def load_task(
    path: str | Path,
    *,
    task_type: str | None = None,
    name: str | None = None,
    split: str = "test",
    instruction: str | None = None,
    **settings: Any,
) -> Task:
    """Build a task from the data at ``path``; ``task_type`` is detected when not given.

    ``instruction`` goes to the queries (retrieval, reranking) or to every text (symmetric types);
    ``settings`` go to the task class (``samples_per_label``, ``ignore_identical_ids`` ...).
    """
    path = Path(path)
    canonical = canonical_task_type(task_type) if task_type else detect_task_type(path, split=split)
    return TASK_TYPES[canonical].from_path(path, name=name, split=split, instruction=instruction, **settings)


def build_task(spec: TaskSpec, path: str | Path, *, split: str | None = None, instruction: str | None = None) -> Task:
    """The known task ``spec`` on the data at ``path`` (its folder or file), with the spec's name,
    split (unless ``split`` is given) and settings (``samples_per_label``, ``ignore_identical_ids`` ...)."""
    cls = task_class(spec.task_type)
    return cls.from_path(path, name=spec.name, split=split or spec.split, instruction=instruction, **spec.settings)
