"""``POST /v1/rerank`` (Cohere/Jina's schema) and the second stage of ``/v1/search``: query–document pairs scored
by a :class:`~lmembed.rerank.Reranker`, batched across requests by a token budget.

Request: ``query`` (a string), ``documents`` (a list of strings, or of ``{"text": ...}`` objects), optionally
``top_n`` (the best N; default all), ``return_documents`` (default false), ``model`` (the reranker's served name);
another field is refused by name. Pairs are cut to the reranker's length (``--no-truncate`` is the embeddings').
Response: ``{"model", "results": [{"index", "relevance_score", "document": {"text"}?}], "usage": {"total_tokens"}}``
with results best first (ties keep the documents' order). ``relevance_score`` is the reranker's activated score
(``CrossEncoder.predict``'s: a probability for a sigmoid cross-encoder or the LLM reranker).

Pairs are tokenised off the event loop (on a thread of their own, with a private copy of the tokenizer), then
queued in a :class:`~lmembed.serving.batcher.TokenBudgetBatcher` whose passes run the reranker: pairs of many
requests share a pass, bounded by padded tokens (``--max-batch-tokens``), as texts are for embeddings. The limits
are the embeddings': more documents than ``--max-inputs`` is 413, a malformed field 400, and the middleware's
body-size (413), concurrency (429) and API-key (401) checks apply. Pass metrics are ``lmembed_rerank_*``.

``/v1/search`` takes ``mode`` (``dense``, ``bm25``, ``hybrid``), ``fusion`` (``rrf``, ``minmax``), ``rerank``
(true: rerank the first stage's candidates with the served reranker) and ``rerank_top_k`` (candidates per query,
default 100): see :func:`parse_search_stages`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from scipy.special import expit

from lmembed.errors import ConfigError, InputError
from lmembed.index.index import SEARCH_MODES, Hit
from lmembed.index.second_stage import candidate_pairs, reorder_hits
from lmembed.lexical.fusion import FUSIONS
from lmembed.rerank.base import Features, Reranker
from lmembed.serving.batcher import TokenBudgetBatcher, forward_workers
from lmembed.serving.errors import ApiError, bad_request, only_fields, shown, too_many_inputs
from lmembed.serving.limits import Limits, TokenAdmission
from lmembed.serving.metrics import LATENCY_BUCKETS, TEXT_BUCKETS, TOKEN_BUCKETS
from lmembed.serving.schemas import text_field

DEFAULT_RERANK_TOP_K = 100
#: Tokens kept past the reranker's max_length when a long query is cut (so the cut never reaches a kept token).
QUERY_MARGIN = 8
#: Characters a query's token may take on average: text takes a few; a query sparser than this (a 3.5 MB run of one
#: character is 1 BERT token) is refused, since no cut keeps its tokens and every pair would tokenise all of it
SPARSE_QUERY_CHARS = 32
#: Pairs tokenised at a time (the token budget is checked after each chunk).
ENCODE_CHUNK = 256
WARM_UP_PAIR = ("warm-up", "warm-up")


class RerankMetrics:
    """The reranker's pass metrics, in the server's registry, under the names the batcher records into."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.queue_depth = Gauge("lmembed_rerank_queue_depth", "Pairs waiting for a forward pass", registry=r)
        self.batch_tokens = Histogram(
            "lmembed_rerank_batch_tokens", "Padded tokens per rerank pass", buckets=TOKEN_BUCKETS, registry=r
        )
        self.batch_texts = Histogram(
            "lmembed_rerank_batch_pairs", "Pairs per rerank pass", buckets=TEXT_BUCKETS, registry=r
        )
        self.forward_seconds = Histogram(
            "lmembed_rerank_forward_seconds", "Time of one rerank pass", buckets=LATENCY_BUCKETS, registry=r
        )
        self.texts = Counter("lmembed_reranked_pairs", "Query-document pairs scored", registry=r)
        self.tokens = Counter("lmembed_rerank_tokens", "Tokens of the pairs scored", registry=r)


