"""Synthetic long-document retrieval, built like LongEmbed's passkey and needle tasks, generated here (no download),
and a length-generalisation grid over ``max_length``.

* :func:`passkey_retrieval`: every document is filler text of about ``words`` words with one sentence giving a
  person's pass key hidden at a depth; the query asks for that person's pass key, and only their document is
  relevant. A model that truncates before the sentence cannot find it.
* :func:`needle_retrieval`: every document is filler with one distinct fact (the needle) at a depth; the query
  asks about that fact.

* :func:`concatenate_documents`: a real retrieval split made long: its documents joined in groups of ``per_doc``
  (shuffled), each query's judgments carried over to the groups holding its judged documents (best grade kept).

Each can be named where a task is (``lmembed eval --data``, an experiment's ``evaluate.tasks``; see
:func:`parse_long_task`): ``passkey:24x600`` (24 documents of about 600 words), ``needle:24x600``, and
``concat:scifact:4`` (SciFact's test split with its documents joined 4 at a time; any retrieval task name or
BEIR folder before the last ``:``).

All are deterministic functions of their arguments (``random.Random(seed)``): the same call gives the same texts,
ids and depths, so scores at different lengths compare. :func:`length_grid` scores one task at each of a list of
``max_length`` values (and optional chunkings): how a model trained at a short length does on longer inputs.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from lmembed.encoding.chunking import Chunking
from lmembed.errors import ConfigError
from lmembed.evaluation.base import TaskResult
from lmembed.evaluation.retrieval_data import RetrievalData
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.protocols import ENCODE_BATCH_SIZE

FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The river runs to the sea.",
)
NAMES = ("Ada", "Bruno", "Chloe", "Dmitri", "Esme", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemal", "Lena")
THINGS = (
    "lantern", "violin", "compass", "teapot", "bicycle", "telescope", "umbrella", "kite", "anchor", "clock",
    "saddle", "trumpet", "globe", "hammock", "canoe", "chessboard", "microscope", "accordion", "sled", "typewriter",
    "harp", "wheelbarrow", "kettle", "easel",
)  # fmt: skip
COLOURS = ("red", "orange", "purple", "silver", "golden", "turquoise", "crimson", "ivory")
PLACES = ("attic", "garden", "cellar", "library", "harbour", "kitchen", "tower", "barn")


def _filler(rng: random.Random, words: int) -> list[str]:
    sentences: list[str] = []
    count = 0
    while count < words:
        sentence = rng.choice(FILLER)
        sentences.append(sentence)
        count += len(sentence.split())
    return sentences


def _hide(rng: random.Random, words: int, sentence: str) -> tuple[str, float]:
    """Filler of about ``words`` words with ``sentence`` at a random depth; the text and the depth (0 to 1)."""
    body = _filler(rng, max(words - len(sentence.split()), 1))
    at = rng.randint(0, len(body))
    body.insert(at, sentence)
    return " ".join(body), at / max(len(body) - 1, 1)


def _check(num_docs: int, words: int, limit: int, what: str) -> None:
    if not 1 <= num_docs <= limit:
        raise ConfigError(f"{what}: num_docs={num_docs} must be from 1 to {limit}")
    if words < 8:
        raise ConfigError(f"{what}: words={words} must be at least 8")


def _data(name: str, docs: list[str], queries: list[str]) -> RetrievalData:
    ids = [f"d{i}" for i in range(len(docs))]
    qids = [f"q{i}" for i in range(len(queries))]
    return RetrievalData(
        name=name,
        split="test",
        corpus_ids=ids,
        corpus_texts=docs,
        query_ids=qids,
        query_texts=queries,
        qrels={q: {d: 1} for q, d in zip(qids, ids, strict=True)},
    )


def passkey_retrieval(num_docs: int = 10, words: int = 400, seed: int = 0) -> RetrievalData:
    """``num_docs`` documents of about ``words`` words, one pass key each; query ``i`` asks for document ``i``'s."""
    _check(num_docs, words, len(NAMES) * 10, "passkey_retrieval")
    rng = random.Random(seed)
    docs, queries = [], []
    for i in range(num_docs):
        name = f"{NAMES[i % len(NAMES)]} {i // len(NAMES) + 1}" if num_docs > len(NAMES) else NAMES[i]
        key = rng.randint(10000, 99999)
        text, _ = _hide(rng, words, f"The pass key of {name} is {key}. Remember it: {key} is {name}'s pass key.")
        docs.append(text)
        queries.append(f"What is the pass key of {name}?")
    return _data(f"Passkey[{num_docs}x{words}w]", docs, queries)


def needle_retrieval(num_docs: int = 10, words: int = 400, seed: int = 0) -> RetrievalData:
    """``num_docs`` documents of about ``words`` words, one distinct fact (thing, colour, place) each."""
    facts = [(t, c, p) for t in THINGS for c in COLOURS for p in PLACES]
    _check(num_docs, words, len(THINGS), "needle_retrieval")
    rng = random.Random(seed)
    chosen = rng.sample(facts, len(facts))
    used: set[str] = set()
    docs, queries = [], []
    for thing, colour, place in chosen:
        if thing in used:  # one fact per thing, so each query has a single answer
            continue
        used.add(thing)
        text, _ = _hide(rng, words, f"The {colour} {thing} was left in the {place}.")
        docs.append(text)
        queries.append(f"Where was the {colour} {thing} left?")
        if len(docs) == num_docs:
            break
    return _data(f"Needle[{num_docs}x{words}w]", docs, queries)


