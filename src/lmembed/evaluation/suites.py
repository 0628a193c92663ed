"""Named task suites and the runner that scores an encoder on every task whose data is present.

Suites:

* ``mteb-lite``: a 15-task cross-section of MTEB(eng) covering six task types;
* ``sts``: the STS tasks whose data the project holds (STS12–16, STSBenchmark, SICK-R);
* ``retrieval``: the retrieval tasks the project holds (SciFact, NFCorpus, ArguAna).

Tasks are looked up under a data root (``$LMEMBED_DATA`` when set, else the project's
``shared/datasets``) at the locations in the known-dataset tables. A task whose files are absent is
*named* in the report and skipped; nothing is downloaded. Aggregation is MTEB's: the mean main score
per task type, then the overall score as the mean of those per-type means (so a type with many tasks
does not dominate). The plain mean over tasks is reported too.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.instructions import instruction_set
from lmembed.evaluation.tasks import KNOWN_DATASETS, TASK_TYPES, InstructedTask
from lmembed.protocols import RetrievalEncoder

logger = logging.getLogger(__name__)

SUITES: dict[str, tuple[str, ...]] = {
    "mteb-lite": (
        "SciFact",
        "ArguAna",
        "NFCorpus",
        "StackOverflowDupQuestions",
        "SciDocsRR",
        "BiorxivClusteringS2S",
        "MedrxivClusteringS2S",
        "TwentyNewsgroupsClustering",
        "SprintDuplicateQuestions",
        "Banking77Classification",
        "EmotionClassification",
        "MassiveIntentClassification",
        "STS17",
        "SICK-R",
        "STSBenchmark",
    ),
    "sts": ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R"),
    "retrieval": ("SciFact", "NFCorpus", "ArguAna"),
}

#: Where each retrieval task's BEIR folder lives under the data root.
RETRIEVAL_LOCATIONS: dict[str, str] = {
    "SciFact": "beir/scifact",
    "NFCorpus": "beir/nfcorpus",
    "ArguAna": "beir/arguana",
    "SCIDOCS": "beir/scidocs",
    "FiQA2018": "beir/fiqa",
    "TRECCOVID": "beir/trec-covid",
    "QuoraRetrieval": "beir/quora",
}


class UnknownTaskError(KeyError):
    """A task name is in no known-dataset table."""


def default_data_root() -> Path | None:
    """``$LMEMBED_DATA`` when set, else the project's ``shared/datasets`` folder (or ``None``)."""
    env = os.environ.get("LMEMBED_DATA")
    if env:
        return Path(env).expanduser()
    from lmembed.datasets import shared_datasets_dir

    return shared_datasets_dir()


def suite_task_names(suite: str | Sequence[str]) -> list[str]:
    """The task names of a named suite, or the given names themselves."""
    if isinstance(suite, str):
        if suite not in SUITES:
            raise KeyError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        return list(SUITES[suite])
    return list(suite)


