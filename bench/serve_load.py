"""Issue 11 benchmark: `lmembed serve minilm` under load, on loopback, bounded in time.

One run, in this order:

1. baseline: sentence-transformers ``encode`` of the same texts at batch 32, in this process (the server
   is up but idle), in texts/s, for ``--baseline-seconds`` (30) before the load and again after it (the
   machine is shared: the mean of both is the baseline);
2. load: ``--clients`` (64) closed-loop clients, each sending ``--texts-per-request`` (1) texts per request and
   the next request as soon as it has the answer, for ``--duration`` (60) seconds: errors (anything but
   200 and 429), 429s, timeouts, p50/p99 latency, throughput in texts/s as a ratio to the baseline, the
   server's RSS growth from a quarter into the run (once the largest forward passes have been allocated
   for) to its end, and from its start, and what the batcher did (texts and padded tokens per forward
   pass, from /metrics);
3. overload: 4x the server's ``--max-concurrent-requests`` (``--limit``, 64) clients for
   ``--overload-duration`` (20) seconds: the excess must get 429 at once (clients back off 20-50 ms and
   retry), with no timeouts and no other errors.

The texts: half STS-benchmark sentences, half SciFact abstracts (as bench/encode_throughput.py), cycled.
The server runs as its own process (``python -m lmembed.cli serve minilm``); the clients share the
machine with it, so the HTTP overhead of both sides is in the figures.

    python bench/serve_load.py [--clients 64] [--duration 60] [--texts-per-request 1] [--limit 64] [--texts 2000]

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


def table(result: dict) -> str:
    load, over, base = result["load"], result["overload"], result["baseline"]
    lines = [
        f"serve_load ({time.strftime('%Y-%m-%d %H:%M')}): {result['command']}",
        f"machine: {os.cpu_count()} cores (shared); server: {result['server']}",
        "",
        f"baseline  sentence-transformers encode, batch {base['batch_size']}, in-process: "
        f"{base['texts_per_s']:.1f} texts/s (mean of {base['before']['texts_per_s']:.1f} before the load and "
        f"{base['after']['texts_per_s']:.1f} after it)",
        f"load      {result['clients']} clients x {result['texts_per_request']} texts/request, "
        f"{load['seconds']:.0f} s: "
        f"{load['texts_per_s']:.1f} texts/s = {result['throughput_ratio']:.2f}x baseline; "
        f"{load['requests_per_s']:.1f} requests/s",
        f"          latency p50 {load['p50_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms; errors {load['error_count']}, "
        f"429s {load['refused_429']}, timeouts {load['timeouts']}",
        f"          batcher: {result['batches']['passes']} passes, {result['batches']['texts_per_pass']:.1f} texts and "
        f"{result['batches']['padded_tokens_per_pass']:.0f} padded tokens per pass",
        f"          server RSS {result['rss']['start_mb']:.0f} MB a quarter into the run -> "
        f"{result['rss']['end_mb']:.0f} MB at its end ({result['rss']['growth_pct']:+.1f} %); "
        f"{result['rss']['run_start_mb']:.0f} MB at its start ({result['rss']['growth_from_run_start_pct']:+.1f} %), "
        f"peak {result['rss']['peak_mb']:.0f} MB",
        f"overload  {result['overload_clients']} clients (4x the limit of {result['limit']}), {over['seconds']:.0f} s: "
        f"{over['ok_requests']} answered, {over['refused_429']} refused with 429, errors {over['error_count']}, "
        f"timeouts {over['timeouts']}; p99 latency of the answered {over['p99_ms']:.0f} ms",
        f"infinity  {result['infinity']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument("--limit", type=int, default=64, help="the server's --max-concurrent-requests")
    parser.add_argument("--overload-duration", type=float, default=20.0)
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--texts", type=int, default=2000, help="size of the text pool")
    parser.add_argument("--baseline-seconds", type=float, default=30.0, help="each baseline measurement")
    parser.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")
    args = parser.parse_args()

    texts = load_texts(args.texts)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port, args.limit, args.max_batch_tokens)
    try:
        print(f"server ready on {url} (pid {proc.pid}); baseline ...", flush=True)
        model = load_baseline_model()
        before = baseline(model, texts, 32, args.baseline_seconds)
        print(f"baseline: {before['texts_per_s']:.1f} texts/s; load: {args.clients} clients for {args.duration:.0f} s")
        samples: list[float] = []

        async def load_with_rss() -> dict:
            async def sample() -> None:
                while True:
                    samples.append(rss_mb(proc.pid))
                    await asyncio.sleep(1.0)

            sampler = asyncio.create_task(sample())
            try:
                return await run_load(url, texts, args.clients, args.duration, args.texts_per_request, args.timeout)
            finally:
                sampler.cancel()

        load = asyncio.run(load_with_rss())
        batches = server_batches(url)
        settled = samples[len(samples) // 4]  # once the largest passes have been allocated for
        rss = {
            "run_start_mb": samples[0],
            "start_mb": settled,
            "end_mb": samples[-1],
            "peak_mb": max(samples),
            "growth_pct": 100 * (samples[-1] - settled) / settled,
            "growth_from_run_start_pct": 100 * (samples[-1] - samples[0]) / samples[0],
        }
        print(f"load: {load['texts_per_s']:.1f} texts/s, p50 {load['p50_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms")
        after = baseline(model, texts, 32, args.baseline_seconds)  # the machine is shared: measured on both sides
        base = {
            "batch_size": 32,
            "before": before,
            "after": after,
            "texts_per_s": (before["texts_per_s"] + after["texts_per_s"]) / 2,
        }
        print(f"baseline after: {after['texts_per_s']:.1f} texts/s")
        overload_clients = 4 * args.limit
        over = asyncio.run(
            run_load(url, texts, overload_clients, args.overload_duration, args.texts_per_request, args.timeout)
        )
        print(f"overload: {over['refused_429']} x 429, {over['error_count']} errors, {over['timeouts']} timeouts")
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
        f"--max-batch-tokens {args.max_batch_tokens}",
        "clients": args.clients,
        "texts_per_request": args.texts_per_request,
        "limit": args.limit,
        "overload_clients": overload_clients,
        "baseline": base,
        "load": load,
        "throughput_ratio": load["texts_per_s"] / base["texts_per_s"],
        "batches": batches,
        "rss": rss,
        "rss_samples_mb": samples,
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
