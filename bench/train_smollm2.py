"""Bench: LoRA-train smollm2-135m into an embedding model on CPU, and measure what it gained.

Recipe (NV-Embed style, scaled to a CPU): bidirectional attention, mean pooling, LoRA (r=16, alpha=32,
dropout 0.1), InfoNCE (tau=0.02) with in-batch negatives and one hard negative per query, datasets
mixed uniformly: NLI triplets + SciFact train judgments from ``../shared/datasets``.

Evaluation: nDCG@10 on held-out retrieval sets (SciFact test queries, NFCorpus test), before and after
training, next to ``minilm`` (a trained sentence encoder) as the reference. On a 2-core CPU full corpora
take hours to embed with a 135M decoder, so each set is a fixed random subsample (``--eval-queries``
queries, ``--eval-docs`` documents: their relevant documents first, then random distractors); all
models are scored on the same subsample. Every number is printed next to a baseline from this same
run (ratios), so results from busy or idle machines stay comparable.

    python bench/train_smollm2.py --quick          # ~minutes: proves the pipeline works
    python bench/train_smollm2.py                  # training capped at 30 min (--time-budget-min)
    python bench/train_smollm2.py --device cuda --dtype bfloat16 --steps 300 --batch-size 64 \
        --max-length 256 --eval-queries 0 --eval-docs 0   # GPU: full test sets (0 = no subsampling)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from _common import SHARED, peak_rss_mb, shared_or_exit
from lmembed import Embedder
from lmembed.training.dev_eval import evaluate_retrieval, load_eval_tasks
from lmembed.training.rows import DataSource
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
DATA = SHARED


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke run of a few minutes")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128, help="tokens, for training and evaluation")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--num-negatives", type=int, default=1)
    parser.add_argument("--grad-cache-chunk", type=int, default=None)
    parser.add_argument("--time-budget-min", type=float, default=30.0, help="stop training after this long")
    parser.add_argument("--eval-sets", default="scifact,nfcorpus")
    parser.add_argument("--eval-queries", type=int, default=50)
    parser.add_argument("--eval-docs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (training and evaluation)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 (weights; LoRA stays float32)")
    parser.add_argument("--data-root", type=Path, default=DATA, help="folder laid out like ../shared/datasets")
    parser.add_argument("--reference", default="minilm", help="reference model evaluated untrained ('none': skip)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", default=str(REPO / "runs" / "bench-smollm2"))
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch_size, args.max_length, args.warmup_steps = 3, 4, 32, 1
        args.eval_queries, args.eval_docs, args.time_budget_min = 8, 40, 5.0
    return args


def scores_of(embedder: Embedder, tasks: list, batch_size: int = 16) -> tuple[dict[str, float], float]:
    started = time.perf_counter()
    scores = evaluate_retrieval(embedder, tasks, batch_size)
    return scores, time.perf_counter() - started


def encode_rate(embedder: Embedder, texts: list[str]) -> float:
    """Texts per second of plain inference: the in-run baseline for the training throughput."""
    started = time.perf_counter()
    embedder.encode(texts, batch_size=16)
    return len(texts) / (time.perf_counter() - started)


def train(trainer: Trainer, budget_s: float) -> tuple[int, float]:
    """Run steps until ``config.steps`` or the time budget; returns (steps done, seconds)."""
    started = time.perf_counter()
    total = trainer.config.steps
    while trainer.step < total:
        record = trainer.train_step()
        elapsed = time.perf_counter() - started
        if trainer.step == 1 or trainer.step % 5 == 0 or trainer.step == total:
            eta = elapsed / trainer.step * (total - trainer.step)
            print(
                f"  step {trainer.step}/{total} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                f"{record['rows_per_s']:.2f} rows/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min",
                flush=True,
            )
        if elapsed > budget_s:
            print(f"  time budget reached after {trainer.step} steps (learning rate not fully decayed)")
            break
    return trainer.step, time.perf_counter() - started


def main() -> None:
    args = parse_args()
    if args.data_root == DATA:
        shared_or_exit()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.eval_sets.split(",") if n.strip()]
    data = args.data_root
    tasks = load_eval_tasks(
        [str(data / "beir" / n) for n in names],
        "test",
        max_queries=args.eval_queries or None,
        max_docs=args.eval_docs or None,
        seed=args.seed,
    )
    sizes = [f"{t.name} ({len(t.data.query_ids)} q, {len(t.data.corpus_ids)} docs)" for t in tasks]
    print(f"eval sets: {', '.join(sizes)}")

    minilm_scores: dict[str, float] = {}
    if args.reference != "none":
        reference = Embedder.from_pretrained(
            args.reference, max_length=args.max_length, device=args.device, show_progress=False
        )
        minilm_scores, minilm_s = scores_of(reference, tasks)
        print(f"{args.reference} (untrained here): {minilm_scores}  [{minilm_s:.0f} s]")

    cfg = TrainConfig(
        model="smollm2-135m",
        data=[
            DataSource(str(data / "training" / "nli_triplets.jsonl"), name="nli"),
            DataSource(str(data / "beir" / "scifact"), name="scifact-train"),
        ],
        pooling="mean",
        attention="bidirectional",
        max_length=args.max_length,
        lora=True,
        loss="infonce",
        temperature=0.02,
        num_negatives=args.num_negatives,
        batch_size=args.batch_size,
        grad_cache_chunk=args.grad_cache_chunk,
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        output=args.output,
        progress=False,
    )
    trainer = Trainer(cfg)
    rss_loaded = peak_rss_mb()
    model = trainer.model
    print(f"smollm2-135m: {model.num_parameters():,} parameters, {model.num_parameters(True):,} trainable (LoRA)")
    model.eval()
    sample = trainer.sampler.batch(0)
    inference_rate = encode_rate(model.embedder, sample.queries + sample.positives)
    before, before_s = scores_of(model.embedder, tasks)
    print(f"smollm2 before training: {before}  [{before_s:.0f} s]")

    steps_done, train_s = train(trainer, args.time_budget_min * 60)
    rss_peak_train = peak_rss_mb()
    model_dir = trainer.save_model()
    trained = Embedder.from_pretrained(str(model_dir), device=args.device, show_progress=False, cache=False)
    after, after_s = scores_of(trained, tasks)
    print(f"smollm2 after training: {after}  [{after_s:.0f} s]  (saved to {model_dir})")

    rows_per_s = steps_done * cfg.batch_size / train_s
    texts_per_row = 2 + cfg.num_negatives
    report = {
        "steps": steps_done,
        "train_minutes": train_s / 60,
        "rows_per_s": rows_per_s,
        "train_texts_per_s_over_inference_texts_per_s": rows_per_s * texts_per_row / inference_rate,
        "ndcg@10": {"minilm": minilm_scores, "smollm2_before": before, "smollm2_after": after},
        "after_over_before": {k: after[k] / before[k] if before[k] else None for k in after},
        "after_over_minilm": {k: after[k] / minilm_scores[k] if minilm_scores.get(k) else None for k in after},
        "reference": args.reference,
        "device": args.device,
        "dtype": args.dtype,
        "peak_rss_mb": rss_peak_train,
        "peak_rss_over_loaded_rss": rss_peak_train / rss_loaded,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else None,
        "eval": {"queries": args.eval_queries or "all", "docs": args.eval_docs or "all", "max_length": args.max_length},
    }
    print_report(report)
    Path(args.output).mkdir(parents=True, exist_ok=True)
    (Path(args.output) / "bench_results.json").write_text(json.dumps(report, indent=2))


def print_report(report: dict) -> None:
    print("\n=== smollm2-135m LoRA training bench ===")
    print(f"{'set':<12} {'minilm':>8} {'before':>8} {'after':>8} {'after/before':>13} {'after/minilm':>13}")
    scores = report["ndcg@10"]
    for name in scores["smollm2_after"]:
        ratio_b, ratio_m = report["after_over_before"][name], report["after_over_minilm"][name]
        print(
            f"{name:<12} {scores['minilm'].get(name, float('nan')):8.4f} {scores['smollm2_before'][name]:8.4f} "
            f"{scores['smollm2_after'][name]:8.4f} {ratio_b or float('nan'):13.2f} {ratio_m or float('nan'):13.2f}"
        )
    print(
        f"training: {report['steps']} steps in {report['train_minutes']:.1f} min, {report['rows_per_s']:.2f} rows/s; "
        f"training text throughput = {report['train_texts_per_s_over_inference_texts_per_s']:.2f} x inference"
    )
    print(f"peak RSS {report['peak_rss_mb']:.0f} MB = {report['peak_rss_over_loaded_rss']:.2f} x the RSS after loading")
    if report.get("peak_gpu_mb"):
        print(f"peak GPU memory {report['peak_gpu_mb']:.0f} MB (torch.cuda.max_memory_allocated)")


if __name__ == "__main__":
    main()
