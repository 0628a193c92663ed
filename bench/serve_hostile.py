"""Issue 39 benchmark: the server's resident memory after hostile search and rerank traffic, as a ratio to its warm
level measured in the same run, on 127.0.0.1 only, bounded in requests and time.

One server per arm (``after``: this checkout; ``before``: ``--before SRC``, another checkout's ``src`` first on the
``PYTHONPATH``), each ``lmembed serve minilm --index I --rerank CE`` on a free loopback port, where ``I`` is a hybrid
index of the first ``--docs`` SciFact abstracts (../shared/datasets/beir) and ``CE`` a cross-encoder made here from
the bundled MiniLM with a new one-label head (its scores mean nothing; its memory and compute are a real one's).

Per arm, in order:

1. warm: ``--warm-rounds`` rounds of ordinary traffic (a batch of embeddings, a hybrid reranked search, a rerank of
   20 abstracts), then 3 s idle: the **warm** RSS;
2. hostile, each once: ``[`` x 100,000 to ``/v1/rerank`` and ``/v1/search``; a 10^6-character hybrid+rerank query;
   ``--queries`` hybrid+rerank queries in one request (``rerank_top_k`` 100); a rerank of ``--long-docs`` SciFact
   abstracts (about 1,500 characters each: ~500k tokens, over the 131,072 of ``--max-tokens-in-flight``, in a body
   under the 4 MiB limit); a rerank of ``--big-docs`` abstracts (within the token budget: admitted); each request's
   status, time and the RSS after it are recorded (timeout ``--timeout`` s);
3. idle ``--settle`` s: the **after** RSS, and ``after / warm``.

    python bench/serve_hostile.py [--before /tmp/before/src] [--docs 1000] [--queries 2048]

Results: bench/results/serve_hostile/result.json and table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, read_jsonl, shared_or_exit

OUT = REPO / "bench" / "results" / "serve_hostile"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepare(work: Path, docs: list[dict]) -> tuple[Path, Path]:
    """The hybrid index of ``docs`` and the cross-encoder folder (made once, shared by the arms)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lmembed import Embedder
    from lmembed.index import Index
    from lmembed.models.loading import resolve_model_path

    ce = work / "cross-encoder"
    folder = resolve_model_path("minilm")
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
    model.save_pretrained(ce)
    AutoTokenizer.from_pretrained(folder).save_pretrained(ce)
    index = work / "index"
    embedder = Embedder.from_pretrained("minilm", cache=False, show_progress=False)
    rows = [(d["_id"], (d.get("title", "") + " " + d["text"]).strip()) for d in docs]
    Index.build(embedder, rows, index, kind="flat")  # BM25 is built at the first hybrid search
    return index, ce


def start(src: Path, index: Path, ce: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, "-m", "lmembed.cli", "serve", "minilm", "--index", str(index), "--rerank", str(ce)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("the server did not warm up in 300 s")
        time.sleep(0.5)


def call(client: httpx.Client, path: str, timeout: float, **kwargs) -> dict:
    start = time.perf_counter()
    try:
        response = client.post(path, timeout=timeout, **kwargs)
        status, code = response.status_code, None
        if status >= 400:
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = response.text[:80]
    except httpx.TimeoutException:
        status, code = "timeout", None
    return {"status": status, "code": code, "seconds": round(time.perf_counter() - start, 2)}


def run_arm(name: str, src: Path, index: Path, ce: Path, texts: list[str], args: argparse.Namespace) -> dict:
    port = free_port()
    proc = start(src, index, ce, port)
    url = f"http://127.0.0.1:{port}"
    result: dict = {"arm": name, "src": str(src), "requests": {}}
    try:
        with httpx.Client(base_url=url) as client:
            for i in range(args.warm_rounds):
                batch = [texts[(i * 16 + j) % len(texts)] for j in range(16)]
                client.post("/v1/embeddings", json={"input": batch}, timeout=args.timeout).raise_for_status()
                search = {"query": batch[:4], "k": 10, "mode": "hybrid", "rerank": True, "rerank_top_k": 20}
                client.post("/v1/search", json=search, timeout=args.timeout).raise_for_status()
                client.post("/v1/rerank", json={"query": batch[0], "documents": batch[:20] + texts[:4]}, timeout=60)
            time.sleep(3)
            result["warm_rss_mb"] = rss_mb(proc.pid)
            nested = b"[" * 100_000
            hostile = {
                "nested_rerank": ("/v1/rerank", {"content": nested}),
                "nested_search": ("/v1/search", {"content": nested}),
                "million_char_query": (
                    "/v1/search",
                    {"json": {"query": ("protein gene cell " * 60000)[:1_000_000], "mode": "hybrid", "rerank": True}},
                ),
                "many_queries": (
                    "/v1/search",
                    {
                        "json": {
                            "query": [texts[i % len(texts)][:200] for i in range(args.queries)],
                            "mode": "hybrid",
                            "rerank": True,
                            "rerank_top_k": 100,
                        }
                    },
                ),
                "long_docs_rerank": (
                    "/v1/rerank",
                    {"json": {"query": "protein", "documents": texts[: args.long_docs]}},
                ),
                "big_admitted_rerank": (
                    "/v1/rerank",
                    {"json": {"query": "protein folding", "documents": texts[: args.big_docs]}},
                ),
            }
            for key, (path, kwargs) in hostile.items():
                result["requests"][key] = call(client, path, args.timeout, **kwargs)
                result["requests"][key]["rss_mb"] = rss_mb(proc.pid)
                print(name, key, result["requests"][key], flush=True)
            time.sleep(args.settle)
            result["after_rss_mb"] = rss_mb(proc.pid)
            result["ratio"] = round(result["after_rss_mb"] / result["warm_rss_mb"], 3)
            result["peak_rss_mb"] = max(r["rss_mb"] for r in result["requests"].values())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(name, {k: v for k, v in result.items() if k != "requests"}, flush=True)
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| arm | warm RSS MiB | peak RSS MiB | after RSS MiB | after / warm |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        sizes = " | ".join(f"{r[k]:.0f}" for k in ("warm_rss_mb", "peak_rss_mb", "after_rss_mb"))
        lines.append(f"| {r['arm']} | {sizes} | {r['ratio']:.3f} |")
    lines += ["", "| arm | request | status | code | seconds |", "|---|---|---|---|---|"]
    for r in results:
        for key, q in r["requests"].items():
            lines.append(f"| {r['arm']} | {key} | {q['status']} | {q['code'] or ''} | {q['seconds']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="another checkout's src folder: the 'before' arm")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=2048)
    parser.add_argument("--long-docs", type=int, default=2000)
    parser.add_argument("--big-docs", type=int, default=400)
    parser.add_argument("--warm-rounds", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    corpus = read_jsonl(shared_or_exit("beir/scifact") / "corpus.jsonl", limit=max(args.docs, args.long_docs))
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in corpus]
    with tempfile.TemporaryDirectory(prefix="serve-hostile-") as tmp:
        index, ce = prepare(Path(tmp), corpus[: args.docs])
        arms = [("after", REPO / "src")] + ([("before", args.before)] if args.before else [])
        results = [run_arm(name, src, index, ce, texts, args) for name, src in arms]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(
        json.dumps({"args": vars(args) | {"before": str(args.before)}, "arms": results}, indent=2) + "\n"
    )
    (OUT / "table.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
