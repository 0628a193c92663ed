"""Does ``torch.compile`` bring lmembed's torch path on the CPU closer to ONNX Runtime's? (issue 40: "graph capture
and fused attention through torch.compile ... where it is exact enough"). Measured, not assumed.

Three arms, all lmembed ``Embedder.encode`` on the same real texts (``encode_throughput.load_texts``: half
STS-benchmark sentences, half SciFact abstracts), minilm, ``--batch-size`` texts a batch, cache off:

* ``torch`` (the baseline): the torch backend as it ships (eager, SDPA attention);
* ``torch+compile``: the same Embedder with its transformer wrapped in ``torch.compile(dynamic=True)`` (inductor,
  the default mode; ``--mode`` picks another); its first encode, which compiles, is timed apart;
* ``onnx``: ``backend="onnx"`` float32 (the fused graph lmembed exports).

Rounds are interleaved (each arm once a round, ``--repeats`` rounds); each figure is the median over rounds and
every ratio is against ``torch`` in the same run. Agreement: the lowest cosine of each arm's vectors to
``torch``'s. Results: ``bench/results/encode-throughput/torch-compile.json`` and ``torch-compile.md``.

    python bench/torch_compile_cpu.py --n 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from _common import REPO, markdown_table, write_report
from encode_throughput import load_texts
from lmembed import Embedder

OUT = REPO / "bench" / "results" / "encode-throughput"


def timed(emb: Embedder, texts: list[str], batch_size: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    vectors = emb.encode(texts, batch_size=batch_size)
    return time.perf_counter() - start, vectors


def min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    texts = load_texts(args.n)
    load = {"cache": False, "show_progress": False}
    arms = {"torch": Embedder.from_pretrained("minilm", **load)}
    compiled = Embedder.from_pretrained("minilm", **load)
    compiled.backbone.model = torch.compile(compiled.backbone.model, dynamic=True, mode=args.mode)
    compile_s, _ = timed(compiled, texts, args.batch_size)  # the first pass compiles (and recompiles per shape)
    arms["torch+compile"] = compiled
    arms["onnx"] = Embedder.from_pretrained("minilm", backend="onnx", **load)
    timed(arms["onnx"], texts[:64], args.batch_size)  # exported (or read from the export cache) before timing

    seconds: dict[str, list[float]] = {name: [] for name in arms}
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(args.repeats):
        order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
        for name in order:
            took, vectors[name] = timed(arms[name], texts, args.batch_size)
            seconds[name].append(took)
            print(f"round {round_ + 1}: {name}: {len(texts) / took:.1f} texts/s", flush=True)

    base = statistics.median(seconds["torch"])
    rows = []
    for name in arms:
        median = statistics.median(seconds[name])
        rows.append(
            {
                "arm": name,
                "texts_per_s": len(texts) / median,
                "x_torch": base / median,
                "min_cos_to_torch": min_cos(vectors[name], vectors["torch"]),
                "seconds": seconds[name],
            }
        )
    result = {
        "command": "python bench/torch_compile_cpu.py "
        + f"--n {args.n} --batch-size {args.batch_size} --repeats {args.repeats}"
        + (f" --mode {args.mode}" if args.mode else ""),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "torch": torch.__version__,
        "texts": len(texts),
        "compile_first_encode_s": compile_s,
        "rows": rows,
    }
    lines = [
        "# torch.compile on the CPU (minilm)",
        "",
        f"`{result['command']}`, torch {torch.__version__}, {torch.get_num_threads()} threads, {len(texts)} texts; "
        f"median of {args.repeats} interleaved rounds; ratios against `torch` (the shipped backend) in this run.",
        "",
        *markdown_table(
            ["arm", "texts/s", "x torch", "min cosine to torch"],
            [
                [r["arm"], f"{r['texts_per_s']:.1f}", f"{r['x_torch']:.2f}", f"{r['min_cos_to_torch']:.6f}"]
                for r in rows
            ],
        ),
        "",
        f"The compiled arm's first encode (compiling, {len(texts)} texts) took {compile_s:.0f} s.",
    ]
    write_report(args.out, "torch-compile", result, lines)


if __name__ == "__main__":
    main()
