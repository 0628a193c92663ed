"""Every non-retrieval MTEB task type, plus a registry and data-format detection.

``TASK_TYPES`` maps an MTEB task-type name to its class; :func:`load_task` builds a task from a file
or folder (what ``lmembed eval --data DIR [--task-type TYPE]`` needs) and :func:`detect_task_type`
guesses the type from the files when none is given:

===================  ==========================================================================
type                 what is looked for
===================  ==========================================================================
Retrieval            ``corpus.jsonl`` and ``queries.jsonl`` (BEIR layout; built by
                     :class:`lmembed.evaluation.retrieval.RetrievalTask`)
Classification       ``train.jsonl`` next to the evaluation split; rows ``{"text", "label"}``
STS                  rows ``{"sentence1", "sentence2", "score"}``
PairClassification   rows ``{"sentence1", "sentence2", "labels"|"label"}``
Clustering           rows ``{"sentences": [...], "labels": [...]}``
Reranking            rows ``{"query", "positive", "negative"}``
Summarization        rows ``{"text", "human_summaries", "machine_summaries", "relevance"}``
===================  ==========================================================================

:data:`KNOWN_DATASETS` joins the per-type tables of known MTEB datasets (MTEB name → location under
the data root and settings); adding a dataset is one entry in the table of its type.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.tasks._common import DatasetSpec, TaskDataError, split_file
from lmembed.evaluation.tasks.classification import KNOWN_CLASSIFICATION, ClassificationTask
from lmembed.evaluation.tasks.clustering import KNOWN_CLUSTERING, ClusteringTask
from lmembed.evaluation.tasks.pair_classification import KNOWN_PAIR_CLASSIFICATION, PairClassificationTask
from lmembed.evaluation.tasks.reranking import KNOWN_RERANKING, RerankingTask
from lmembed.evaluation.tasks.sts import KNOWN_STS, STSTask
from lmembed.evaluation.tasks.summarization import KNOWN_SUMMARIZATION, SummarizationTask

__all__ = [
    "KNOWN_DATASETS",
    "TASK_TYPES",
    "ClassificationTask",
    "ClusteringTask",
    "DatasetSpec",
    "InstructedTask",
    "PairClassificationTask",
    "RerankingTask",
    "STSTask",
    "SummarizationTask",
    "TaskDataError",
    "canonical_task_type",
    "detect_task_type",
    "load_task",
    "register_task_type",
    "task_class",
]

# Each built-in task class with its table of known MTEB datasets; the class names its task type.
_BUILT_IN: tuple[tuple[Any, dict[str, DatasetSpec]], ...] = (
    (STSTask, KNOWN_STS),
    (ClassificationTask, KNOWN_CLASSIFICATION),
    (ClusteringTask, KNOWN_CLUSTERING),
    (PairClassificationTask, KNOWN_PAIR_CLASSIFICATION),
    (RerankingTask, KNOWN_RERANKING),
    (SummarizationTask, KNOWN_SUMMARIZATION),
)

TASK_TYPES: dict[str, Any] = {cls.task_type: cls for cls, _ in _BUILT_IN}

#: (task type, dataset spec) for every known non-retrieval MTEB dataset, by MTEB name.
KNOWN_DATASETS: dict[str, tuple[str, DatasetSpec]] = {
    name: (cls.task_type, spec) for cls, table in _BUILT_IN for name, spec in table.items()
}

_ALIASES = {task_type.lower(): task_type for task_type in (*TASK_TYPES, "Retrieval")}


def canonical_task_type(name: str) -> str:
    """Map spellings like ``pair-classification`` or ``sts`` to MTEB's type name."""
    key = name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key not in _ALIASES:
        known = ", ".join(sorted({*TASK_TYPES, "Retrieval"}))
        raise KeyError(f"unknown task type {name!r}; known: {known}")
    return _ALIASES[key]


def register_task_type(name: str, cls: Any) -> None:
    """Add (or replace) a task type; ``cls`` needs a ``from_path(path, name=, split=, **settings)``."""
    TASK_TYPES[name] = cls
    _ALIASES[name.lower().replace("-", "").replace("_", "")] = name


def task_class(task_type: str) -> Any:
    """The class implementing ``task_type`` (Retrieval is imported on demand)."""
    canonical = canonical_task_type(task_type)
    if canonical == "Retrieval":
        from lmembed.evaluation.retrieval import RetrievalTask

        return RetrievalTask
    return TASK_TYPES[canonical]


def _first_row(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise TaskDataError(f"{path}: rows must be JSON objects")
                return row
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
    if path.is_dir() and (path / "corpus.jsonl").is_file() and (path / "queries.jsonl").is_file():
        return "Retrieval"
    file = _data_file(path, split)
    has_train = (file.parent / "train.jsonl").is_file() and file.name != "train.jsonl"
    detected = _type_from_row(_first_row(file), has_train)
    if detected is None:
        fields = sorted(_first_row(file))
        hint = " (classification needs a train.jsonl beside it)" if {"text", "label"} <= set(fields) else ""
        raise TaskDataError(f"cannot tell the task type of {file} from its fields {fields}{hint}")
    return detected


def _forwarded(attribute: str) -> property:
    """A read-only property returning the wrapped task's ``attribute``."""
    return property(lambda self: getattr(self.task, attribute), doc=f"The wrapped task's ``{attribute}``.")


@dataclass
class InstructedTask:
    """A task whose ``evaluate`` takes the instruction as an argument (retrieval), bound to one.

    It presents the plain :class:`~lmembed.evaluation.base.Task` interface, so callers treat every
    task alike: ``evaluate(encoder, batch_size=...)``.
    """

    task: Any
    instruction: str | None

    name = _forwarded("name")
    task_type = _forwarded("task_type")
    main_metric = _forwarded("main_metric")
    split = _forwarded("split")

    def evaluate(self, encoder: Any, *, batch_size: int = 32) -> TaskResult:
        return self.task.evaluate(encoder, batch_size=batch_size, instruction=self.instruction)


def load_task(
    path: str | Path,
    *,
    task_type: str | None = None,
    name: str | None = None,
    split: str = "test",
    instruction: str | None = None,
    **settings: Any,
) -> Any:
    """Build a task from the data at ``path``; ``task_type`` is detected when not given.

    ``instruction`` goes to the queries (retrieval, reranking) or to every text (symmetric types);
    ``settings`` go to the task class (``samples_per_label`` ...; for retrieval, the
    ``RetrievalTask`` constructor's keywords such as ``ignore_identical_ids``).
    """
    path = Path(path)
    canonical = canonical_task_type(task_type) if task_type else detect_task_type(path, split=split)
    if canonical == "Retrieval":
        retrieval = task_class("Retrieval").from_folder(path, name=name or path.name, split=split, **settings)
        return InstructedTask(retrieval, instruction)
    return TASK_TYPES[canonical].from_path(path, name=name, split=split, instruction=instruction, **settings)
