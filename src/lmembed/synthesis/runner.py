"""Running a synthesis recipe: work cut into shards, each landing atomically, so a rerun does only the rest.

Layout beside the output file ``OUT.jsonl``::

    OUT.jsonl.parts/plan.json          what the run was asked (recipe digest, generator, seed, items)
    OUT.jsonl.parts/stage-*.json       a recipe's earlier stage (E5-mistral's brainstormed tasks)
    OUT.jsonl.parts/shard-00000.jsonl  the rows of one finished shard, with shard-00000.stats.json
    OUT.jsonl.parts/progress.log       one line per shard: rows/s, acceptance rate, ETA
    OUT.jsonl                          every shard's rows, written once all are done
    OUT.jsonl.stats.json               totals: rows, rejections by reason, repairs, usage, rows/s

A rerun with the same recipe, seed and inputs skips the finished shards; a different plan is refused rather
than mixed in.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.errors import ConfigError
from lmembed.synthesis.generators import Generator
from lmembed.synthesis.recipes import Recipe

log = logging.getLogger(__name__)

#: ``encode(texts, side)`` with side ``"query"`` or ``"document"``: L2-normalised embeddings
Encode = Callable[[Sequence[str], str], np.ndarray]


class PlanMismatch(ConfigError):
    """The output's folder of shards was made by a different recipe, generator, seed or input."""


@dataclass
class Context:
    """What a recipe's stages are given."""

    recipe: Recipe
    generator: Generator
    parts: Path
    seed: int = 0
    corpus_ids: list[str] = field(default_factory=list)
    corpus_texts: list[str] = field(default_factory=list)
    encode: Encode | None = None
    notes: list[str] = field(default_factory=list)

    def provenance(self, **extra: Any) -> dict[str, Any]:
        return {"generator": self.generator.name, **self.recipe.provenance(), "seed": self.seed, **extra}


@dataclass
class ShardResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    repaired: int = 0
    attempted: int = 0
    #: the first rejected answer of each reason (cut to 300 characters), to see what the generator wrote
    samples: dict[str, str] = field(default_factory=dict)

    def reject(self, reason: str, answer: str) -> None:
        self.rejected[reason] += 1
        self.samples.setdefault(reason, answer[:300])

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows),
            "attempted": self.attempted,
            "rejected": dict(self.rejected),
            "repaired": self.repaired,
            "samples": self.samples,
        }


class RecipeRunner(Protocol):
    def plan(self, context: Context) -> list[dict[str, Any]]:
        """The work items (JSON values), in a fixed order; may run and cache an earlier stage."""
        ...

    def run(self, items: Sequence[dict[str, Any]], context: Context) -> ShardResult: ...


@dataclass
class Progress:
    """Per-shard progress: rows/s, acceptance rate and ETA, logged and appended to ``progress.log``."""

    total_shards: int
    log_file: Path
    echo: Callable[[str], None] | None = None
    started: float = field(default_factory=time.perf_counter)
    done_now: int = 0
    rows: int = 0
    attempted: int = 0

    def shard(self, index: int, result: ShardResult, remaining: int) -> None:
        self.done_now += 1
        self.rows += len(result.rows)
        self.attempted += result.attempted
        elapsed = time.perf_counter() - self.started
        rate = self.rows / elapsed if elapsed else 0.0
        accept = self.rows / self.attempted if self.attempted else 0.0
        eta = elapsed / self.done_now * remaining
        line = (
            f"shard {index + 1}/{self.total_shards}: {len(result.rows)} rows, {rate:.2f} rows/s, "
            f"acceptance {accept:.0%}, ETA {eta:.0f}s, rejected {dict(result.rejected) or 0}"
        )
        with self.log_file.open("a") as handle:
            handle.write(time.strftime("%H:%M:%S ") + line + "\n")
        log.info(line)
        if self.echo:
            self.echo(line)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def run_shards(
    runner: RecipeRunner,
    context: Context,
    output: Path,
    *,
    shard_size: int = 32,
    limit: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Plan the work, generate the shards not yet on disk, then write the output and its stats."""
    parts = context.parts
    parts.mkdir(parents=True, exist_ok=True)
    items = runner.plan(context)
    if limit is not None:
        items = items[:limit]
    _check_plan(parts / "plan.json", context, items, shard_size)
    shards = [items[i : i + shard_size] for i in range(0, len(items), shard_size)]
    todo = [i for i in range(len(shards)) if not (parts / f"{shard_name(i)}.stats.json").exists()]
    progress = Progress(len(shards), parts / "progress.log", echo)
    if echo and len(todo) < len(shards):
        echo(f"resuming: {len(shards) - len(todo)} of {len(shards)} shards already done")
    started = time.perf_counter()
    for n, index in enumerate(todo):
        result = runner.run(shards[index], context)
        name = shard_name(index)
        atomic_write_text(
            parts / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in result.rows)
        )
        atomic_write_json(parts / f"{name}.stats.json", result.to_dict())  # the shard counts as done from here
        progress.shard(index, result, len(todo) - n - 1)
    seconds = time.perf_counter() - started
    return _finish(output, parts, len(shards), context, len(todo), seconds, progress.rows)


def _check_plan(path: Path, context: Context, items: list[dict[str, Any]], shard_size: int) -> None:
    plan = {
        "recipe": context.recipe.provenance(),
        "generator": context.generator.name,
        "seed": context.seed,
        "shard_size": shard_size,
        "items": len(items),
        "first_items": items[:3],
    }
    if path.exists():
        old = json.loads(path.read_text())
        if old != json.loads(json.dumps(plan)):
            changed = sorted(k for k in plan if old.get(k) != json.loads(json.dumps(plan[k])))
            raise PlanMismatch(
                f"{path}: this folder holds shards of a different run (changed: {', '.join(changed)}); "
                "remove it or write to another output"
            )
    else:
        atomic_write_json(path, plan)


def _finish(
    output: Path, parts: Path, n_shards: int, context: Context, generated: int, seconds: float, new_rows: int
) -> dict[str, Any]:
    lines: list[str] = []
    totals = ShardResult()
    for index in range(n_shards):
        name = shard_name(index)
        stats = json.loads((parts / f"{name}.stats.json").read_text())
        totals.attempted += stats["attempted"]
        totals.repaired += stats["repaired"]
        totals.rejected.update(stats["rejected"])
        for reason, sample in stats.get("samples", {}).items():
            totals.samples.setdefault(reason, sample)
        lines.append((parts / f"{name}.jsonl").read_text())
    text = "".join(lines)
    atomic_write_text(output, text)
    rows = text.count("\n")
    stats = {
        "output": str(output),
        "rows": rows,
        "attempted": totals.attempted,
        "acceptance": rows / totals.attempted if totals.attempted else 0.0,
        "rejected": dict(totals.rejected),
        "repaired": totals.repaired,
        "rejected_samples": totals.samples,
        "shards": n_shards,
        "shards_generated_now": generated,
        "rows_generated_now": new_rows,
        "seconds_now": round(seconds, 3),
        "rows_per_second_now": round(new_rows / seconds, 3) if seconds > 0 else None,
        "generator": context.generator.name,
        "usage_now": context.generator.usage.to_dict(),
        "recipe": context.recipe.provenance(),
        "notes": context.notes,
    }
    atomic_write_json(output.with_name(output.name + ".stats.json"), stats)
    return stats
