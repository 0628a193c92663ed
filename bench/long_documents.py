"""Long documents on synthetic passkey/needle retrieval: truncation at several max_lengths against chunking.

    PYTHONPATH=src python bench/long_documents.py --model minilm --docs 20 --words 600

Prints nDCG@10 per reading (truncate at each --lengths value; first/MaxP/mean chunks of --chunk-tokens with
--chunk-overlap; late chunking at the longest length) and writes bench/results/long_documents.json.
"""

from __future__ import annotations

import argparse
import time

from _common import save_json
from lmembed import Embedder
from lmembed.encoding.chunking import Chunking
from lmembed.evaluation.long_synthetic import length_grid, needle_retrieval, passkey_retrieval
from lmembed.evaluation.tasks.retrieval import RetrievalTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--words", type=int, default=600)
    parser.add_argument("--lengths", default="128,256,512")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--chunk-overlap", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    emb = Embedder.from_pretrained(args.model, cache=False)
    rows = []
    for build in (passkey_retrieval, needle_retrieval):
        task = RetrievalTask(build(num_docs=args.docs, words=args.words, seed=args.seed))
        readings: list[tuple[str, int, Chunking | None]] = [(f"truncate@{n}", n, None) for n in lengths]
        for aggregate in ("first", "maxp", "mean"):
            chunking = Chunking(aggregate, tokens=args.chunk_tokens, overlap=args.chunk_overlap)
            readings.append((f"{aggregate}[{args.chunk_tokens}/{args.chunk_overlap}]", max(lengths), chunking))
        late = Chunking("maxp", tokens=args.chunk_tokens, overlap=args.chunk_overlap, late=True)
        readings.append((f"late-maxp@{max(lengths)}", max(lengths), late))
        for label, length, chunking in readings:
            start = time.perf_counter()
            ((_, result),) = length_grid(emb, task, [length], chunking=chunking)
            ndcg = result.scores["ndcg_at_10"]
            rows.append(
                {"task": task.name, "reading": label, "ndcg_at_10": ndcg, "seconds": time.perf_counter() - start}
            )
            print(f"{task.name:24s} {label:24s} nDCG@10 {ndcg:.3f}")
    out = save_json({"model": args.model, **vars(args), "rows": rows}, "long_documents")
    print(f"written {out}")


if __name__ == "__main__":
    main()
