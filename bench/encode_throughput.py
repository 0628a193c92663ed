"""Issue 2 benchmark: lmembed vs sentence-transformers on the same 2,000 real texts with `minilm`.

Prints per-vector cosine agreement, the throughput ratio lmembed / sentence-transformers (float32
and int8), and the cache speed-up (second encode vs first). Results also go to
bench/results/encode_throughput.json.

    python bench/encode_throughput.py [--n 2000] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch

from _common import read_jsonl, save_json, shared_or_exit


def load_texts(n: int) -> list[str]:
    """Half short sentences (STSBenchmark), half abstracts (SciFact corpus): a realistic length mix."""
    sts = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"))
    docs = read_jsonl(shared_or_exit("beir/scifact/corpus.jsonl"), limit=n)
    short = [r["sentence1"] for r in sts][: n // 2]
    long = [(d.get("title", "") + " " + d["text"]).strip() for d in docs][: n - len(short)]
    return short + long


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from lmembed import Embedder

    texts = load_texts(args.n)
    print(f"{len(texts)} texts, torch threads: {torch.get_num_threads()}")
    ours = Embedder.from_pretrained("minilm", cache=False, show_progress=False)
    st = SentenceTransformer(ours.backbone.path, device="cpu")
    int8 = Embedder.from_pretrained("minilm", cache=False, show_progress=False, quantize="int8")
    for model in (lambda t: st.encode(t), ours.encode, int8.encode):  # warm-up
        model(texts[:64])

    ref, t_st = timed(lambda: st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True))
    fp32, t_fp32 = timed(lambda: ours.encode(texts, batch_size=args.batch_size))
    q8, t_int8 = timed(lambda: int8.encode(texts, batch_size=args.batch_size))
    agree = (fp32 * ref).sum(1)
    agree_int8 = (q8 * fp32).sum(1)

    with tempfile.TemporaryDirectory() as cache_dir:
        cached = Embedder.from_pretrained("minilm", cache_dir=cache_dir, show_progress=False)
        _, t_cold = timed(lambda: cached.encode(texts, batch_size=args.batch_size))
        again, t_warm = timed(lambda: cached.encode(texts, batch_size=args.batch_size))
    assert np.allclose(again, fp32, atol=1e-6)

    result = {
        "texts": len(texts),
        "sentence_transformers_s": t_st,
        "lmembed_fp32_s": t_fp32,
        "lmembed_int8_s": t_int8,
        "agreement_fp32_min_cosine": float(agree.min()),
        "agreement_int8_vs_fp32_min_cosine": float(agree_int8.min()),
        "throughput_ratio_fp32": t_st / t_fp32,
        "throughput_ratio_int8": t_st / t_int8,
        "cache_first_s": t_cold,
        "cache_second_s": t_warm,
        "cache_speedup": t_cold / t_warm,
    }
    print(f"sentence-transformers: {len(texts) / t_st:8.1f} texts/s  (baseline)")
    print(
        f"lmembed float32      : {len(texts) / t_fp32:8.1f} texts/s  ratio {result['throughput_ratio_fp32']:.2f}x"
        f"  min cosine vs ST {agree.min():.6f}  (vectors >= 0.999: {(agree >= 0.999).mean():.1%})"
    )
    print(
        f"lmembed int8         : {len(texts) / t_int8:8.1f} texts/s  ratio {result['throughput_ratio_int8']:.2f}x"
        f"  min cosine vs fp32 {agree_int8.min():.4f}"
    )
    print(f"cache: first encode {t_cold:.2f}s, second {t_warm:.3f}s, speed-up {result['cache_speedup']:.0f}x")
    print(f"saved {save_json(result, 'encode_throughput')}")


if __name__ == "__main__":
    main()