class PairBatcher(TokenBudgetBatcher):
    """The token-budget batcher with the reranker's forward pass: items are query-document pairs with their
    features (encoded once, off the event loop), outputs scores. It schedules as the embeddings' batcher does,
    with the server's ``--batch-wait-ms``, ``--window-share`` and ``--workers``."""

    def __init__(
        self, reranker: Reranker, *, max_batch_tokens: int, metrics: RerankMetrics, limits: Limits | None = None
    ) -> None:
        if reranker.num_labels != 1:
            raise ConfigError(f"reranker {reranker.name} has {reranker.num_labels} labels; serving needs one score")
        self.reranker = reranker
        limits = limits or Limits()
        super().__init__(
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            max_batch_tokens=max_batch_tokens,
            metrics=metrics,  # type: ignore[arg-type]
            width=1,
            max_wait_s=limits.batch_wait_s,
            window_share=limits.window_share,
            **forward_workers(limits.workers, reranker.device),
        )

    def _forward(
        self, pairs: list[tuple[str, str]], instruction: str | None, features: list[Features] | None
    ) -> np.ndarray:
        if features is None:
            raise ValueError("a rerank pass needs its pairs' features")
        reranker = self.reranker
        with torch.inference_mode():  # raw logits: each route puts them on its dialect's scale (RerankService)
            scores = reranker.forward(reranker.collate(features)).float()
        return scores.cpu().numpy()


