"""``lmembed decontaminate``: drop training rows that repeat the evaluation sets a model will be scored on.

Example (NV-Embed filtered its training data against the MTEB evaluation sets with a BM25 threshold)::

    lmembed decontaminate train.jsonl --against scifact,nfcorpus -o train.clean.jsonl

Rows are kept exactly as they were written (every field, provenance included); a row goes when its query or a
positive repeats an evaluation item (:mod:`lmembed.synthesis.decontaminate`). What went and why is written
beside the output as ``<output>.decontamination.json`` and ``.md``. ``lmembed train --decontaminate-against``
does the same inside a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from lmembed import terminal
from lmembed.atomic import atomic_write_text
from lmembed.cli.options import check_writable
from lmembed.io import iter_jsonl
from lmembed.training.rows import TrainingDataError, parse_row


def decontaminate_command(
    rows: Annotated[Path, typer.Argument(help="Training rows (JSON lines: query, positive, ...).")],
    against: Annotated[
        str,
        typer.Option("--against", help="Comma list of evaluation sets (names, folders, files): scifact,nfcorpus."),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the rows that are kept.")],
    ngram: Annotated[
        int, typer.Option("--ngram", min=0, help="Shared run of this many words counts (13; 0 turns it off).")
    ] = 13,
    contains: Annotated[
        int,
        typer.Option(
            "--contains", min=0, help="An evaluation text of at least this many words inside a row counts (6; 0: off)."
        ),
    ] = 6,
    near_duplicate: Annotated[
        float, typer.Option("--near-duplicate", min=0, help="Word-set Jaccard threshold (0.8; 0 turns it off).")
    ] = 0.8,
    bm25: Annotated[
        float, typer.Option("--bm25", min=0, help="BM25 score relative to the evaluation text's own (0.9; 0: off).")
    ] = 0.9,
    split: Annotated[str, typer.Option("--split", help="Split of the evaluation sets.")] = "test",
) -> None:
    """Drop training rows whose query or positive repeats an evaluation item: exact and near-duplicate texts,
    shared n-grams, a query holding a shorter evaluation text, and a BM25 similarity threshold as NV-Embed did;
    writes the kept rows and a report."""
    # lazy: the evaluation sets' readers import scikit-learn and SciPy, seconds that --help must not pay
    from lmembed.synthesis.decontaminate import DecontaminationSettings, decontaminate
    from lmembed.synthesis.eval_texts import evaluation_texts, parse_names

    names = parse_names(against)
    if not names:
        raise typer.BadParameter("name at least one evaluation set", param_hint="--against")
    check_writable(output, "--output")
    settings = DecontaminationSettings(
        ngram=ngram or None, contains=contains or None, near_duplicate=near_duplicate or None, bm25=bm25 or None
    )
    raw, texts = [], []
    for line_no, row in iter_jsonl(rows):
        try:
            example = parse_row(row)
        except ValueError as exc:  # parse_row says what is wrong; the file and line are added here
            raise TrainingDataError(f"{rows}:{line_no}: {exc}") from exc
        raw.append(row)
        texts.append((example.query, *example.positives))
    report = decontaminate(texts, evaluation_texts(names, split=split), settings)
    atomic_write_text(output, "".join(json.dumps(raw[i], ensure_ascii=False) + "\n" for i in report.kept))
    atomic_write_text(_beside(output, ".json"), json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
    atomic_write_text(_beside(output, ".md"), report.markdown())
    terminal.console(stderr=True, soft_wrap=True).print(report.markdown(), markup=False)
    terminal.console(stderr=True).print(f"kept {len(report.kept)} of {report.rows} rows: {output}")


def _beside(output: Path, suffix: str) -> Path:
    return output.with_name(output.name + ".decontamination" + suffix)
