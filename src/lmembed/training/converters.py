"""Turn labelled datasets into contrastive training rows (NV-Embed's stage-2 data), and batch by task.

Every converter returns rows in the trainer's JSON-lines format::

    {"query": str, "positive": str, "negatives": [str, ...], "instruction": str, "task": str}

How each kind of data becomes rows, following NV-Embed (Lee et al., 2024, section 4.2):

* **retrieval** (:func:`beir_rows`): one row per judged query, its relevant documents as positives.
* **multi-class classification and clustering**, *example-based* (the paper's choice): the positive is
  another example of the same class, the negatives are examples of other classes.
* **classification**, *label-based*: the label text itself is the document; other labels are the
  negatives. Binary tasks always use label texts (``mode="auto"``).
* **STS** (:func:`sts_rows`): a pair scored at least 4 becomes two rows, one per direction. The data is
  symmetric, so the instruction belongs on both sides: rows carry ``"symmetric": true`` (and the same
  text under ``document_instruction``) so that a trainer can instruct positives and negatives too. Hard
  negatives are mined from the other sentences with a teacher (:mod:`lmembed.mining`) when one is
  given, else drawn at random.
* **pairs / triplets** (:func:`pair_rows`): ``anchor``/``positive``/``negative`` files such as NLI.

Batching: the trainer's :class:`~lmembed.training.rows.MixtureSampler` already samples datasets
uniformly and blends them row by row (NV-Embed's choice). :class:`~lmembed.training.rows.TaskHomogeneousSampler` is the
alternative (SFR-Embedding's): every batch comes from one dataset, picked with the same mixture
weights, so in-batch negatives always share a task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.errors import ConfigError
from lmembed.evaluation.retrieval_data import load_beir
from lmembed.io import DataFormatError, iter_jsonl
from lmembed.mining import mine_hard_negatives, read_rows, write_rows
from lmembed.task_registry import STS_INSTRUCTION
from lmembed.training.rows import TrainingDataError

CLASSIFICATION_MODES = ("auto", "example", "label")

__all__ = [
    "CLASSIFICATION_MODES",
    "STS_INSTRUCTION",
    "beir_rows",
    "classification_rows",
    "clustering_rows",
    "group_by_label",
    "label_text",
    "pair_rows",
    "read_rows",
    "sts_rows",
    "write_rows",
]


# ---------------------------------------------------------------------------------------------- helpers
def _load(source: str | Path | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows from a JSON-lines path or an iterable of mappings."""
    if isinstance(source, str | Path):
        return read_rows(source)
    return [dict(r) for r in source]


def _subsample(items: list[Any], max_rows: int | None, rng: np.random.Generator) -> list[Any]:
    if max_rows is None or len(items) <= max_rows:
        return items
    keep = np.sort(rng.choice(len(items), size=max_rows, replace=False))
    return [items[int(i)] for i in keep]


def label_text(value: Any) -> str:
    """A label as a readable document: ``card_arrival`` → ``card arrival``."""
    return str(value).replace("_", " ").strip()


def group_by_label(rows: Sequence[Mapping[str, Any]], text_key: str, label_key: str) -> dict[str, list[str]]:
    """``{label: [texts]}`` in first-seen order, empty texts dropped, duplicates kept once."""
    groups: dict[str, dict[str, None]] = {}
    for i, row in enumerate(rows):
        if text_key not in row or label_key not in row:
            raise TrainingDataError(f"row {i} lacks {text_key!r} or {label_key!r}: {dict(row)!r:.100}")
        text = str(row[text_key]).strip()
        if text:
            groups.setdefault(str(row[label_key]), {}).setdefault(text, None)
    return {label: list(texts) for label, texts in groups.items()}


def _row(query: str, positive: str, negatives: list[str], instruction: str | None, task: str | None) -> dict:
    row: dict[str, Any] = {"query": query, "positive": positive, "negatives": negatives}
    if instruction:
        row["instruction"] = instruction
    if task:
        row["task"] = task
    return row


