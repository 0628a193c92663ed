"""Bench: memory of one GradCache training step at a large batch vs plain steps.

GradCache embeds a batch chunk by chunk, so a step's activation memory is that of one chunk, whatever
the batch. This bench measures, each in a fresh process (no allocator state carried over):

* a GradCache step at ``--batch`` (256) with chunks of ``--chunk`` rows;
* plain steps at doubling batch sizes, to find the largest plain batch that fits in a memory budget.

The budget is the GradCache step's own memory unless ``--budget-mb`` is given: "with the memory
GradCache needs for batch 256, plain training reaches batch B". Memory is the rise of the resident set
during a step above the resident set just before it (sampled every 2 ms on CPU; on a GPU,
``torch.cuda.max_memory_allocated``), measured on the second step so that the optimizer state created by
the first is not counted. Results are printed as ratios between configurations of this run.

    python bench/gradcache_memory.py --quick
    python bench/gradcache_memory.py                      # minilm, batch 256, chunk 16
    python bench/gradcache_memory.py --model smollm2-135m --lora
    python bench/gradcache_memory.py --model DIR --random-weights --device cuda   # architecture only

``--random-weights`` builds the model from ``DIR``'s ``config.json`` and tokenizer with random weights:
memory does not depend on weight values, so a GPU machine without the bundled packages can measure
a real architecture from two small files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import SHARED, shared_or_exit

REPO = Path(__file__).resolve().parents[1]
DATA = SHARED / "training" / "nli_triplets.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small batches and short texts (a minute or two)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--random-weights", action="store_true", help="--model is a folder: its config, random init")
    parser.add_argument("--data", default=str(DATA), help="training rows (JSONL) the batches are drawn from")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in backward")
    parser.add_argument("--batch", type=int, default=256, help="GradCache batch size")
    parser.add_argument("--chunk", type=int, default=16, help="GradCache chunk size")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--start-batch", type=int, default=8, help="smallest plain batch tried")
    parser.add_argument("--budget-mb", type=float, default=None, help="memory budget (default: GradCache's)")
    parser.add_argument("--no-warmup", action="store_true", help="measure the first step (optimizer state included)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here (JSON)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.chunk, args.max_length, args.start_batch = 32, 8, 32, 8
    return args


# ---------------------------------------------------------------------------------------------- child side
def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakSampler:
    """Samples the resident set size in a background thread while a step runs."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def load_model(args: argparse.Namespace):
    """The bench's model: a real checkpoint, or (``--random-weights``) its architecture only."""
    from lmembed import Embedder, EmbeddingConfig

    if not args.random_weights:
        return Embedder.from_pretrained(
            args.model, max_length=args.max_length, device=args.device, cache=False, show_progress=False
        )
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.from_pretrained(args.model), attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = EmbeddingConfig(max_length=args.max_length)
    return Embedder.from_model(model.to(args.device), tokenizer, config, use_cache=False, show_progress=False)


def measure_step(args: argparse.Namespace, batch: int, chunk: int | None) -> dict:
    """One training step in this process; returns its memory rise and duration."""
    import torch

    from lmembed.training.rows import TrainDataset, read_jsonl_examples
    from lmembed.training.train_config import TrainConfig
    from lmembed.training.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)
    examples, _ = read_jsonl_examples(args.data)
    examples = examples[: max(batch, 64)]
    pool = [t for e in examples for t in (*e.positives, *e.negatives)]
    embedder = load_model(args)
    with tempfile.TemporaryDirectory() as output:
        cfg = TrainConfig(
            data=[args.data],
            output=output,
            batch_size=batch,
            grad_cache_chunk=chunk,
            steps=10,
            lora=args.lora,
            gradient_checkpointing=args.gradient_checkpointing,
            num_negatives=1,
            device=args.device,
            progress=False,
        )
        trainer = Trainer(cfg, model=embedder, datasets=[TrainDataset("nli", examples, pool)])
        if not args.no_warmup:  # allocates gradients and AdamW state, which every step reuses
            trainer.train_step()
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() / 2**20
        else:
            before = rss_mb()
        started = time.perf_counter()
        with PeakSampler() as sampler:
            trainer.train_step()
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else sampler.peak
    return {
        "batch": batch,
        "chunk": chunk,
        "before_mb": before,
        "peak_mb": peak,
        "rise_mb": peak - before,
        "s": seconds,
    }


# ---------------------------------------------------------------------------------------------- parent side
def run_child(args: argparse.Namespace, batch: int, chunk: int | None) -> dict:
    spec = json.dumps({"batch": batch, "chunk": chunk})
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    command = [sys.executable, __file__, *argv, "--max-length", str(args.max_length), "--child", spec]
    # A fixed mmap threshold makes glibc hand large freed blocks back at once, so RSS follows live memory.
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "TOKENIZERS_PARALLELISM": "false",
        "MALLOC_MMAP_THRESHOLD_": "131072",
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measurement batch={batch} chunk={chunk} failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    label = f"GradCache chunk {chunk}" if chunk else "plain"
    print(f"  {label:<20} batch {batch:>4}: +{result['rise_mb']:8.1f} MB in {result['s']:6.1f} s", flush=True)
    return result


def main() -> None:
    args = parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure_step(args, spec["batch"], spec["chunk"])))
        return
    if args.data == str(DATA):
        shared_or_exit("training/nli_triplets.jsonl")
    checkpointing = ", gradient checkpointing" if args.gradient_checkpointing else ""
    print(
        f"model {args.model} ({'LoRA' if args.lora else 'full'}{checkpointing}), max_length {args.max_length}, "
        f"device {args.device}"
    )
    cached = run_child(args, args.batch, args.chunk)
    budget = args.budget_mb or cached["rise_mb"]
    plain: list[dict] = []
    batch = args.start_batch
    while batch <= args.batch:
        result = run_child(args, batch, None)
        plain.append(result)
        if result["rise_mb"] > budget:
            break
        batch *= 2
    report(cached, plain, budget)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        keys = ("model", "lora", "gradient_checkpointing", "batch", "chunk", "max_length", "device")
        settings = {k: getattr(args, k) for k in keys}
        record = {"settings": settings, "budget_mb": budget, "gradcache": cached, "plain": plain}
        args.json.write_text(json.dumps(record, indent=2) + "\n")


def report(cached: dict, plain: list[dict], budget: float) -> None:
    fitting = [p for p in plain if p["rise_mb"] <= budget]
    origin = "given" if budget != cached["rise_mb"] else "the GradCache step's"
    print(f"\n=== GradCache memory (budget {budget:.1f} MB = {origin}) ===")
    if fitting:
        best = fitting[-1]
        print(
            f"largest plain batch within the budget: {best['batch']} "
            f"(GradCache batch {cached['batch']} = {cached['batch'] / best['batch']:.1f} x larger)"
        )
        print(f"memory GradCache@{cached['batch']} / plain@{best['batch']}: {cached['rise_mb'] / best['rise_mb']:.2f}")
    else:
        print("no plain batch fits within the budget")
    same = next((p for p in plain if p["batch"] == cached["batch"]), None)
    if same:
        print(
            f"at batch {cached['batch']}: plain needs {same['rise_mb'] / cached['rise_mb']:.2f} x GradCache's memory; "
            f"GradCache takes {cached['s'] / same['s']:.2f} x the time (second forward pass)"
        )
    else:
        largest = plain[-1]
        print(
            f"plain@{largest['batch']} already needs {largest['rise_mb'] / cached['rise_mb']:.2f} x the memory of "
            f"GradCache@{cached['batch']}"
        )


if __name__ == "__main__":
    main()
