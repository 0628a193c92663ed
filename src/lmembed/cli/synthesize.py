"""``lmembed synthesize``: generate training rows with a language model, following a recipe file.

Examples::

    # E5-mistral's two steps with a local model (a bundled name, a folder or a Hub id)
    lmembed synthesize --recipe e5-mistral --generator local:smollm2-135m -o synthetic.jsonl

    # an OpenAI-compatible server (vLLM, TGI, llama.cpp, transformers serve); the key comes from $OPENAI_API_KEY
    lmembed synthesize --recipe e5-mistral --generator http://127.0.0.1:8000/v1 --model my-model \\
        --concurrency 8 --max-requests 5000 -o synthetic.jsonl

    # Gecko relabelling / corpus-only queries from your own passages, retrieving with an embedder
    lmembed synthesize --recipe gecko --corpus beir/scifact --embedder minilm --generator local:smollm2-135m \\
        -o scifact.gecko.jsonl

The work is cut into shards under ``<output>.parts/``; a finished shard is never generated again, so after a kill
the same command does only the rest. Progress (rows/s, acceptance rate, ETA) goes to stderr and to
``<output>.parts/progress.log``; totals and rejection reasons to ``<output>.stats.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from lmembed.cli.options import check_writable


def synthesize_command(
    recipe: Annotated[str, typer.Option("--recipe", help="Recipe file or name: e5-mistral, gecko, corpus-only.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the rows (JSON lines).")],
    generator: Annotated[
        str,
        typer.Option("--generator", "-g", help="tiny[:SEED] (tests), local:MODEL, or an endpoint URL (http://.../v1)."),
    ] = "tiny",
    model: Annotated[str, typer.Option("--model", help="Model name sent to an endpoint.")] = "default",
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="Environment variable holding the endpoint's API key.")
    ] = "OPENAI_API_KEY",
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Endpoint requests in flight.")] = 4,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Retries on 429/5xx/dropped connections.")] = 4,
    max_requests: Annotated[int | None, typer.Option("--max-requests", min=1, help="Endpoint request budget.")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Endpoint token budget.")] = None,
    corpus: Annotated[
        Path | None, typer.Option("--corpus", help="Seed passages: BEIR folder, corpus.jsonl or text file.")
    ] = None,
    corpus_limit: Annotated[int | None, typer.Option("--corpus-limit", min=1, help="Use the first N passages.")] = None,
    embedder: Annotated[
        str | None, typer.Option("--embedder", help="Embedder that retrieves (gecko, corpus-only).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the knobs and sampling.")] = 0,
    shard_size: Annotated[int, typer.Option("--shard-size", min=1, help="Work items per shard.")] = 32,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Generate only the first N work items.")] = None,
    device: Annotated[str, typer.Option("--device", help="Device of a local generator.")] = "cpu",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Local generator batch size.")] = 8,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Local generator dtype: float32, bfloat16 (fast on CPUs with AMX), ...")
    ] = "float32",
) -> None:
    """Generate training rows with an LLM following a recipe file (E5-mistral, Gecko, corpus-only); sharded and
    resumable; the output is read by lmembed train --data as it is."""
    from lmembed.synthesis.generators import Budget, build_generator
    from lmembed.synthesis.synthesize import read_passages, synthesize

    check_writable(output, "--output")
    console = Console(stderr=True, soft_wrap=True)
    passages = read_passages(corpus, corpus_limit) if corpus is not None else None
    encode = _encoder(embedder) if embedder else None
    gen = build_generator(
        generator,
        model=model,
        api_key_env=api_key_env,
        concurrency=concurrency,
        retries=retries,
        budget=Budget(max_requests, max_tokens),
        device=device,
        dtype=dtype,
        batch_size=batch_size,
    )
    stats = synthesize(
        recipe,
        gen,
        output,
        corpus=passages,
        encode=encode,
        seed=seed,
        shard_size=shard_size,
        limit=limit,
        echo=lambda line: console.print(line, markup=False),
    )
    console.print(
        f"{stats['rows']} rows ({stats['acceptance']:.0%} accepted of {stats['attempted']}; rejected "
        f"{stats['rejected'] or 'none'}): {output}",
        markup=False,
    )
    for note in stats["notes"]:
        console.print(f"note: {note}", markup=False)


def _encoder(name: str) -> Any:
    from lmembed import Embedder
    from lmembed.synthesis.retrieval import embedder_encode

    return embedder_encode(Embedder.from_pretrained(name))