def concatenate_documents(data: RetrievalData, per_doc: int, seed: int = 0) -> RetrievalData:
    """``data`` with its documents shuffled (``random.Random(seed)``) and joined ``per_doc`` at a time (blank line
    between), ids ``cat0, cat1 ...``; a query's judgment of a document becomes its judgment of that document's
    group (the best grade where it judged several in one group)."""
    if per_doc < 1:
        raise ConfigError(f"concatenate_documents: per_doc={per_doc} must be >= 1")
    order = list(range(len(data.corpus_ids)))
    random.Random(seed).shuffle(order)
    groups = [order[i : i + per_doc] for i in range(0, len(order), per_doc)]
    ids = [f"cat{g}" for g in range(len(groups))]
    owner = {data.corpus_ids[i]: ids[g] for g, rows in enumerate(groups) for i in rows}
    qrels: dict[str, dict[str, int]] = {}
    for query, judged in data.qrels.items():
        merged: dict[str, int] = {}
        for doc, grade in judged.items():
            if doc in owner:
                merged[owner[doc]] = max(merged.get(owner[doc], grade), grade)
        qrels[query] = merged
    texts = ["\n\n".join(data.corpus_texts[i] for i in rows) for rows in groups]
    return dataclasses.replace(
        data, name=f"{data.name}[x{per_doc}]", corpus_ids=ids, corpus_texts=texts, qrels=qrels, files=[]
    )


#: The prefixes of a long task's name (:func:`parse_long_task`).
LONG_TASK_PREFIXES = ("passkey:", "needle:", "concat:")


@dataclasses.dataclass(frozen=True)
class LongTaskName:
    """A long task's name taken apart: ``kind`` (passkey, needle, concat), the synthetic tasks' ``num_docs`` and
    ``words``, or the concatenated task's ``source`` (a task name or folder) and ``per_doc``."""

    kind: str
    num_docs: int = 0
    words: int = 0
    source: str = ""
    per_doc: int = 0


def is_long_task(name: str) -> bool:
    """True when ``name`` names a long task (starts with ``passkey:``, ``needle:`` or ``concat:``)."""
    return str(name).startswith(LONG_TASK_PREFIXES)


def parse_long_task(name: str) -> LongTaskName:
    """``passkey:24x600`` / ``needle:24x600`` (documents x words) or ``concat:SOURCE:K`` (SOURCE's documents
    joined K at a time); a malformed name is a :class:`ConfigError` that shows the expected form."""
    kind, _, rest = str(name).partition(":")
    if kind in ("passkey", "needle"):
        docs, sep, words = rest.partition("x")
        if not sep or not docs.isdigit() or not words.isdigit():
            raise ConfigError(f"task {name!r}: expected {kind}:DOCSxWORDS, e.g. {kind}:24x600")
        return LongTaskName(kind, num_docs=int(docs), words=int(words))
    if kind == "concat":
        source, sep, per_doc = rest.rpartition(":")
        if not sep or not source or not per_doc.isdigit():
            raise ConfigError(
                f"task {name!r}: expected concat:TASK:K (TASK a retrieval task or BEIR folder), e.g. concat:scifact:4"
            )
        return LongTaskName(kind, source=source, per_doc=int(per_doc))
    raise ConfigError(f"task {name!r}: a long task starts with {', '.join(LONG_TASK_PREFIXES)}")


def synthetic_task(name: LongTaskName, seed: int = 0) -> RetrievalTask:
    """The passkey or needle task ``name`` describes (not ``concat``, which needs its source task loaded)."""
    build = {"passkey": passkey_retrieval, "needle": needle_retrieval}.get(name.kind)
    if build is None:
        raise ConfigError(f"{name.kind!r} is not a synthetic task (passkey, needle)")
    return RetrievalTask(build(num_docs=name.num_docs, words=name.words, seed=seed))


def concatenated_task(task: RetrievalTask, per_doc: int, seed: int = 0) -> RetrievalTask:
    """``task`` on :func:`concatenate_documents` of its data (same instruction and settings), named ``NAME[xK]``;
    it claims no MTEB dataset revision, since its scores are not MTEB's."""
    data = concatenate_documents(task.data, per_doc, seed=seed)
    return dataclasses.replace(
        task,
        data=data,
        name=data.name,
        mteb_dataset_revision=None,
        dataset_revision=f"{task.dataset_revision}+x{per_doc}",
    )


def length_grid(
    embedder: Any,
    task: RetrievalTask,
    max_lengths: Sequence[int],
    *,
    chunking: Chunking | None = None,
    batch_size: int = ENCODE_BATCH_SIZE,
) -> list[tuple[int, TaskResult]]:
    """``task`` scored by ``embedder`` (an lmembed Embedder) read at each of ``max_lengths`` (documents and queries
    truncated there, or with ``chunking`` cut into its windows): ``[(max_length, result), ...]``."""
    out = []
    for length in max_lengths:
        reader = embedder.with_config(embedder.config.with_options(max_length=int(length)))
        result = dataclasses.replace(task, chunking=chunking).evaluate(reader, batch_size=batch_size)
        result.extra["max_length"] = int(length)
        out.append((int(length), result))
    return out
