"""Issue 12 benchmark: corpus encoding on Ray Data against the single-process engine, and a simulated large corpus.

1. SciFact's corpus (``--docs``, default all 5,183 documents; ``minilm``, batch 32, its 256-token limit) encoded
   by the single-process engine (torch with 2 threads: the whole of this 2-core machine) and, in the same run,
   as sharded jobs on a local Ray cluster of 2 CPUs: 1 actor with 2 threads, and 2 actors with 1 thread each,
   each from an empty cache (shards of 128 texts). Figures are ratios to the single process;
   ``--one-thread-reference`` also times a 1-thread single process, the exact reference of the 2-actor run.
   Ray's overhead is stated: cluster start, plan pass, and the encode pass's time outside the shards (worker
   start-up: a process that imports torch and loads the model; scheduling; workers waiting on the last,
   unequal shards). The JSON also holds ``worker_startup_s`` (encode pass start to the first finished shard,
   less that shard's own time), a rough figure: Ray Data may queue a shard at an actor before it runs.
   Vectors are compared with the single process's with the same number of torch threads (bit for bit), and
   across thread counts (parallel reductions may round differently).
2. A simulated large corpus: ``--rows`` short synthetic texts (default 1,000,000) in a Parquet file, a tiny
   random BERT (2 layers, 32 wide) with minilm's tokenizer, 2 Ray actors. Each run is a child process with
   its own cluster; the resident memory of the driver and of every Ray process is sampled twice a second.
   Run A encodes ``rows / 10`` rows; run B encodes ``rows`` rows and is killed (SIGKILL) once about half of
   its shards are in the cache; run C resumes it. Constant memory: peaks of A, B and C side by side (the
   plan's arrays, ~30 bytes a row, are the only part that grows with the corpus); resume: the shards C
   encodes are exactly the ones B had not finished.

    python bench/scale_encode.py [--docs 5183] [--rows 1000000] [--skip-scifact] [--skip-large]

Results: bench/results/scale_encode/result.json and table.txt (a part skipped keeps its last figures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from _common import REPO, shared_or_exit

OUT = REPO / "bench" / "results" / "scale_encode"
BATCH = 32
SHARD_ROWS = 128  # 4 batches: enough shards for two workers to balance long and short texts
_WORD_LIST = """
the a of to in and is was for on with as by at from that this it be are or an not have has had
which their they we you he she his her its our one two three first new more most other some such
only also time year people way day man woman child world life hand part place case week company
system program question work government number night point home water room mother area money story
fact month lot right study book eye job word business issue side kind head house service friend
father power hour game line end member law car city community name president team minute idea kid
body information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education protein cell gene
model vector search retrieval embedding
"""
WORDS = _WORD_LIST.split()  # common English words, plus a few from the domain


# ---------------------------------------------------------------------------------------------- part 1
def scifact(docs: int, one_thread_reference: bool) -> dict:
    import torch

    from lmembed import Embedder
    from lmembed.io import read_corpus
    from lmembed.scale import encode_corpus, make_engine, memory_source, open_source

    folder = shared_or_exit("beir/scifact")
    ids, texts = read_corpus(folder / "corpus.jsonl")
    source = open_source(folder) if docs >= len(texts) else memory_source(texts[:docs], ids[:docs])
    texts = texts[:docs]
    result: dict = {"docs": len(texts), "model": "minilm", "batch_size": BATCH}

    local = {}
    for threads in (2,) if one_thread_reference is False else (2, 1):
        torch.set_num_threads(threads)
        emb = Embedder.from_pretrained("minilm", cache=False, show_progress=False)
        start = time.perf_counter()
        local[threads] = emb.encode(texts, batch_size=BATCH)
        seconds = time.perf_counter() - start
        result[f"single_process_{threads}_threads"] = {"seconds": seconds, "docs_per_s": len(texts) / seconds}
        print(f"single process, {threads} threads: {seconds:.1f} s ({len(texts) / seconds:.1f} docs/s)", flush=True)
    torch.set_num_threads(2)

    start = time.perf_counter()
    cluster = make_engine("ray", num_cpus=2)
    cluster.start()
    result["ray_cluster_start_s"] = time.perf_counter() - start
    baseline = result["single_process_2_threads"]["seconds"]
    for workers, threads in ((1, 2), (2, 1)):
        cache = Path(tempfile.mkdtemp(prefix="scale-bench-"))
        emb = Embedder.from_pretrained("minilm", cache_dir=cache, show_progress=False)
        engine = make_engine("ray", workers=workers, threads_per_worker=threads)
        start = time.perf_counter()
        done = encode_corpus(emb, source, engine=engine, batch_size=BATCH, shard_rows=SHARD_ROWS)
        seconds = time.perf_counter() - start
        report = done.report
        timings = report.timings
        outside = timings["encode_s"] - report.busy_s / workers
        same_threads = local.get(threads)
        entry = {
            "workers": workers,
            "threads_per_worker": threads,
            "seconds": seconds,
            "docs_per_s": len(texts) / seconds,
            "speed_vs_single_process": baseline / seconds,
            "plan_s": timings.get("plan_s", 0.0),
            "encode_s": timings["encode_s"],
            "busy_s_per_worker": report.busy_s / workers,
            "overhead_s": seconds - report.busy_s / workers,
            "encode_pass_outside_shards_s": outside,
            "worker_startup_s": report.startup_s,
            "shards": report.shards,
            "identical_to_single_process_same_threads": None
            if same_threads is None
            else bool(np.array_equal(done.vectors, same_threads)),
            "max_abs_diff_vs_single_process_2_threads": float(np.abs(done.vectors - local[2]).max()),
            "ids_in_input_order": done.ids == ids[: len(texts)],
        }
        result[f"ray_{workers}x{threads}"] = entry
        print(json.dumps({f"ray {workers} actor(s) x {threads} thread(s)": entry}), flush=True)
    cluster.shutdown()
    return result


# ---------------------------------------------------------------------------------------------- part 2
def write_corpus(path: Path, rows: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    schema = pa.schema([("_id", pa.string()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, 50_000):
            n = min(50_000, rows - start)
            texts = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) for _ in range(n)]
            ids = [f"s{start + i}" for i in range(n)]
            writer.write_table(pa.table({"_id": ids, "text": texts}, schema=schema))


def tiny_embedder(cache: Path):
    import torch
    from transformers import BertConfig, BertModel

    from lmembed import Embedder, EmbeddingConfig

    tokenizer = Embedder.from_pretrained("minilm", cache=False, show_progress=False).backbone.tokenizer
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model = BertModel(config).eval()
    return Embedder.from_model(model, tokenizer, EmbeddingConfig(max_length=64), cache_dir=cache, show_progress=False)


class MemorySampler:
    """Peak resident memory of this process and of every process below it (the local Ray cluster)."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()
        self.driver = 0
        self.worker = 0
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                driver = self.me.memory_info().rss
                total = driver
                for child in self.me.children(recursive=True):
                    try:
                        rss = child.memory_info().rss
                        total += rss
                        if "ray::" in " ".join(child.cmdline()) or "default_worker" in " ".join(child.cmdline()):
                            self.worker = max(self.worker, rss)
                    except psutil.Error:
                        continue
                self.driver = max(self.driver, driver)
                self.total = max(self.total, total)
            except psutil.Error:
                pass
            self._stop.wait(0.5)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peaks_mb(self) -> dict:
        return {
            "driver_mb": self.driver / 2**20,
            "largest_worker_mb": self.worker / 2**20,
            "total_mb": self.total / 2**20,
        }


