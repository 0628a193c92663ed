"""``lmembed index build|add|info|verify|restore`` and ``lmembed search``: persistent FAISS indexes of vectors.

    lmembed index build ../shared/datasets/beir/scifact -o scifact.index --model minilm --kind hnsw
    lmembed index info scifact.index
    lmembed index verify scifact.index          # each data file against its sha256 in the manifest
    lmembed search scifact.index "what causes cancer?" -k 5
    lmembed search scifact.index --queries ../shared/datasets/beir/scifact -o run.jsonl   # + run.trec
    lmembed search scifact.index "what causes cancer?" --mode hybrid --rerank my-cross-encoder --rerank-top-k 100

The index remembers its model and strategy; ``search`` and ``add`` load them from its manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from lmembed import terminal
from lmembed.atomic import atomic_write_text
from lmembed.cli.options import (
    DEFAULT_DEVICE,
    BatchSizeOpt,
    ChunkingOpt,
    ChunkOverlapOpt,
    ChunkTokensOpt,
    DeviceOpt,
    InstructionOpt,
    LateChunkingOpt,
    ModelOpt,
    NoCacheOpt,
    check_engine,
    check_writable,
    load_embedder,
    make_chunking,
    options_command,
    refuse_unused,
    scale_out,
    typed_flags,
)
from lmembed.cli.rerank import (
    CandidatesOpt,
    FusionOpt,
    ModeOpt,
    RerankBatchTokensOpt,
    RerankOpt,
    RerankTopKOpt,
    check_stage_options,
    open_reranker,
)
from lmembed.encoding.chunking import DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS
from lmembed.errors import ConfigError
from lmembed.options import EngineOptions, ModelOptions
from lmembed.protocols import ENCODE_BATCH_SIZE

if TYPE_CHECKING:  # lmembed.index imports FAISS; commands import it only when they run
    from lmembed.index import Hit, Index

app = typer.Typer(help="Build, inspect and extend persistent vector indexes (search them with `lmembed search`).")
console = terminal.console(stderr=True)

KIND_DOC = (
    "flat (exact, default), hnsw (graph), ivf-pq (compressed inverted lists), "
    "binary (1 bit per dimension, rescored: 32x less memory)."
)
IndexDirArg = Annotated[Path, typer.Argument(help="The index folder.")]
DataArg = Annotated[
    Path,
    typer.Argument(
        help="Documents: a BEIR folder, a .jsonl file (_id/id, title, text; other fields kept as metadata) "
        "or a text file (one document per line, id = line number)."
    ),
]
ChunkOpt = Annotated[
    int, typer.Option("--chunk-size", min=1, help="Documents per encoding call (each is cached when done).")
]
EfSearchOpt = Annotated[int | None, typer.Option("--ef-search", min=1, help="hnsw: candidates kept while searching.")]
NprobeOpt = Annotated[int | None, typer.Option("--nprobe", min=1, help="ivf-pq: lists visited per query.")]
RescoreMultOpt = Annotated[
    int | None, typer.Option("--rescore-multiplier", min=1, help="binary: rescore k x this many candidates.")
]
TREC_SUFFIX = ".trec"
RUN_SUFFIXES = (".jsonl", TREC_SUFFIX)
SNIPPET = 100


class _ProgressBar:
    """A rich progress bar fed by the index's (done, total) callback."""

    def __init__(self, label: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

        columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        self.progress = terminal.progress(*columns, label=label, unit="documents", console=console)
        self.task = None

    def __enter__(self) -> _ProgressBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.progress.add_task("documents", total=total)
        self.progress.update(self.task, completed=done)


@options_command
def build(
    ctx: typer.Context,
    data: DataArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="The index folder to create.")],
    model: ModelOpt = "minilm",
    kind: Annotated[str, typer.Option("--kind", help=KIND_DOC)] = "flat",
    hnsw_m: Annotated[int, typer.Option("--hnsw-m", min=2, help="hnsw: links per node.")] = 32,
    ef_construction: Annotated[int, typer.Option("--ef-construction", min=1, help="hnsw: build beam width.")] = 200,
    ef_search: Annotated[int, typer.Option("--ef-search", min=1, help="hnsw: search beam width.")] = 128,
    nlist: Annotated[int | None, typer.Option("--nlist", min=1, help="ivf-pq: lists (default 4·√n).")] = None,
    pq_m: Annotated[int | None, typer.Option("--pq-m", min=1, help="ivf-pq: sub-quantisers (default dim/8).")] = None,
    nprobe: Annotated[int, typer.Option("--nprobe", min=1, help="ivf-pq: lists visited per query.")] = 16,
    rescore: Annotated[str, typer.Option("--rescore", help="binary: float, int8 or none.")] = "float",
    rescore_multiplier: Annotated[
        int, typer.Option("--rescore-multiplier", min=1, help="binary: rescore k x this many candidates.")
    ] = 4,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an index already in OUTPUT.")] = False,
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    chunk_size: ChunkOpt = 2048,
    options: ModelOptions = ModelOptions(),
    engine: EngineOptions = EngineOptions(),
    chunking: ChunkingOpt = None,
    chunk_tokens: ChunkTokensOpt = DEFAULT_CHUNK_TOKENS,
    chunk_overlap: ChunkOverlapOpt = DEFAULT_CHUNK_OVERLAP,
    late_chunking: LateChunkingOpt = False,
) -> None:
    """Embed a corpus and write a searchable index folder (a re-run after an interruption reuses the cache).

    With --chunking maxp long documents are indexed as token windows and searches return each document at its best
    chunk's score (--chunking first indexes the first window only).

    With --engine ray the corpus is embedded as one resumable sharded job on Ray (workers load the model
    themselves); the vectors, and so the index, are the same as with --engine local."""
    from lmembed.index import Index, IndexParams, load_corpus  # lazy: FAISS loads only when a command runs
    from lmembed.index.index import INDEX_AGGREGATES
    from lmembed.index.kinds import KIND_PARAMS

    if kind in KIND_PARAMS:  # an unknown kind is IndexParams' to refuse, naming the kinds
        other = sorted({p for params in KIND_PARAMS.values() for p in params} - set(KIND_PARAMS[kind]))
        refuse_unused(ctx, other, f"not used by a --kind {kind} index")
    params = IndexParams(
        kind=kind,
        hnsw_m=hnsw_m,
        ef_construction=ef_construction,
        ef_search=ef_search,
        nlist=nlist,
        pq_m=pq_m,
        nprobe=nprobe,
        rescore=rescore,
        rescore_multiplier=rescore_multiplier,
    )
    check_writable(output, "--output", folder=True)
    check_engine(engine, options)
    check_chunk_options(ctx, chunking, late_chunking)
    chunks = make_chunking(chunking, chunk_tokens, chunk_overlap, late_chunking)
    if chunks is not None and chunks.aggregate not in INDEX_AGGREGATES:
        raise typer.BadParameter(
            f"an index scores a document by its best chunk: use {' or '.join(INDEX_AGGREGATES)}",
            param_hint="--chunking",
        )
    docs = load_corpus(data)
    emb = load_embedder(model, options)
    if engine.engine == "ray":  # one job for the whole corpus: the job resumes by itself, shard by shard
        emb = scale_out(emb, engine, on_progress=_ray_line)
        chunk_size = max(1, len(docs))
    with _ProgressBar(f"indexing [{emb.config.label()}]") as bar:
        index = Index.build(
            emb,
            docs,
            output,
            params=params,
            batch_size=batch_size,
            chunk_size=chunk_size,
            overwrite=overwrite,
            progress=bar,
            chunking=chunks,
        )
    console.print(
        f"indexed {index.count} documents ({index.kind}, dim {index.dim}, {emb.config.label()}) into {output}"
    )


