"""The server's limits, and the ASGI middleware that enforces the ones that come before a request is parsed.

The middleware answers at once, before the application sees the request, in this order:

* ``400`` (and the connection closed) for ambiguous framing: both ``Content-Length`` and
  ``Transfer-Encoding`` (RFC 9112 §6.1: a request-smuggling shape);
* ``431`` when the request's header block is larger than ``max_header_bytes``;
* ``401`` without the right ``Authorization: Bearer <key>`` when an API key is set;
* ``413`` when the body is larger than ``max_request_bytes`` (from ``Content-Length``, or while reading a
  body sent without one);
* ``408`` (and the connection closed) when the whole body has not arrived within ``body_timeout_s``;
* ``415`` (``param: content-encoding``) for a body sent with a ``Content-Encoding`` other than ``identity``: no body
  is decompressed;
* ``429`` when ``max_concurrent_requests`` requests are already being handled: the caller is refused
  immediately (with ``Retry-After``), never queued without bound.

The body is read, under its timeout, *before* a concurrency slot is taken: clients that trickle their bodies
hold a connection each, never a slot, so they cannot starve the others. Connections per client address are
capped by the server (:mod:`lmembed.serving.server`, ``429`` and a bounded close), and texts by the tokens in flight
(:class:`TokenAdmission`, once a request's texts are tokenised), so a few huge requests cannot fill the queue.

``/health`` is exempt from the key and the concurrency limit, so probes keep working under load; so is ``/metrics``,
except that with an API key it needs the key too (unless ``public_metrics`` opens it to scrapers without one); their
framing, body size and body time are bounded as any request's. The
middleware also records every request's status and latency in the metrics. The other limits (inputs per
request, text length, ``dimensions``, ``k``) are checked where the request is parsed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from lmembed.errors import ConfigError
from lmembed.io import is_whole_number
from lmembed.serving.errors import COHERE_ROUTES, TEI_ROUTES, ApiError
from lmembed.serving.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/metrics"})
METRICS_PATH = "/metrics"
#: Refusals after which the connection is closed (the rest of the request is unread or its framing is unsafe).
CLOSING = frozenset({400, 408, 413, 431})
#: Every route's path (each its own metric label): the OpenAI ones, then those of TEI's and Cohere's dialects.
ENDPOINTS = (
    frozenset({"/v1/embeddings", "/v1/search", "/v1/rerank", "/v1/models", "/health", "/metrics"})
    | TEI_ROUTES
    | COHERE_ROUTES
)


@dataclass(frozen=True)
class Limits:
    """What one server accepts (each refusal has its status and error code, see the module docs)."""

    max_batch_tokens: int = 16384  # padded tokens (texts x longest) per forward pass
    max_request_bytes: int = 4 * 2**20
    max_concurrent_requests: int = 256
    max_inputs: int = 2048  # texts (or queries) in one request
    max_top_k: int = 1000
    truncate: bool = True  # False: a text longer than the model's max_length is refused (400)
    api_key: str | None = None
    public_metrics: bool = False  # True: /metrics answers without the API key
    body_timeout_s: float = 10.0  # a begun header block, then the whole body, must arrive within this (else 408)
    max_header_bytes: int = 16384  # names, values and line ends of all header lines (431 otherwise)
    max_connections_per_client: int = 64  # open connections from one address (429, then closed)
    max_tokens_in_flight: int = 131072  # tokens admitted and not yet answered (429; rerank pairs over it alone: 413)
    batch_wait_s: float = 0.005  # a free worker with less queued than a window waits until none came for this long
    # A window of the scheduler admits this share of the queued tokens (batcher). At saturation a text waits for the
    # window running when it arrives, then for its place in its own (texts run by length inside a window). A smaller
    # share shortens the tail latency and costs some throughput (more, smaller passes): bench/serve_load.py measures
    # the trade with a model (bench/results/serve_load/share-0.25), bench/serve_sim.py without one.
    window_share: float = 0.25
    # Forward passes run at once, each on its own thread with an equal share of torch's threads (1: one pass at a
    # time on all of them; None: two on a CPU with two threads or more, else one, batcher.forward_workers).
    workers: int | None = None
    # A response of this many bytes or more is gzip-compressed for a client that sends 'Accept-Encoding: gzip' (httpx
    # and the official clients do); 0: never.
    gzip_min_bytes: int = 1024

    def __post_init__(self) -> None:
        for name in (
            "max_batch_tokens",
            "max_request_bytes",
            "max_concurrent_requests",
            "max_inputs",
            "max_top_k",
            "max_header_bytes",
            "max_connections_per_client",
            "max_tokens_in_flight",
            "workers",
        ):
            value = getattr(self, name)
            if name == "workers" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if isinstance(self.body_timeout_s, bool) or not self.body_timeout_s > 0:
            raise ConfigError(f"body_timeout_s={self.body_timeout_s!r} must be a positive number of seconds")
        if isinstance(self.batch_wait_s, bool) or not self.batch_wait_s >= 0:
            raise ConfigError(f"batch_wait_s={self.batch_wait_s!r} must be a number of seconds >= 0")
        if isinstance(self.window_share, bool) or not 0 < self.window_share <= 1:
            raise ConfigError(f"window_share={self.window_share!r} must be a share of the queue in (0, 1]")
        if not is_whole_number(self.gzip_min_bytes) or self.gzip_min_bytes < 0:
            raise ConfigError(f"gzip_min_bytes={self.gzip_min_bytes!r} must be a whole number of bytes >= 0 (0: never)")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty (leave it unset to serve without authentication)")


async def send_error(send: Send, error: ApiError, metrics: ServerMetrics, scope: Scope) -> None:
    """Answer with ``error``'s status and JSON body (in the error shape of the route ``scope`` asks for)."""
    metrics.error(error.status, error.code)
    body = json.dumps(error.body(scope.get("path", ""))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status in CLOSING:
        headers.append((b"connection", b"close"))  # what is left of the request cannot be trusted or waited for
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if error.status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class GuardMiddleware:
    """Authentication, request size and concurrency limits, and per-request metrics (see the module doc)."""

    def __init__(
        self, app: ASGIApp, *, limits: Limits, metrics: ServerMetrics, on_idle: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.limits = limits
        self.metrics = metrics
        self.on_idle = on_idle  # called when the last request in flight is answered (the server trims its memory)
        self.in_flight = 0  # touched only on the event loop's thread
        self._expected = limits.api_key.encode() if limits.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = 500
        start = time.perf_counter()

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if path == METRICS_PATH and self._expected is not None and not self.limits.public_metrics:
                if await self._authorised(scope, tracked):
                    await self._open(scope, receive, tracked)
            elif path in OPEN_PATHS:
                await self._open(scope, receive, tracked)
            else:
                await self._guarded(scope, receive, tracked)
        finally:
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)

    async def _authorised(self, scope: Scope, send: Send) -> bool:
        """True without an API key or with the right one; else answers 401 and returns False."""
        if self._expected is None:
            return True
        given = _header(scope, b"authorization") or b""
        scheme, _, token = given.strip().partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected):
            return True  # the scheme's name is case-insensitive (RFC 9110 11.1), the key is not
        message = "invalid API key" if given else "missing API key: send 'Authorization: Bearer <key>'"
        await send_error(send, ApiError(401, message, "invalid_api_key"), self.metrics, scope)
        return False

    def _framing_error(self, scope: Scope) -> ApiError | None:
        headers = scope.get("headers", ())
        names = {key.lower() for key, _ in headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            return ApiError(
                400,
                "a request with both Content-Length and Transfer-Encoding is ambiguous (RFC 9112 6.1); send one",
                "ambiguous_framing",
            )
        size = sum(len(key) + len(value) + 4 for key, value in headers)
        if size > self.limits.max_header_bytes:
            return ApiError(
                431,
                f"request headers are {size} bytes, more than the limit of {self.limits.max_header_bytes}",
                "headers_too_large",
            )
        return None

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An open path (``/health``, ``/metrics``): no slot is taken, but its framing, body size and body time are
        bounded like any request's (a probe sending a gigabyte was read and dropped in full)."""
        framing = self._framing_error(scope)
        if framing is not None:
            await send_error(send, framing, self.metrics, scope)
            return
        body = await self._read_body(scope, receive, send)
        if body is not None:
            await self.app(scope, _replaying(body, receive), send)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        framing = self._framing_error(scope)
        if framing is not None:
            await send_error(send, framing, self.metrics, scope)
            return
        if not await self._authorised(scope, send):
            return
        body = await self._read_body(scope, receive, send)  # before a slot: a slow body holds none
        if body is None:
            return
        encoded = _encoding_error(scope, body)
        if encoded is not None:
            await send_error(send, encoded, self.metrics, scope)
            return
        if self.in_flight >= self.limits.max_concurrent_requests:
            error = ApiError(
                429,
                f"the server is handling {self.limits.max_concurrent_requests} requests already "
                "(--max-concurrent-requests); retry shortly",
                "too_many_concurrent_requests",
            )
            await send_error(send, error, self.metrics, scope)
            return
        self.in_flight += 1
        self.metrics.in_flight.inc()
        done = False

        def finish() -> None:
            nonlocal done
            if not done:
                done = True
                self.in_flight -= 1
                self.metrics.in_flight.dec()
                if self.in_flight == 0 and self.on_idle is not None:
                    self.on_idle()

        async def send_and_finish(message: Message) -> None:
            # The slot frees before the response's last bytes go out, so a client that sends its next
            # request as soon as it has the answer never finds its own previous request still counted.
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finish()
            await send(message)

        try:
            await self.app(scope, _replaying(body, receive), send_and_finish)
        finally:
            finish()

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body within ``body_timeout_s``, or ``None`` after answering 408 or 413 (or when the client
        went away)."""
        timeout = self.limits.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self._read_body_unbounded(scope, receive, send)
        except TimeoutError:
            error = ApiError(
                408, f"the request body did not arrive within {timeout:g} s (--body-timeout)", "request_timeout"
            )
            await send_error(send, error, self.metrics, scope)
            return None

    async def _read_body_unbounded(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        limit = self.limits.max_request_bytes
        too_large = ApiError(
            413, f"request body is larger than the limit of {limit} bytes (--max-request-bytes)", "payload_too_large"
        )
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await send_error(send, too_large, self.metrics, scope)
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # the client hung up mid-body: 499 in the logs, not a 500
                gone = ApiError(499, "the client closed the connection before its body came", "client_closed_request")
                await send_error(send, gone, self.metrics, scope)  # the server drops it (nobody to read it)
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await send_error(send, too_large, self.metrics, scope)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _encoding_error(scope: Scope, body: bytes) -> ApiError | None:
    """415 for a body sent with a ``Content-Encoding`` (gzip, ...): the server reads bodies as they are sent and
    decompresses none (the body was read whole first, so the connection stays usable)."""
    coding = _header(scope, b"content-encoding")
    if not body or coding is None or coding.strip().lower() in (b"", b"identity"):
        return None
    shown = coding.decode("latin-1")[:40]
    return ApiError(
        415,
        f"'content-encoding' is {shown!r}; this server reads uncompressed bodies only: send the JSON as it is",
        "unsupported_content_encoding",
        param="content-encoding",
    )


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the application the body already read, then what the connection says next."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class TokenAdmission:
    """Admission by the tokens of the requests in flight (see the module doc): a request whose tokens would take
    the total over ``limit`` is refused with 429 (retry later), unless nothing else is in flight (so any embedding
    request can run). Embedding texts, search queries and rerank pairs all count; rerank pairs (``/v1/rerank``,
    reranked search) are admitted with ``alone=False``: more than ``limit`` of them is 413 even alone, since their
    number is the client's choice (documents, ``rerank_top_k``) rather than bounded by ``--max-inputs`` texts.
    Used on the event loop's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def admit(self, tokens: int, *, alone: bool = True) -> None:
        """Count ``tokens`` in flight, or refuse them (``alone``: a request over the limit passes by itself)."""
        if not alone and tokens > self.limit:
            raise ApiError(
                413,
                f"this request has {tokens} tokens, more than the limit of {self.limit} tokens in flight "
                "(--max-tokens-in-flight); send it in smaller requests",
                "too_many_tokens",
            )
        if self.in_flight and self.in_flight + tokens > self.limit:
            raise ApiError(
                429,
                f"the server has {self.in_flight} tokens in flight; this request's {tokens} would pass the limit of "
                f"{self.limit} (--max-tokens-in-flight); retry shortly",
                "too_many_tokens_in_flight",
            )
        self.in_flight += tokens

    def release(self, tokens: int) -> None:
        self.in_flight -= tokens
