"""A published sentence-transformers model through lmembed against sentence-transformers itself, on STS.

Loads the same model folder both ways, encodes a STS test set's sentences (batched, so texts are padded), and
prints per-text cosine between the two libraries' vectors (min / mean) and the cosine-Spearman score (x100, MTEB's
main score) of each, with lmembed's score as a ratio of sentence-transformers' (the baseline, same run).

    python bench/published_fidelity.py MODEL_DIR [--task stsbenchmark] [--name all-mpnet-base-v2] [--limit N]

Run it under another checkout's source (``PYTHONPATH=OTHER/src``) to measure an older lmembed the same way.
Results: bench/results/published-fidelity/<name>-<label>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from _common import REPO, read_jsonl, shared_or_exit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--task", default="stsbenchmark")
    parser.add_argument("--name", default=None, help="label of the model in the results (default: folder name)")
    parser.add_argument("--label", default="current", help="which lmembed this is (e.g. current, before)")
    parser.add_argument("--limit", type=int, default=None, help="first N pairs only")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    import lmembed
    from lmembed import Embedder

    rows = read_jsonl(shared_or_exit(f"sts/{args.task}/test.jsonl"), args.limit)
    first, second = [r["sentence1"] for r in rows], [r["sentence2"] for r in rows]
    gold = np.array([float(r["score"]) for r in rows])

    start = time.perf_counter()
    emb = Embedder.from_pretrained(str(args.model_dir), cache=False, show_progress=False)
    ours = [emb.encode(texts, batch_size=args.batch_size) for texts in (first, second)]
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    st = SentenceTransformer(str(args.model_dir), device="cpu")
    theirs = [st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True) for texts in (first, second)]
    theirs_s = time.perf_counter() - start

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    agreement = np.concatenate([np.sum(unit(a) * unit(b), axis=1) for a, b in zip(ours, theirs, strict=True)])

    def score(pair: list[np.ndarray]) -> float:
        return float(spearmanr(np.sum(unit(pair[0]) * unit(pair[1]), axis=1), gold).statistic * 100)

    result = {
        "model": args.name or args.model_dir.name,
        "task": args.task,
        "pairs": len(rows),
        "lmembed": args.label,
        "lmembed_source": str(Path(lmembed.__file__).parent),
        "cosine_to_sentence_transformers": {"min": float(agreement.min()), "mean": float(agreement.mean())},
        "spearman_lmembed": score(ours),
        "spearman_sentence_transformers": score(theirs),
        "seconds": {"lmembed": ours_s, "sentence_transformers": theirs_s},
    }
    result["spearman_ratio"] = result["spearman_lmembed"] / result["spearman_sentence_transformers"]
    out = REPO / "bench" / "results" / "published-fidelity" / f"{result['model']}-{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['model']} on {args.task} ({len(rows)} pairs), lmembed {args.label}: cosine to sentence-transformers "
        f"min {agreement.min():.6f} mean {agreement.mean():.6f}; Spearman lmembed {result['spearman_lmembed']:.2f} vs "
        f"sentence-transformers {result['spearman_sentence_transformers']:.2f} "
        f"(ratio {result['spearman_ratio']:.4f}); wrote {out.relative_to(REPO)}"
    )


if __name__ == "__main__":
    main()
