"""A training recipe's data preparation: each ``prepare`` step turned into one JSONL file of training rows.

A step converts a dataset (``beir``, ``classification``, ``clustering``, ``sts``, ``pairs``, ``rows``) or
generates rows with an LLM (``synthesize``), then optionally re-mines hard negatives with a teacher; the file is
stamped with a digest of its step and reused while the step is unchanged (see :mod:`lmembed.training.recipes`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.atomic import atomic_write_text
from lmembed.datasets import resolve_local
from lmembed.errors import LmembedError
from lmembed.io import read_json, sha256_file
from lmembed.mining import MiningStats, load_corpus, mine_hard_negatives, read_rows, read_training_rows, write_rows
from lmembed.paths import inside
from lmembed.training import converters as conv
from lmembed.training.recipe_schema import RecipeError

log = logging.getLogger(__name__)


def resolve_input(spec: str) -> Path:
    """An existing path, or a dataset name / relative path found by :mod:`lmembed.datasets`."""
    try:
        return resolve_local(spec)
    except Exception as exc:
        raise RecipeError(f"input {spec!r} is neither a path nor a dataset lmembed can find locally") from exc


def resolve_data(data: Sequence[Any]) -> list[Any]:
    """Data-source paths made concrete: existing paths stay, dataset names / shared paths resolve (a plain
    string, or the ``path`` of a source given as a mapping)."""
    out = []
    for item in data:
        if isinstance(item, str):
            item = str(resolve_input(item))
        elif isinstance(item, dict) and isinstance(item.get("path"), str):
            item = {**item, "path": str(resolve_input(item["path"]))}
        out.append(item)
    return out


# ---------------------------------------------------------------------------------------------- prepare
def _spec_hash(step: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(step, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _input_digest(path: Path | None) -> str | None:
    """The content of a prepare step's input (a file, or every file of a folder by name): data edited in place is
    prepared again, not reused because its path is unchanged."""
    if path is None:
        return None
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}\0{sha256_file(file)}\0".encode())
    return digest.hexdigest()


def _stamp_hash(stamp: Path) -> str | None:
    """The digest a prepared file's stamp records; ``None`` for a stamp that is damaged (the step runs again)."""
    try:
        recorded = read_json(stamp, what="prepare stamp").get("hash")
    except ValueError as exc:
        log.warning("%s; preparing the data again", exc)
        return None
    return recorded if isinstance(recorded, str) else None


_TEACHERS: dict[str, Any] = {}


def _teacher(name: str, options: Mapping[str, Any]) -> Any:
    """Load (once per process) the mining teacher, with the embedding cache on."""
    key = json.dumps([name, dict(options)], sort_keys=True)
    if key not in _TEACHERS:
        from lmembed.embedder import Embedder  # lazy: keeps `lmembed --help` free of torch

        _TEACHERS.clear()  # keep at most one teacher in memory
        _TEACHERS[key] = Embedder.from_pretrained(name, show_progress=False, **options)
    return _TEACHERS[key]


def _convert(step: dict[str, Any], path: Path, teacher: Any | None) -> list[dict[str, Any]]:
    """Rows for one prepare step, before any separate mining."""
    kind, options = step["kind"], dict(step.get("options") or {})
    common = {"max_rows": step.get("max_rows"), "seed": int(step.get("seed", 0))}
    instruction, task = step.get("instruction"), step.get("task") or step["name"]
    if kind == "beir":
        return conv.beir_rows(path, step.get("split", "train"), instruction=instruction, task=task, **common, **options)
    if kind == "classification":
        return conv.classification_rows(path, instruction=instruction, task=task, **common, **options)
    if kind == "clustering":
        return conv.clustering_rows(path, instruction=instruction, task=task, **common, **options)
    if kind == "sts":
        mine = dict(step.get("mine") or {})
        for key in ("teacher", "teacher_options", "corpus"):
            mine.pop(key, None)
        k = int(mine.pop("k", 7))
        if "max_corpus" in mine:
            options.setdefault("pool_size", int(mine.pop("max_corpus")))
        return conv.sts_rows(
            path,
            instruction=conv.STS_INSTRUCTION if instruction is None else instruction,  # "": none
            task=task,
            teacher=teacher,
            num_negatives=k,
            mining=mine,
            **common,
            **options,
        )
    if kind == "pairs":
        return conv.pair_rows(path, instruction=instruction, task=task, **common, **options)
    rows = read_training_rows(path) if teacher is not None else read_rows(path)  # to mine: each row's line checked
    return rows[: common["max_rows"]] if common["max_rows"] else rows


def _mine(step: dict[str, Any], rows: list[dict[str, Any]], path: Path, teacher: Any) -> list[dict[str, Any]]:
    options = dict(step["mine"])
    for key in ("teacher", "teacher_options"):
        options.pop(key, None)
    corpus_spec = options.pop("corpus", None)
    max_corpus = options.pop("max_corpus", None)
    if corpus_spec:
        corpus = load_corpus(resolve_input(corpus_spec))
    elif step["kind"] == "beir":
        corpus = load_corpus(path)
    else:
        corpus = None
    if corpus is not None and max_corpus is not None:
        corpus = _shrink_corpus(corpus, rows, int(max_corpus), int(step.get("seed", 0)))
    stats = MiningStats()
    mined = mine_hard_negatives(teacher, rows, corpus, stats=stats, **options)
    log.info("mined %s: %s", step["name"], stats.to_dict())
    return mined


