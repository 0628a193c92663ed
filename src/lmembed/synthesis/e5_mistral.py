"""E5-mistral's recipe (Wang et al. 2024): brainstorm task definitions per task family, then one JSON example
(query, positive, hard negative) per task and draw of the knobs (query length, clarity, difficulty, document
length, language). The prompts and knobs live in the recipe file (``recipes/synthesis/e5-mistral.yaml``)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from lmembed.schema import first_problem
from lmembed.synthesis.generators import Request
from lmembed.synthesis.parsing import parse_object, parse_string_list
from lmembed.synthesis.recipes import render
from lmembed.synthesis.runner import Context, ShardError, ShardResult, read_stage, write_stage

STAGE_FILE = "stage-brainstorm.json"


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:4], "big")


class _Brainstorm(BaseModel):
    """``stage-brainstorm.json``: the tasks brainstormed per family, and what the generator's answers lost."""

    model_config = ConfigDict(extra="forbid")
    tasks: dict[str, list[str]]
    rejected: dict[str, int]
    samples: dict[str, str]


class E5MistralRunner:
    """The two steps; the brainstorm's tasks are kept in ``stage-brainstorm.json`` so a rerun reuses them."""

    def brainstorm(self, context: Context) -> dict[str, Any]:
        kept = read_stage(context.parts, STAGE_FILE)
        if kept is not None:  # its digest matched: its shape is checked too, before a task of it is used
            try:
                return _Brainstorm.model_validate_json(kept).model_dump()
            except ValidationError as exc:
                where = context.parts / STAGE_FILE
                raise ShardError(
                    f"{where}: {first_problem(exc)} (not a brainstorm stage as lmembed writes it)"
                ) from exc
        recipe = context.recipe
        families = recipe.data["families"]
        requests = [
            Request(
                ({"role": "user", "content": render(spec["brainstorm"])},),
                json_list=True,
                max_new_tokens=int(recipe.get("max_new_tokens", 384)),
                temperature=float(recipe.get("temperature", 1.0)),
                seed=_seed(context.seed, family),
            )
            for family, spec in families.items()
        ]
        rejected: Counter = Counter()
        samples: dict[str, str] = {}
        tasks: dict[str, list[str]] = {}
        for family, answer in zip(families, context.generator.generate(requests), strict=True):
            parsed = parse_string_list(answer)
            if not parsed.ok:
                rejected[parsed.reason] += 1
                samples.setdefault(parsed.reason, answer[:300])
            tasks[family] = (parsed.value or [])[: int(recipe.get("tasks_per_family", 4))]
        stage = {"tasks": tasks, "rejected": dict(rejected), "samples": samples}
        write_stage(context.parts, STAGE_FILE, json.dumps(stage, indent=2, ensure_ascii=False).encode("utf-8"))
        return stage

    def plan(self, context: Context) -> list[dict[str, Any]]:
        stage = self.brainstorm(context)
        for family, tasks in stage["tasks"].items():
            if not tasks:
                context.notes.append(f"family {family}: the brainstorm gave no usable task; no examples")
        if stage["rejected"]:
            context.notes.append(f"brainstorm answers rejected: {stage['rejected']} (samples in {STAGE_FILE})")
        knobs = context.recipe.data["knobs"]
        per_task = int(context.recipe.get("examples_per_task", 1))
        items = []
        for family, tasks in stage["tasks"].items():
            for t, task in enumerate(tasks):
                for j in range(per_task):
                    rng = random.Random(_seed(context.seed, family, t, j))
                    drawn = {name: rng.choice(list(values)) for name, values in knobs.items()}
                    items.append({"id": f"{family}/{t}/{j}", "family": family, "task": task, "knobs": drawn})
        return items

    def run(self, items: Sequence[dict[str, Any]], context: Context) -> ShardResult:
        recipe = context.recipe
        families = recipe.data["families"]
        requests = [
            Request(
                ({"role": "user", "content": render(families[i["family"]]["generate"], task=i["task"], **i["knobs"])},),
                json_keys=tuple(families[i["family"]]["keys"]),
                max_new_tokens=int(recipe.get("max_new_tokens", 384)),
                temperature=float(recipe.get("temperature", 1.0)),
                seed=_seed(context.seed, i["id"]),
            )
            for i in items
        ]
        result = ShardResult(attempted=len(items))
        for item, answer in zip(items, context.generator.generate(requests), strict=True):
            spec = families[item["family"]]
            parsed = parse_object(answer, tuple(spec["keys"]))
            if not parsed.ok:
                result.reject(parsed.reason, answer)
                continue
            result.repaired += parsed.repaired
            value, mapping = parsed.value, spec["row"]
            if value[mapping["query"]] == value[mapping["positive"]]:
                result.reject("positive_repeats_query", answer)
                continue
            if mapping.get("negative") and value[mapping["negative"]] == value[mapping["positive"]]:
                result.reject("negative_repeats_positive", answer)  # a false negative of itself
                continue
            result.rows.append(
                {
                    "query": value[mapping["query"]],
                    "positive": value[mapping["positive"]],
                    "negatives": [value[mapping["negative"]]] if mapping.get("negative") else [],
                    "instruction": item["task"],
                    "task": item["family"],
                    "symmetric": bool(spec.get("symmetric", False)),
                    "provenance": context.provenance(
                        prompt=f"families.{item['family']}.generate",
                        item=item["id"],
                        knobs=item["knobs"],
                        repaired=parsed.repaired,
                    ),
                }
            )
        return result
