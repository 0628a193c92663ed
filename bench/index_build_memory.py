"""The memory an index build takes for its vectors: the peak resident memory a build adds, over the bytes of the
corpus's float32 vectors, for each index kind, against the gathered build (the baseline, measured in the same run:
every vector encoded into one array, then added to the index as a normalised copy, the structure of a build before
stop 60).

A kind that takes vectors a part at a time (flat, binary without rescoring) is now given each encoded chunk as
it comes; the others get the gathered array normalised in place. Each cell runs in a fresh process with a stand-in
encoder (seeded random vectors, so the figure is the index's and not a model's), and reads its peak from the kernel.

    python bench/index_build_memory.py --documents 300000 --dim 384
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import REPO, markdown_table, run_cell, write_report

CELL = r"""
import json, resource, sys
import numpy as np
from lmembed.index.index import encode_in_chunks, encode_into
from lmembed.index.kinds import IndexParams, create

documents, dim, kind, rescore, way, chunk = sys.argv[1:]
documents, dim, chunk = int(documents), int(dim), int(chunk)

class StandIn:  # what a build asks of an Embedder: its width, and vectors for texts
    dim = dim
    def __init__(self):
        self.rng = np.random.default_rng(0)
    def encode_corpus(self, texts, batch_size):
        return self.rng.standard_normal((len(texts), self.dim), dtype=np.float32)

params = IndexParams.of(kind, **({"rescore": rescore} if kind == "binary" else {}))
vectors = create(params, dim)
texts = [""] * documents
page = resource.getpagesize()
before = int(open("/proc/self/statm").read().split()[1]) * page
if way == "gathered":
    vectors.add(encode_in_chunks(StandIn(), texts, batch_size=64, chunk_size=chunk))
else:
    encode_into(vectors, StandIn(), texts, batch_size=64, chunk_size=chunk)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"added_bytes": peak - before, "ntotal": vectors.ntotal}))
"""

KINDS = [("flat", ""), ("binary", "none"), ("binary", "float"), ("ivf-pq", "")]


def cell(documents: int, dim: int, kind: str, rescore: str, way: str, chunk: int) -> dict:
    return run_cell(CELL, documents, dim, kind, rescore, way, chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--chunk-size", type=int, default=2048, help="texts encoded per chunk (the build's default)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "index-build-memory")
    args = parser.parse_args()
    vector_bytes = args.documents * args.dim * 4
    rows, result = [], {"documents": args.documents, "dim": args.dim, "vector_bytes": vector_bytes, "kinds": {}}
    for kind, rescore in KINDS:
        name = f"{kind} ({rescore} rescoring)" if rescore else kind
        base = cell(args.documents, args.dim, kind, rescore, "gathered", args.chunk_size)
        now = cell(args.documents, args.dim, kind, rescore, "encode_into", args.chunk_size)
        assert base["ntotal"] == now["ntotal"] == args.documents
        gathered, built = base["added_bytes"] / vector_bytes, now["added_bytes"] / vector_bytes
        result["kinds"][name] = {"gathered_over_vectors": gathered, "build_over_vectors": built}
        rows.append([name, f"{gathered:.2f}x", f"{built:.2f}x", f"{built / gathered:.2f}"])
        print(rows[-1], flush=True)
    lines = [
        f"# Index build memory: {args.documents:,} documents x {args.dim} dims "
        f"({vector_bytes / 2**20:.0f} MiB of float32 vectors), chunks of {args.chunk_size:,}",
        "",
        "Peak resident memory a build adds, over the vectors' bytes; baseline: the gathered build in the same run.",
        "",
        *markdown_table(["kind", "gathered (baseline)", "lmembed build", "build / baseline"], rows),
        "",
        f"`python bench/index_build_memory.py --documents {args.documents} --dim {args.dim}`",
    ]
    write_report(args.out, "index_build_memory", result, lines)


if __name__ == "__main__":
    main()
