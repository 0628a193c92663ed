"""The server under hostile clients, driven with raw sockets on 127.0.0.1 against a real server on a free port:
slow bodies (408, and they hold no slot: others still get 200), ambiguous framing (400 and close), header and
body sizes (431, 413), connections per client address (429 and close), admission by tokens in flight (429)."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from lmembed.serving.limits import Limits
from test_server import assert_error, gated, post, serving, token_count, wait_until

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BODY = json.dumps({"input": ["the cat sat on the mat"], "model": "tiny"}).encode()
JSON = {"content-type": "application/json"}


def connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=20)


def head(length: int | None = None, *extra: str) -> bytes:
    lines = ["POST /v1/embeddings HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes, bool]:
    """Status, headers, body, and whether the server then closed the connection (read to EOF, bounded)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {data!r}")
        data += chunk
    header_block, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
    if "content-length" not in headers:  # a body delimited by the connection's close (uvicorn's own 400)
        while chunk := sock.recv(65536):
            body += chunk
        return int(status_line.split()[1]), headers, body, True
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    sock.settimeout(5)
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        closed = False
    return int(status_line.split()[1]), headers, body, closed


def error_code(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


def test_slow_bodies_hold_no_slot_and_get_408(make_embedder):
    limits = Limits(max_concurrent_requests=4, body_timeout_s=3.0)
    with serving(make_embedder("bert"), limits=limits) as (server, state):
        slow = []
        for _ in range(8):  # twice the slots: headers sent, then the body trickles (one byte, then nothing)
            sock = connect(server)
            sock.sendall(head(len(BODY)) + BODY[:1])
            slow.append(sock)
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:  # as many at once as there are slots
            others = list(pool.map(lambda i: post(server, {"input": [f"text {i}"]}), range(6)))
        assert [r.status_code for r in others] == [200] * 6
        assert time.monotonic() - started < 3.0  # answered while the slow ones still trickle
        assert state.metrics.in_flight._value.get() == 0
        for sock in slow:
            status, headers, body, closed = read_response(sock)
            assert (status, error_code(body), headers["connection"], closed) == (408, "request_timeout", "close", True)
            assert json.loads(body)["error"]["message"] == "the request body did not arrive within 3 s (--body-timeout)"
            sock.close()
        assert post(server, {"input": ["after"]}).status_code == 200


def test_ambiguous_framing_is_refused_and_closed(make_embedder):
    with serving(make_embedder("bert")) as (server, _):
        chunked = f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n0\r\n\r\n"
        for declared in (len(BODY), 5, 100000):
            with connect(server) as sock:
                sock.sendall(head(declared, "Transfer-Encoding: chunked") + chunked)
                status, _, body, closed = read_response(sock)
            assert (status, error_code(body), closed) == (400, "ambiguous_framing", True), body
            assert "both Content-Length and Transfer-Encoding" in json.loads(body)["error"]["message"]
        with connect(server) as sock:  # chunked alone is fine
            sock.sendall(head(None, "Transfer-Encoding: chunked") + chunked)
            assert read_response(sock)[0] == 200


def test_a_request_h11_cannot_parse_gets_the_json_refusal(make_embedder):
    """A Content-Length that is no number, negative, or given twice with two values: h11 refuses the request, and the
    answer is the server's JSON refusal (uvicorn's own is plain text, which no client's error reader parses)."""
    with serving(make_embedder("bert")) as (server, _):
        for bad in ("Content-Length: abc", "Content-Length: -1", "Content-Length: 5\r\nContent-Length: 7"):
            with connect(server) as sock:
                sock.sendall(head(None, bad) + BODY)
                status, headers, body, closed = read_response(sock)
            assert (status, headers["content-type"], error_code(body), closed) == (
                400,
                "application/json",
                "invalid_http",
                True,
            ), bad
            assert "not valid HTTP/1.1" in json.loads(body)["error"]["message"]
        assert post(server, {"input": ["still fine"]}).status_code == 200


def test_header_and_body_size_limits(make_embedder):
    limits = Limits(max_header_bytes=4096, max_request_bytes=2000)
    with serving(make_embedder("bert"), limits=limits) as (server, _):
        with connect(server) as sock:
            sock.sendall(head(len(BODY), "X-Padding: " + "a" * 8000) + BODY)
            status, _, body, closed = read_response(sock)
        assert (status, error_code(body), closed) == (431, "headers_too_large", True)
        with connect(server) as sock:  # far past any limit: uvicorn's parser answers 400 and closes, at once
            started = time.monotonic()
            try:
                sock.sendall(head(len(BODY), "X-Padding: " + "a" * 200_000) + BODY)
                status, _, _, closed = read_response(sock)
            except (ConnectionResetError, BrokenPipeError):  # closed while the rest was still being sent
                status, closed = 400, True
        assert (status, closed) == (400, True) and time.monotonic() - started < 5
        with connect(server) as sock:
            sock.sendall(head(5000) + b"x" * 100)
            status, _, body, closed = read_response(sock)
        assert (status, error_code(body), closed) == (413, "payload_too_large", True)
        assert post(server, {"input": ["still fine"]}).status_code == 200


def test_connections_per_client_address(make_embedder):
    with serving(make_embedder("bert"), limits=Limits(max_connections_per_client=3)) as (server, _):
        counts = server.server.config.http.open_connections
        wait_until(lambda: not counts)  # the start-up health checks' connections are gone
        idle = [connect(server) for _ in range(3)]  # hold three connections, send nothing
        wait_until(lambda: counts.get("127.0.0.1") == 3)
        with connect(server) as sock:
            status, headers, body, closed = read_response(sock)
        assert (status, error_code(body), headers["connection"], closed) == (429, "too_many_connections", "close", True)
        idle.pop().close()
        wait_until(lambda: post(server, {"input": ["room again"]}).status_code == 200, timeout=10)
        for sock in idle:
            sock.close()
        metrics = httpx.get(server.url + "/metrics").text
    assert 'lmembed_errors_total{code="too_many_connections",status="429"}' in metrics


def test_a_request_past_the_connection_limit_reads_its_429(make_embedder):
    """A client that sends its request before the server refuses the connection reads the 429 (with Retry-After),
    not a connection reset; the refused connection is held no longer than the server's linger."""
    limit = 8
    with serving(make_embedder("bert"), limits=Limits(max_connections_per_client=limit)) as (server, _):
        counts = server.server.config.http.open_connections
        wait_until(lambda: not counts)
        idle = [connect(server) for _ in range(limit)]
        wait_until(lambda: counts.get("127.0.0.1") == limit)
        loop = server.server.servers[0].get_loop()
        seen = []
        for _ in range(12):
            loop.call_soon_threadsafe(time.sleep, 0.2)  # the request arrives before the server accepts its connection
            with httpx.Client(timeout=10) as client:  # a new connection each time
                try:
                    response = client.post(server.url + "/v1/embeddings", content=BODY, headers=JSON)
                    seen.append(
                        (response.status_code, response.json()["error"]["code"], response.headers["retry-after"])
                    )
                except httpx.TransportError as exc:
                    seen.append((type(exc).__name__, str(exc), ""))
        assert seen == [(429, "too_many_connections", "1")] * 12
        for i in range(9):  # a client that reads to the end finds the 429 and a clean close, not a reset
            with connect(server) as sock:
                sock.sendall(head(len(BODY)) + BODY)
                time.sleep(0.05 * (i % 3))
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            head_block, _, body = answer.partition(b"\r\n\r\n")
            assert head_block.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head_block.lower(), answer
            assert error_code(body) == "too_many_connections"
        for sock in idle:
            sock.close()


def test_admission_by_tokens_in_flight(make_embedder):
    emb = make_embedder("bert")
    big, small = ["word " * 30], ["cat"]
    n_big, n_small = token_count(emb, big), token_count(emb, small)
    limit = n_big + n_small + 2  # room for the big request and a small one, not for two big ones
    with serving(emb, limits=Limits(max_tokens_in_flight=limit)) as (server, state):
        with gated(state) as gate, ThreadPoolExecutor(2) as pool:
            held = pool.submit(post, server, {"input": big})
            wait_until(gate.entered.is_set)
            assert state.admission.in_flight == n_big
            refused = post(server, {"input": big})
            assert_error(refused, 429, "too_many_tokens_in_flight", f"{n_big} tokens in flight; this request's {n_big}")
            fits = pool.submit(post, server, {"input": small})  # fits beside the big one
            wait_until(lambda: state.admission.in_flight == n_big + n_small)
            gate.set()
            assert held.result().status_code == 200 and fits.result().status_code == 200
        assert state.admission.in_flight == 0
        assert post(server, {"input": big * 2}).status_code == 200  # over the limit, but alone: admitted


def test_a_header_block_that_never_ends_gets_408_and_frees_its_address(make_embedder):
    """Connections that began a header block and stopped (or trickled it a line at a time) were never timed out:
    64 of them locked their address out of the server, /health included."""
    limits = Limits(max_connections_per_client=3, body_timeout_s=1.5)
    with serving(make_embedder("bert"), limits=limits) as (server, _):
        counts = server.server.config.http.open_connections
        wait_until(lambda: not counts)
        stalled = [connect(server) for _ in range(3)]
        for sock in stalled[:2]:
            sock.sendall(b"GET /health HTTP/1.1\r\nHo")
        trickled = stalled[2]
        started = time.monotonic()
        for line in (b"GET /health HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n"):  # each within the timeout
            trickled.sendall(line)
            time.sleep(0.4)
        for sock in stalled:
            status, _, body, closed = read_response(sock)
            assert (status, error_code(body), closed) == (408, "request_timeout", True)
            assert "headers did not arrive within 1.5 s (--body-timeout)" in json.loads(body)["error"]["message"]
            sock.close()
        assert time.monotonic() - started < 6  # from the block's first byte, not renewed by each line
        wait_until(lambda: httpx.get(server.url + "/health").status_code == 200, timeout=10)
        metrics = httpx.get(server.url + "/metrics").text
    assert 'lmembed_errors_total{code="header_timeout",status="408"} 3.0' in metrics


def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive(make_embedder, monkeypatch):
    from lmembed.serving import server as server_module

    monkeypatch.setattr(server_module, "KEEP_ALIVE_S", 1)
    with serving(make_embedder("bert")) as (server, _):
        with connect(server) as sock:
            sock.settimeout(10)
            started = time.monotonic()
            assert sock.recv(1) == b""  # closed by the server, nothing sent either way
            assert time.monotonic() - started < 5
        with connect(server) as sock:  # a request on a fresh connection is served as before
            sock.sendall(head(len(BODY)) + BODY)
            assert read_response(sock)[0] == 200


def test_the_open_routes_bound_their_bodies_too(make_embedder):
    """``/health`` with ``Content-Length: 1000000000`` answered 200, then read and dropped the gigabyte."""
    with serving(make_embedder("bert"), limits=Limits(max_request_bytes=2000, body_timeout_s=1.5)) as (server, _):
        for path in ("/health", "/metrics"):
            with connect(server) as sock:
                sock.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n".encode() + b"x" * 10
                )
                status, _, body, closed = read_response(sock)
            assert (status, error_code(body), closed) == (413, "payload_too_large", True), path
            with connect(server) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nx".encode())
                status, _, body, closed = read_response(sock)
            assert (status, error_code(body), closed) == (408, "request_timeout", True), path
        assert httpx.get(server.url + "/health").status_code == 200