def child(corpus: str, cache: str) -> None:
    """One run of the large job in this process (prints progress lines, then a JSON summary)."""
    from lmembed.scale import EncodeJob, make_engine, open_source

    engine = make_engine("ray", num_cpus=2, workers=2)
    emb = tiny_embedder(Path(cache))
    with MemorySampler() as memory:
        start = time.perf_counter()
        job = EncodeJob(emb, open_source(corpus), batch_size=BATCH, shard_rows=16_384)
        report = job.run(engine, on_progress=lambda p: print("PROGRESS " + p.line(), flush=True))
        seconds = time.perf_counter() - start
    summary = {"seconds": seconds, "report": report.to_dict(), "memory": memory.peaks_mb()}
    summary["report"]["shards_encoded_list"] = report.shards_encoded
    summary["report"]["shards_skipped_list"] = report.shards_skipped
    with MemorySampler() as memory:
        start = time.perf_counter()
        vectors = job.vectors(output=Path(cache) / "vectors.npy")
        summary["assemble"] = {"seconds": time.perf_counter() - start, "memory": memory.peaks_mb()}
    summary["vectors_shape"] = list(vectors.shape)
    engine.shutdown()
    print("SUMMARY " + json.dumps(summary), flush=True)


def run_child(corpus: Path, cache: Path, kill_at: float | None = None) -> dict:
    command = [sys.executable, __file__, "--child", str(corpus), str(cache)]
    # A session of its own: killing it takes its Ray cluster down too, as a crash of the machine would.
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:
        if line.startswith("PROGRESS"):
            last = line.split(" ", 1)[1].strip()
            done, total = (int(x) for x in last.split(" ")[1].split("/"))
            if kill_at is not None and done >= kill_at * total:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return {"killed_after": last}
        elif line.startswith("SUMMARY"):
            proc.wait()
            return json.loads(line.split(" ", 1)[1])
    proc.wait()
    raise RuntimeError(f"child run ended without a summary (exit {proc.returncode}); last progress: {last}")


