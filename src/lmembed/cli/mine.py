"""``lmembed mine``: add teacher-mined hard negatives to a training file.

Example (NV-Retriever's TopK-PercPos with a 95% ceiling, as NV-Embed uses)::

    lmembed mine --teacher minilm --data train.jsonl --corpus ../shared/datasets/beir/scifact \\
        --k 7 --method perc_pos --margin 0.95 --output train.mined.jsonl

``--data`` is a JSON-lines file of rows ``{"query", "positive", ...}`` or a BEIR folder (its ``--split``
judgments become rows). ``--corpus`` is a BEIR folder, a BEIR-style ``corpus.jsonl`` or a text file with
one document per line; without it, the positives of all rows form the candidate pool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from lmembed import terminal
from lmembed.cli.options import (
    BatchSizeOpt,
    Exclude,
    InstructionOpt,
    check_writable,
    load_embedder,
    options_command,
)
from lmembed.mining import MiningStats, load_corpus, mine_hard_negatives, read_training_rows, write_rows
from lmembed.options import ModelOptions
from lmembed.protocols import ENCODE_BATCH_SIZE
from lmembed.training.converters import beir_rows

METHOD_HELP = (
    "naive (plain top-k), abs (score < MARGIN), margin_pos (score < positive - MARGIN), "
    "perc_pos (score < positive x MARGIN; NV-Embed uses 0.95)."
)


#: The teacher's options: its pooling, device and cache (the rest stay the model's own).
TEACHER = Exclude("layer", "attention", "echo", "dim", "max_length", "dtype", "backend", "precision", "calibration")


@options_command
def mine(
    teacher: Annotated[str, typer.Option("--teacher", "-t", help="Teacher model: bundled name, folder or Hub id.")],
    data: Annotated[Path, typer.Option("--data", help="Training rows (JSONL) or a BEIR folder.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the rows with negatives.")],
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Candidate documents (BEIR folder or file).")] = None,
    k: Annotated[int, typer.Option("--k", min=1, help="Negatives per row.")] = 7,
    method: Annotated[str, typer.Option("--method", help=METHOD_HELP)] = "perc_pos",
    margin: Annotated[float | None, typer.Option("--margin", help="Filter parameter (method default).")] = None,
    skip_top: Annotated[int, typer.Option("--skip-top", min=0, help="Ignore the N best non-positive candidates.")] = 0,
    candidates: Annotated[
        int | None, typer.Option("--candidates", min=1, help="Documents retrieved per query.")
    ] = None,
    split: Annotated[str, typer.Option("--split", help="Qrels split when --data is a BEIR folder.")] = "train",
    instruction: InstructionOpt = None,
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    scores: Annotated[
        bool,
        typer.Option(
            "--scores",
            help="Also write the teacher's score of each positive and negative as teacher_scores, the field the "
            "distillation losses (margin_mse, distill_kl) read.",
        ),
    ] = False,
    options: Annotated[ModelOptions, TEACHER] = ModelOptions(),
) -> None:
    """Mine hard negatives for training rows with a teacher embedding model."""
    check_writable(output, "--output")
    rows = beir_rows(data, split=split) if data.is_dir() else read_training_rows(data)
    docs = load_corpus(corpus) if corpus else None
    model = load_embedder(teacher, options)
    stats = MiningStats()
    mined = mine_hard_negatives(
        model,
        rows,
        docs,
        k=k,
        method=method,
        margin=margin,
        skip_top=skip_top,
        candidates=candidates,
        batch_size=batch_size,
        query_instruction=instruction,
        with_scores=scores,
        stats=stats,
    )
    write_rows(mined, output)
    console = terminal.console(stderr=True)
    console.print(json.dumps(stats.to_dict()))
    console.print(f"wrote {len(mined)} rows to {output}")