#: the options that only shape chunks, refused without --chunking when given
CHUNK_SHAPING = ("late_chunking", "chunk_tokens", "chunk_overlap")


def check_chunk_options(ctx: typer.Context | None, chunking: str | None, late_chunking: bool) -> None:
    """Without --chunking, refuse the options that only shape chunks (--late-chunking, --chunk-tokens,
    --chunk-overlap) when given on the command line, naming them: not a complaint about a --chunking that was
    never given, nor silence. ``ctx`` tells given values from defaults (``None`` outside the command line)."""
    if chunking is not None:
        return
    given = typed_flags(ctx, *CHUNK_SHAPING)
    if late_chunking and "--late-chunking" not in given:
        given.insert(0, "--late-chunking")
    if given:
        raise typer.BadParameter(
            f"{' and '.join(given)} {'shapes' if len(given) == 1 else 'shape'} the chunks of --chunking, "
            "which is not given: add --chunking",
            param_hint=given[0],
        )


def _ray_line(progress: Any) -> None:
    """--engine ray: one line per finished shard (shards done, texts/s, ETA)."""
    console.print(progress.line(), markup=False, soft_wrap=True)


def add(
    index_dir: IndexDirArg,
    data: DataArg,
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    chunk_size: ChunkOpt = 2048,
    device: DeviceOpt = DEFAULT_DEVICE,
    no_cache: NoCacheOpt = False,
) -> None:
    """Append documents to an index, embedded by the index's own model and strategy (ids must be new)."""
    from lmembed.index import Index, load_corpus  # lazy: FAISS loads only when a command runs

    check_writable(index_dir, "INDEX_DIR", folder=True)  # a read-only index is refused before the model loads
    index = Index.open(index_dir)
    docs = load_corpus(data)
    index.store.check_new(docs)  # refuse duplicate ids before the model loads
    index.load_embedder(device=device, cache=not no_cache)
    with _ProgressBar("adding") as bar:
        added = index.add(docs, batch_size=batch_size, chunk_size=chunk_size, progress=bar)
    console.print(f"added {added} document{'' if added == 1 else 's'} to {index_dir} (now {index.count})")


