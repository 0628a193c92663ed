"""Serving benchmark (issues 11 and 30): `lmembed serve minilm` under load, on loopback, bounded in time,
against the server before the first-come-first-served scheduler and optionally infinity, in one run.

The arms, each its own server process on its own port, all started before the load and kept up:

* ``after``: this checkout's server (``PYTHONPATH=src``);
* ``before``: the server of another checkout (``--before DIR``, e.g. a worktree of commit bbeecce, the
  scheduler before this one), started with that checkout's ``src`` first on its ``PYTHONPATH``;
* ``NAME`` (``--variant NAME="FLAGS"``, repeatable): this checkout's server with FLAGS added (e.g.
  ``--variant one-worker="--workers 1"``, to measure one setting against the default in the same run);
* ``infinity`` (``--infinity PYTHON``): infinity-emb's server on the same bundled MiniLM folder, started
  with that interpreter (infinity needs an environment of its own).

One run, in this order:

1. baseline: sentence-transformers ``encode`` of the same texts at batch 32, in this process (the servers
   are up but idle), in texts/s, for ``--baseline-seconds`` before the load and again after it (the machine
   is shared: the mean of both is the baseline);
2. load, per shape of ``--shapes`` (``16x1,64x1,8x32``: clients x texts per request) and per arm:
   closed-loop clients, each sending the next request as soon as it has the answer, for ``--duration``
   seconds: p50/p95/p99 latency, texts/s and its ratio to the baseline, errors (anything but 200 and 429),
   429s, timeouts and, for lmembed, what its batcher did (texts and padded tokens per forward pass, from
   /metrics). The arms take turns within each shape, in an order that alternates from shape to shape (and
   round to round, ``--rounds``), so a change in the machine's load hits every arm;
3. hostile, per lmembed arm: its RSS after warm-up, after the load, after a run of hostile and large
   requests, and 5 s later: clients that send headers and trickle their bodies (408), Content-Length with
   Transfer-Encoding (400), bodies over the size limit (413), 4 requests of ``--large-texts`` long texts at
   once, and more connections from one address than allowed (429);
4. overload (``--overload-duration`` > 0), ``after`` only: 4x ``--limit`` clients of the first shape: the
   excess must get 429 at once, with no timeouts and no other errors.

The texts: half STS-benchmark sentences, half SciFact abstracts (as bench/encode_throughput.py), cycled.
The clients share the machine with the servers, so the HTTP overhead of both sides is in the figures; the
1-minute load average is recorded at the start and the end.

    python bench/serve_load.py --before ../wt-serve-before [--infinity /tmp/infvenv/bin/python]
        [--shapes 16x1,64x1,8x32] [--duration 30] [--rounds 1] [--baseline-seconds 15] [--limit 64]

Results: bench/results/serve_load/result.json and table.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
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
READY_TIMEOUT_S = 300
LOGS = Path(tempfile.gettempdir())


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
    seconds: float = 0.0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

        return {
            "seconds": self.seconds,
            "ok_requests": self.ok,
            "texts": self.texts,
            "texts_per_s": self.texts / self.seconds if self.seconds else float("nan"),
            "requests_per_s": self.ok / self.seconds if self.seconds else float("nan"),
            "refused_429": self.refused,
            "timeouts": self.timeouts,
            "errors": dict(self.errors),
            "error_count": sum(self.errors.values()),
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
        }


@dataclass
class Arm:
    """One server under test: its process, where to send requests, and what to call the model."""

    name: str
    label: str
    proc: subprocess.Popen
    port: int
    path: str = "/v1/embeddings"
    model: str = MODEL
    lmembed: bool = True
    stats: dict[str, Stats] = field(default_factory=dict)  # per shape, over the rounds
    batches: dict[str, dict] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def run_load(
    arm: Arm, texts: list[str], clients: int, seconds: float, per_request: int, stats: Stats, timeout: float
) -> None:
    """``clients`` closed-loop clients for ``seconds`` (``timeout`` per request), added into ``stats``."""
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
                response = await client.post(arm.path, json={"model": arm.model, "input": batch})
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

    async with httpx.AsyncClient(base_url=arm.url, timeout=timeout, limits=limits) as client:
        began = time.monotonic()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        stats.seconds += time.monotonic() - began


def batcher_totals(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(("lmembed_batch_texts_", "lmembed_batch_tokens_", "lmembed_forward_seconds_")):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def batches_between(before: dict[str, float], after: dict[str, float]) -> dict:
    """Texts and padded tokens per forward pass between two /metrics readings."""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    passes = delta("lmembed_batch_texts_count")
    return {
        "passes": int(passes),
        "texts_per_pass": delta("lmembed_batch_texts_sum") / passes if passes else float("nan"),
        "padded_tokens_per_pass": delta("lmembed_batch_tokens_sum") / passes if passes else float("nan"),
        "forward_seconds": delta("lmembed_forward_seconds_sum"),
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


def spawn(name: str, command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """Start a server; its output goes to serve_load-NAME.log in the temporary folder."""
    log = open(LOGS / f"serve_load-{name}.log", "w")  # noqa: SIM115 - the process writes it until it stops
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)


def start_lmembed(name: str, checkout: Path, args: argparse.Namespace, flags: list[str] | None = None) -> Arm:
    port = free_port()
    command = [sys.executable, "-m", "lmembed.cli", "serve", MODEL, "--port", str(port)]
    command += ["--max-concurrent-requests", str(args.limit), "--max-batch-tokens", str(args.max_batch_tokens)]
    command += ["--body-timeout", str(BODY_TIMEOUT_S), "--max-request-bytes", str(MAX_REQUEST_BYTES)]
    command += ["--log-level", "warning", "--graceful-timeout", "5", *(flags or [])]
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    proc = spawn(name, command, env, checkout)
    label = f"lmembed at {git_head(checkout)}" + (f" with `{' '.join(flags)}`" if flags else "")
    return Arm(name, label, proc, port)


def start_infinity(python: str) -> Arm:
    from lmembed.models.loading import resolve_model_path

    port = free_port()
    folder = resolve_model_path(MODEL)
    command = [python, "-m", "infinity_emb.cli", "v2", "--model-id", folder, "--served-model-name", MODEL]
    command += ["--engine", "torch", "--device", "cpu", "--batch-size", "32", "--log-level", "warning"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}  # a local folder
    proc = spawn("infinity", command, env, Path("/tmp"))
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    return Arm("infinity", f"infinity-emb {version} (torch, CPU, batch 32)", proc, port, "/embeddings", MODEL, False)


def git_head(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "src"], capture_output=True, text=True)
    return out.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def wait_ready(arm: Arm) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if arm.proc.poll() is not None:
            log = (LOGS / f"serve_load-{arm.name}.log").read_text()[-2000:]
            raise SystemExit(f"the {arm.name} server exited: {log}")
        try:
            if httpx.get(arm.url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the {arm.name} server did not become ready within {READY_TIMEOUT_S} s")


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


def hostile(port: int, texts: list[str], large: int) -> dict:
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
    long_texts = sorted(texts, key=len)[-large:]
    with ThreadPoolExecutor(4) as pool:
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        big = [pool.submit(httpx.post, url, json={"input": long_texts}, timeout=600) for _ in range(4)]
        for future in big:
            statuses[str(future.result().status_code)] += 1
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(CONNECTIONS_PER_CLIENT)]
    try:
        statuses[str(_raw(port, b""))] += 1  # one connection past the limit of this address
    finally:
        for sock in held:
            sock.close()
    return dict(statuses)


def memory_after_abuse(arm: Arm, texts: list[str], large: int, warm_mb: float) -> dict:
    loaded = rss_mb(arm.proc.pid)
    statuses = hostile(arm.port, texts, large)
    after = rss_mb(arm.proc.pid)
    time.sleep(5)
    settled = rss_mb(arm.proc.pid)
    return {
        "statuses": statuses,
        "warm_mb": warm_mb,
        "loaded_mb": loaded,
        "after_mb": after,
        "settled_mb": settled,
        "settled_vs_warm_pct": 100 * (settled - warm_mb) / warm_mb,
        "settled_vs_loaded_pct": 100 * (settled - loaded) / loaded,
    }


# ---------------------------------------------------------------------------------------------- report
def ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def table(result: dict) -> str:
    base = result["baseline"]
    load = result["load_average_1min"]
    lines = [
        f"# serve_load, {result['date']}",
        "",
        f"`{result['command']}`",
        "",
        f"Machine: {result['cores']} cores, shared with other jobs: 1-minute load average {load['start']:.1f} at the "
        f"start, {load['end']:.1f} at the end (figures and ratios are from a loaded machine unless these are "
        "below 1). Servers: " + "; ".join(f"{a['name']} = {a['label']}" for a in result["arms"]) + ".",
        f"Flags of every lmembed server (a variant adds its own): `{result['server_flags']}`.",
        "",
        f"Baseline: sentence-transformers `encode`, batch {base['batch_size']}, in-process: "
        f"{base['texts_per_s']:.1f} texts/s (mean of {base['before']['texts_per_s']:.1f} before the load and "
        f"{base['after']['texts_per_s']:.1f} after it).",
        "",
        "| shape (clients x texts) | arm | texts/s | x in-process | p50 | p95 | p99 | p99/p50 | requests | errors "
        "| 429 | texts/pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape, arms in result["shapes"].items():
        for name, s in arms.items():
            per_pass = s.get("batches", {}).get("texts_per_pass")
            lines.append(
                f"| {shape} | {name} | {s['texts_per_s']:.1f} | {s['ratio']:.2f} | {ms(s['p50_ms'])} "
                f"| {ms(s['p95_ms'])} | {ms(s['p99_ms'])} | {s['p99_ms'] / s['p50_ms']:.2f} | {s['ok_requests']} "
                f"| {s['error_count'] + s['timeouts']} | {s['refused_429']} "
                f"| {'' if per_pass is None else f'{per_pass:.1f}'} |"
            )
    if all({"before", "after"} <= set(arms) for arms in result["shapes"].values()):
        lines += [
            "",
            "Before -> after, per shape (same run):",
            "",
            "| shape | p50 | p99 | p99/p50 | x in-process |",
            "|---|---|---|---|---|",
        ]
        for shape, arms in result["shapes"].items():
            b, a = arms["before"], arms["after"]
            lines.append(
                f"| {shape} | {ms(b['p50_ms'])} -> {ms(a['p50_ms'])} | {ms(b['p99_ms'])} -> {ms(a['p99_ms'])} "
                f"| {b['p99_ms'] / b['p50_ms']:.2f} -> {a['p99_ms'] / a['p50_ms']:.2f} "
                f"| {b['ratio']:.2f} -> {a['ratio']:.2f} |"
            )
    lines.append("")
    for name, rss in result["rss"].items():
        lines.append(
            f"- RSS, {name}: {rss['warm_mb']:.0f} MB after warm-up, {rss['loaded_mb']:.0f} MB after the load, "
            f"{rss['after_mb']:.0f} MB after the hostile run, {rss['settled_mb']:.0f} MB 5 s later "
            f"({rss['settled_vs_warm_pct']:+.1f} % against warm-up, {rss['settled_vs_loaded_pct']:+.1f} % against "
            f"after the load); statuses {rss['statuses']}"
        )
    if result.get("overload"):
        over = result["overload"]
        lines.append(
            f"- overload, after: {result['overload_clients']} clients (4x the limit of {result['limit']}), "
            f"{over['seconds']:.0f} s: {over['ok_requests']} answered, {over['refused_429']} refused with 429, "
            f"errors {over['error_count']}, timeouts {over['timeouts']}"
        )
    lines.append(f"- infinity: {result['infinity']}")
    return "\n".join(lines)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(","):
        clients, per_request = part.lower().split("x")
        shapes.append((int(clients), int(per_request)))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="checkout of the server to compare with (its src/ is used)")
    parser.add_argument("--infinity", help="python of an environment with infinity-emb[server,torch]")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar='NAME="FLAGS"',
        help="an arm of this checkout's server with FLAGS added (repeatable; no hostile run)",
    )
    parser.add_argument("--shapes", default="16x1,64x1,8x32", help="clients x texts per request, comma-separated")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per shape, arm and round")
    parser.add_argument("--rounds", type=int, default=1, help="times each shape runs on each arm")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load on each arm before measuring")
    parser.add_argument("--limit", type=int, default=64, help="the servers' --max-concurrent-requests")
    parser.add_argument("--overload-duration", type=float, default=0.0, help="0: no overload phase")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--large-texts", type=int, default=256, help="long texts per large request (hostile run)")
    parser.add_argument("--texts", type=int, default=2000, help="size of the text pool")
    parser.add_argument("--baseline-seconds", type=float, default=15.0, help="each baseline measurement")
    parser.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of result.json and table.md")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    load_start = os.getloadavg()[0]
    texts = load_texts(args.texts)
    shapes = parse_shapes(args.shapes)
    arms: list[Arm] = []
    try:
        if args.before is not None:
            arms.append(start_lmembed("before", args.before.resolve(), args))
        arms.append(start_lmembed("after", REPO, args))
        for variant in args.variant:
            name, _, flags = variant.partition("=")
            if not name or name in {"before", "after", "infinity"} or not flags.strip():
                parser.error(f"--variant {variant!r}: NAME=FLAGS, NAME not before, after or infinity")
            arms.append(start_lmembed(name, REPO, args, shlex.split(flags)))
        if args.infinity:
            arms.append(start_infinity(args.infinity))
        for arm in arms:
            wait_ready(arm)
        warm = {}
        for arm in arms:
            asyncio.run(run_load(arm, texts, 8, args.warmup, 1, Stats(), args.timeout))
            warm[arm.name] = rss_mb(arm.proc.pid)
        print("servers ready: " + ", ".join(f"{a.name} {a.url} (pid {a.proc.pid})" for a in arms), flush=True)
        model = load_baseline_model()
        before = baseline(model, texts, 32, args.baseline_seconds)
        print(f"baseline: {before['texts_per_s']:.1f} texts/s", flush=True)
        turn = 0
        for _ in range(args.rounds):
            for clients, per_request in shapes:
                shape = f"{clients}x{per_request}"
                order = arms[turn % len(arms) :] + arms[: turn % len(arms)]  # rotates: each arm leads in turn
                turn += 1
                for arm in order:
                    stats = arm.stats.setdefault(shape, Stats())
                    totals = batcher_totals(arm.url) if arm.lmembed else {}
                    asyncio.run(run_load(arm, texts, clients, args.duration, per_request, stats, args.timeout))
                    if arm.lmembed:
                        arm.batches[shape] = batches_between(totals, batcher_totals(arm.url))
                    s = stats.summary()
                    print(
                        f"{shape} {arm.name}: {s['texts_per_s']:.1f} texts/s, p50 {s['p50_ms']:.0f} ms, "
                        f"p99 {s['p99_ms']:.0f} ms ({s['ok_requests']} requests so far)",
                        flush=True,
                    )
        after = baseline(model, texts, 32, args.baseline_seconds)  # the machine is shared: measured on both sides
        base = {"batch_size": 32, "before": before, "after": after}
        base["texts_per_s"] = (before["texts_per_s"] + after["texts_per_s"]) / 2
        results: dict[str, dict] = {}
        for clients, per_request in shapes:
            shape = f"{clients}x{per_request}"
            results[shape] = {}
            for arm in arms:
                summary = arm.stats[shape].summary()
                summary["ratio"] = summary["texts_per_s"] / base["texts_per_s"]
                if arm.lmembed:
                    summary["batches"] = arm.batches[shape]
                results[shape][arm.name] = summary
        rss = {}
        for arm in arms:
            if arm.name in {"before", "after"}:
                rss[arm.name] = memory_after_abuse(arm, texts, args.large_texts, warm[arm.name])
                print(f"hostile {arm.name}: {rss[arm.name]}", flush=True)
        over = None
        after_arm = next(arm for arm in arms if arm.name == "after")
        if args.overload_duration > 0:
            clients, per_request = shapes[0]
            stats = Stats()
            asyncio.run(run_load(after_arm, texts, 4 * args.limit, args.overload_duration, per_request, stats, 30))
            over = stats.summary()
    finally:
        for arm in arms:
            arm.stop()
    infinity = next((a.label for a in arms if a.name == "infinity"), None)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python bench/serve_load.py " + shlex.join(sys.argv[1:]),
        "cores": os.cpu_count(),
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
        "arms": [{"name": a.name, "label": a.label} for a in arms],
        "server_flags": f"--max-concurrent-requests {args.limit} --max-batch-tokens {args.max_batch_tokens} "
        f"--body-timeout {BODY_TIMEOUT_S:g} --max-request-bytes {MAX_REQUEST_BYTES}",
        "limit": args.limit,
        "overload_clients": 4 * args.limit,
        "baseline": base,
        "shapes": results,
        "rss": rss,
        "overload": over,
        "infinity": f"measured in this run: {infinity}" if infinity else "not measured in this run (no --infinity)",
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    text = table(result)
    (out / "table.md").write_text(text + "\n")
    print()
    print(text)
    print(f"saved {out / 'result.json'} and {out / 'table.md'}")


if __name__ == "__main__":
    main()