class RerankService:
    """The served reranker: its pair tokenizer (own thread) and its batcher."""

    def __init__(
        self,
        reranker: Reranker,
        name: str,
        *,
        max_batch_tokens: int,
        registry: CollectorRegistry,
        limits: Limits | None = None,
    ) -> None:
        self.reranker = reranker
        self.name = name
        self.metrics = RerankMetrics(registry)
        self.batcher = PairBatcher(reranker, max_batch_tokens=max_batch_tokens, metrics=self.metrics, limits=limits)
        self.tokenizing = copy.copy(reranker)  # the same reranker with a private tokenizer, for the thread below
        self.tokenizing.tokenizer = copy.deepcopy(reranker.tokenizer)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-rerank-tokenize")

    async def start(self) -> None:
        await self.batcher.start()

    def _encode(self, pairs: list[tuple[str, str]], budget: int | None = None) -> list[Features]:
        """The pairs' features, each distinct query first cut to what a pair can hold of it (on the tokenizing
        thread), tokenised ``ENCODE_CHUNK`` pairs at a time: past ``budget`` tokens it stops and refuses (413),
        so 200,000 pairs are not all tokenised only to be refused."""
        longest: dict[str, int] = {}
        for query, document in pairs:
            longest[query] = max(longest.get(query, 0), len(document))
        cut = {query: self.bounded_query(query, chars) for query, chars in longest.items()}
        features: list[Features] = []
        tokens = 0
        for start in range(0, len(pairs), ENCODE_CHUNK):
            chunk = self.tokenizing.encode_pairs([(cut[q], d) for q, d in pairs[start : start + ENCODE_CHUNK]])
            tokens += sum(len(f["input_ids"]) for f in chunk)
            if budget is not None and tokens > budget:
                raise ApiError(
                    413,
                    f"this request's first {start + len(chunk)} of {len(pairs)} query-document pairs have {tokens} "
                    f"tokens, more than the limit of {budget} tokens in flight (--max-tokens-in-flight); send fewer "
                    "documents or a smaller rerank_top_k",
                    "too_many_tokens",
                )
            features.extend(chunk)
        return features

    def bounded_query(self, query: str, longest_document: int = 0) -> str:
        """``query`` cut after its first ``max(max_length + 8, longest_document + 1)`` tokens (``longest_document``:
        the characters of its longest document, at least that document's tokens): no pair keeps more of a query
        than the reranker reads (truncation keeps the query's first tokens), and a query longer than a document
        stays longer than it, so truncation, which cuts the longer side of a pair first and gives it the odd token,
        cuts the same tokens and the features are the same; but a query of a million characters is tokenised once
        here, not once per candidate (which took GBs for 100 candidates)."""
        keep = max(self.reranker.max_length + QUERY_MARGIN, longest_document + 1)
        if len(query) <= keep * 4:
            return query
        tokenizer = self.tokenizing.tokenizer
        if not getattr(tokenizer, "is_fast", False):
            return query  # no offsets to cut at
        for text in (query[: keep * SPARSE_QUERY_CHARS], query):
            offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) > keep:
                return query[: offsets[keep - 1][1]]
            if len(text) == len(query):
                break
        if len(query) > keep * SPARSE_QUERY_CHARS:  # no cut keeps its tokens, and each pair would read it all again
            raise bad_request(
                f"'query' is {len(query)} characters that make only {len(offsets)} tokens: more than "
                f"{SPARSE_QUERY_CHARS} characters a token, and a query is tokenised again with every document; "
                "send the part of it that is text",
                "query_too_sparse",
                "query",
            )
        return query

    async def stop(self) -> None:
        await self.batcher.stop()
        self.executor.shutdown(wait=True)

    def activated(self, logits: np.ndarray) -> np.ndarray:
        """The reranker's own scores (its recorded activation of the logits), as the in-process reranker gives."""
        with torch.inference_mode():
            return self.reranker.activation(torch.from_numpy(np.asarray(logits, dtype=np.float32))).numpy()

    async def score(
        self, pairs: Sequence[tuple[str, str]], admission: TokenAdmission | None = None
    ) -> tuple[np.ndarray, int]:
        """Raw logits of ``pairs`` (input order) and the tokens they took; with an ``admission``, the pairs'
        tokens count against the server's tokens in flight (413/429 beyond them) while they are scored. A route
        gives them on its dialect's scale: :func:`relevance_scores` (Cohere, TEI), :meth:`activated` (lmembed's
        search, equal to the in-process reranker)."""
        # A pair given more than once is scored once: copies split across passes of different shapes would get
        # scores a rounding apart, and ties would no longer keep the documents' order (usage still counts each).
        unique: dict[tuple[str, str], int] = {}
        where = [unique.setdefault((query, document), len(unique)) for query, document in pairs]
        distinct = list(unique)
        loop = asyncio.get_running_loop()
        try:
            budget = admission.limit if admission is not None else None
            features = await loop.run_in_executor(self.executor, self._encode, distinct, budget)
        except InputError as exc:
            raise bad_request(str(exc), "invalid_input") from None
        lengths = [len(f["input_ids"]) for f in features]
        scored = sum(lengths)
        if admission is not None:
            admission.admit(scored, alone=False)
        try:
            scores = await self.batcher.embed(distinct, lengths, None, features)
        finally:
            if admission is not None:
                admission.release(scored)
        tokens = sum(lengths[i] for i in where)
        self.metrics.tokens.inc(tokens)
        return scores[where, 0], tokens

    async def rerank_hits(
        self,
        queries: Sequence[str],
        results: Sequence[Sequence[Hit]],
        k: int,
        admission: TokenAdmission | None = None,
    ) -> list[list[Hit]]:
        """Each query's hits reordered by the reranker, the ``k`` best (``rerank_hits``, through the batcher)."""
        pairs = candidate_pairs(queries, results)
        scores = self.activated((await self.score(pairs, admission))[0]).tolist() if pairs else []
        return reorder_hits(results, scores, k)


# ---------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    model: str
    top_n: int | None = None
    return_documents: bool = False


#: the fields ``/v1/rerank`` takes (Cohere's and Jina's); another is refused by name (a misspelt ``top_n`` would
#: otherwise answer every document without a word)
RERANK_FIELDS = ("model", "query", "documents", "top_n", "return_documents")


def _documents(value: Any, max_inputs: int, field: str = "documents") -> list[str]:
    """The documents of a rerank request, from its field ``field`` (``texts`` on TEI's route)."""
    if value is None:
        raise bad_request(f"'{field}' is required", "missing_input", field)
    if not isinstance(value, list):
        raise bad_request(f"'{field}' must be a list of strings, got {type(value).__name__}", "invalid_input", field)
    if not value:
        raise bad_request(f"'{field}' is an empty list; send at least one document", "empty_input", field)
    if len(value) > max_inputs:
        raise too_many_inputs(field, len(value), max_inputs)
    out = []
    for i, item in enumerate(value):
        if isinstance(item, dict) and set(item) == {"text"}:
            item = item["text"]
        if not isinstance(item, str):
            raise bad_request(
                f"'{field}[{i}]' is {type(item).__name__}; every document must be a string or {{\"text\": ...}}",
                "invalid_input",
                field,
            )
        out.append(text_field(item, f"{field}[{i}]", param=field))
    return out