@dataclass(frozen=True)
class SuiteTask:
    """One named task of a suite, located under a data root."""

    name: str
    task_type: str
    path: Path
    required: tuple[Path, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    split: str = "test"

    @property
    def available(self) -> bool:
        """True when every file the task needs exists."""
        return all(p.is_file() for p in self.required)

    @property
    def missing_files(self) -> list[Path]:
        return [p for p in self.required if not p.is_file()]


def locate(name: str, data_root: str | Path) -> SuiteTask:
    """Where ``name``'s data is (or would be) under ``data_root``, and its settings."""
    root = Path(data_root)
    if name in KNOWN_DATASETS:
        task_type, spec = KNOWN_DATASETS[name]
        return SuiteTask(name, task_type, root / spec.path, tuple(spec.files(root)), spec.settings, spec.split)
    if name in RETRIEVAL_LOCATIONS:
        folder = root / RETRIEVAL_LOCATIONS[name]
        required = (folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / "test.tsv")
        return SuiteTask(name, "Retrieval", folder, required)
    raise UnknownTaskError(f"no known dataset named {name!r}")


def build_task(located: SuiteTask, *, instruction: str | None = None) -> Any:
    """Load the task's data and bind its instruction; the result has ``evaluate(encoder, batch_size=)``."""
    if located.task_type == "Retrieval":
        from lmembed.evaluation.retrieval import MTEB_RETRIEVAL_TASKS, RetrievalTask

        if located.name in MTEB_RETRIEVAL_TASKS:  # carries MTEB's per-task settings (ArguAna's self-hits)
            task = RetrievalTask.from_name(located.name, path=located.path, split=located.split)
        else:
            task = RetrievalTask.from_folder(located.path, name=located.name, split=located.split)
        return InstructedTask(task, instruction)
    cls = TASK_TYPES[located.task_type]
    return cls.from_path(
        located.path, name=located.name, split=located.split, instruction=instruction, **located.settings
    )


def aggregate(results: Sequence[TaskResult]) -> tuple[dict[str, float], float | None, float | None]:
    """(mean main score per task type, mean of those means, plain mean over tasks)."""
    by_type: dict[str, list[float]] = defaultdict(list)
    for result in results:
        by_type[result.task_type].append(result.main_score)
    per_type = {task_type: float(np.mean(scores)) for task_type, scores in by_type.items()}
    overall = float(np.mean(list(per_type.values()))) if per_type else None
    task_mean = float(np.mean([r.main_score for r in results])) if results else None
    return per_type, overall, task_mean


@dataclass
class SuiteReport:
    """What a suite run produced: scores, and which tasks were absent or failed."""

    suite: str
    results: list[TaskResult]
    missing: dict[str, list[str]]
    failed: dict[str, str]
    per_type: dict[str, float]
    overall: float | None
    task_mean: float | None
    data_root: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary (main scores only; full scores live in the TaskResults)."""
        return {
            "suite": self.suite,
            "data_root": self.data_root,
            "main_scores": {r.task_name: r.main_score for r in self.results},
            "task_types": {r.task_name: r.task_type for r in self.results},
            "per_type": self.per_type,
            "overall": self.overall,
            "task_mean": self.task_mean,
            "missing": self.missing,
            "failed": self.failed,
        }

    def summary(self) -> str:
        """A short human-readable table (scores in percent, as on the MTEB leaderboard)."""
        lines = [f"suite {self.suite} ({len(self.results)} scored, {len(self.missing)} absent)"]
        for result in self.results:
            lines.append(f"  {result.task_type:<20} {result.task_name:<40} {100 * result.main_score:6.2f}")
        for task_type, score in sorted(self.per_type.items()):
            lines.append(f"  mean {task_type:<35} {100 * score:6.2f}")
        if self.overall is not None:
            lines.append(f"  overall (mean of type means)             {100 * self.overall:6.2f}")
        for name in self.missing:
            lines.append(f"  absent: {name}")
        for name, error in self.failed.items():
            lines.append(f"  failed: {name}: {error}")
        return "\n".join(lines)


def run_suite(
    suite: str | Sequence[str],
    encoder: RetrievalEncoder,
    *,
    data_root: str | Path | None = None,
    batch_size: int = 32,
    instructions: str | Mapping[str, str] | None = None,
    raise_errors: bool = False,
    on_result: Callable[[TaskResult], None] | None = None,
) -> SuiteReport:
    """Score ``encoder`` on every task of ``suite`` whose data is present under ``data_root``.

    ``instructions``: ``None`` (no task instructions, as for MiniLM/BGE-style models), a named
    table (``"nv-embed"``), or a mapping of task name → definition. A task that raises is recorded
    in ``failed`` unless ``raise_errors``.
    """
    root = Path(data_root) if data_root is not None else default_data_root()
    if root is None:
        raise FileNotFoundError("no data root: pass data_root or set $LMEMBED_DATA")
    table = instruction_set(instructions) if instructions is not None else {}
    results: list[TaskResult] = []
    missing: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    for name in suite_task_names(suite):
        located = locate(name, root)
        if not located.available:
            missing[name] = [str(p) for p in located.missing_files]
            logger.info("skipping %s: data absent (%s)", name, ", ".join(missing[name]))
            continue
        try:
            result = build_task(located, instruction=table.get(name)).evaluate(encoder, batch_size=batch_size)
        except Exception as exc:
            if raise_errors:
                raise
            failed[name] = f"{type(exc).__name__}: {exc}"
            logger.warning("task %s failed: %s", name, failed[name])
            continue
        results.append(result)
        if on_result is not None:
            on_result(result)
    per_type, overall, task_mean = aggregate(results)
    label = suite if isinstance(suite, str) else "custom"
    return SuiteReport(label, results, missing, failed, per_type, overall, task_mean, str(root))
