"""The scheduler in a closed loop without a model: lmembed's real batcher, a fake engine that sleeps for a
pass (``--pass-ms`` + ``--token-us`` per padded token), and closed-loop clients that take a random
turnaround (``--turnaround-ms``, the HTTP round trip) between requests. It shows how the window share
(``lmembed serve --window-share``: a window admits this share of the queued tokens) trades the tail
(p99/p50) against throughput, in seconds of sleeping, so it can run beside other jobs.

Texts are half short (8-40 tokens), half long (150-256), as bench/serve_load.py's mix.

    python bench/serve_sim.py [--shares 1,0.5,0.25] [--shapes 16x1,64x1,8x32] [--seconds 30] [--workers 1]

``--workers N``: the batcher's forward workers, each with 1/N of the machine (a pass sleeps N times as long), the
model of ``lmembed serve --workers`` on a CPU; it shows the scheduling only, not what N workers gain in compute.

Results: bench/results/serve_sim/result.json and table.md (ratios against share 1, the same run; ``--out``
elsewhere), with the share of the time the fake engine was busy (the forward thread had a pass to run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from _common import REPO
from lmembed.serving import batcher
from lmembed.serving.metrics import ServerMetrics

OUT = REPO / "bench" / "results" / "serve_sim"


class SleepingEngine:
    def __init__(self, pass_s: float, token_s: float) -> None:
        self.pass_s, self.token_s = pass_s, token_s
        self.busy = 0.0  # seconds spent in passes

    def output_dim(self, config) -> int:
        return 1

    def encode_raw(self, texts, configs, *, instruction=None, batch_size=32, features=None) -> list[np.ndarray]:
        longest = max(int(t.split(":")[1]) for t in texts)
        seconds = self.pass_s + self.token_s * len(texts) * longest
        time.sleep(seconds)
        self.busy += seconds
        return [np.zeros((len(texts), 1), dtype=np.float32)]


async def closed_loop(share: float, clients: int, per_request: int, args: argparse.Namespace) -> dict:
    rng = random.Random(0)
    slowdown = args.workers  # each worker has 1/N of the machine
    engine = SleepingEngine(slowdown * args.pass_ms / 1000, slowdown * args.token_us / 1e6)
    worker = batcher.TokenBudgetBatcher(
        engine,
        None,
        max_batch_tokens=args.max_batch_tokens,
        metrics=ServerMetrics(),
        window_share=share,
        workers=args.workers,
    )
    await worker.start()
    latencies: list[float] = []
    deadline = time.monotonic() + args.seconds

    async def client() -> None:
        while time.monotonic() < deadline:
            lengths = [rng.choice([rng.randint(8, 40), rng.randint(150, 256)]) for _ in range(per_request)]
            await asyncio.sleep(rng.uniform(0, args.turnaround_ms / 1000))
            start = time.monotonic()
            await worker.embed([f"t:{n}" for n in lengths], lengths, None)
            latencies.append(time.monotonic() - start)

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - began
    await worker.stop()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "texts_per_s": len(latencies) * per_request / elapsed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "passes": worker.passes,
        "windows": worker.windows,
        "engine_busy": engine.busy / elapsed / args.workers,  # the share of the time the workers had a pass to run
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shares", default="1,0.5,0.25", help="window shares to compare (the first: baseline)")
    parser.add_argument("--shapes", default="16x1,64x1,8x32", help="clients x texts per request")
    parser.add_argument("--seconds", type=float, default=30.0, help="per shape and share")
    parser.add_argument("--pass-ms", type=float, default=10.0, help="fixed cost of a pass")
    parser.add_argument("--token-us", type=float, default=100.0, help="cost of a padded token")
    parser.add_argument("--turnaround-ms", type=float, default=100.0, help="most a client takes between requests")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--workers", type=int, default=1, help="forward workers, each 1/N of the machine")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of result.json and table.md")
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    rows = {}
    for shape in args.shapes.split(","):
        clients, per_request = (int(x) for x in shape.split("x"))
        for share in shares:
            rows[f"{shape} share {share:g}"] = asyncio.run(closed_loop(share, clients, per_request, args))
            print(shape, share, rows[f"{shape} share {share:g}"], flush=True)
    lines = [
        f"`python bench/serve_sim.py {' '.join(sys.argv[1:])}` (a sleeping fake engine: {args.pass_ms:g} ms a pass + "
        f"{args.token_us:g} us a padded token; turnaround up to {args.turnaround_ms:g} ms; {args.workers} worker(s))",
        "",
        "| shape | window share | texts/s | x share "
        + f"{shares[0]:g}"
        + " | p50 | p99 | p99/p50 | passes | engine busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in args.shapes.split(","):
        first = rows[f"{shape} share {shares[0]:g}"]
        for share in shares:
            r = rows[f"{shape} share {share:g}"]
            lines.append(
                f"| {shape} | {share:g} | {r['texts_per_s']:.1f} | {r['texts_per_s'] / first['texts_per_s']:.2f} "
                f"| {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {r['p99_ms'] / r['p50_ms']:.2f} | {r['passes']} "
                f"| {r['engine_busy']:.3f} |"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps({"command": lines[0], "rows": rows}, indent=2) + "\n")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
