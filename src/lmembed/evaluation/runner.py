"""Evaluate one model under many strategies on many tasks: compute once, evaluate many.

Retrieval tasks are scored from embeddings computed for all strategies together (one forward pass
serves every pooling/layer combination that shares the forward fields), then each strategy's
vectors are searched and scored. Other task types go through their own ``evaluate`` with the
embedder re-configured per strategy; the embedding cache makes repeats free.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from lmembed.config import ConfigError, EmbeddingConfig, for_side
from lmembed.evaluation.base import Task, TaskResult
from lmembed.evaluation.results import record_strategy, runtime_record, strategy_label, write_result
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

if TYPE_CHECKING:  # the backend interface imports torch, which the CLI's help must not load
    from lmembed.encoding.backends import Backend

log = logging.getLogger(__name__)

GRID_KEYS = ("pooling", "layer", "attention", "echo", "final_norm", "dim", "max_length")
#: Documents encoded (uncached) per read-out layer to measure a grid point's texts/s.
SPEED_SAMPLE = 64


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
        choices = {"none": None, "true": True, "false": False}
        if value.lower() not in choices:
            raise ConfigError(f"--grid final_norm={value!r}: use none, true or false")
        return choices[value.lower()]
    if key == "max_length":  # a length grid: texts truncated at each (a model's own window caps it)
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"--grid max_length={value!r}: use a whole number of tokens")
        return int(value)
    if key == "dim":
        if value.lower() == "none":
            return None
        if not value.strip().isdigit():
            raise ConfigError(f"--grid dim={value!r}: use a whole number of dimensions or none")
        return int(value)
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
    penultimate+last, and the mean of all layers past the first. ``with_final_norm`` (decoders) reads each
    layer raw (``final_norm=False``: the last one too, where transformers hands its state out normed) and once
    more through the final norm (intermediate decoder states carry a few huge "massive activation" dimensions
    that the norm tames)."""
    mid = num_layers // 2
    fused = [
        (mid - 1, mid, mid + 1),
        (mid, mid + 1),
        (num_layers - 1, num_layers),
        tuple(range(1, num_layers + 1)),
    ]
    layers: list[int | tuple[int, ...]] = [*range(num_layers + 1), *fused]
    if not with_final_norm:
        return [base.with_options(layer=layer) for layer in layers]
    return [base.with_options(layer=layer, final_norm=normed) for normed in (False, True) for layer in layers]


@dataclass
class StrategyResult:
    """One task's result under one embedding strategy."""

    config: EmbeddingConfig
    result: TaskResult


class StrategyEncoder(Protocol):
    """An encoder that can read out several strategies from shared forward passes (an ``Embedder``)."""

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> Backend:
        """What runs the transformer (calibrated here before a retrieval task is encoded)."""
        ...

    def encode_strategies(
        self,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
    ) -> list[np.ndarray]: ...

    def with_config(self, config: EmbeddingConfig) -> RetrievalEncoder: ...

    def texts_per_second(self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE) -> float:
        """This strategy's measured speed on ``texts`` (encoded uncached)."""
        ...


