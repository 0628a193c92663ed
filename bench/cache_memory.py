"""What the embedding cache holds in memory once it has read a large folder of shards, and what a lookup costs,
against the design before stop 60 (the baseline, measured in the same run: every shard's vectors kept in a dict by
key, which is what the cache's index was).

The cache now keeps each key with its shard and row, and a lookup reads the rows it finds from the shard files. This
writes ``--shards`` shards of 2,048 random vectors, then, each in a fresh process, reads the folder and looks up
``--lookup`` keys spread over it, and prints the resident memory the read added and the lookup's seconds, as ratios
to the baseline.

    python bench/cache_memory.py --shards 100 --dim 384 --lookup 20000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from _common import REPO, markdown_table, run_cell, write_report
from lmembed.encoding.cache import EmbeddingCache, text_key

ROWS = 2048

CELL = r"""
import json, resource, sys, time
from pathlib import Path
import numpy as np
from lmembed.encoding.cache import EmbeddingCache, read_shard, text_key

root, shards, lookup, way = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
page = resource.getpagesize()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
step = max(1, shards * 2048 // lookup)
keys = [text_key(f"text {i}") for i in range(0, shards * 2048, step)][:lookup]
before = rss()
start = time.perf_counter()
if way == "baseline":  # the former index: every vector of every shard, by key
    index = {}
    for path in sorted((Path(root) / "model" / "strategy").glob("*.npz")):
        shard_keys, vectors = read_shard(path)
        for key, vector in zip(shard_keys, vectors):
            index[key.tobytes()] = vector
    read_seconds = time.perf_counter() - start
    start = time.perf_counter()
    found = [index.get(k) for k in keys]
    out = np.empty((len(keys), len(next(iter(index.values())))), dtype=np.float32)
    for i, vector in enumerate(found):  # what the engine then did with them: each into its row
        if vector is not None:
            out[i] = vector
else:
    cache = EmbeddingCache(Path(root), "model", "strategy")
    len(cache)
    read_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = np.empty((len(keys), cache._shards[0].width), dtype=np.float32)
    missing = set(cache.fill(out, keys))  # what the engine does: each shard's rows into theirs at once
    found = [None if i in missing else out[i] for i in range(len(keys))]
lookup_seconds = time.perf_counter() - start
held = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before  # the peak, not what is left after
checksum = float(np.sum([f[0] for f in found if f is not None]))
print(json.dumps({"held_bytes": held, "read_seconds": read_seconds, "lookup_seconds": lookup_seconds,
                  "found": sum(f is not None for f in found), "checksum": checksum}))
"""


def cell(root: Path, shards: int, lookup: int, way: str) -> dict:
    return run_cell(CELL, root, shards, lookup, way)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--lookup", type=int, action="append", help="keys looked up (repeat for several)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cache-memory")
    args = parser.parse_args()
    lookups = args.lookup or [16, 20_000]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        cache = EmbeddingCache(root, "model", "strategy")
        for s in range(args.shards):
            keys = [text_key(f"text {i}") for i in range(s * ROWS, (s + 1) * ROWS)]
            cache.store(keys, rng.standard_normal((ROWS, args.dim), dtype=np.float32))
        vector_bytes = args.shards * ROWS * args.dim * 4
        rows, result = [], {"shards": args.shards, "dim": args.dim, "vector_bytes": vector_bytes, "lookups": {}}
        for lookup in lookups:
            base = cell(root, args.shards, lookup, "baseline")
            now = cell(root, args.shards, lookup, "cache")
            assert base["found"] == now["found"] == lookup and base["checksum"] == now["checksum"]
            result["lookups"][str(lookup)] = {"baseline": base, "cache": now}
            rows.append(
                [
                    f"{lookup:,}",
                    f"{base['held_bytes'] / vector_bytes:.2f}x",
                    f"{now['held_bytes'] / vector_bytes:.2f}x",
                    f"{now['held_bytes'] / base['held_bytes']:.2f}",
                    f"{now['read_seconds'] / base['read_seconds']:.2f}",
                    f"{now['lookup_seconds'] / max(base['lookup_seconds'], 1e-9):.1f}",
                ]
            )
            print(rows[-1], flush=True)
    lines = [
        f"# Embedding cache memory: {args.shards} shards x {ROWS:,} vectors x {args.dim} dims "
        f"({vector_bytes / 2**20:.0f} MiB of float32 vectors)",
        "",
        "Peak resident memory the folder's read and the lookup added (over the vectors' bytes: the looked-up rows' "
        "array included) and seconds, against the former index (every vector kept by key, then copied row by row) in "
        "the same run; the same vectors found in both.",
        "",
        *markdown_table(
            [
                "keys looked up",
                "memory, baseline",
                "memory, cache",
                "memory cache/baseline",
                "read cache/baseline",
                "lookup cache/baseline",
            ],
            rows,
        ),
        "",
        f"`python bench/cache_memory.py --shards {args.shards} --dim {args.dim}"
        + "".join(f" --lookup {n}" for n in lookups)
        + "`",
    ]
    write_report(args.out, "cache_memory", result, lines)


if __name__ == "__main__":
    main()