def info(
    index_dir: IndexDirArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest and sizes as JSON.")] = False,
) -> None:
    """Show what an index holds: kind, size, model, strategy, build parameters."""
    from lmembed.index import Index  # lazy: FAISS loads only when a command runs

    data = Index.open(index_dir).info()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title=str(index_dir), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    model = data["model"]
    rows = {
        "kind": data["kind"],
        "documents": str(data["count"]),
        "dimension": str(data["dim"]),
        "similarity": data["similarity"],
        "model": f"{model['name']} ({_runner(model)}, weights {model['fingerprint'][:16]})",
        "model source": model["source"] or "(in memory: pass the Embedder to Index.open)",
        "strategy": data["strategy_label"],
        "parameters": ", ".join(f"{k}={v}" for k, v in data["params"].items() if k != "kind") or "-",
        "chunking": ", ".join(f"{k}={v}" for k, v in (data.get("chunking") or {}).items()) or "-",
        "memory": f"{data['memory_bytes'] / 2**20:.1f} MiB (approx.)",
        "on disk": f"{data['disk_bytes'] / 2**20:.1f} MiB",
        "updated": data["updated"],
    }
    for key, value in rows.items():
        table.add_row(key, value)
    terminal.console().print(table)


def _runner(model: dict[str, Any]) -> str:
    """What runs an index's model, as ``index info`` shows it: ``float32``, ``onnx int8 (64 calibration texts)``."""
    backend, precision = model.get("backend") or "torch", model.get("precision") or model["dtype"]
    runner = model["dtype"] if backend == "torch" and precision == model["dtype"] else f"{backend} {precision}"
    calibration = model.get("calibration")
    return f"{runner} ({len(calibration)} calibration texts)" if calibration else runner


