"""What planning batches window by window costs in padding, and what it saves before the first batch (issue 40).

``EncodingEngine.plan_window`` (``plan_batches(..., window=N)``) tokenises and plans N texts at a time, so the
pipelined engine's first batches can compute while the rest is tokenised; without it every text is tokenised and
sorted by length first (the least padding). This measures both sides of that trade on real texts, on the CPU, with
lmembed's own tokenisation (``InputBuilder``) of minilm:

* padding: the padded tokens of the planned batches (texts x the longest, summed) over the real tokens, for each
  window against no window (the baseline, in the same run);
* the wait before the first batch: the seconds to tokenise every text (no window) against one window.

Texts: the SciFact corpus (5,183 abstracts, titles prepended, cut at ``--max-length`` tokens) and every sentence of
the STS-benchmark test split (2,758), shuffled together (short and long texts, as a user's file mixes them).
Results: ``bench/results/encode-throughput/plan-window.json`` and ``plan-window.md``.

    python bench/plan_window.py
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from _common import REPO, markdown_table, read_jsonl, shared_or_exit, write_report
from lmembed import Embedder
from lmembed.encoding.engine import plan_batches
from lmembed.encoding.inputs import InputBuilder

OUT = REPO / "bench" / "results" / "encode-throughput"


def texts() -> list[str]:
    docs = read_jsonl(shared_or_exit("beir/scifact/corpus.jsonl"))
    sts = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"))
    long = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    short = [r[key] for r in sts for key in ("sentence1", "sentence2")]
    mixed = long + short
    random.Random(0).shuffle(mixed)  # arrival order: lengths mixed, as a user's file would be
    return mixed


def padded(lengths: list[int], batch_size: int, window: int | None) -> int:
    return sum(len(chunk) * max(lengths[j] for j in chunk) for chunk in plan_batches(lengths, batch_size, None, window))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--windows", default="512,1024,4096")
    parser.add_argument("--batch-sizes", default="32,128")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    emb = Embedder.from_pretrained("minilm", cache=False, show_progress=False, max_length=args.max_length)
    builder = InputBuilder(emb.backbone.tokenizer, emb.config, is_decoder=False, max_length=args.max_length)
    items = texts()
    start = time.perf_counter()
    lengths = [len(f) for f in builder.build_all(items)]
    tokenise_all = time.perf_counter() - start
    first: dict[int, float] = {}
    for window in windows:
        start = time.perf_counter()
        builder.build_all(items[:window])
        first[window] = time.perf_counter() - start
    real = sum(lengths)
    rows = []
    for bs in batch_sizes:
        base = padded(lengths, bs, None)
        rows.append({"batch_size": bs, "window": None, "padded_over_real": base / real, "x_baseline_padding": 1.0})
        for window in windows:
            cost = padded(lengths, bs, window)
            rows.append(
                {
                    "batch_size": bs,
                    "window": window,
                    "padded_over_real": cost / real,
                    "x_baseline_padding": cost / base,
                }
            )
    result = {
        "command": "python bench/plan_window.py",
        "texts": len(items),
        "real_tokens": real,
        "tokenise_all_s": tokenise_all,
        "tokenise_first_window_s": first,
        "rows": rows,
    }
    lines = [
        "# Planning batches window by window: padding against the wait before the first batch",
        "",
        f"`{result['command']}`: {len(items)} texts (SciFact abstracts and STS-benchmark sentences, shuffled), "
        f"minilm's tokenisation, at most {args.max_length} tokens, {real} real tokens. Baseline: no window (every "
        "length known first), in this run.",
        "",
        *markdown_table(
            ["batch", "window", "padded / real tokens", "x baseline padding"],
            [
                [
                    r["batch_size"],
                    r["window"] or "none (baseline)",
                    f"{r['padded_over_real']:.3f}",
                    f"{r['x_baseline_padding']:.3f}",
                ]
                for r in rows
            ],
        ),
        "",
        *markdown_table(
            ["before the first batch can be planned", "seconds", "x baseline"],
            [["tokenise every text (baseline)", f"{tokenise_all:.2f}", "1.000"]]
            + [[f"tokenise one window of {w}", f"{s:.2f}", f"{s / tokenise_all:.3f}"] for w, s in first.items()],
        ),
    ]
    write_report(args.out, "plan-window", result, lines)


if __name__ == "__main__":
    main()
