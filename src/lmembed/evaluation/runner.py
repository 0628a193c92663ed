"""Evaluate one model under many strategies on many tasks: compute once, evaluate many.

Retrieval tasks are scored from embeddings computed for all strategies together (one forward pass
serves every pooling/layer combination that shares the forward fields), then each strategy's
vectors are searched and scored. Other task types go through their own ``evaluate`` with the
embedder re-configured per strategy; the embedding cache makes repeats free.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.config import ConfigError, EmbeddingConfig
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.retrieval import RetrievalTask

log = logging.getLogger(__name__)

GRID_KEYS = ("pooling", "layer", "attention", "echo", "final_norm", "dim")


def parse_layer_value(value: str, num_layers: int) -> int | tuple[int, ...]:
    """Grid/sweep layer syntax: ``-1``, ``mid`` (middle layer), ``penultimate``, ``15+16`` (fused)."""
    named = {"mid": num_layers // 2, "middle": num_layers // 2, "penultimate": num_layers - 1, "last": num_layers}
    parts = value.split("+")
    try:
        layers = tuple(named[p] if p in named else int(p) for p in parts)
    except ValueError as exc:
        raise ConfigError(f"layer value {value!r}: use an int, 'mid', 'penultimate', 'last' or 'a+b' to fuse") from exc
    return layers[0] if len(layers) == 1 else layers


def _parse_grid_value(key: str, value: str, num_layers: int) -> Any:
    if key == "layer":
        return parse_layer_value(value, num_layers)
    if key in ("echo",):
        return value.lower() in ("1", "true", "yes", "on")
    if key == "final_norm":
        return {"none": None, "true": True, "false": False}[value.lower()]
    if key == "dim":
        return None if value.lower() == "none" else int(value)
    return value


def parse_grid(specs: Sequence[str], num_layers: int) -> dict[str, list[Any]]:
    """``["pooling=mean,last", "layer=-1,mid"]`` → ``{"pooling": ["mean", "last"], "layer": [-1, 15]}``."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or key not in GRID_KEYS:
            raise ConfigError(f"--grid {spec!r}: expected KEY=V1,V2 with KEY one of {', '.join(GRID_KEYS)}")
        grid[key] = [_parse_grid_value(key, v.strip(), num_layers) for v in values.split(",") if v.strip()]
    return grid


def expand_grid(base: EmbeddingConfig, grid: Mapping[str, Sequence[Any]]) -> list[EmbeddingConfig]:
    """Every combination of the grid's values applied to ``base`` (duplicates removed, order kept)."""
    if not grid:
        return [base]
    keys = list(grid)
    configs: list[EmbeddingConfig] = []
    for values in itertools.product(*(grid[k] for k in keys)):
        cfg = base.with_options(**dict(zip(keys, values, strict=True)))
        if cfg not in configs:
            configs.append(cfg)
    return configs


def sweep_configs(base: EmbeddingConfig, num_layers: int, *, with_final_norm: bool = False) -> list[EmbeddingConfig]:
    """Every layer 0..L on its own, plus fused sets: middle three, the two layers around the middle,
    penultimate+last, and the mean of all layers past the first. ``with_final_norm`` adds each read-out
    once more through the decoder's final norm (intermediate decoder states carry a few huge
    "massive activation" dimensions that the norm tames)."""
    mid = num_layers // 2
    fused = [
        (mid - 1, mid, mid + 1),
        (mid, mid + 1),
        (num_layers - 1, num_layers),
        tuple(range(1, num_layers + 1)),
    ]
    layers: list[int | tuple[int, ...]] = [*range(num_layers + 1), *fused]
    configs = [base.with_options(layer=layer) for layer in layers]
    if with_final_norm:
        configs += [base.with_options(layer=layer, final_norm=True) for layer in layers]
    return configs


@dataclass
class StrategyResult:
    config: EmbeddingConfig
    result: TaskResult


def evaluate_retrieval_strategies(
    embedder: Any,
    task: RetrievalTask,
    configs: Sequence[EmbeddingConfig],
    *,
    batch_size: int = 32,
    instruction: str | None = None,
) -> list[StrategyResult]:
    """Score every strategy on one retrieval task, sharing forward passes between strategies."""
    start = time.perf_counter()
    data = task.data
    queries = embedder.encode_strategies(data.query_texts, configs, instruction=instruction, batch_size=batch_size)
    corpus = embedder.encode_strategies(data.corpus_texts, configs, batch_size=batch_size)
    encode_s = time.perf_counter() - start
    out = []
    for cfg, q, c in zip(configs, queries, corpus, strict=True):
        result = task.score_embeddings(q, c, model_name=embedder.name)
        result.strategy = cfg.to_dict()
        result.extra.setdefault("timings", {})["encode_s_shared"] = encode_s
        result.extra["strategy_label"] = cfg.label()
        result.extra["instruction"] = instruction
        result.extra["texts_encoded"] = len(data.query_texts) + len(data.corpus_texts)
        out.append(StrategyResult(cfg, result))
    return out