def measure_speeds(
    embedder: StrategyEncoder,
    texts: Sequence[str],
    configs: Sequence[EmbeddingConfig],
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
) -> dict[EmbeddingConfig, float]:
    """Texts/s of each strategy when they read different layers (a pass stops at its deepest layer, so a
    shallower read-out is cheaper): :data:`SPEED_SAMPLE` of ``texts``, spread over them, encoded uncached once per
    distinct set of layers (strategies that differ only in ``dim`` or the pooling cost the same and share the
    figure), each after a two-text warm-up. Empty when every strategy reads the same layers."""
    by_layers: dict[tuple[int, ...], EmbeddingConfig] = {}
    for cfg in configs:
        by_layers.setdefault(cfg.layers, cfg)
    if len(by_layers) < 2 or not texts:
        return {}
    step = max(1, len(texts) // SPEED_SAMPLE)
    sample = list(texts[::step][:SPEED_SAMPLE])
    speed = {}
    for layers, cfg in by_layers.items():
        encoder = embedder.with_config(cfg)
        encoder.texts_per_second(sample[:2], batch_size=batch_size)  # warm-up: an ONNX backend exports its graph
        speed[layers] = encoder.texts_per_second(sample, batch_size=batch_size)
    return {cfg: speed[cfg.layers] for cfg in configs}


def evaluate_retrieval_strategies(
    embedder: StrategyEncoder,
    task: RetrievalTask,
    configs: Sequence[EmbeddingConfig],
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    measure_speed: bool = False,
) -> list[StrategyResult]:
    """Score every strategy on one retrieval task, sharing forward passes between strategies.

    The queries get the task's ``instruction``; documents get none. An int8 embedder not yet calibrated is
    calibrated on a spread of the task's queries and documents (not on the queries alone, which come first).
    With ``measure_speed``, when the strategies read different layers, each result also holds its measured
    ``texts_per_s`` on the task's documents (:func:`measure_speeds`): a layer × dim grid shows quality against
    cost."""
    start = time.perf_counter()
    data = task.data
    embedder.backend.ensure_calibration([*data.query_texts, *data.corpus_texts])
    queries = encode_side(embedder, data.query_texts, configs, "query", task.instruction, batch_size)
    if task.chunking is None:
        corpus = encode_side(embedder, data.corpus_texts, configs, "document", None, batch_size)
    else:  # long documents: each strategy's chunk vectors (cached per chunk text, as any text)
        corpus = [
            embedder.with_config(cfg).encode_corpus(data.corpus_texts, batch_size=batch_size, chunking=task.chunking)
            for cfg in configs
        ]
    encode_s = time.perf_counter() - start
    speeds = measure_speeds(embedder, data.corpus_texts, configs, batch_size=batch_size) if measure_speed else {}
    runtime = runtime_record(embedder)
    out = []
    for cfg, q, c in zip(configs, queries, corpus, strict=True):
        result = task.score_embeddings(q, c, model_name=embedder.name)
        record_strategy(result, cfg.to_dict(), cfg.label(), runtime)
        result.extra.setdefault("timings", {})["encode_s_shared"] = encode_s
        result.extra["instruction"] = task.instruction
        result.extra["texts_encoded"] = len(data.query_texts) + len(data.corpus_texts)
        if cfg in speeds:
            result.extra["texts_per_s"] = round(speeds[cfg], 2)
        out.append(StrategyResult(cfg, result))
    return out


def encode_side(
    embedder: StrategyEncoder,
    texts: Sequence[str],
    configs: Sequence[EmbeddingConfig],
    side: str,
    instruction: str | None,
    batch_size: int,
) -> list[np.ndarray]:
    """Every strategy's vectors of ``texts`` read as ``side`` (queries: the task's instruction or the strategy's
    query prompt; documents: a published model's document prompt), one shared call per distinct prefix."""
    sides = [for_side(cfg, side, instruction) for cfg in configs]
    out: list[np.ndarray | None] = [None] * len(configs)
    for prefix in dict.fromkeys(prefix for _, prefix in sides):
        picked = [i for i, (_, p) in enumerate(sides) if p == prefix]
        vectors = embedder.encode_strategies(
            texts, [sides[i][0] for i in picked], instruction=prefix, batch_size=batch_size
        )
        for i, vec in zip(picked, vectors, strict=True):
            out[i] = vec
    return out  # type: ignore[return-value]


def evaluate_strategies(
    embedder: StrategyEncoder,
    tasks: Sequence[Task],
    configs: Sequence[EmbeddingConfig],
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    instruction_for: Callable[[Task], str | None] | None = None,
    on_result: Callable[[StrategyResult], None] | None = None,
    measure_speed: bool = False,
) -> list[StrategyResult]:
    """Evaluate ``embedder`` under each strategy on each task, with each task's own instruction.

    ``instruction_for`` (optional) replaces each task's instruction with ``instruction_for(task)``.
    Retrieval tasks share forward passes between strategies (:func:`evaluate_retrieval_strategies`, which with
    ``measure_speed`` also measures each strategy's texts/s when they read different layers). Each result records
    the strategy, its label and the backend and precision that ran it (``extra["runtime"]``), which name its folder
    (:func:`~lmembed.evaluation.results.strategy_dir_name`).
    """
    results: list[StrategyResult] = []
    runtime = runtime_record(embedder)
    for task in tasks:
        if instruction_for is not None:
            task = task.with_instruction(instruction_for(task))
        if isinstance(task, RetrievalTask):
            batch = evaluate_retrieval_strategies(
                embedder, task, configs, batch_size=batch_size, measure_speed=measure_speed
            )
        else:
            batch = []
            for cfg in configs:
                result = task.evaluate(embedder.with_config(cfg), batch_size=batch_size)
                record_strategy(result, cfg.to_dict(), cfg.label(), runtime)
                result.model_name = result.model_name or embedder.name
                batch.append(StrategyResult(cfg, result))
        for item in batch:
            if on_result:
                on_result(item)
        results.extend(batch)
    return results


def results_table(results: Sequence[StrategyResult], metrics: Sequence[str] = ("ndcg_at_10",)) -> str:
    """Markdown table sorted by main score (best first); ``metrics`` are shown where a task has them, and a
    ``texts/s`` column where results carry a measured speed (a grid over layers). A strategy is labelled as the
    report labels it (with the backend and precision where they are not torch at float32)."""
    rows = sorted(results, key=lambda r: -r.result.main_score)
    speeds = any("texts_per_s" in r.result.extra for r in rows)
    header = ["model", "strategy", "task", "main metric", "score", *metrics, *(["texts/s"] if speeds else []), "eval s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for item in rows:
        res = item.result
        cells = [
            res.model_name,
            strategy_label(res) if isinstance(res.extra.get("strategy_label"), str) else item.config.label(),
            res.task_name,
            res.main_metric,
            f"{100 * res.main_score:.2f}",
            *(f"{100 * res.scores[m]:.2f}" if m in res.scores else "-" for m in metrics),
            *([f"{res.extra['texts_per_s']:.1f}" if "texts_per_s" in res.extra else "-"] if speeds else []),
            f"{res.evaluation_time:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_all(results: Sequence[StrategyResult], output: Path) -> list[Path]:
    """Write every result under ``output`` in MTEB's results layout; return the files."""
    return [write_result(item.result, output) for item in results]