def verify(index_dir: IndexDirArg) -> None:
    """Check every data file of an index against the sha256 its manifest recorded, and that each reads back.

    Exit 0 when it is whole; exit 2 naming the damaged file and what to do (rebuild, or `lmembed index restore`)."""
    from lmembed.index import Index  # lazy: FAISS loads only when a command runs
    from lmembed.index.integrity import lexical_files

    manifest = Index.verify(index_dir)
    checked = "no checksums recorded (written before lmembed kept them)" if manifest.checksums is None else "sha256 ok"
    bm25 = len(lexical_files(index_dir))
    console.print(
        f"{index_dir}: generation {manifest.generation}, {manifest.count} documents, "
        f"{len(manifest.files)} data files{f' + {bm25} BM25 files' if bm25 else ''}, {checked}; every file reads back",
        markup=False,
    )


def restore(index_dir: IndexDirArg) -> None:
    """Go back to the previous generation kept by the last `index add` (documents added since are dropped)."""
    from lmembed.index import Index  # lazy: FAISS loads only when a command runs

    check_writable(index_dir, "INDEX_DIR", folder=True)
    manifest = Index.restore_previous(index_dir)
    console.print(f"{index_dir}: restored generation {manifest.generation} ({manifest.count} documents)", markup=False)


app.command("build")(build)
app.command("add")(add)
app.command("info")(info)
app.command("verify")(verify)
app.command("restore")(restore)


# ---------------------------------------------------------------------------------------------- search
def _open_for_search(
    index_dir: Path,
    model: str | None,
    device: str,
    ef_search: int | None,
    nprobe: int | None,
    mult: int | None,
    *,
    needs_model: bool = True,
) -> Index:
    from lmembed.index import Index  # lazy: FAISS loads only when a command runs

    index = Index.open(index_dir, ef_search=ef_search, nprobe=nprobe, rescore_multiplier=mult)
    if needs_model:  # BM25 alone needs no model
        index.load_embedder(device=device, source=model)  # the index's model, or MODEL checked against it
    return index


def _print_hits(query: str, hits: list[Hit]) -> None:
    table = Table(title=f"{query!r}")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("id")
    table.add_column("text")
    for hit in hits:
        text = hit.text if len(hit.text) <= SNIPPET else hit.text[: SNIPPET - 1] + "…"
        table.add_row(str(hit.rank), f"{hit.score:.4f}", hit.id, text)
    terminal.console().print(table)


def trec_lines(query_ids: list[str], results: list[list[Hit]], tag: str = "lmembed") -> list[str]:
    """TREC run lines ``qid Q0 docid rank score tag`` (what trec_eval, pytrec_eval and ranx read)."""
    lines = []
    for query_id, hits in zip(query_ids, results, strict=True):
        for hit in hits:
            for value in (query_id, hit.id):
                if not value or any(c.isspace() for c in value):
                    raise ConfigError(f"id {value!r} contains whitespace; a TREC run cannot hold it (use .jsonl)")
            # the score in full (shortest round trip): trec_eval re-sorts by it, so rounding to a few decimals
            # turned a reranker's close scores into ties and the file was scored in another order than written
            lines.append(f"{query_id} Q0 {hit.id} {hit.rank} {float(hit.score)!r} {tag}")
    return lines


def write_run(output: Path, queries: list[tuple[str, str]], results: list[list[Hit]]) -> list[Path]:
    """``.jsonl``: one ``{"query_id", "query", "hits": [{"rank", "id", "score"}]}`` row per query, plus the
    same run in TREC format beside it (``.trec``); ``.trec``: the TREC file only. Written atomically."""
    ids = [query_id for query_id, _ in queries]
    trec = "\n".join(trec_lines(ids, results)) + "\n"
    written = []
    if output.suffix == ".jsonl":
        rows = (
            json.dumps(
                {
                    "query_id": query_id,
                    "query": text,
                    "hits": [{"rank": h.rank, "id": h.id, "score": h.score} for h in hits],
                },
                ensure_ascii=False,
            )
            for (query_id, text), hits in zip(queries, results, strict=True)
        )
        written.append(atomic_write_text(output, "\n".join(rows) + "\n"))
        output = output.with_suffix(TREC_SUFFIX)
    written.append(atomic_write_text(output, trec))
    return written


