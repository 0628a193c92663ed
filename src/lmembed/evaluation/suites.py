"""Named task suites and the runner that scores an encoder on every task whose data is present.

Suites:

* ``mteb-lite``: a 20-task cross-section of MTEB covering all seven task types: fifteen MTEB(eng) tasks
  plus the English clustering, pair-classification and summarization sets the project holds
  (MasakhaNEWS S2S/P2P, SIB-200, RTE3, SummEval);
* ``sts``: the STS tasks whose data the project holds (STS12–16, STSBenchmark, SICK-R);
* ``retrieval``: the retrieval tasks the project holds (SciFact, NFCorpus, ArguAna).

Tasks are looked up under a data root (``$LMEMBED_DATA`` when set, else the project's
``shared/datasets``) at the locations their entries in :mod:`lmembed.task_registry` give. A task
whose files are absent is *named* in the report and skipped; a suite run downloads nothing.
Aggregation is MTEB's: the mean main score per task type, then the overall score as the mean of those
per-type means (so a type with many tasks does not dominate). The plain mean over tasks is reported too.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmembed import datasets, paths
from lmembed.errors import ConfigError, UnknownNameError
from lmembed.evaluation.base import Task, TaskResult
from lmembed.evaluation.instructions import instruction_set
from lmembed.evaluation.long_synthetic import concatenated_task, is_long_task, parse_long_task, synthetic_task
from lmembed.evaluation.tasks import build_task as build_known_task
from lmembed.evaluation.tasks import load_task
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder
from lmembed.task_registry import TASKS, TaskSpec, UnknownTaskError, find

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
        "MasakhaNEWSClusteringS2S",
        "MasakhaNEWSClusteringP2P",
        "SIB200ClusteringS2S",
        "RTE3",
        "SummEval",
    ),
    "sts": ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICK-R"),
    "retrieval": ("SciFact", "NFCorpus", "ArguAna"),
}


def default_data_root() -> Path | None:
    """``$LMEMBED_DATA`` when set, else the project's ``shared/datasets`` folder (or ``None``)."""
    return paths.default_data_root()


def suite_task_names(suite: str | Sequence[str]) -> list[str]:
    """The task names of a named suite, or the given names themselves."""
    if isinstance(suite, str):
        if suite not in SUITES:
            raise UnknownNameError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        return list(SUITES[suite])
    return list(suite)


@dataclass(frozen=True)
class SuiteTask:
    """One known task (its registry entry), located under a data root."""

    spec: TaskSpec
    path: Path
    required: tuple[Path, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def task_type(self) -> str:
        return self.spec.task_type

    @property
    def split(self) -> str:
        return self.spec.split

    @property
    def available(self) -> bool:
        """True when every file the task needs exists."""
        return all(p.is_file() for p in self.required)

    @property
    def missing_files(self) -> list[Path]:
        return [p for p in self.required if not p.is_file()]


def locate(name: str, data_root: str | Path) -> SuiteTask:
    """Where the known task ``name`` (its MTEB name) has (or would have) its data under ``data_root``."""
    spec = TASKS.get(name)
    if spec is None or spec.path is None:
        raise UnknownTaskError(f"no known dataset named {name!r}")
    root = Path(data_root)
    return SuiteTask(spec, root / spec.path, tuple(spec.files(root)))


def build_task(located: SuiteTask, *, instruction: str | None = None) -> Task:
    """Load the located task's data with its MTEB settings, bound to ``instruction``."""
    return build_known_task(located.spec, located.path, instruction=instruction)


def resolve_task(
    data: str | Path,
    *,
    task_type: str | None = None,
    split: str = "test",
    instruction: str | None = None,
) -> Task:
    """A task from a known name (``scifact``, ``stsbenchmark``, ``SICK-R`` ...) or a data file/folder.

    A known name carries its MTEB name, split and settings (:mod:`lmembed.task_registry`); its data is
    looked up under the default data root, then wherever :func:`lmembed.datasets.resolve_dataset`
    finds it (``$LMEMBED_DATA/NAME``, a download). A path's task type is recognised from its files
    (:func:`lmembed.evaluation.tasks.detect_task_type`) unless ``task_type`` is given; ``split`` is
    the split read from it. A long task's name (``passkey:24x600``, ``needle:24x600``, ``concat:scifact:4``:
    :func:`lmembed.evaluation.long_synthetic.parse_long_task`) gives that task, built here.
    """
    if is_long_task(str(data)) and not Path(data).exists():
        return _long_task(str(data), split=split, instruction=instruction)
    path = Path(data)
    spec = None if path.exists() else find(str(data))
    if spec is not None and spec.path is not None:
        located = locate(spec.name, default_data_root() or Path("."))
        folder = located.path if located.available else datasets.resolve_dataset(str(data))
        return build_known_task(spec, folder, instruction=instruction)
    if not path.exists():
        path = datasets.resolve_dataset(str(data))  # raises with the places it looked
    return load_task(path, task_type=task_type, split=split, instruction=instruction)


def _long_task(name: str, *, split: str, instruction: str | None) -> Task:
    """A synthetic long task, or a retrieval task (resolved as any other) with its documents joined."""
    parsed = parse_long_task(name)
    if parsed.kind != "concat":
        return synthetic_task(parsed).with_instruction(instruction)
    source = resolve_task(parsed.source, split=split, instruction=instruction)
    if not isinstance(source, RetrievalTask):
        raise ConfigError(
            f"task {name!r}: {parsed.source!r} is a {source.task_type} task; concat joins retrieval documents"
        )
    return concatenated_task(source, parsed.per_doc)


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
    batch_size: int = ENCODE_BATCH_SIZE,
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
        raise datasets.DatasetNotFoundError("no data root: pass data_root or set $LMEMBED_DATA")
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