def parse_rerank_request(
    payload: dict[str, Any],
    *,
    served: Collection[str],
    default_model: str,
    max_inputs: int,
    fields: Sequence[str] | None = RERANK_FIELDS,
    what: str = "a rerank request",
    documents_field: str = "documents",
) -> RerankRequest:
    """Validate a ``/v1/rerank`` body (see the module doc): a field not in ``fields`` is refused by name (``None``: the
    caller checked them), and the documents are read from ``documents_field``."""
    if fields is not None:
        only_fields(payload, fields, what)
    if "query" not in payload:
        raise bad_request("'query' is required", "missing_input", "query")
    query = text_field(payload["query"], "query")
    documents = _documents(payload.get(documents_field), max_inputs, documents_field)
    model = payload.get("model")
    if model is not None and (not isinstance(model, str) or model not in served):
        raise bad_request(
            f"model {shown(model)} is not served here; this server reranks with {', '.join(sorted(served))}",
            "model_not_found",
            "model",
        )
    top_n = payload.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise bad_request(f"'top_n' must be a positive integer, got {shown(top_n)}", "invalid_top_n", "top_n")
    return_documents = payload.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise bad_request(
            f"'return_documents' must be true or false, got {shown(return_documents)}",
            "invalid_return_documents",
            "return_documents",
        )
    return RerankRequest(query, documents, model or default_model, top_n, return_documents)


def ranking(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices best first (ties keep the documents' order), the ``top_n`` first."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_n]


def relevance_scores(logits: np.ndarray) -> np.ndarray:
    """A relevance score in (0, 1) for each logit: its sigmoid, as Text Embeddings Inference gives a one-label
    reranker's scores unless ``raw_scores`` (``core/src/infer.rs``) and as Cohere's ``relevance_score`` is bounded;
    whatever activation the reranker's folder records (cross-encoder/ms-marco-* record none: raw logits)."""
    return expit(np.asarray(logits, dtype=np.float64)).astype(np.float32)


def rerank_body(req: RerankRequest, scores: np.ndarray, tokens: int) -> dict[str, Any]:
    order = ranking(scores, req.top_n)
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            item["document"] = {"text": req.documents[i]}
        results.append(item)
    return {"object": "list", "model": req.model, "results": results, "usage": {"total_tokens": tokens}}


@dataclass(frozen=True)
class SearchStages:
    """How ``/v1/search`` finds and orders documents."""

    mode: str = "dense"
    fusion: str = "rrf"
    rerank: bool = False
    rerank_top_k: int = DEFAULT_RERANK_TOP_K


def parse_search_stages(payload: dict[str, Any], *, has_reranker: bool, max_k: int) -> SearchStages:
    """``mode``, ``fusion``, ``rerank`` and ``rerank_top_k`` of a ``/v1/search`` body."""
    mode = payload.get("mode", "dense")
    if mode not in SEARCH_MODES:
        raise bad_request(f"'mode' must be one of {', '.join(SEARCH_MODES)}, got {shown(mode)}", "invalid_mode", "mode")
    fusion = payload.get("fusion", "rrf")
    if fusion not in FUSIONS:
        raise bad_request(
            f"'fusion' must be one of {', '.join(FUSIONS)}, got {shown(fusion)}", "invalid_fusion", "fusion"
        )
    rerank = payload.get("rerank", False)
    if not isinstance(rerank, bool):
        raise bad_request(f"'rerank' must be true or false, got {shown(rerank)}", "invalid_rerank", "rerank")
    if rerank and not has_reranker:
        raise bad_request("no reranker is loaded; start the server with --rerank MODEL", "no_reranker", "rerank")
    top_k = payload.get("rerank_top_k", min(DEFAULT_RERANK_TOP_K, max_k))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= max_k:
        raise bad_request(
            f"'rerank_top_k' must be an integer from 1 to {max_k}, got {shown(top_k)}",
            "invalid_rerank_top_k",
            "rerank_top_k",
        )
    return SearchStages(mode, fusion, rerank, top_k)
