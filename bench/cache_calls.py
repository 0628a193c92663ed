"""What the embedding cache costs a process that encodes a few new texts per call, call after call (a web app, a
notebook loop), against the same calls with the cache off (the baseline, in the same run).

Before stop 59 each call built a new cache and read every shard earlier calls had written, so a call's time grew
with the number of calls before it; the engine now keeps its cache and reads each shard once. This prints, per
window of calls, the mean seconds a call with the cache on over the mean with it off: a ratio that stays flat as the
calls add up is the fix; one that grows is the old behaviour.

    python bench/cache_calls.py --calls 300 --per-call 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from _common import REPO, markdown_table, write_report
from lmembed import Embedder


def timed_calls(embedder: Embedder, calls: int, per_call: int, tag: str) -> list[float]:
    seconds = []
    for i in range(calls):
        texts = [f"{tag} text {i} number {j} about proteins and cells" for j in range(per_call)]
        start = time.perf_counter()
        embedder.encode(texts)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--per-call", type=int, default=4)
    parser.add_argument("--windows", type=int, default=5, help="windows of calls the table reports")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cache-calls")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        cached = Embedder.from_pretrained(args.model, cache_dir=folder, show_progress=False)
        plain = Embedder.from_pretrained(args.model, cache=False, show_progress=False)
        timed_calls(plain, 5, args.per_call, "warm")  # first calls pay for lazy set-up: not measured
        timed_calls(cached, 5, args.per_call, "warm")
        on = timed_calls(cached, args.calls, args.per_call, "on")
        off = timed_calls(plain, args.calls, args.per_call, "off")
        shards = len(list(Path(folder).rglob("*.npz")))
    size = max(1, args.calls // args.windows)
    rows, windows = [], []
    for first in range(0, args.calls, size):
        part_on, part_off = on[first : first + size], off[first : first + size]
        mean_on, mean_off = sum(part_on) / len(part_on), sum(part_off) / len(part_off)
        last = first + len(part_on)
        windows.append({"calls": [first + 1, last], "on_s": mean_on, "off_s": mean_off})
        rows.append([f"{first + 1}-{last}", f"{mean_on:.4f}", f"{mean_off:.4f}", f"{mean_on / mean_off:.2f}x"])
    lines = [
        f"`python bench/cache_calls.py --calls {args.calls} --per-call {args.per_call}` ({args.model}, one torch "
        f"thread; {shards} cache shards at the end). Baseline: the same calls with the cache off, in the same run.",
        "",
        *markdown_table(["calls", "cache on (s a call)", "cache off (s a call)", "on / off"], rows),
    ]
    result = {"model": args.model, "calls": args.calls, "per_call": args.per_call, "shards": shards, "windows": windows}
    write_report(args.out, "cache-calls", result, lines)


if __name__ == "__main__":
    main()