def large(rows: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="scale-large-"))
    result: dict = {"rows": rows, "model": "random BERT, 2 layers x 32, minilm tokenizer, max 64 tokens"}
    for name, n in (("small", rows // 10), ("large", rows)):
        start = time.perf_counter()
        write_corpus(work / f"{name}.parquet", n)
        print(f"wrote {n:,} synthetic texts in {time.perf_counter() - start:.1f} s", flush=True)
    result["run_a_rows_div_10"] = run_child(work / "small.parquet", work / "cache-small")
    print(json.dumps({"A": result["run_a_rows_div_10"]["memory"]}), flush=True)
    result["run_b_killed"] = run_child(work / "large.parquet", work / "cache-large", kill_at=0.5)
    print(json.dumps({"B": result["run_b_killed"]}), flush=True)
    result["run_c_resumed"] = run_child(work / "large.parquet", work / "cache-large")
    print(json.dumps({"C": result["run_c_resumed"]["memory"], "report": result["run_c_resumed"]["report"]}), flush=True)
    resumed = result["run_c_resumed"]["report"]
    result["resume"] = {
        "shards": resumed["shards"],
        "shards_found_done": resumed["shards_skipped"],
        "shards_encoded_by_resume": resumed["shards_encoded"],
        "only_missing_encoded": sorted(resumed["shards_encoded_list"] + resumed["shards_skipped_list"])
        == list(range(resumed["shards"])),
        "planned_again": resumed["planned"],
    }
    return result


# ---------------------------------------------------------------------------------------------- output
def table(result: dict) -> str:
    lines = []
    if "scifact" in result:
        s = result["scifact"]
        base = s["single_process_2_threads"]
        lines += [
            f"SciFact corpus, {s['docs']:,} docs, minilm, batch {s['batch_size']}; local Ray cluster of 2 CPUs "
            f"(started in {s['ray_cluster_start_s']:.1f} s, not counted below)",
            "",
            "| engine | seconds | docs/s | speed vs single process | plan s | outside shards s | same vectors |",
            "|---|---|---|---|---|---|---|",
            f"| single process, 2 threads | {base['seconds']:.1f} | {base['docs_per_s']:.1f} | 1.00x | - | - | - |",
        ]
        if "single_process_1_threads" in s:
            one = s["single_process_1_threads"]
            lines.append(
                f"| single process, 1 thread | {one['seconds']:.1f} | {one['docs_per_s']:.1f} | "
                f"{base['seconds'] / one['seconds']:.2f}x | - | - | - |"
            )
        for key in ("ray_1x2", "ray_2x1"):
            e = s[key]
            same = {True: "bit for bit", False: "no", None: "not compared"}[
                e["identical_to_single_process_same_threads"]
            ]
            if same == "not compared" and e["max_abs_diff_vs_single_process_2_threads"] == 0:
                same = "bit for bit"  # equal to the 2-thread single process, so to any reference
            lines.append(
                f"| Ray, {e['workers']} actor(s) x {e['threads_per_worker']} thread(s) | {e['seconds']:.1f} | "
                f"{e['docs_per_s']:.1f} | {e['speed_vs_single_process']:.2f}x | {e['plan_s']:.1f} | "
                f"{e['encode_pass_outside_shards_s']:.1f} | "
                f"{same} (max diff vs 2 threads "
                f"{e['max_abs_diff_vs_single_process_2_threads']:.1e}) |"
            )
        lines.append("")
    if "large" in result:
        g = result["large"]
        lines += [
            f"Simulated large corpus: {g['rows']:,} synthetic texts (Parquet), {g['model']}, 2 Ray actors",
            "",
            "| run | rows | seconds | texts/s | driver peak MB | largest worker peak MB | all processes peak MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, label, n in (
            ("run_a_rows_div_10", "A: complete", g["rows"] // 10),
            ("run_c_resumed", "C: resumed after B was killed", g["rows"]),
        ):
            r = g[key]
            m = r["memory"]
            report = r["report"]
            # C encodes only the shards B left: its rate counts those (shards are near-equal in rows)
            share = report["shards_encoded"] / report["shards"] if report["shards"] else 1.0
            rate = report["distinct_texts"] * share / r["seconds"]
            lines.append(
                f"| {label} | {n:,} | {r['seconds']:.1f} | {rate:,.0f} | {m['driver_mb']:.0f} | "
                f"{m['largest_worker_mb']:.0f} | {m['total_mb']:.0f} |"
            )
        res = g["resume"]
        lines += [
            "",
            f"B killed after: {g['run_b_killed']['killed_after']}",
            f"C found {res['shards_found_done']} of {res['shards']} shards done and encoded "
            f"{res['shards_encoded_by_resume']} (only the missing ones: {res['only_missing_encoded']}; "
            f"planned again: {res['planned_again']})",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=5183)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--skip-scifact", action="store_true")
    parser.add_argument(
        "--one-thread-reference", action="store_true", help="also time the single process with 1 thread"
    )
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    previous = OUT / "result.json"
    result: dict = json.loads(previous.read_text()) if previous.exists() else {}  # a part skipped keeps its figures
    result["machine"] = f"{os.cpu_count()} CPUs (shared)"
    if not args.skip_scifact:
        result["scifact"] = scifact(args.docs, args.one_thread_reference)
    if not args.skip_large:
        result["large"] = large(args.rows)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    text = table(result)
    (OUT / "table.txt").write_text(text + "\n")
    print(text)
    print(f"saved {OUT / 'result.json'} and {OUT / 'table.txt'}")


if __name__ == "__main__":
    main()