def evaluate_strategies(
    embedder: Any,
    tasks: Sequence[Any],
    configs: Sequence[EmbeddingConfig],
    *,
    batch_size: int = 32,
    instruction_for: Callable[[Any], str | None] | None = None,
    on_result: Callable[[StrategyResult], None] | None = None,
) -> list[StrategyResult]:
    """Evaluate ``embedder`` under each strategy on each task."""
    results: list[StrategyResult] = []
    for task in tasks:
        instruction = instruction_for(task) if instruction_for else None
        if isinstance(task, RetrievalTask):
            batch = evaluate_retrieval_strategies(
                embedder, task, configs, batch_size=batch_size, instruction=instruction
            )
        else:
            batch = []
            for cfg in configs:
                result = task.evaluate(embedder.with_config(cfg), batch_size=batch_size)
                result.strategy = cfg.to_dict()
                result.model_name = result.model_name or embedder.name
                result.extra["strategy_label"] = cfg.label()
                batch.append(StrategyResult(cfg, result))
        for item in batch:
            if on_result:
                on_result(item)
        results.extend(batch)
    return results


def known_task_name(name: str) -> str | None:
    """MTEB name for a dataset name such as ``scifact``, ``stsbenchmark``, ``sickr`` or ``banking77``."""
    from lmembed.evaluation.suites import RETRIEVAL_LOCATIONS
    from lmembed.evaluation.tasks import KNOWN_DATASETS

    def keys(mteb_name: str, relative: str) -> set[str]:
        short = mteb_name.lower()
        for suffix in ("classification", "clustering", "retrieval"):
            short = short.removesuffix(suffix)
        return {mteb_name.lower(), short, short.replace("-", ""), Path(relative).name.lower()}

    locations = {n: str(spec.path) for n, (_, spec) in KNOWN_DATASETS.items()} | dict(RETRIEVAL_LOCATIONS)
    wanted = name.strip().lower()
    return next((n for n, rel in locations.items() if wanted in keys(n, rel)), None)


def load_task(data: str | Path, *, task_type: str | None = None, split: str = "test") -> Any:
    """A task from a known name (``scifact``, ``stsbenchmark`` ...) or a data directory.

    Known names carry MTEB's per-task settings; a directory's task type is recognised from its
    files (:func:`lmembed.evaluation.tasks.detect_task_type`) unless ``task_type`` is given.
    """
    from lmembed import datasets
    from lmembed.evaluation import suites, tasks

    path = Path(data)
    mteb_name = None if path.exists() else known_task_name(str(data))
    if mteb_name is not None:
        root = suites.default_data_root()
        located = suites.locate(mteb_name, root or Path("."))
        if not located.available:  # found elsewhere ($LMEMBED_DATA/NAME or a download): same settings
            located = dataclasses.replace(located, path=datasets.resolve_dataset(str(data)))
        return unwrap(suites.build_task(located))
    if not path.exists():
        path = datasets.resolve_dataset(str(data))  # raises with the places it looked
    return unwrap(tasks.load_task(path, task_type=task_type, split=split))


def unwrap(task: Any) -> Any:
    """Retrieval tasks come wrapped with their instruction; the runner handles instructions itself."""
    inner = getattr(task, "task", None)
    return inner if isinstance(inner, RetrievalTask) else task


def results_table(results: Sequence[StrategyResult], metrics: Sequence[str] = ("ndcg_at_10",)) -> str:
    """Markdown table sorted by main score (best first); ``metrics`` are shown where a task has them."""
    rows = sorted(results, key=lambda r: -r.result.main_score)
    header = ["model", "strategy", "task", "main metric", "score", *metrics, "eval s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for item in rows:
        res = item.result
        cells = [
            res.model_name,
            item.config.label(),
            res.task_name,
            res.main_metric,
            f"{100 * res.main_score:.2f}",
            *(f"{100 * res.scores[m]:.2f}" if m in res.scores else "-" for m in metrics),
            f"{res.evaluation_time:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_all(results: Sequence[StrategyResult], output: Path) -> list[Path]:
    from lmembed.evaluation.results import write_result

    return [write_result(item.result, output) for item in results]
