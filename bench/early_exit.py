"""Early exit (2DMSE's inference side): texts/s when ``layer=k`` stops the forward pass at layer k, as a ratio to
the full model measured in the same run.

For each ``--models`` entry (default ``minilm`` and ``smollm2-135m``) and each layer k (every layer of a model
with up to 8, else about six evenly spaced ones; ``--layers`` to choose), ``--n`` real texts (half STS sentences,
half SciFact abstracts) are embedded with mean pooling at layer k, the embedding cache off. The layers are timed in
turn, ``--repeats`` rounds, and each keeps its fastest round (the machine is shared). Reported per layer: texts/s,
the cost as a fraction of the full model's (time_k / time_L), the ideal ``k / L`` and their ratio (the aim: within
10 % of k/L). Before timing, each layer's vectors are checked against the full pass read at that layer (one pass
shared with the last layer's strategy, which runs every block): the largest difference must be 0.

    python bench/early_exit.py                                  # both models, torch
    python bench/early_exit.py --models minilm --backend onnx   # the exported graph stops at k as well

Results: ``bench/results/early_exit/<model>-<backend>.json`` and ``table.md`` (every model of the run).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from _common import REPO
from encode_throughput import load_texts

OUT = REPO / "bench" / "results" / "early_exit"


def default_layers(num_layers: int) -> list[int]:
    if num_layers <= 8:
        return list(range(1, num_layers + 1))
    step = num_layers / 6
    return sorted({max(1, round(step * i)) for i in range(1, 7)} | {num_layers})


def check_exact(embedder, texts: list[str], layer: int, batch_size: int) -> float:
    """Largest |difference| between ``layer=k`` (early exit) and the full pass read at layer k."""
    config = embedder.config.with_options(layer=layer)
    full = embedder.encode_strategies(texts, [config, config.with_options(layer=-1)], batch_size=batch_size)[0]
    early = embedder.with_config(config).encode(texts, batch_size=batch_size)
    return float(np.abs(full - early).max())


def time_layers(embedder, texts: list[str], layers: list[int], batch_size: int, repeats: int) -> dict[int, float]:
    """Fastest of ``repeats`` rounds per layer, the layers interleaved within each round."""
    best = {k: float("inf") for k in layers}
    for _ in range(repeats):
        for k in layers:
            emb = embedder.with_config(embedder.config.with_options(layer=k))
            start = time.perf_counter()
            emb.encode(texts, batch_size=batch_size)
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def run_model(name: str, args: argparse.Namespace, texts: list[str]) -> dict:
    from lmembed import Embedder

    embedder = Embedder.from_pretrained(
        name, pooling="mean", max_length=args.max_length, backend=args.backend, cache=False, show_progress=False
    )
    num_layers = embedder.backbone.num_layers
    layers = args.layers or default_layers(num_layers)
    if num_layers not in layers:
        layers = [*layers, num_layers]
    exact = {k: check_exact(embedder, texts[:16], k, args.batch_size) for k in layers if k < num_layers}
    embedder.encode(texts[: args.batch_size], batch_size=args.batch_size)  # warm-up (and, for ONNX, the export)
    seconds = time_layers(embedder, texts, layers, args.batch_size, args.repeats)
    full = seconds[num_layers]
    rows = []
    for k in layers:
        cost = seconds[k] / full
        rows.append(
            {
                "layer": k,
                "texts_per_s": round(len(texts) / seconds[k], 2),
                "speedup": round(full / seconds[k], 3),
                "cost": round(cost, 4),
                "ideal_cost": round(k / num_layers, 4),
                "cost_over_ideal": round(cost / (k / num_layers), 3),
                "max_abs_diff_vs_full_pass": exact.get(k, 0.0),
            }
        )
    return {
        "model": name,
        "backend": embedder.backend.name,
        "num_layers": num_layers,
        "texts": len(texts),
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "full_seconds": round(full, 3),
        "rows": rows,
    }


def markdown(results: list[dict]) -> str:
    lines = []
    for res in results:
        lines += [
            f"### {res['model']} ({res['backend']}, {res['num_layers']} layers, {res['texts']} texts, "
            f"max_length {res['max_length']}, batch {res['batch_size']}, best of {res['repeats']}, "
            f"{res['torch_threads']} torch threads; full model {res['full_seconds']} s)",
            "",
            "| layer k | texts/s | speed-up | cost (time_k / time_L) | k / L | cost ÷ (k / L) | max diff vs full |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in res["rows"]:
            lines.append(
                f"| {r['layer']} | {r['texts_per_s']:.1f} | {r['speedup']:.2f}× | {r['cost']:.3f} | "
                f"{r['ideal_cost']:.3f} | {r['cost_over_ideal']:.2f} | {r['max_abs_diff_vs_full_pass']:.1e} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2-135m"])
    parser.add_argument("--layers", nargs="+", type=int, default=None, help="layers to time (default: see above)")
    parser.add_argument("--n", type=int, default=256, help="texts per timed encode")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"])
    args = parser.parse_args()
    texts = load_texts(args.n)
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models:
        res = run_model(name, args, texts)
        (OUT / f"{name}-{args.backend}.json").write_text(json.dumps(res, indent=2) + "\n")
        results.append(res)
        print(markdown([res]), flush=True)
    table = OUT / ("table.md" if args.backend == "torch" else f"table-{args.backend}.md")
    table.write_text(f"<!-- python bench/early_exit.py {' '.join(_argv())} -->\n" + markdown(results))
    print(f"wrote {table}")


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


if __name__ == "__main__":
    main()