def _shrink_corpus(corpus: list[str], rows: list[dict[str, Any]], size: int, seed: int) -> list[str]:
    """The rows' positives plus random other documents, ``size`` in all (at least the positives)."""
    positives = list(dict.fromkeys(p for r in rows for p in _as_list(r.get("positive"))))
    taken = set(positives)
    others = [t for t in dict.fromkeys(corpus) if t not in taken]
    room = max(0, size - len(positives))
    if len(others) > room:
        keep = np.sort(np.random.default_rng(seed).choice(len(others), size=room, replace=False))
        others = [others[int(i)] for i in keep]
    return positives + others


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _synthesize(step: dict[str, Any], corpus: Path | None, target: Path) -> list[dict[str, Any]]:
    """Rows of a ``synthesize`` step, generated (or resumed) into ``target``'s ``.synth.jsonl`` beside it."""
    # lazy: the synthesis runners load transformers or httpx, which the other prepare kinds never need
    from lmembed.synthesis.generators import Budget, build_generator
    from lmembed.synthesis.retrieval import embedder_encode
    from lmembed.synthesis.synthesize import read_passages, synthesize

    options = dict(step.get("options") or {})
    budget = Budget(options.pop("max_requests", None), options.pop("max_tokens", None))
    generator = build_generator(step["generator"], budget=budget, **options)
    passages = read_passages(corpus, step.get("corpus_limit")) if corpus is not None else None
    embedder = step.get("embedder")
    encode = embedder_encode(_teacher(embedder, step.get("embedder_options") or {})) if embedder else None
    caps = [int(v) for v in (step.get("limit"), step.get("max_rows")) if v is not None]
    synthesized = target.with_name(target.name.removesuffix(".jsonl") + ".synth.jsonl")
    try:
        stats = synthesize(
            step["recipe"],
            generator,
            synthesized,
            corpus=passages,
            encode=encode,
            seed=int(step.get("seed", 0)),
            shard_size=int(step.get("shard_size", 32)),
            limit=min(caps) if caps else None,
            echo=log.info,
        )
    except LmembedError as exc:
        raise RecipeError(f"prepare step {step['name']!r}: {exc}") from exc
    finally:
        close = getattr(generator, "close", None)  # an endpoint generator holds an HTTP client
        if close is not None:
            close()
    log.info(
        "synthesized %s: %d rows (%.0f%% of %d accepted, rejected %s)%s",
        step["name"],
        stats["rows"],
        100 * stats["acceptance"],
        stats["attempted"],
        stats["rejected"] or "none",
        "".join(f"; note: {note}" for note in stats["notes"]),
    )
    rows = read_rows(synthesized)
    return rows[: int(step["max_rows"])] if step.get("max_rows") else rows


def prepared_file(step: Mapping[str, Any], output: Path, source: str = "recipe") -> Path:
    """Where a prepare step writes its rows: ``<output>/data/NAME.jsonl``, or its ``output`` (a path inside
    ``<output>/data``); one that leaves the folder is refused naming ``source`` and the field."""
    data = output / "data"
    named = inside(data, f"{step['name']}.jsonl", file=source, field="prepare.name", error=RecipeError)
    chosen = step.get("output")
    if not chosen:
        return named
    if not isinstance(chosen, str):
        raise RecipeError(f"{source}: prepare.output={chosen!r} must be a file name inside {data}")
    return inside(data, chosen, file=source, field="prepare.output", error=RecipeError)


def prepare_data(step: dict[str, Any], output: Path, source: str = "recipe") -> Path:
    """Run one prepare step; reuses the file when it was written from the same step before."""
    # name and output are files of <output>/data: checked when the recipe is read, and here (links, code-built)
    target = prepared_file(step, output, source)
    stamp = target.with_name(target.name + ".recipe.json")
    path = resolve_input(str(step["input"])) if "input" in step else None
    digest = _spec_hash({**step, "input content": _input_digest(path)})
    if target.exists() and stamp.exists() and _stamp_hash(stamp) == digest:
        log.info("prepared data %s is up to date", target)
        return target
    mine = step.get("mine")
    teacher = _teacher(mine["teacher"], mine.get("teacher_options") or {}) if isinstance(mine, dict) else None
    if step["kind"] == "synthesize":
        rows = _synthesize(step, path, target)
    else:
        assert path is not None  # every other kind needs an input (_check_prepare)
        rows = _convert(step, path, teacher)
    if teacher is not None and step["kind"] != "sts":
        rows = _mine(step, rows, path, teacher)
    if not rows:
        raise RecipeError(f"prepare step {step['name']!r} produced no rows")
    write_rows(rows, target)
    atomic_write_text(stamp, json.dumps({"hash": digest, "rows": len(rows), "step": step}, default=str, indent=2))
    return target


__all__ = ["prepare_data", "prepared_file", "resolve_data", "resolve_input"]
