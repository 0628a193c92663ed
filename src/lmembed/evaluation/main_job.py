"""What ``lmembed eval`` runs, as library functions: the main job and the tasks named on its command line.

* :func:`main_job_plan` / :func:`run_main_job`: the default evaluation (``lmembed eval`` with no
  arguments), the bundled models on SciFact;
* :func:`resolve_eval_tasks`: ``--data`` / ``--suite`` / ``--task-type`` / ``--instructions`` turned
  into tasks bound to their instructions, plus the suite tasks whose data is absent;
* :func:`suite_summary_lines`: MTEB-style per-type and overall means for each model and strategy.

Nothing here prints; progress goes to an optional callback, and the command line renders results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from lmembed.evaluation.base import Task, TaskResult
from lmembed.evaluation.instructions import instruction_for
from lmembed.evaluation.runner import StrategyResult, evaluate_strategies, write_all
from lmembed.evaluation.suites import aggregate, build_task, default_data_root, locate, resolve_task, suite_task_names
from lmembed.evaluation.tasks.retrieval import RetrievalTask

#: Documents in the main job's reduced SciFact corpus (every judged document plus random others).
MAIN_JOB_SUBSET = 500
#: Token limit of the decoder in the main job (minilm's own limit is 256 too).
MAIN_JOB_DECODER_MAX_LENGTH = 256
#: The metrics the main job's table shows.
MAIN_JOB_METRICS = ("ndcg_at_10", "map_at_10", "mrr_at_10", "recall_at_100")
#: The task the main job scores.
MAIN_JOB_TASK = "scifact"

#: Which SciFact corpus a main-job step scores: the whole one, or the reduced one.
Corpus = Literal["full", "subset"]


def main_job_plan() -> list[tuple[str, list[dict[str, Any]], Corpus]]:
    """(model, strategies, corpus) triples of the default evaluation; each strategy is the options it gives over
    the model's own (so minilm keeps its folder's conventions, bidirectional attention among them).

    minilm runs on the full SciFact (comparable with MTEB's published 64.51). The 135M-parameter
    decoder is ~30x slower per token on a laptop CPU, so it runs on a SciFact corpus reduced to every
    judged document plus random distractors (500 docs) and truncated at 256 tokens like minilm, with
    minilm repeated there for a fair comparison; four read-outs share one forward pass. Middle layers
    are read through the final norm: raw middle-layer states of this model carry "massive activations"
    (|x| up to about 30,000 at layer 15) that swamp mean-pooled vectors (bench/massive_activations.py).
    """
    decoder: list[dict[str, Any]] = [
        {"pooling": "mean", "layer": -1},
        {"pooling": "weighted_mean", "layer": -1},
        {"pooling": "mean", "layer": 15, "final_norm": True},
        {"pooling": "mean", "layer": (15, 16), "final_norm": True},
    ]
    return [
        ("minilm", [{"pooling": "mean"}], "full"),
        ("minilm", [{"pooling": "mean"}], "subset"),
        ("smollm2-135m", decoder, "subset"),
    ]


def main_job_tasks() -> dict[Corpus, RetrievalTask]:
    """The main job's two SciFact tasks: ``"full"`` and ``"subset"`` (``SciFact[500 docs]``)."""
    full = resolve_task(MAIN_JOB_TASK)
    if not isinstance(full, RetrievalTask):  # the registry says SciFact is retrieval; this guards a re-registration
        raise TypeError(f"the main job needs a retrieval task, {MAIN_JOB_TASK!r} is {full.task_type}")
    return {"full": full, "subset": full.subsample(max_docs=MAIN_JOB_SUBSET, policy="all-judged")}


def run_main_job(
    output: Path,
    batch_size: int,
    *,
    progress: Callable[[str], None] | None = None,
    backend: str | None = None,
    precision: str | None = None,
) -> list[StrategyResult]:
    """Run :func:`main_job_plan` and write every result under ``output``; return the results.

    ``progress`` receives one line per (model, corpus) step before it runs. ``backend`` and ``precision`` run
    the models: torch float32 by default, the path whose scores are checked against MTEB's; ``backend="onnx"``
    (float32) is faster where the onnx extra is installed; ``precision="int8"`` quantises, each model calibrated
    on a spread of the queries and documents it scores (``bench/main_job_time.py`` measures both against torch).
    """
    from lmembed import Embedder  # lazy: torch loads only when the main job runs

    tasks = main_job_tasks()
    results: list[StrategyResult] = []
    embedders: dict[str, Embedder] = {}  # one per model: an int8 model is calibrated once, and its cache reused
    plan = main_job_plan()
    for step, (model, strategies, corpus) in enumerate(plan):
        task = tasks[corpus]
        if model not in embedders:
            max_length = MAIN_JOB_DECODER_MAX_LENGTH if model != "minilm" else None
            embedders[model] = Embedder.from_pretrained(
                model, max_length=max_length, backend=backend, precision=precision, **strategies[0]
            )
        embedder = embedders[model]
        configs = [embedder.config.with_options(**options) for options in strategies]
        if progress is not None:
            progress(f"• {model} on {task.name}: {', '.join(c.label() for c in configs)}")
        results += evaluate_strategies(embedder, [task], configs, batch_size=batch_size)
        if all(later != model for later, _, _ in plan[step + 1 :]):
            del embedders[model]  # frees the model once no later step needs it
    write_all(results, output)
    return results


def instruction_lookup(instructions: str | Mapping[str, str] | None) -> Callable[[Task], str | None] | None:
    """``task → its definition in the table`` (``"nv-embed"``, ``"e5-mistral"`` or a mapping); ``None``
    when no table is given."""
    if not instructions:
        return None
    table = instructions
    return lambda task: instruction_for(task.name, table)


def resolve_eval_tasks(
    data: Sequence[str] | None,
    suite: str | None,
    task_type: str | None = None,
    instructions: str | Mapping[str, str] | None = None,
    *,
    data_root: str | Path | None = None,
) -> tuple[list[Task], list[str]]:
    """The tasks named by ``--data`` (known names or paths) and ``--suite``, and the suite's tasks
    whose data is absent under the data root (``data_root``, else :func:`default_data_root`).

    ``task_type`` forces the type of ``--data`` paths. With ``instructions`` (a table name or a mapping),
    every task is bound to its definition there (``None`` where the table has none).
    """
    tasks = [resolve_task(d, task_type=task_type) for d in data or []]
    missing: list[str] = []
    if suite:
        root = Path(data_root) if data_root is not None else default_data_root()
        for name in suite_task_names(suite):
            located = locate(name, root) if root else None
            if located is None or not located.available:
                missing.append(name)
                continue
            tasks.append(build_task(located))
    lookup = instruction_lookup(instructions)
    if lookup is not None:
        tasks = [task.with_instruction(lookup(task)) for task in tasks]
    return tasks, missing


def suite_summary_lines(results: Sequence[StrategyResult]) -> list[str]:
    """One line per (model, strategy): the mean main score per task type and the overall mean (percent)."""
    by_key: dict[tuple[str, str], list[TaskResult]] = {}
    for item in results:
        by_key.setdefault((item.result.model_name, item.config.label()), []).append(item.result)
    lines = []
    for (model, label), rows in by_key.items():
        per_type, overall, _ = aggregate(rows)
        cells = ", ".join(f"{k} {100 * v:.2f}" for k, v in per_type.items())
        lines.append(f"{model} {label}: {cells}; overall {100 * (overall or 0):.2f}")
    return lines
