"""The FastAPI application: :func:`create_app` serves one Embedder (and optionally one index).

=========================== ==================================================================================
endpoint                    what it does
=========================== ==================================================================================
``POST /v1/embeddings``     OpenAI-compatible embeddings (see :mod:`lmembed.serving.schemas` for the fields)
``POST /v1/search``         query text(s) → ids, scores, texts of the index (404 without one; followed on disk):
                            dense, BM25 or hybrid, optionally reranked (:mod:`lmembed.serving.rerank`)
``POST /v1/rerank``         Cohere/Jina-style reranking with the loaded reranker (404 without one)
``GET /v1/models``          the served model, with its dimension and strategy (and the reranker)
``GET /v1/models/{model}``  one of them, by its name or an alias (404 ``model_not_found`` otherwise)
``POST /v2/embed``          Cohere v2 embeddings (float, int8, uint8, binary, ubinary, base64: :mod:`.compat`)
``POST /v2/rerank``         Cohere v2 reranking (404 without a reranker)
``POST /embed``, ``POST /`` Text Embeddings Inference's embeddings (``{"inputs": ...}`` → a list of vectors)
``POST /embed_all``         Text Embeddings Inference's token vectors (``{"inputs": ...}`` → per text, per token)
``POST /rerank``            Text Embeddings Inference's reranking (404 without a reranker)
``GET /info``               Text Embeddings Inference's model information
``GET /health``             200 once warmed up (one forward pass done), 503 before and while shutting down
``GET /metrics``            Prometheus metrics (:mod:`lmembed.serving.metrics`); with an API key, it needs the key
                            too unless ``Limits.public_metrics``
=========================== ==================================================================================

The routes that read (``/v1/models``, ``/info``, ``/health``, ``/metrics``) answer ``HEAD`` too, and a ``405``
says in ``Allow`` which methods a route takes. The model answers to each of its served names (``model_name`` and
``aliases``: a client's default name such as ``text-embedding-ada-002`` can be mapped on purpose). A request body is
refused before it is parsed when it nests deeper than :data:`~lmembed.serving.schemas.MAX_JSON_DEPTH`; embedding
texts, search queries and rerank pairs count against ``--max-tokens-in-flight``. When the server is idle after
large requests, it hands freed heap memory back to the operating system (:mod:`lmembed.serving.memory`).

The server keeps its own encoding engine over the Embedder's backbone (no embedding cache: requests are
not worth caching, and it must not write a cache shard per pass), reads out with the Embedder's strategy,
and sends every text through the :class:`~lmembed.serving.batcher.TokenBudgetBatcher`. Shutdown is graceful:
uvicorn stops accepting connections and lets requests in flight finish; then the batcher finishes every
queued text before it stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmembed import __version__
from lmembed.config import SIDES, for_side
from lmembed.embedder import Embedder, postprocess
from lmembed.index import Index
from lmembed.index.manifest import check_embedder
from lmembed.load_spec import LoadSpec
from lmembed.rerank import Reranker
from lmembed.serving.batcher import TokenBudgetBatcher, forward_workers
from lmembed.serving.compat import (
    COHERE_RERANK_FIELDS,
    MAX_TOKEN_VALUES,
    CompatEmbedRequest,
    cohere_embed_body,
    cohere_rerank_body,
    cohere_rerank_checks,
    parse_cohere_embed,
    parse_tei_decode,
    parse_tei_embed,
    parse_tei_embed_all,
    parse_tei_rerank,
    parse_tei_similarity,
    parse_tei_tokenize,
    similarity_body,
    tei_rerank_body,
    token_states_body,
)
from lmembed.serving.errors import ApiError
from lmembed.serving.followed_index import DEFAULT_POLL_S, FollowedIndex
from lmembed.serving.limits import ENDPOINTS, GuardMiddleware, Limits, TokenAdmission
from lmembed.serving.memory import MemoryTrimmer
from lmembed.serving.metrics import ServerMetrics
from lmembed.serving.rerank import (
    WARM_UP_PAIR,
    RerankRequest,
    RerankService,
    parse_rerank_request,
    parse_search_stages,
    ranking,
    relevance_scores,
    rerank_body,
)
from lmembed.serving.schemas import embedding_body, parse_embedding_request, parse_json, parse_search_request
from lmembed.serving.tokens import Field, RequestTokenizer

log = logging.getLogger(__name__)

T = TypeVar("T")
WARM_UP_TEXT = "warm-up"
JSON = "application/json"
#: the routes that only read answer HEAD as well as GET (RFC 9110 9.1: a general-purpose server supports both)
READ_METHODS = ["GET", "HEAD"]


class ServerState:
    """Everything one app holds: the model, its batcher and tokenizer, the index, limits and metrics."""

    def __init__(
        self,
        embedder: Embedder,
        model_name: str,
        index: Index | None,
        limits: Limits,
        reranker: Reranker | None = None,
        reranker_name: str | None = None,
        aliases: Sequence[str] = (),
        index_poll_s: float = DEFAULT_POLL_S,
    ) -> None:
        self.embedder = embedder
        self.config = embedder.config
        self.model_name = model_name
        self.aliases = tuple(a for a in dict.fromkeys(aliases) if a != model_name)
        self.trimmer = MemoryTrimmer()
        self.index = None if index is None else FollowedIndex(index, self.open_index, every_s=index_poll_s)
        self.limits = limits
        self.metrics = ServerMetrics()
        self.engine = embedder.engine.uncached()  # its backend too: served vectors are the ones its encode gives
        schedule = {
            "max_batch_tokens": limits.max_batch_tokens,
            "max_wait_s": limits.batch_wait_s,
            "window_share": limits.window_share,
            **forward_workers(limits.workers, embedder.backbone.device, embedder.backend.name),
        }
        self.batcher = TokenBudgetBatcher(self.engine, self.config, metrics=self.metrics, **schedule)
        query_config = for_side(self.config, "query")[0]
        self.query_batcher = None  # an asymmetric (Router) model reads queries through their own route
        if query_config != self.config:
            self.query_batcher = TokenBudgetBatcher(self.engine, query_config, metrics=self.metrics, **schedule)
        # one tokenisation serves both batchers: a query's strategy differs from the model's by its head's route
        # only, which is not read when texts are tokenised
        self.tokenizer = RequestTokenizer(self.engine, self.config, truncate=limits.truncate)
        self.admission = TokenAdmission(limits.max_tokens_in_flight)
        self.rerank = None
        if reranker is not None:
            name = reranker_name or reranker.name
            self.rerank = RerankService(
                reranker, name, max_batch_tokens=limits.max_batch_tokens, registry=self.metrics.registry, limits=limits
            )
        self.created = int(time.time())
        self.status = "starting"

    @property
    def served(self) -> set[str]:
        return {self.model_name, *self.aliases}

    def instruction_for(self, input_type: str | None, instruction: str | None) -> str | None:
        """Queries get the request's instruction or the strategy's, documents the strategy's document prompt (as
        ``encode_queries``/``encode_corpus``); other texts the request's instruction or the model's default prompt
        (as ``encode``)."""
        if input_type in SIDES:
            return for_side(self.config, input_type, instruction)[1]
        return instruction or self.config.named_prompt(None)

    @contextmanager
    def in_flight(self, tokens: int, *, memory: int | None = None, counted: bool = True) -> Iterator[None]:
        """Hold ``tokens`` as in flight while the block runs (a 429 past ``--max-tokens-in-flight``), note what the
        work holds for the memory trimmer (``memory``: its size in tokens' worth, the tokens when not given), and
        count the tokens in ``lmembed_prompt_tokens_total`` once the block succeeded, unless not ``counted``."""
        self.admission.admit(tokens)
        self.trimmer.note(tokens if memory is None else memory)
        try:
            yield
        finally:
            self.admission.release(tokens)
        if counted:
            self.metrics.tokens.inc(tokens)

    async def embed(
        self,
        texts: list[str],
        instruction: str | None,
        dimensions: int | None,
        field: Field,
        side: str | None = None,
        normalize: bool | None = None,
        truncate: bool | None = None,
        *,
        counted: bool = True,
        instruction_field: str | None = None,
    ) -> tuple[np.ndarray, int]:
        """Final vectors (as ``Embedder.encode`` returns them; ``side="query"`` as ``encode_queries``) and the
        number of tokens embedded (``normalize``: L2-normalise or not, whatever the strategy says; ``truncate``
        False: a text longer than the model reads is refused). The tokens count in ``lmembed_prompt_tokens_total``
        unless not ``counted`` (the warm-up). ``field`` and ``instruction_field`` name the texts and the request's
        instruction in a refusal (:meth:`RequestTokenizer.build`)."""
        features = await self.tokenizer.features(texts, instruction, field, truncate, instruction_field)
        lengths = [len(f) for f in features]
        tokens = sum(lengths)
        batcher = self.query_batcher if side == "query" and self.query_batcher is not None else self.batcher
        with self.in_flight(tokens, counted=counted):  # every route that embeds counts here (search's queries too)
            raw = await batcher.embed(texts, lengths, instruction, features)
        config = self.config if dimensions is None else self.config.with_options(dim=dimensions)
        if normalize is not None:
            config = config.with_options(normalize=normalize)
        return postprocess(raw, config), tokens

    async def embed_compat(self, request: Request, req: CompatEmbedRequest, field: str) -> tuple[np.ndarray, int]:
        """The vectors of a Cohere or TEI embedding request (as ``/v1/embeddings`` embeds them)."""
        instruction = self.instruction_for(req.input_type, None)
        work = self.embed(req.texts, instruction, req.dimensions, field, req.input_type, req.normalize, req.truncate)
        return await unless_disconnected(request, work)

    async def token_states(self, request: Request, req: CompatEmbedRequest) -> list[np.ndarray]:
        """Token vectors of a TEI ``/embed_all`` request (``Embedder.encode_tokens``, the side its ``prompt_name``
        names), their tokens admitted as in flight; 413 when the answer would hold over ``MAX_TOKEN_VALUES``."""
        if req.input_type in SIDES:
            config, instruction = for_side(self.config, req.input_type)
        else:  # as encode: the model's default prompt
            config, instruction = self.config, self.instruction_for(None, None)
        features = await self.tokenizer.features(req.texts, instruction, "inputs", req.truncate)
        tokens = sum(len(f) for f in features)
        values = tokens * self.embedder.backbone.hidden_size
        if values > MAX_TOKEN_VALUES:
            raise ApiError(
                413,
                f"'inputs' make {tokens} tokens of {self.embedder.backbone.hidden_size} numbers each ({values}); an "
                f"/embed_all answer holds at most {MAX_TOKEN_VALUES}: send fewer or shorter texts",
                "too_many_token_values",
                param="inputs",
            )
        with self.in_flight(tokens, memory=tokens + values * 10 // 4):  # the answer: about 10 characters a number
            work = asyncio.to_thread(
                self.engine.encode_token_states, req.texts, config, instruction=instruction, features=features
            )
            return await unless_disconnected(request, work)

    async def score(self, request: Request, req: RerankRequest) -> tuple[np.ndarray, int]:
        """The reranker's logits of a rerank request's documents (their tokens admitted as in flight)."""
        if self.rerank is None:
            raise ApiError(404, "no reranker is loaded; start the server with --rerank MODEL", "no_reranker")
        pairs = [(req.query, document) for document in req.documents]
        self.trimmer.note((len(req.query) * len(pairs) + sum(map(len, req.documents))) // 4)  # even if refused
        return await unless_disconnected(request, self.rerank.score(pairs, self.admission))

    def parse_rerank(self, payload: dict[str, Any], **dialect: Any) -> RerankRequest:
        """A rerank body validated (``dialect``: :func:`parse_rerank_request`'s ``fields``, ``what`` and
        ``documents_field`` for a route that is not ``/v1/rerank``)."""
        if self.rerank is None:
            raise ApiError(404, "no reranker is loaded; start the server with --rerank MODEL", "no_reranker")
        name = self.rerank.name
        limit = self.limits.max_inputs
        return parse_rerank_request(payload, served={name}, default_model=name, max_inputs=limit, **dialect)

    def open_index(self, folder: Path) -> Index:
        """The index at ``folder`` opened with every check a server start makes: each data file's sha256, the model
        it was built with against the served one, its BM25 files."""
        index = Index.open(folder, self.embedder)
        Index.check_lexical(folder)
        return index

    async def warm_up(self) -> None:
        try:
            vectors, _ = await self.embed([WARM_UP_TEXT], None, None, "input", counted=False)
            if self.index is not None:
                await asyncio.to_thread(self.index.index.search_vectors, vectors, 1)
            if self.rerank is not None:
                await self.rerank.score([WARM_UP_PAIR])
        except Exception:
            self.status = "failed"
            log.exception("warm-up failed; /health stays 503")
            return
        if self.status == "starting":
            self.status = "ok"
            log.info("ready: %s (%s, dim %d)", self.model_name, self.config.label(), self.embedder.dim)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await self.batcher.start()
        if self.query_batcher is not None:
            await self.query_batcher.start()
        if self.rerank is not None:
            await self.rerank.start()
        warm_up = asyncio.create_task(self.warm_up())
        try:
            yield
        finally:
            self.status = "shutting_down"
            await warm_up
            await self.batcher.stop()
            if self.query_batcher is not None:
                await self.query_batcher.stop()
            if self.rerank is not None:
                await self.rerank.stop()
            self.tokenizer.close()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client hangs up first: then cancel it, so its texts still waiting leave the
    queue instead of taking a forward pass nobody will read (answered 499, for the logs and metrics)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(request.receive())  # the body is read: the next message is the disconnect
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        gone = task not in done and watch.exception() is None and watch.result().get("type") == "http.disconnect"
        if gone:
            task.cancel()
            raise ApiError(499, "the client closed the connection before the answer", "client_closed_request")
        return await task
    finally:
        watch.cancel()


def _error_response(
    state: ServerState, request: Request, error: ApiError, headers: dict[str, str] | None = None
) -> JSONResponse:
    state.metrics.error(error.status, error.code)
    headers = dict(headers or {})
    if error.status in (429, 503):
        headers["Retry-After"] = "1"
    return JSONResponse(error.body(request.url.path), status_code=error.status, headers=headers or None)


def served_load_spec(spec: LoadSpec) -> dict[str, Any]:
    """The load spec a client sees in ``/v1/models`` (to reproduce the served vectors itself): the whole spec,
    but int8's calibration texts (the operator's own texts) only counted."""
    data = spec.to_dict()
    if data.get("calibration") is not None:
        data["calibration"] = {"texts": len(data["calibration"])}
    return data


def index_card(followed: FollowedIndex) -> dict[str, Any]:
    """What ``/v1/models`` says of the searched index: its kind, documents and generation, and why the folder's
    newest write is not searched when it is not."""
    index = followed.index
    card = {"kind": index.kind, "documents": index.count, "generation": index.manifest.generation}
    return card if followed.failure is None else {**card, "not_searched": followed.failure}


def create_app(
    embedder: Embedder,
    *,
    model_name: str | None = None,
    index: Index | None = None,
    limits: Limits | None = None,
    reranker: Reranker | None = None,
    reranker_name: str | None = None,
    aliases: Sequence[str] = (),
    index_poll_s: float = DEFAULT_POLL_S,
) -> FastAPI:
    """The server application for ``embedder`` (served under ``model_name``, by default the model's name, and
    under each of ``aliases``: requests may name any of them).

    With an ``index``, ``/v1/search`` searches it; the index must have been built with this model and
    strategy (an :class:`~lmembed.index.IndexMismatchError` otherwise). With a ``reranker`` (served under
    ``reranker_name``), ``/v1/rerank`` reranks and ``/v1/search`` can rerank its candidates. An index saved to a
    folder is followed (:mod:`lmembed.serving.followed_index`): its manifest is looked at every ``index_poll_s``
    seconds at most, and a new generation (``lmembed index add``) is searched once it is opened whole (0: never).
    A response of ``limits.gzip_min_bytes`` or more is gzip-compressed for a client that accepts it
    (``Accept-Encoding: gzip``, as httpx and the official clients send).
    """
    if index is not None:
        check_embedder(index.manifest, embedder, index.path or "(in memory)")
    name = model_name or embedder.name
    state = ServerState(embedder, name, index, limits or Limits(), reranker, reranker_name, aliases, index_poll_s)
    app = FastAPI(title="lmembed", version=__version__, lifespan=state.lifespan)
    app.state.lmembed = state
    if state.limits.gzip_min_bytes:
        app.add_middleware(GZipMiddleware, minimum_size=state.limits.gzip_min_bytes)  # inside the guard's refusals
    app.add_middleware(GuardMiddleware, limits=state.limits, metrics=state.metrics, on_idle=state.trimmer.idle)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(state, request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        path = request.url.path
        message = f"{path}: {exc.detail}"
        if exc.status_code == 404 and f"/v1{path}" in ENDPOINTS:
            message += f"; the OpenAI-compatible routes are under /v1: use /v1{path} (a client's base URL ends in /v1)"
        return _error_response(state, request, ApiError(exc.status_code, message, code), exc.headers)  # 405: its Allow

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request to %s failed", request.url.path)
        return _error_response(
            state, request, ApiError(500, f"internal error ({type(exc).__name__}: {exc})", "internal_error")
        )

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        req = parse_embedding_request(
            parse_json(await request.body()),
            served=state.served,
            default_model=state.model_name,
            max_inputs=state.limits.max_inputs,
            dim=embedder.dim,
            fixed_width=embedder.config.fixed_width(),
        )
        instruction = state.instruction_for(req.input_type, req.instruction)
        asked = "instruction" if req.instruction is not None else None  # a refusal of it names the request's field
        work = state.embed(req.texts, instruction, req.dimensions, "input", req.input_type, instruction_field=asked)
        vectors, tokens = await unless_disconnected(request, work)
        body = await asyncio.to_thread(embedding_body, vectors, req.encoding_format, req.model, tokens)
        return Response(body, media_type=JSON)

    @app.post("/v1/search")
    async def search(request: Request) -> Response:
        if state.index is None:
            raise ApiError(404, "no index is loaded; start the server with --index DIR", "no_index")
        payload = parse_json(await request.body())
        req = parse_search_request(
            payload,
            served=state.served,
            default_model=state.model_name,
            max_inputs=state.limits.max_inputs,
            max_k=state.limits.max_top_k,
        )
        stages = parse_search_stages(payload, has_reranker=state.rerank is not None, max_k=state.limits.max_top_k)
        instruction = state.instruction_for("query", req.instruction)
        vectors, tokens = None, 0
        if stages.mode != "bm25":
            asked = "instruction" if req.instruction is not None else None
            embedding = state.embed(req.queries, instruction, None, "query", "query", instruction_field=asked)
            vectors, tokens = await unless_disconnected(request, embedding)
        depth = max(req.k, stages.rerank_top_k) if stages.rerank else req.k
        how = {"mode": stages.mode, "fusion": stages.fusion, "vectors": vectors}
        index = state.index.current()  # the newest generation opened whole (followed_index)
        scores, rows = await asyncio.to_thread(index.search_rows, req.queries, depth, **how)
        results = index.hits(scores, rows)
        state.trimmer.note(sum(map(len, req.queries)) // 4 + depth * len(req.queries))  # even if reranking is refused
        if stages.rerank:
            reranked = state.rerank.rerank_hits(req.queries, results, req.k, state.admission)
            results = await unless_disconnected(request, reranked)
        data = [
            {
                "object": "search_result",
                "index": i,
                "query": query,
                "hits": [
                    {
                        "rank": h.rank,
                        "id": h.id,
                        "score": h.score,
                        "text": h.text,
                        **({"metadata": h.metadata} if h.metadata else {}),
                    }
                    for h in hits
                ],
            }
            for i, (query, hits) in enumerate(zip(req.queries, results, strict=True))
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": req.model, "usage": usage})

    @app.post("/v1/rerank")
    async def rerank(request: Request) -> Response:
        req = state.parse_rerank(parse_json(await request.body()))
        logits, tokens = await state.score(request, req)
        return JSONResponse(rerank_body(req, relevance_scores(logits), tokens))

    @app.post("/v2/embed")
    async def cohere_embed(request: Request) -> Response:
        req = parse_cohere_embed(
            parse_json(await request.body()),
            served=state.served,
            default_model=state.model_name,
            max_inputs=state.limits.max_inputs,
            dim=embedder.dim,
            fixed_width=embedder.config.fixed_width(),
            max_length=state.tokenizer.max_length,
        )
        vectors, tokens = await state.embed_compat(request, req, "texts")
        body = await asyncio.to_thread(cohere_embed_body, req, vectors, tokens)
        return JSONResponse(body)

    @app.post("/v2/rerank")
    async def cohere_rerank(request: Request) -> Response:
        payload = parse_json(await request.body())
        req = state.parse_rerank(payload, fields=COHERE_RERANK_FIELDS, what="a Cohere v2 rerank request")
        cohere_rerank_checks(payload, state.rerank.reranker.max_length if state.rerank else 0)
        logits, tokens = await state.score(request, req)
        scores = relevance_scores(logits)
        documents = req.documents if req.return_documents else None
        return JSONResponse(cohere_rerank_body(ranking(scores, req.top_n), scores, documents, tokens))

    async def tei_similarity(request: Request, payload: dict[str, Any]) -> Response:
        req = parse_tei_similarity(payload, max_inputs=state.limits.max_inputs)
        texts = [req.source, *req.sentences]
        names = [("inputs.source_sentence",) * 2] + [
            (f"inputs.sentences[{i}]", "inputs.sentences") for i in range(len(req.sentences))
        ]
        work = state.embed(texts, state.instruction_for(req.side, None), None, names, req.side)
        vectors, _ = await unless_disconnected(request, work)
        return JSONResponse(similarity_body(vectors))

    @app.post("/similarity")
    async def tei_similarity_route(request: Request) -> Response:
        return await tei_similarity(request, parse_json(await request.body()))

    @app.post("/tokenize")
    async def tei_tokenize(request: Request) -> Response:
        req = parse_tei_tokenize(parse_json(await request.body()), max_inputs=state.limits.max_inputs)
        limit = state.limits.max_tokens_in_flight  # the answer lists each token: bounded as one request's tokens
        tokens = state.tokenizer
        return JSONResponse(await tokens.inspect(tokens.split, req.texts, req.add_special_tokens, limit))

    @app.post("/decode")
    async def tei_decode(request: Request) -> Response:
        vocab = len(embedder.backbone.tokenizer)
        req = parse_tei_decode(parse_json(await request.body()), max_inputs=state.limits.max_inputs, vocab_size=vocab)
        return JSONResponse(await state.tokenizer.inspect(state.tokenizer.decode, req.ids, req.skip_special_tokens))

    @app.post("/embed")
    @app.post("/")
    async def tei_embed(request: Request) -> Response:
        payload = parse_json(await request.body())
        if request.url.path == "/" and isinstance(payload.get("inputs"), dict):
            return await tei_similarity(request, payload)  # InferenceClient(model=URL).sentence_similarity
        req = parse_tei_embed(
            payload,
            default_model=state.model_name,
            max_inputs=state.limits.max_inputs,
            dim=embedder.dim,
            fixed_width=embedder.config.fixed_width(),
        )
        vectors, _ = await state.embed_compat(request, req, "inputs")
        return Response(json.dumps(vectors.tolist()).encode(), media_type=JSON)

    @app.post("/embed_all")
    async def tei_embed_all(request: Request) -> Response:
        req = parse_tei_embed_all(
            parse_json(await request.body()), default_model=state.model_name, max_inputs=state.limits.max_inputs
        )
        states = await state.token_states(request, req)
        return Response(await asyncio.to_thread(token_states_body, states), media_type=JSON)

    @app.post("/rerank")
    async def tei_rerank(request: Request) -> Response:
        payload = parse_json(await request.body())
        body = parse_tei_rerank(payload)
        raw = body.pop("raw_scores")
        req = state.parse_rerank(body, fields=None, documents_field="texts")
        logits, _ = await state.score(request, req)
        scores = logits if raw else relevance_scores(logits)  # TEI: the sigmoid unless raw_scores
        return JSONResponse(tei_rerank_body(ranking(scores), scores, req.documents, req.return_documents))

    @app.api_route("/info", methods=READ_METHODS)
    async def tei_info() -> dict[str, Any]:
        limits = state.limits
        info: dict[str, Any] = {
            "model_id": state.model_name,
            "model_sha": None,
            "model_dtype": str(embedder.backbone.dtype).removeprefix("torch."),
            "model_type": {"embedding": {"pooling": state.config.pooling}},
            "served_model_names": [state.model_name, *state.aliases],
            "strategy": state.config.label(),
            "dimensions": embedder.dim,
            "max_concurrent_requests": limits.max_concurrent_requests,
            "max_input_length": state.tokenizer.max_length,
            "max_batch_tokens": limits.max_batch_tokens,
            "max_batch_requests": None,
            "max_client_batch_size": limits.max_inputs,
            "auto_truncate": limits.truncate,
            "tokenization_workers": 1,
            "version": __version__,
        }
        if state.rerank is not None:
            info["reranker"] = {"model_id": state.rerank.name, "max_input_length": state.rerank.reranker.max_length}
        return info

    def cards() -> list[dict[str, Any]]:
        card = {
            "id": state.model_name,
            "aliases": list(state.aliases),
            "object": "model",
            "created": state.created,
            "owned_by": "lmembed",
            "dimensions": embedder.dim,
            "max_input_tokens": state.tokenizer.max_length,
            "strategy": state.config.label(),
            "load": served_load_spec(embedder.load_spec),
            "index": None if state.index is None else index_card(state.index),
        }
        served = [card]
        if state.rerank is not None:
            reranker = state.rerank.reranker
            served.append(
                {
                    "id": state.rerank.name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "lmembed",
                    "type": "reranker",
                    "kind": reranker.kind,
                    "max_input_tokens": reranker.max_length,
                }
            )
        return served

    @app.api_route("/v1/models", methods=READ_METHODS)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": cards()}

    @app.api_route("/v1/models/{model:path}", methods=READ_METHODS)
    async def model(model: str) -> dict[str, Any]:
        served = cards()
        for card in served:
            if model == card["id"] or model in card.get("aliases", ()):
                return card
        names = ", ".join(sorted(name for card in served for name in (card["id"], *card.get("aliases", ()))))
        raise ApiError(404, f"model {model!r} is not served here; this server serves {names}", "model_not_found")

    @app.api_route("/health", methods=READ_METHODS)
    async def health() -> JSONResponse:
        return JSONResponse({"status": state.status}, status_code=200 if state.status == "ok" else 503)

    @app.api_route("/metrics", methods=READ_METHODS)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    return app