# ---------------------------------------------------------------------------------------------- retrieval
def beir_rows(
    folder: str | Path,
    split: str = "train",
    *,
    instruction: str | None = None,
    min_score: int = 1,
    task: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per judged query of a BEIR folder; ``positive`` lists its relevant documents."""
    data = load_beir(folder, split)
    docs = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
    rows = []
    for query_id, text in zip(data.query_ids, data.query_texts, strict=True):
        relevant = [docs[d] for d, s in data.qrels.get(query_id, {}).items() if s >= min_score and docs.get(d)]
        if relevant and text.strip():
            row = {"query": text, "positive": relevant}
            if instruction:
                row["instruction"] = instruction
            row["task"] = task or data.name
            rows.append(row)
    return _subsample(rows, max_rows, np.random.default_rng(seed))


def pair_rows(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    instruction: str | None = None,
    task: str | None = None,
    query_key: str = "anchor",
    positive_key: str = "positive",
    negative_key: str = "negative",
    max_rows: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """(anchor, positive[, negative]) rows, e.g. NLI triplets, in the trainer's format. A row without a text
    anchor or positive is a :class:`TrainingDataError` naming the file and line (the row number for rows given
    in code)."""
    if isinstance(source, str | Path):
        try:
            items = list(iter_jsonl(source))
        except DataFormatError as exc:
            raise TrainingDataError(str(exc)) from exc
        where = str(source)
    else:
        items = [(i + 1, dict(r)) for i, r in enumerate(source)]
        where = "rows"
    rows = []
    for line, item in items:
        for key in (query_key, positive_key):
            value = item.get(key)
            texts = value if key == positive_key and isinstance(value, list) and value else [value]
            if not all(isinstance(t, str) for t in texts):
                raise TrainingDataError(
                    f"{where}:{line}: {key!r} must be a text (a pairs row holds {query_key!r}, {positive_key!r} "
                    f"and optionally {negative_key!r}); got {item.get(key)!r:.80}"
                )
        negative = item.get(negative_key)
        negatives = [negative] if isinstance(negative, str) else negative if negative is not None else []
        if not isinstance(negatives, list) or not all(isinstance(n, str) for n in negatives):
            raise TrainingDataError(f"{where}:{line}: {negative_key!r} must be a text or a list of texts")
        rows.append(_row(item[query_key], item[positive_key], list(negatives), instruction, task))
    return _subsample(rows, max_rows, np.random.default_rng(seed))


# ---------------------------------------------------------------------------------------------- classes
def _other_class_examples(groups: dict[str, list[str]], own: str, count: int, rng: np.random.Generator) -> list[str]:
    """``count`` texts from classes other than ``own``: a different class for each while they last."""
    others = [label for label in groups if label != own]
    if not others or count < 1:
        return []
    picked = []
    order = list(rng.permutation(len(others)))
    while len(picked) < count:
        for j in order:
            texts = groups[others[int(j)]]
            picked.append(texts[int(rng.integers(len(texts)))])
            if len(picked) == count:
                break
        order = list(rng.permutation(len(others)))
    return picked


def _queries(
    groups: dict[str, list[str]], max_rows: int | None, rng: np.random.Generator, min_class_size: int
) -> list[tuple[str, int]]:
    """``(label, index)`` of the examples used as queries: all of them, or a random ``max_rows``."""
    items = [(label, i) for label, texts in groups.items() if len(texts) >= min_class_size for i in range(len(texts))]
    return _subsample(items, max_rows, rng)


def _example_based(
    groups: dict[str, list[str]],
    queries: list[tuple[str, int]],
    *,
    instruction: str | None,
    task: str | None,
    num_negatives: int,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    rows = []
    for label, i in queries:
        texts = groups[label]
        j = int(rng.integers(len(texts) - 1))
        positive = texts[j + 1] if j >= i else texts[j]  # any example of the class but the query itself
        negatives = _other_class_examples(groups, label, num_negatives, rng)
        rows.append(_row(texts[i], positive, negatives, instruction, task))
    return rows


def _label_based(
    groups: dict[str, list[str]],
    queries: list[tuple[str, int]],
    *,
    instruction: str | None,
    task: str | None,
    num_negatives: int,
    rng: np.random.Generator,
    label_format: Callable[[Any], str],
) -> list[dict[str, Any]]:
    names = {label: label_format(label) for label in groups}
    rows = []
    for label, i in queries:
        others = [names[o] for o in groups if o != label]
        take = min(num_negatives, len(others))
        negatives = [others[int(k)] for k in rng.choice(len(others), size=take, replace=False)] if take else []
        rows.append(_row(groups[label][i], names[label], negatives, instruction, task))
    return rows


def classification_rows(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    instruction: str | None = None,
    mode: str = "auto",
    text_key: str = "text",
    label_key: str = "label_text",
    num_negatives: int = 7,
    task: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
    label_format: Callable[[Any], str] = label_text,
) -> list[dict[str, Any]]:
    """Rows from a classification dataset ``{text, label_text}``.

    ``mode="example"``: positive = another example of the class, negatives = examples of other classes.
    ``mode="label"``: positive = the label text, negatives = other label texts. ``mode="auto"`` uses
    label texts for binary tasks and examples otherwise (NV-Embed's rule). ``max_rows`` caps the number
    of rows (a random subset of the examples become queries; positives and negatives are still drawn
    from the whole dataset). In example mode, examples of single-example classes cannot be queries.
    """
    if mode not in CLASSIFICATION_MODES:
        raise ConfigError(f"mode={mode!r} is unknown; choose one of {', '.join(CLASSIFICATION_MODES)}")
    rng = np.random.default_rng(seed)
    groups = group_by_label(_load(source), text_key, label_key)
    if len(groups) < 2:
        raise TrainingDataError(f"classification data needs at least 2 classes, found {len(groups)}")
    if mode == "auto":
        mode = "label" if len(groups) == 2 else "example"
    queries = _queries(groups, max_rows, rng, 2 if mode == "example" else 1)
    common = {"instruction": instruction, "task": task, "num_negatives": num_negatives, "rng": rng}
    if mode == "label":
        return _label_based(groups, queries, label_format=label_format, **common)
    return _example_based(groups, queries, **common)


def clustering_rows(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    instruction: str | None = None,
    text_key: str = "text",
    label_key: str = "label",
    num_negatives: int = 7,
    task: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Example-based rows from clustered texts: same cluster = positive, other clusters = negatives."""
    return classification_rows(
        source,
        instruction=instruction,
        mode="example",
        text_key=text_key,
        label_key=label_key,
        num_negatives=num_negatives,
        task=task,
        max_rows=max_rows,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------- STS
def _sts_pairs(
    items: Sequence[Mapping[str, Any]], threshold: float, keys: tuple[str, str, str]
) -> list[tuple[str, str]]:
    first, second, score = keys
    pairs = []
    for item in items:
        a, b = str(item[first]).strip(), str(item[second]).strip()
        if a and b and a != b and float(item[score]) >= threshold:
            pairs.append((a, b))
    return pairs


def _random_negatives(rows: list[dict[str, Any]], pool: list[str], count: int, rng: np.random.Generator) -> None:
    for row in rows:
        banned = {row["query"], row["positive"]}
        chosen: list[str] = []
        for _ in range(50 * max(count, 1)):
            if len(chosen) == count or len(pool) <= len(banned):
                break
            text = pool[int(rng.integers(len(pool)))]
            if text not in banned and text not in chosen:
                chosen.append(text)
        row["negatives"] = chosen


def sts_rows(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    threshold: float = 4.0,
    instruction: str = STS_INSTRUCTION,
    teacher: Any | None = None,
    num_negatives: int = 7,
    mining: Mapping[str, Any] | None = None,
    task: str | None = "sts",
    keys: tuple[str, str, str] = ("sentence1", "sentence2", "score"),
    max_rows: int | None = None,
    pool_size: int | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Two rows (both directions) per STS pair scored ``>= threshold``, instructed on both sides.

    Negatives come from the dataset's other sentences: mined with ``teacher`` (``mining`` holds
    :func:`lmembed.mining.mine_hard_negatives` options, e.g. ``{"method": "perc_pos"}``) or, without a
    teacher, drawn at random. ``max_rows`` caps the number of pairs kept (before doubling);
    ``pool_size`` caps the candidate sentences (the kept pairs' own sentences plus random others).
    """
    rng = np.random.default_rng(seed)
    items = _load(source)
    pairs = _subsample(_sts_pairs(items, threshold, keys), max_rows, rng)
    pool = list(dict.fromkeys(str(item[k]).strip() for item in items for k in keys[:2]))
    if pool_size is not None and len(pool) > pool_size:
        own = list(dict.fromkeys(t for pair in pairs for t in pair))
        others = [t for t in pool if t not in set(own)]
        pool = own + _subsample(others, max(0, pool_size - len(own)), rng)
    rows = []
    for a, b in pairs:
        for query, positive in ((a, b), (b, a)):
            row = _row(query, positive, [], instruction, task)
            row["symmetric"] = True
            row["document_instruction"] = instruction
            rows.append(row)
    if teacher is not None and num_negatives:
        return mine_hard_negatives(teacher, rows, pool, k=num_negatives, **dict(mining or {}))
    _random_negatives(rows, pool, num_negatives, rng)
    return rows
