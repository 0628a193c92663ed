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

METHOD_HELP = (
    "naive (plain top-k), abs (score < MARGIN), margin_pos (score < positive - MARGIN), "
    "perc_pos (score < positive x MARGIN; NV-Embed uses 0.95)."
)


def mine_command(
    teacher: Annotated[str, typer.Option("--teacher", "-t", help="Teacher model: bundled name, folder or Hub id.")],
    data: Annotated[Path, typer.Option("--data", help="Training rows (JSONL) or a BEIR folder.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the rows with negatives.")],
    corpus: Annotated[Path | None, typer.Option("--corpus", help="Candidate documents (BEIR folder or file).")] = None,
    k: Annotated[int, typer.Option("--k", help="Negatives per row.")] = 7,
    method: Annotated[str, typer.Option("--method", help=METHOD_HELP)] = "perc_pos",
    margin: Annotated[float | None, typer.Option("--margin", help="Filter parameter (method default).")] = None,
    skip_top: Annotated[int, typer.Option("--skip-top", help="Ignore the N best non-positive candidates.")] = 0,
    candidates: Annotated[int | None, typer.Option("--candidates", help="Documents retrieved per query.")] = None,
    split: Annotated[str, typer.Option("--split", help="Qrels split when --data is a BEIR folder.")] = "train",
    instruction: Annotated[
        str | None, typer.Option("--instruction", help="Query instruction for rows that carry none.")
    ] = None,
    pooling: Annotated[str | None, typer.Option("--pooling", help="Teacher pooling (model default).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Encoding batch size.")] = 32,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")] = "cpu",
    scores: Annotated[bool, typer.Option("--scores", help="Also write the teacher scores.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the embedding cache.")] = False,
) -> None:
    """Mine hard negatives for training rows with a teacher embedding model."""
    from rich.console import Console

    from lmembed import Embedder
    from lmembed.mining import MiningError, MiningStats, load_corpus, mine_hard_negatives, write_rows

    console = Console(stderr=True)
    try:
        rows = _load_rows(data, split)
        docs = load_corpus(corpus) if corpus else None
    except (MiningError, OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    options = {"pooling": pooling} if pooling else {}
    model = Embedder.from_pretrained(teacher, device=device, cache=not no_cache, **options)
    stats = MiningStats()
    try:
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
    except MiningError as exc:
        raise typer.BadParameter(str(exc)) from exc
    write_rows(mined, output)
    console.print(json.dumps(stats.to_dict()))
    console.print(f"wrote {len(mined)} rows to {output}")


def _load_rows(data: Path, split: str) -> list[dict]:
    """Rows from a JSONL file, or one row per judged query of a BEIR folder."""
    from lmembed.mining import read_rows

    if data.is_dir():
        from lmembed.training.converters import beir_rows

        return beir_rows(data, split=split)
    return read_rows(data)


def register(app: typer.Typer) -> None:
    """Add the ``mine`` command to ``app``."""
    app.command("mine")(mine_command)
