"""Serving benchmark (issues 11 and 30): `lmembed serve minilm` under load, on loopback, bounded in time.

One run, in this order:

1. baseline: sentence-transformers ``encode`` of the same texts at batch 32, in this process (the server
   is up but idle), in texts/s, for ``--baseline-seconds`` before the load and again after it (the machine is
   shared: the mean of both is the baseline);
2. load, per shape of ``--shapes`` (``16x1,64x1,8x32``: clients x texts per request): closed-loop clients, each
   sending the next request as soon as it has the answer, for ``--duration`` seconds: p50/p95/p99 latency,
   throughput in texts/s and its ratio to the baseline, errors (anything but 200 and 429), 429s, timeouts, and
   what the batcher did (texts and padded tokens per forward pass, from /metrics);
3. hostile: the server's RSS before and after (and 5 s after) a run of hostile and large requests: clients
   that send headers and trickle their bodies (answered 408), Content-Length with Transfer-Encoding (400),
   bodies over the size limit (413), requests of ``--max-inputs``-sized long texts, and more connections from
   one address than allowed (429);
4. overload (``--overload-duration`` > 0): 4x the server's ``--max-concurrent-requests`` (``--limit``) clients
   of the first shape: the excess must get 429 at once, with no timeouts and no other errors.

The texts: half STS-benchmark sentences, half SciFact abstracts (as bench/encode_throughput.py), cycled.
The server runs as its own process (``python -m lmembed.cli serve minilm``); the clients share the
machine with it, so the HTTP overhead of both sides is in the figures.

    python bench/serve_load.py [--shapes 16x1,64x1,8x32] [--duration 30] [--baseline-seconds 15] [--limit 64]

Results: bench/results/serve_load/result.json and table.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from _common import REPO, read_jsonl, shared_or_exit

OUT = REPO / "bench" / "results" / "serve_load"
MODEL = "minilm"
BODY_TIMEOUT_S = 2.0
MAX_REQUEST_BYTES = 1 << 20
CONNECTIONS_PER_CLIENT = 64


def load_texts(n: int) -> list[str]:
    sts = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"))
    docs = read_jsonl(shared_or_exit("beir/scifact/corpus.jsonl"), limit=n)
    short = [r["sentence1"] for r in sts][: n // 2]
    long = [(d.get("title", "") + " " + d["text"]).strip() for d in docs][: n - len(short)]
    mixed = short + long
    random.Random(0).shuffle(mixed)
    return mixed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Stats:
    ok: int = 0
    texts: int = 0
    refused: int = 0
    timeouts: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def summary(self, seconds: float) -> dict:
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

        return {
            "seconds": seconds,
            "ok_requests": self.ok,
            "texts": self.texts,
            "texts_per_s": self.texts / seconds,
            "requests_per_s": self.ok / seconds,
            "refused_429": self.refused,
            "timeouts": self.timeouts,
            "errors": dict(self.errors),
            "error_count": sum(self.errors.values()),
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
        }


async def run_load(url: str, texts: list[str], clients: int, seconds: float, per_request: int, timeout: float) -> dict:
    stats = Stats()
    cursor = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal cursor
        while time.monotonic() < deadline:
            batch = [texts[(cursor + i) % len(texts)] for i in range(per_request)]
            cursor += per_request
            start = time.perf_counter()
            try:
                response = await client.post("/v1/embeddings", json={"model": MODEL, "input": batch})
            except httpx.TimeoutException:
                stats.timeouts += 1
                continue
            except httpx.TransportError as exc:
                stats.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.05)
                continue
            if response.status_code == 200:
                stats.ok += 1
                stats.texts += len(batch)
                stats.latencies.append(time.perf_counter() - start)
            elif response.status_code == 429:
                stats.refused += 1
                await asyncio.sleep(random.uniform(0.02, 0.05))
            else:
                stats.errors[str(response.status_code)] += 1

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        began = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return stats.summary(time.monotonic() - began)


def server_batches(url: str) -> dict:
    """Texts and padded tokens per forward pass, from /metrics."""
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(("lmembed_batch_texts_", "lmembed_batch_tokens_", "lmembed_forward_seconds_")):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    passes = values.get("lmembed_batch_texts_count", 0) or 1
    return {
        "passes": int(values.get("lmembed_batch_texts_count", 0)),
        "texts_per_pass": values.get("lmembed_batch_texts_sum", 0) / passes,
        "padded_tokens_per_pass": values.get("lmembed_batch_tokens_sum", 0) / passes,
        "forward_seconds": values.get("lmembed_forward_seconds_sum", 0),
    }


def load_baseline_model():
    from sentence_transformers import SentenceTransformer

    from lmembed.models.loading import resolve_model_path

    return SentenceTransformer(resolve_model_path(MODEL), device="cpu")


def baseline(model, texts: list[str], batch_size: int, seconds: float) -> dict:
    """sentence-transformers ``encode`` over the text pool, 4 batches per call, for about ``seconds``."""
    model.encode(texts[:batch_size], batch_size=batch_size)  # warm-up
    done, cursor = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        chunk = [texts[(cursor + i) % len(texts)] for i in range(4 * batch_size)]
        model.encode(chunk, batch_size=batch_size, normalize_embeddings=True)
        cursor += len(chunk)
        done += len(chunk)
    elapsed = time.perf_counter() - start
    return {"texts": done, "batch_size": batch_size, "seconds": elapsed, "texts_per_s": done / elapsed}


def start_server(port: int, limit: int, max_batch_tokens: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "lmembed.cli", "serve", MODEL, "--port", str(port)]
    command += ["--max-concurrent-requests", str(limit), "--max-batch-tokens", str(max_batch_tokens)]
    command += ["--body-timeout", str(BODY_TIMEOUT_S), "--max-request-bytes", str(MAX_REQUEST_BYTES)]
    command += ["--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit("the server did not become ready within 180 s")


# ---------------------------------------------------------------------------------------------- hostile
def _raw(port: int, data: bytes, *, linger: float = 0.0) -> int | None:
    """Send ``data`` on a new connection; the status of the answer (``None``: closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(data)
            time.sleep(linger)
            answer = sock.recv(4096)
        except OSError:
            return None
    return int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None


def _head(length: int | None, *extra: str) -> bytes:
    lines = ["POST /v1/embeddings HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *extra]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def hostile(port: int, texts: list[str]) -> dict:
    """Hostile and large requests (see the module doc); the statuses they got."""
    from concurrent.futures import ThreadPoolExecutor

    body = json.dumps({"model": MODEL, "input": texts[:4]}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    statuses: Counter = Counter()
    with ThreadPoolExecutor(32) as pool:
        slow = [pool.submit(_raw, port, _head(len(body)) + body[:1]) for _ in range(32)]  # then nothing: 408
        ambiguous = [
            pool.submit(_raw, port, _head(len(body), "Transfer-Encoding: chunked") + chunked) for _ in range(32)
        ]
        huge = b"x" * (MAX_REQUEST_BYTES + 1)
        too_big = [pool.submit(_raw, port, _head(len(huge)) + huge) for _ in range(16)]
        for future in slow + ambiguous + too_big:
            statuses[str(future.result())] += 1
    long_texts = sorted(texts, key=len)[-256:]
    with ThreadPoolExecutor(4) as pool:
        large = [
            pool.submit(httpx.post, f"http://127.0.0.1:{port}/v1/embeddings", json={"input": long_texts}, timeout=600)
            for _ in range(4)
        ]
        for future in large:
            statuses[str(future.result().status_code)] += 1
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS_PER_CLIENT)]
    try:
        statuses[str(_raw(port, b""))] += 1  # one connection past the limit of this address
    finally:
        for sock in held:
            sock.close()
    return dict(statuses)


def table(result: dict) -> str:
    base = result["baseline"]
    lines = [
        f"serve_load ({time.strftime('%Y-%m-%d %H:%M')}): {result['command']}",
        f"machine: {os.cpu_count()} cores, shared with other jobs while this ran; server: {result['server']}",
        "",
        f"baseline  sentence-transformers encode, batch {base['batch_size']}, in-process: "
        f"{base['texts_per_s']:.1f} texts/s (mean of {base['before']['texts_per_s']:.1f} before the load and "
        f"{base['after']['texts_per_s']:.1f} after it)",
        "",
        "| shape (clients x texts) | texts/s | x in-process | p50 ms | p95 ms | p99 ms | p99/p50 | errors | 429 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, load in result["shapes"].items():
        lines.append(
            f"| {shape} | {load['texts_per_s']:.1f} | {load['ratio']:.2f} | {load['p50_ms']:.0f} "
            f"| {load['p95_ms']:.0f} | {load['p99_ms']:.0f} | {load['p99_ms'] / load['p50_ms']:.2f} "
            f"| {load['error_count']} | {load['refused_429']} |"
        )
    rss = result["rss"]
    lines += [
        "",
        f"hostile   statuses {rss['statuses']}; server RSS {rss['before_mb']:.0f} MB before -> "
        f"{rss['after_mb']:.0f} MB after ({rss['growth_pct']:+.1f} %), {rss['settled_mb']:.0f} MB 5 s later "
        f"({rss['settled_growth_pct']:+.1f} %)",
    ]
    if result.get("overload"):
        over = result["overload"]
        lines.append(
            f"overload  {result['overload_clients']} clients (4x the limit of {result['limit']}), "
            f"{over['seconds']:.0f} s: "
            f"{over['ok_requests']} answered, {over['refused_429']} refused with 429, errors {over['error_count']}, "
            f"timeouts {over['timeouts']}"
        )
    lines.append(f"infinity  {result['infinity']}")
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(","):
        clients, per_request = part.lower().split("x")
        shapes.append((int(clients), int(per_request)))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="16x1,64x1,8x32", help="clients x texts per request, comma-separated")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per shape")
    parser.add_argument("--limit", type=int, default=64, help="the server's --max-concurrent-requests")
    parser.add_argument("--overload-duration", type=float, default=0.0, help="0: no overload phase")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--texts", type=int, default=2000, help="size of the text pool")
    parser.add_argument("--baseline-seconds", type=float, default=15.0, help="each baseline measurement")
    parser.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")
    args = parser.parse_args()

    texts = load_texts(args.texts)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, args.limit, args.max_batch_tokens)
    shapes, over = {}, None
    try:
        print(f"server ready on {url} (pid {proc.pid}); baseline ...", flush=True)
        model = load_baseline_model()
        before = baseline(model, texts, 32, args.baseline_seconds)
        print(f"baseline: {before['texts_per_s']:.1f} texts/s", flush=True)
        for clients, per_request in parse_shapes(args.shapes):
            load = asyncio.run(run_load(url, texts, clients, args.duration, per_request, args.timeout))
            load["batches"] = server_batches(url)
            shapes[f"{clients}x{per_request}"] = load
            print(
                f"{clients}x{per_request}: {load['texts_per_s']:.1f} texts/s, p50 {load['p50_ms']:.0f} ms, "
                f"p95 {load['p95_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms",
                flush=True,
            )
        after = baseline(model, texts, 32, args.baseline_seconds)  # the machine is shared: measured on both sides
        base = {"batch_size": 32, "before": before, "after": after}
        base["texts_per_s"] = (before["texts_per_s"] + after["texts_per_s"]) / 2
        for load in shapes.values():
            load["ratio"] = load["texts_per_s"] / base["texts_per_s"]
        rss_before = rss_mb(proc.pid)
        statuses = hostile(port, texts)
        rss_after = rss_mb(proc.pid)
        time.sleep(5)
        rss_settled = rss_mb(proc.pid)
        rss = {
            "statuses": statuses,
            "before_mb": rss_before,
            "after_mb": rss_after,
            "settled_mb": rss_settled,
            "growth_pct": 100 * (rss_after - rss_before) / rss_before,
            "settled_growth_pct": 100 * (rss_settled - rss_before) / rss_before,
        }
        print(f"hostile: {statuses}; RSS {rss_before:.0f} -> {rss_after:.0f} -> {rss_settled:.0f} MB", flush=True)
        if args.overload_duration > 0:
            clients, per_request = parse_shapes(args.shapes)[0]
            over = asyncio.run(run_load(url, texts, 4 * args.limit, args.overload_duration, per_request, args.timeout))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        import infinity_emb  # noqa: F401

        infinity = "installed, but the comparison run is not implemented in this script"
    except ImportError:
        infinity = (
            "not measured: infinity-emb 0.0.78 installs (it pins numpy<2, transformers<5, sentence-transformers<4) "
            "but does not start beside this environment's pandas/pyarrow (numpy>=2); not installed here"
        )
    result = {
        "command": "python bench/serve_load.py " + " ".join(sys.argv[1:]),
        "server": f"lmembed serve {MODEL} --max-concurrent-requests {args.limit} "
        f"--max-batch-tokens {args.max_batch_tokens} --body-timeout {BODY_TIMEOUT_S:g} "
        f"--max-request-bytes {MAX_REQUEST_BYTES}",
        "limit": args.limit,
        "overload_clients": 4 * args.limit,
        "baseline": base,
        "shapes": shapes,
        "rss": rss,
        "overload": over,
        "infinity": infinity,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    text = table(result)
    (OUT / "table.txt").write_text(text + "\n")
    print()
    print(text)
    print(f"saved {OUT / 'result.json'} and {OUT / 'table.txt'}")


if __name__ == "__main__":
    main()
