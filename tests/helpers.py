"""Plain helpers shared by test files in several folders (fixtures live in conftest.py).

tests/ is on ``sys.path`` while the suite runs (pytest puts conftest.py's folder there), so any test file
imports these as ``from helpers import write_jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def flat(output: str) -> str:
    """A command's output as one line: the frame rich draws around an error removed and its lines joined, so a
    message wrapped at the terminal's width (which depends on how long a temporary path is) reads whole."""
    return " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


def write_jsonl(path: Path, rows: list) -> Path:
    """Write ``rows`` one per line: dicts as JSON, strings as they are (to plant malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def save_tiny_cross_encoder(folder: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A tiny random BERT with a sequence-classification head (and the tiny tokenizer) saved in ``folder``."""
    import torch
    from transformers import BertForSequenceClassification

    from conftest import build_tokenizer, tiny_bert_config

    torch.manual_seed(seed)
    tok = build_tokenizer()
    config = tiny_bert_config(len(tok), num_labels=num_labels)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


#: Eight short documents of distinct topics, shared by the BM25, second-stage and rerank-server tests.
TOY_DOCS = [
    "the cat sat on the mat",
    "a dog and a cat on the rug",
    "protein folding in the cell",
    "gene expression study of the cell and the protein",
    "a man was riding a horse",
    "the movie was great",
    "language model embedding vector search",
    "retrieval with a language model",
]


def write_beir(
    folder: Path,
    docs: list[tuple[str, str]],
    queries: list[tuple[str, str]],
    qrels: list[tuple[str, str]],
    *,
    newline: str = "\n",
) -> Path:
    """A BEIR folder with a ``test`` split: ``(id, text)`` documents and queries, relevant ``(query, doc)`` pairs
    (score 1); ``newline`` ends the qrels lines (CRLF to check that it is read)."""
    (folder / "qrels").mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", [{"_id": i, "title": "", "text": t} for i, t in docs])
    write_jsonl(folder / "queries.jsonl", [{"_id": i, "text": t} for i, t in queries])
    rows = newline.join(["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in qrels)])
    (folder / "qrels" / "test.tsv").write_text(rows + newline, newline="")
    return folder


def random_beir(
    folder: Path, words: list[str], *, docs: int, queries: int, relevant: int, seed: int, lengths: tuple = (4, 12)
) -> Path:
    """A BEIR folder of random texts over ``words``: ``docs`` documents (``lengths``: from, below which many words;
    ids ``d0``...), ``queries`` queries of 3 words (``q0``...), each with ``relevant`` distinct relevant documents
    drawn at random."""
    import numpy as np  # lazy: the other helpers need none

    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(words, size=rng.integers(*lengths))) for _ in range(docs)]
    asked = [" ".join(rng.choice(words, size=3)) for _ in range(queries)]
    pairs = [(f"q{q}", f"d{d}") for q in range(queries) for d in rng.choice(docs, size=relevant, replace=False)]
    return write_beir(folder, list(enumerate_ids("d", texts)), list(enumerate_ids("q", asked)), pairs)


def enumerate_ids(prefix: str, texts: list[str]) -> Iterator[tuple[str, str]]:
    return ((f"{prefix}{i}", t) for i, t in enumerate(texts))


# ---------------------------------------------------------------------------------------------- files opened
_opened: list[str] | None = None
_hooked = False


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str | bytes | os.PathLike):
        _opened.append(os.fsdecode(args[0]))


@contextmanager
def opened() -> Iterator[list[str]]:
    """The paths of the files opened inside the block (Python's audit hook sees open(), os.open, np.load ...;
    installed once, on first use: a hook cannot be removed)."""
    global _opened, _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def opened_under(paths: list[str], folder: Path) -> list[str]:
    """Those of ``paths`` that lie under ``folder`` (after following links)."""
    root = str(folder.resolve())
    return [p for p in paths if os.path.realpath(p).startswith(root + os.sep)]


def reseal(folder: Path) -> Path:
    """Record a saved folder's files as they now are, in its ``lmembed.json``: what a folder edited by hand, its
    record made to match, looks like (so a test reaches the checks behind the digests)."""
    from lmembed.load_plan import FILES_KEY, write_strategy_file
    from lmembed.load_spec import STRATEGY_FILE

    meta = json.loads((folder / STRATEGY_FILE).read_text())
    meta.pop(FILES_KEY, None)
    meta.pop("format", None)
    return write_strategy_file(folder, meta)


def unrecord(folder: Path) -> Path:
    """Drop a saved folder's file record, as an lmembed from before the record saved it (format 1)."""
    from lmembed.load_plan import FILES_KEY
    from lmembed.load_spec import STRATEGY_FILE

    meta = json.loads((folder / STRATEGY_FILE).read_text())
    meta.pop(FILES_KEY, None)
    (folder / STRATEGY_FILE).write_text(json.dumps({**meta, "format": 1}))
    return folder


def add_dense_head(
    folder: Path,
    in_features: int = 32,
    out_features: int = 12,
    *,
    tensors: dict | None = None,
    activation: str = "torch.nn.modules.activation.Tanh",
) -> Path:
    """Make ``folder`` a sentence-transformers folder: Transformer (the folder itself) → mean Pooling → a Dense module
    whose config says ``in_features`` → ``out_features`` and whose weight file holds ``tensors`` (default: a seeded
    12 × 32 layer with its bias, whatever the config says, so a test can make the two disagree). Returns the Dense
    folder."""
    import torch
    from safetensors.torch import save_file

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode": "mean"})
    )
    dense = folder / "2_Dense"
    dense.mkdir()
    config = {"in_features": in_features, "out_features": out_features, "bias": True, "activation_function": activation}
    (dense / "config.json").write_text(json.dumps(config))
    if tensors is None:
        torch.manual_seed(1)
        tensors = {"linear.weight": torch.randn(12, 32), "linear.bias": torch.randn(12)}
    save_file(tensors, str(dense / "model.safetensors"))
    return dense