def search(
    ctx: typer.Context,
    index_dir: IndexDirArg,
    query: Annotated[str | None, typer.Argument(help="A query (or use --queries for a file of them).")] = None,
    k: Annotated[int, typer.Option("-k", "--top-k", min=1, help="Results per query.")] = 10,
    queries: Annotated[
        Path | None,
        typer.Option("--queries", help="Batch: a BEIR folder, a .jsonl file (_id/id, text) or a text file."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Batch run file: .jsonl (+ a .trec beside it) or .trec.")
    ] = None,
    instruction: InstructionOpt = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Load the model from here (checked against the index).")
    ] = None,
    ef_search: EfSearchOpt = None,
    nprobe: NprobeOpt = None,
    rescore_multiplier: RescoreMultOpt = None,
    batch_size: BatchSizeOpt = ENCODE_BATCH_SIZE,
    device: DeviceOpt = DEFAULT_DEVICE,
    mode: ModeOpt = "dense",
    fusion: FusionOpt = "rrf",
    candidates: CandidatesOpt = 100,
    rerank: RerankOpt = None,
    rerank_top_k: RerankTopKOpt = 100,
    rerank_batch_tokens: RerankBatchTokensOpt = 16384,
) -> None:
    """Search an index with a query (a readable table) or a file of queries (a run file): by the model's vectors,
    BM25 or both fused (--mode), optionally reranked (--rerank)."""
    check_stage_options(mode, fusion)
    if mode == "bm25":
        model_side = ("instruction", "model", "batch_size", "ef_search", "nprobe", "rescore_multiplier")
        refuse_unused(ctx, (*model_side, *(() if rerank else ("device",))), "not used with --mode bm25 (no model runs)")
    if mode == "dense":
        refuse_unused(ctx, ("fusion", "candidates"), "not used with --mode dense (nothing is fused)")
    if not rerank:
        refuse_unused(ctx, ("rerank_top_k", "rerank_batch_tokens"), "not used without --rerank")
    if (query is None) == (queries is None):
        raise typer.BadParameter("give a QUERY or --queries FILE (one of them)", param_hint="QUERY")
    if query is not None and not query.strip():
        raise typer.BadParameter("the query is empty; give the text to search for", param_hint="QUERY")
    if queries is not None and output is None:
        raise typer.BadParameter("--queries needs --output run.jsonl (or run.trec)", param_hint="--output")
    if output is not None:
        if queries is None:
            raise typer.BadParameter("--output is for batch search with --queries", param_hint="--output")
        if output.suffix not in RUN_SUFFIXES:
            raise typer.BadParameter(f"{output}: use a .jsonl or .trec file name", param_hint="--output")
        check_writable(output, "--output")
    from lmembed.index import load_queries  # lazy: FAISS loads only when a command runs

    batch = load_queries(queries) if queries is not None else None
    index = _open_for_search(
        index_dir, model, device, ef_search, nprobe, rescore_multiplier, needs_model=mode != "bm25"
    )
    texts = [query] if batch is None else [text for _, text in batch]
    depth = max(k, rerank_top_k) if rerank else k
    how = {"mode": mode, "fusion": fusion, "candidates": candidates}
    results = index.search_batch(texts, depth, instruction=instruction, batch_size=batch_size, **how)
    if rerank:
        from lmembed.index.second_stage import rerank_hits  # lazy: torch

        reranker = open_reranker(rerank, device=device, max_batch_tokens=rerank_batch_tokens)
        results = rerank_hits(reranker, texts, results, k)
    if batch is None:
        _print_hits(query, results[0])
        return
    written = write_run(output, batch, results)
    console.print(f"searched {len(batch)} queries (top {k}); wrote {', '.join(map(str, written))}")
