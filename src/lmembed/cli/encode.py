"""``lmembed encode``: embed the texts of a file and write the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Annotated

import numpy as np
import typer

from lmembed import terminal
from lmembed.atomic import atomic_write
from lmembed.cli.options import (
    BatchSizeOpt,
    InstructionOpt,
    ModelOpt,
    check_engine,
    check_input_file,
    check_writable,
    load_embedder,
    options_command,
    worker_spec,
)
from lmembed.config import SIDES, for_side
from lmembed.io import is_jsonl, read_text_lines, read_texts_field
from lmembed.options import EngineOptions, ModelOptions
from lmembed.protocols import ENCODE_BATCH_SIZE

console = terminal.console(stderr=True)
OUTPUT_SUFFIXES = (".npy", ".jsonl")
TOKENS_SUFFIX = ".npz"  # --tokens: every text's token vectors and their offsets


def read_texts(path: Path, field: str) -> list[str]:
    """Lines of a text file, or the ``field`` of each row of a JSON-lines file (``.jsonl``, ``.jsonl.gz``, any case:
    :func:`~lmembed.io.is_jsonl`)."""
    if is_jsonl(path):
        return read_texts_field(path, field)
    if path.name.lower().removesuffix(".gz").endswith(".json"):  # read as lines, its JSON syntax became texts
        raise typer.BadParameter(
            f"{path}: a .json file is not read as texts; give JSON lines (.jsonl: one object a line, its text in "
            "--field) or a text file (one text a line)",
            param_hint="INPUT",
        )
    return read_text_lines(path)


def write_vectors(vectors: np.ndarray, texts: list[str], output: Path) -> None:
    """``.npy``: the matrix; ``.jsonl``: one ``{"text", "embedding"}`` row per text. Written atomically; a file
    that cannot be written is a parameter error naming --output and ``output`` (not the temporary file beside it)."""
    try:
        if output.suffix == ".npy":
            atomic_write(output, lambda handle: np.save(handle, vectors))
        else:

            def rows(handle: IO[bytes]) -> None:  # a line at a time: the whole text was twice the file in memory
                for text, vector in zip(texts, vectors, strict=True):
                    handle.write((json.dumps({"text": text, "embedding": vector.tolist()}) + "\n").encode("utf-8"))

            atomic_write(output, rows)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {output}: {exc.strerror or exc}", param_hint="--output") from None


@options_command
def encode(
    input: Annotated[Path, typer.Argument(help="A text file (one text per line) or a .jsonl file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write: .npy or .jsonl (--tokens: .npz).")],
    model: ModelOpt = "minilm",
    field: Annotated[str, typer.Option(help="Text field of .jsonl rows.")] = "text",
    instruction: InstructionOpt = None,
    prompt_name: Annotated[
        str | None,
        typer.Option(
            "--prompt-name",
            help="One of a published model's own prompts (its config_sentence_transformers.json), e.g. query; "
            "without it (and --instruction) the model's default prompt applies, if it has one.",
        ),
    ] = None,
    side: Annotated[
        str | None,
        typer.Option(
            "--side",
            help="Embed the texts as search 'query' (with --instruction or the model's query prompt, as "
            "encode_queries) or 'document' (with the model's document prompt, as encode_corpus): what an asymmetric "
            "model (query/document routes, a term channel, published prompts) needs. Without it: as they are.",
        ),
    ] = None,
    tokens: Annotated[
        bool,
        typer.Option(
            "--tokens",
            help="Write token vectors instead (Embedder.encode_tokens: the states the strategy pools, one row per "
            "token the model reads, before pooling) to an .npz: 'vectors' (all tokens × hidden) and 'offsets' "
            "(text i's rows are vectors[offsets[i]:offsets[i+1]]).",
        ),
    ] = False,
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    options: ModelOptions = ModelOptions(),
    engine: EngineOptions = EngineOptions(),
) -> None:
    """Embed texts from a file and write the vectors (float32, one row per input, in order).

    With --engine ray the file is streamed (also .parquet: column FIELD) and encoded as a resumable sharded
    job: run the same command again after an interruption and only the missing shards are encoded."""
    if tokens and output.suffix != TOKENS_SUFFIX:
        raise typer.BadParameter(f"{output}: --tokens writes an {TOKENS_SUFFIX} file; name one", param_hint="--output")
    if not tokens and output.suffix not in OUTPUT_SUFFIXES:
        raise typer.BadParameter(f"{output}: use a .npy or .jsonl file name", param_hint="--output")
    _check_side(side, instruction, prompt_name)
    check_writable(output, "--output")
    check_engine(engine, options)
    if tokens and engine.engine == "ray":
        raise typer.BadParameter(
            "--tokens runs on this machine (--engine local): a sharded job keeps one vector per text",
            param_hint="--engine",
        )
    if engine.engine == "ray":
        path = check_input_file(input, "INPUT")
        _encode_on_ray(path, output, model, field, instruction, prompt_name, side, batch_size, options, engine)
        return
    texts = read_texts(check_input_file(input, "INPUT"), field)
    emb = load_embedder(model, options)
    if tokens:
        states = emb.encode_tokens(texts, batch_size, side=side, instruction=instruction, prompt_name=prompt_name)
        write_token_vectors(states, output)
        console.print(
            f"wrote {sum(len(s) for s in states)} token vectors of {len(texts)} texts ({emb.config.label()}) "
            f"to {output}"
        )
        return
    if side == "query":
        vectors = emb.encode_queries(texts, instruction=instruction, batch_size=batch_size)
    elif side == "document":
        vectors = emb.encode_corpus(texts, batch_size=batch_size)
    else:
        vectors = emb.encode(texts, batch_size=batch_size, instruction=instruction, prompt_name=prompt_name)
    write_vectors(vectors, texts, output)
    console.print(f"wrote {vectors.shape[0]} × {vectors.shape[1]} vectors ({emb.config.label()}) to {output}")


def write_token_vectors(states: list[np.ndarray], output: Path) -> None:
    """An ``.npz`` of every text's token vectors, one after another (``vectors``, float32) and where each text's
    begin (``offsets``, int64, one more than the texts), written atomically and readable without pickles."""
    offsets = np.zeros(len(states) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in states])
    width = states[0].shape[1] if states else 0
    vectors = np.concatenate(states).astype(np.float32, copy=False) if states else np.zeros((0, width), np.float32)
    try:
        atomic_write(output, lambda handle: np.savez(handle, vectors=vectors, offsets=offsets))
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {output}: {exc.strerror or exc}", param_hint="--output") from None


def _check_side(side: str | None, instruction: str | None, prompt_name: str | None) -> None:
    """Refuse a --side that is none, prompt options the side decides itself, or --instruction with --prompt-name
    (the instruction won and the prompt name went unchecked), before anything is loaded."""
    if instruction is not None and prompt_name is not None:
        raise typer.BadParameter(
            "--instruction and --prompt-name both set the text before each input; give one", param_hint="--prompt-name"
        )
    if side is None:
        return
    if side not in SIDES:
        raise typer.BadParameter(f"{side!r} is not a side; use one of {', '.join(SIDES)}", param_hint="--side")
    if prompt_name is not None:
        raise typer.BadParameter(
            f"--side {side} takes the model's {side} prompt; drop --prompt-name (or --side, to name a prompt)",
            param_hint="--prompt-name",
        )
    if side == "document" and instruction is not None:
        raise typer.BadParameter(
            "documents are embedded without an instruction (as encode_corpus): drop --instruction or use --side query",
            param_hint="--instruction",
        )


def _encode_on_ray(
    input: Path,
    output: Path,
    model: str,
    field: str,
    instruction: str | None,
    prompt_name: str | None,
    side: str | None,
    batch_size: int,
    options: ModelOptions,
    engine: EngineOptions,
) -> None:
    """``lmembed encode --engine ray``: a sharded job streamed from the file; vectors written as they are assembled.
    The strategy and the prompt are those the local command uses: with ``--side``, that side's
    (:func:`~lmembed.config.for_side`, as ``encode_queries``/``encode_corpus``); else as ``Embedder.encode``
    chooses: ``--instruction``, else ``--prompt-name``, else the model's default prompt."""
    from lmembed.scale import encode_corpus, open_texts  # lazy: Ray Data is optional and heavy

    emb = load_embedder(model, options)
    if side is not None:
        config, instruction = for_side(emb.config, side, instruction)
        emb = emb.with_config(config)
    elif instruction is None:
        instruction = emb.config.named_prompt(prompt_name)
    done = encode_corpus(
        emb,
        open_texts(input, field=field),
        engine=engine,
        instruction=instruction,
        batch_size=batch_size,
        output=output if output.suffix == ".npy" else None,
        memory_map=output.suffix != ".npy",
        spec=worker_spec(emb),
        on_progress=lambda progress: console.print(progress.line(), markup=False, soft_wrap=True),
    )
    if output.suffix == ".jsonl":
        done.write_jsonl(output)
    if options.no_cache:
        done.job.remove()  # resumable while it runs; nothing left in the cache once the output is written
    report = done.report
    counts = f"{report.shards} shards, {len(report.shards_encoded)} encoded now, {len(report.shards_skipped)} resumed"
    console.print(
        f"wrote {done.vectors.shape[0]} × {done.vectors.shape[1]} vectors ({emb.config.label()}) to {output} "
        f"[ray: {counts}]",
        markup=False,
        soft_wrap=True,
    )
