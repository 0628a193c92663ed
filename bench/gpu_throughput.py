"""GPU encoding throughput: lmembed in float16 and bfloat16 vs sentence-transformers in float16, same GPU, one run.

Issue 13's GPU target: ``minilm`` and ``smollm2-135m`` texts/s at least 2x sentence-transformers' float16 on the same
GPU. For each model, on the encode_throughput mix of real texts (half STSBenchmark sentences, half SciFact
abstracts) truncated at ``--max-length`` tokens, mean pooling, normalised vectors, ``--batch-size`` texts per batch:

* ``st-float16``: ``SentenceTransformer(path, model_kwargs={"torch_dtype": torch.float16})`` (its default SDPA);
* ``lmembed-float16`` and ``lmembed-bfloat16``: ``Embedder.from_pretrained(name, dtype=..., device=...)`` (SDPA,
  length-sorted batches, optionally bounded by ``--max-batch-tokens``).

Rounds are interleaved (every contender once per round) and each figure is the median over ``--repeats`` rounds;
the ratios are lmembed / st-float16 within this run. Agreement: min cosine of each contender's vectors to lmembed's
float32 vectors on the same device. Without CUDA the script stops and says so; ``--device cpu`` runs
the same code on the CPU in float32 (a smoke test of the script, not a measurement of the GPU path).

    python bench/gpu_throughput.py --n 4000 --repeats 3
    python bench/gpu_throughput.py --device cpu --n 64 --repeats 1 --models minilm   # smoke test

Results: ``bench/results/gpu-throughput/result.json`` and ``table.md``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable

import numpy as np

from _common import REPO
from encode_throughput import interleave, load_texts, timed

OUT = REPO / "bench" / "results" / "gpu-throughput"
MODELS = ("minilm", "smollm2-135m")


def sentence_transformer(path: str, device: str, dtype, args: argparse.Namespace):
    """sentence-transformers on ``path`` with mean pooling over the plain text's tokens (its defaults for a chat
    decoder are the last token of the chat-templated text)."""
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer

    options = {"model_kwargs": {"torch_dtype": dtype}, "max_seq_length": args.max_length}
    if "modality_config" in inspect.signature(Transformer).parameters:
        # sentence-transformers >= 6 wraps a chat model's input in its chat template (a system prompt and all):
        # plain text in, as lmembed reads it, so both encode the same tokens
        options["modality_config"] = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
        options["module_output_name"] = "token_embeddings"
    word = Transformer(path, **options)
    if word.tokenizer.pad_token is None:  # decoders ship without one; sentence-transformers pads on the right
        word.tokenizer.pad_token = word.tokenizer.eos_token
    pool = Pooling(
        word.get_embedding_dimension()
        if hasattr(word, "get_embedding_dimension")
        else word.get_word_embedding_dimension(),
        pooling_mode="mean",
    )
    return SentenceTransformer(modules=[word, pool], device=device)


def model_section(name: str, texts: list[str], args: argparse.Namespace) -> dict:
    import torch

    from lmembed import Embedder

    gpu = args.device != "cpu"
    dtypes = ("float16", "bfloat16") if gpu else ("float32",)
    common = {
        "cache": False,
        "show_progress": False,
        "device": args.device,
        "max_length": args.max_length,
        "pooling": "mean",
    }
    reference = Embedder.from_pretrained(name, **common)
    ours = {
        f"lmembed-{d}": Embedder.from_pretrained(name, dtype=d, max_batch_tokens=args.max_batch_tokens, **common)
        for d in dtypes
    }
    st = sentence_transformer(reference.backbone.path, args.device, torch.float16 if gpu else torch.float32, args)
    bs = args.batch_size
    st_name = "st-float16" if gpu else "st-float32"
    runs: dict[str, Callable[[], np.ndarray]] = {
        st_name: lambda: st.encode(texts, batch_size=bs, normalize_embeddings=True),
        **{label: (lambda e=e: e.encode(texts, batch_size=bs)) for label, e in ours.items()},
    }
    for label, run in runs.items():  # warm-up: kernels, autotuning, allocator
        run()
        print(f"warm-up {name} {label} done", flush=True)
    seconds, vectors = interleave({label: (lambda r=run: timed(r)) for label, run in runs.items()}, args.repeats)
    exact = reference.encode(texts, batch_size=bs)
    median = {label: float(np.median(s)) for label, s in seconds.items()}
    rate = {label: len(texts) / s for label, s in median.items()}
    return {
        "texts": len(texts),
        "batch_size": bs,
        "max_length": args.max_length,
        "repeats": args.repeats,
        "seconds": seconds,
        "texts_per_s": rate,
        "ratios": {f"{label} / {st_name}": rate[label] / rate[st_name] for label in ours},
        "min_cosine_vs_lmembed_float32": {
            label: float((v.astype(np.float32) * exact).sum(1).min()) for label, v in vectors.items()
        },
    }


def table(result: dict) -> str:
    lines = [f"# Encoding throughput on {result['device_name']} (baseline: sentence-transformers, same run)", ""]
    for name, m in result["models"].items():
        lines += [
            f"## {name}: {m['texts']} texts, max {m['max_length']} tokens, batch {m['batch_size']}, "
            f"median of {m['repeats']} interleaved rounds",
            "",
            "| contender | texts/s | min cosine vs lmembed float32 |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {label} | {rate:.1f} | {m['min_cosine_vs_lmembed_float32'][label]:.5f} |"
            for label, rate in m["texts_per_s"].items()
        ]
        lines += ["", *(f"- {k}: **{v:.2f}x**" for k, v in m["ratios"].items()), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in models if m not in MODELS]:
        parser.error(f"--models: choose among {', '.join(MODELS)}; got {', '.join(unknown)}")
    for option in ("n", "batch_size", "max_length", "repeats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: must be at least 1, got {getattr(args, option)}")
    import torch

    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"skipped: --device {args.device} but torch sees no CUDA device (run where a GPU is lent)")
    texts = load_texts(args.n)
    device_name = torch.cuda.get_device_name() if args.device != "cpu" else "CPU (smoke test, float32)"
    result = {"device": args.device, "device_name": device_name, "models": {}}
    for name in models:
        result["models"][name] = model_section(name, texts, args)
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.device != "cpu" else "-cpu-smoke"
    (OUT / f"result{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"table{suffix}.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
