"""Running the app with uvicorn: in the foreground (``lmembed serve``) or in a background thread.

Shutdown is graceful either way: on SIGINT/SIGTERM (foreground) or :meth:`BackgroundServer.stop`, uvicorn
stops accepting connections, waits up to ``graceful_timeout`` seconds for the requests in flight, then runs
the app's shutdown (the batcher finishes its queue). A second signal stops at once.

Connections are counted per client address: one past the app's ``Limits.max_connections_per_client`` is
answered ``429`` (with ``Retry-After``) as it opens and half-closed; what the client sends on it is read and dropped,
at most :data:`REFUSAL_DRAIN_BYTES` for at most :data:`REFUSAL_LINGER_S`, then it is closed. Closing at once would
reset a connection whose request had already arrived, and the reset throws the 429 away before the client reads it.
A client cannot hold every connection the server has. A connection that sends nothing is closed after the keep-alive
time, and a header block not finished within ``Limits.body_timeout_s`` is answered ``408`` and closed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lmembed.errors import Terminated
from lmembed.serving.errors import ApiError
from lmembed.serving.limits import Limits

#: Idle keep-alive connections stay open this long (uvicorn's 5 s default races busy clients that reuse
#: a pooled connection just as the server closes it).
KEEP_ALIVE_S = 75
#: A connection refused for its address's connection count is closed after this long at most ...
REFUSAL_LINGER_S = 2.0
#: ... or once it has sent this many bytes (read and dropped, so that its request does not reset the connection).
REFUSAL_DRAIN_BYTES = 65536


def _closing_answer(status: str, error: ApiError, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with ``error``'s JSON body that closes the connection, written before (or without)
    a request uvicorn could hand the application."""
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _refusal(limit: int) -> bytes:
    message = f"this address has {limit} connections open already (--max-connections-per-client)"
    return _closing_answer(
        "429 Too Many Requests", ApiError(429, message, "too_many_connections"), "retry-after: 1\r\n"
    )


def _late_headers(timeout_s: float) -> bytes:
    message = f"the request's headers did not arrive within {timeout_s:g} s (--body-timeout)"
    return _closing_answer("408 Request Timeout", ApiError(408, message, "request_timeout"))


def per_client_protocol(limit: int, metrics: Any = None, header_timeout_s: float = 10.0) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, with at most ``limit`` open connections per client address, and the time a
    connection may take bounded where uvicorn leaves it open: a connection that sends nothing is closed after the
    keep-alive time, and a request whose header block has begun but not ended within ``header_timeout_s`` is
    answered ``408`` and closed (else a few connections trickling a header a byte at a time held their address's
    every slot, ``/health`` included, for as long as they liked)."""
    open_by_address: Counter[str] = Counter()  # touched on the event loop's thread only
    refusal = _refusal(limit)
    late = _late_headers(header_timeout_s)

    class PerClientLimited(H11Protocol):
        address: str | None = None
        header_timer: asyncio.TimerHandle | None = None
        refused: asyncio.Transport | None = None  # answered 429: drained until the client closes or the linger ends
        refused_timer: asyncio.TimerHandle | None = None
        drained = 0
        open_connections = open_by_address  # {address: connections open}, for metrics and tests

        def connection_made(self, transport: Any) -> None:
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if peer else ""
            if open_by_address[address] >= limit:
                if metrics is not None:
                    metrics.error(429, "too_many_connections")
                self._refuse(transport)
                return
            open_by_address[address] += 1
            self.address = address
            super().connection_made(transport)
            # a connection that never sends a byte is idle like one between requests (uvicorn times only those)
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def _refuse(self, transport: asyncio.Transport) -> None:
            """Answer 429 and half-close: the client reads the answer whether or not its request was already sent."""
            self.refused = transport
            transport.write(refusal)
            if transport.can_write_eof():
                transport.write_eof()
            self.refused_timer = self.loop.call_later(REFUSAL_LINGER_S, transport.close)

        def data_received(self, data: bytes) -> None:
            if self.refused is not None:  # what a refused client sends is dropped, up to a bound
                self.drained += len(data)
                if self.drained > REFUSAL_DRAIN_BYTES:
                    self.refused.close()
                return
            super().data_received(data)
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()  # a header block begun
            if waiting and self.header_timer is None:
                self.header_timer = self.loop.call_later(header_timeout_s, self._headers_late)
            elif not waiting:
                self._stop_header_timer()

        def _headers_late(self) -> None:
            self.header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                if metrics is not None:
                    metrics.error(408, "header_timeout")
                self.transport.write(late)
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """A request h11 cannot parse (a Content-Length that is no number, two that differ ...): the JSON refusal
            every other error gets, instead of uvicorn's plain text, and the connection closed."""
            if metrics is not None:
                metrics.error(400, "invalid_http")
            message = f"the request is not valid HTTP/1.1 ({msg}); check its request line and headers"
            self.transport.write(_closing_answer("400 Bad Request", ApiError(400, message, "invalid_http")))
            self.transport.close()

        def _stop_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def eof_received(self) -> bool | None:
            if self.refused is not None:
                return None  # the client is done: the transport closes
            return super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.refused_timer is not None:
                self.refused_timer.cancel()
                self.refused_timer = None
            if self.address is None:
                return  # refused in connection_made: uvicorn's state was never set up
            self._stop_header_timer()
            open_by_address[self.address] -= 1
            if open_by_address[self.address] <= 0:
                del open_by_address[self.address]
            self.address = None
            super().connection_lost(exc)

    return PerClientLimited


def _config(app: Any, *, graceful_timeout: float, log_level: str, access_log: bool, **options: Any) -> uvicorn.Config:
    state = getattr(getattr(app, "state", None), "lmembed", None)
    limits = getattr(state, "limits", None) or Limits()
    return uvicorn.Config(
        app,
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=graceful_timeout,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=per_client_protocol(
            limits.max_connections_per_client, getattr(state, "metrics", None), limits.body_timeout_s
        ),
        # h11 buffers at most this much of an unfinished header block (then 400); a finished block over
        # max_header_bytes gets the middleware's 431
        h11_max_incomplete_event_size=max(4 * limits.max_header_bytes, 65536),
        **options,
    )


def run(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    graceful_timeout: float = 30.0,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Serve ``app`` until interrupted. SIGTERM is the usual way to stop a server: uvicorn drains its requests and
    shuts down, then raises the signal again, which ends the run here as a normal stop."""
    config = _config(
        app, host=host, port=port, graceful_timeout=graceful_timeout, log_level=log_level, access_log=access_log
    )
    try:
        uvicorn.Server(config).run()
    except Terminated:  # raised by the command line's handler after the graceful shutdown
        return


class BackgroundServer:
    """``app`` served by uvicorn on a thread of this process (for tests, benchmarks and notebooks).

    ``port=0`` takes a free port; :attr:`url` says which. Use as a context manager, or call :meth:`start`
    and :meth:`stop`.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        graceful_timeout: float = 30.0,
        log_level: str = "warning",
    ) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = self.socket.getsockname()[:2]
        config = _config(app, graceful_timeout=graceful_timeout, log_level=log_level, access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="lmembed-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        """Start serving; returns once uvicorn accepts connections (the app may still be warming up)."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {timeout:.0f} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown: requests in flight finish first."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
