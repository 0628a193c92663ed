"""Running the app with uvicorn: in the foreground (``lmembed serve``) or in a background thread.

Shutdown is graceful either way: on SIGINT/SIGTERM (foreground) or :meth:`BackgroundServer.stop`, uvicorn
stops accepting connections, waits up to ``graceful_timeout`` seconds for the requests in flight, then runs
the app's shutdown (the batcher finishes its queue). A second signal stops at once.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

#: Idle keep-alive connections stay open this long (uvicorn's 5 s default races busy clients that reuse
#: a pooled connection just as the server closes it).
KEEP_ALIVE_S = 75


def _config(app: Any, *, graceful_timeout: float, log_level: str, access_log: bool, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=graceful_timeout,
        timeout_keep_alive=KEEP_ALIVE_S,
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
    """Serve ``app`` until interrupted."""
    config = _config(
        app, host=host, port=port, graceful_timeout=graceful_timeout, log_level=log_level, access_log=access_log
    )
    uvicorn.Server(config).run()


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
