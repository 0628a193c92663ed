"""``lmembed serve``: an OpenAI-compatible embedding server for any model or saved Embedder.

    lmembed serve minilm --port 8080
    lmembed serve ./my-embedder --index scifact.index --api-key "$KEY"
    lmembed serve minilm --index scifact.index --rerank ./my-cross-encoder     # + /v1/rerank, reranked search

Clients use the official ``openai`` package (``OpenAI(base_url="http://127.0.0.1:8080/v1")``) or plain
HTTP; see ``lmembed.serving`` for the endpoints, fields and limits.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from lmembed.cli.options import Exclude, load_embedder, options_command
from lmembed.cli.rerank import RerankOpt, open_reranker
from lmembed.options import ModelOptions
from lmembed.paths import API_KEY_ENV_VAR

#: A server never caches what it embeds.
SERVED = ModelOptions(no_cache=True)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def served_names(given: list[str] | None, model: str) -> list[str]:
    """``--served-model-name`` values (repeated or comma lists) in order, without repeats; ``[model]`` if none."""
    names = [name.strip() for value in given or () for name in value.split(",") if name.strip()]
    return list(dict.fromkeys(names)) or [model]


@options_command
def serve(
    model: Annotated[str, typer.Argument(help="Bundled name, saved Embedder folder or Hub id.")],
    index_dir: Annotated[
        Path | None,
        typer.Option(
            "--index",
            help="Serve /v1/search over this index (built with the same model). Without strategy or runtime "
            "options, the model is read as the index was built (strategy, backend, precision), as `search` reads it.",
        ),
    ] = None,
    index_poll: Annotated[
        float,
        typer.Option(
            "--index-poll",
            min=0,
            help="Seconds between looks at the --index folder: documents `lmembed index add` writes while the server "
            "runs are searched once their generation is opened whole, with a start's checks (0: the index as it was "
            "at start).",
        ),
    ] = 2.0,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8080,
    served_model_name: Annotated[
        list[str] | None,
        typer.Option(
            "--served-model-name",
            help="The names clients may pass as `model`, the first one reported (default: MODEL); repeat it or give "
            "a comma list to accept a client's default name, e.g. 'mine,text-embedding-ada-002'.",
        ),
    ] = None,
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", min=1, help="Padded tokens per forward pass (texts x longest).")
    ] = 16384,
    batch_wait_ms: Annotated[
        float,
        typer.Option(
            "--batch-wait-ms",
            min=0,
            help="A free worker with less queued than a window waits for texts until none came for this long "
            "(ms, 10x at most).",
        ),
    ] = 5.0,
    window_share: Annotated[
        float,
        typer.Option(
            "--window-share",
            min=0.01,
            max=1.0,
            help="Share of the queued tokens a scheduling window admits (smaller: shorter tail; larger: throughput).",
        ),
    ] = 0.25,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Forward passes run at once, torch's threads shared among them (default: 2 on a CPU with 2 threads "
            "or more, else 1).",
            show_default=False,
        ),
    ] = None,
    max_request_bytes: Annotated[
        int, typer.Option("--max-request-bytes", min=1, help="Largest request body; larger ones get 413.")
    ] = 4 * 2**20,
    max_concurrent_requests: Annotated[
        int, typer.Option("--max-concurrent-requests", min=1, help="Requests handled at once; more get 429 at once.")
    ] = 256,
    max_inputs: Annotated[int, typer.Option("--max-inputs", min=1, help="Texts per request; more get 413.")] = 2048,
    no_truncate: Annotated[
        bool, typer.Option("--no-truncate", help="Refuse (400) texts longer than the model reads, do not cut them.")
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar=API_KEY_ENV_VAR,
            help="Require 'Authorization: Bearer KEY' (else 401), on every route but /health (/metrics too).",
        ),
    ] = None,
    public_metrics: Annotated[
        bool, typer.Option("--public-metrics", help="With --api-key: let /metrics answer without the key.")
    ] = False,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout",
            min=0.001,
            help="Seconds a request's header block, and then its body, may take to arrive (else 408).",
        ),
    ] = 10.0,
    max_header_bytes: Annotated[
        int, typer.Option("--max-header-bytes", min=1, help="Largest header block of a request (else 431).")
    ] = 16384,
    max_connections_per_client: Annotated[
        int, typer.Option("--max-connections-per-client", min=1, help="Open connections per client address (429).")
    ] = 64,
    max_tokens_in_flight: Annotated[
        int, typer.Option("--max-tokens-in-flight", min=1, help="Tokens admitted and not yet answered (else 429).")
    ] = 131072,
    gzip_min_bytes: Annotated[
        int,
        typer.Option(
            "--gzip-min-bytes",
            min=0,
            help="Gzip-compress responses of this many bytes or more for clients that accept gzip (0: never).",
        ),
    ] = 1024,
    options: Annotated[ModelOptions, Exclude("no_cache", "plan_window")] = SERVED,
    graceful_timeout: Annotated[
        float, typer.Option("--graceful-timeout", min=0, help="Seconds requests in flight get to finish on shutdown.")
    ] = 30.0,
    rerank: RerankOpt = None,
    log_level: Annotated[str, typer.Option("--log-level", help=", ".join(LOG_LEVELS))] = "info",
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request.")] = False,
) -> None:
    """Serve MODEL over HTTP: /v1/embeddings (OpenAI-compatible), /v1/search, /v1/rerank (with --rerank),
    Cohere v2 (/v2/embed, /v2/rerank), Text Embeddings Inference (/embed, /rerank, /similarity, /tokenize, /decode,
    /info), /health, /metrics."""
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r}: choose one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    # lazy: FastAPI, uvicorn, FAISS and torch load only when the server starts, not for --help
    from lmembed.index import Index
    from lmembed.serving.app import create_app
    from lmembed.serving.limits import Limits
    from lmembed.serving.server import run

    limits = Limits(
        max_batch_tokens=max_batch_tokens,
        batch_wait_s=batch_wait_ms / 1000,
        window_share=window_share,
        workers=workers,
        max_request_bytes=max_request_bytes,
        max_concurrent_requests=max_concurrent_requests,
        max_inputs=max_inputs,
        truncate=not no_truncate,
        api_key=api_key,
        public_metrics=public_metrics,
        body_timeout_s=body_timeout,
        max_header_bytes=max_header_bytes,
        max_connections_per_client=max_connections_per_client,
        max_tokens_in_flight=max_tokens_in_flight,
        gzip_min_bytes=gzip_min_bytes,
    )
    index = Index.open(index_dir) if index_dir is not None else None  # a broken index fails before the model loads
    if index_dir is not None:
        Index.check_lexical(index_dir)  # its BM25 files too, before the first hybrid search
    # an int8 model is calibrated before it serves: else the first request's texts would decide every vector
    recorded = index.manifest.model.load.calibration if index is not None and options.calibration is None else None
    if options.precision == "int8" and options.calibration is None and not recorded:
        raise typer.BadParameter(
            "a served int8 model needs calibration texts: --calibration FILE (or an int8 --index)",
            param_hint="--calibration",
        )
    if index is not None and replace(options, device=SERVED.device) == SERVED:
        # no strategy or runtime option given: serve the index's model as it was built (strategy, backend,
        # precision, int8 calibration), as `lmembed search` reads it; MODEL is checked against the index
        embedder = index.load_embedder(device=options.device, source=model)
    else:
        embedder = load_embedder(model, options)
        if options.precision == "int8" and recorded:
            embedder.calibrate(recorded)  # as the index was built
    reranker = open_reranker(rerank, device=options.device) if rerank else None
    names = served_names(served_model_name, model)
    app = create_app(
        embedder,
        model_name=names[0],
        aliases=names[1:],
        index=index,
        limits=limits,
        reranker=reranker,
        reranker_name=rerank,
        index_poll_s=index_poll,
    )
    run(app, host=host, port=port, graceful_timeout=graceful_timeout, log_level=log_level, access_log=access_log)
