"""Bench: fine-tune minilm with a triplet loss on scientific retrieval data; in- and out-of-domain effect.

The layer-wise decoder-vs-encoder study fine-tunes a small encoder with a triplet objective on the task's
own training data. Here: ``minilm`` (full fine-tuning, mean pooling) on SciFact's train judgments
(query, a relevant abstract, a negative). Negatives are random abstracts by default; ``--mine-negatives``
instead takes the untrained model's top-ranked non-relevant abstracts, skipping any that score above
95% of the query's positive (positive-aware mining, as NV-Retriever/NV-Embed do, to avoid false
negatives).

Evaluation, before and after: in-domain SciFact test queries; out-of-domain NFCorpus (medical) and
ArguAna (arguments). Sets are subsampled (``--eval-queries``/``--eval-docs``; ``--full-eval`` for the
whole corpora) so a 2-core CPU finishes in reasonable time; before/after use the same subsample and
results are printed as ratios to the untrained model of this same run.

    python bench/train_minilm_triplet.py --quick
    python bench/train_minilm_triplet.py --mine-negatives --full-eval
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from _common import SHARED, peak_rss_mb, shared_or_exit
from lmembed import Embedder
from lmembed.training.dev_eval import evaluate_retrieval, load_eval_tasks
from lmembed.training.rows import DataSource, read_beir
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
DATA = SHARED
SCIFACT = DATA / "beir" / "scifact"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke run of a few minutes")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--distance", default="cosine", choices=["cosine", "euclidean"])
    parser.add_argument("--margin", type=float, default=0.3)
    parser.add_argument("--mine-negatives", action="store_true", help="hard negatives from the untrained model")
    parser.add_argument("--mine-depth", type=int, default=10, help="candidates per query when mining")
    parser.add_argument("--in-domain", default="scifact")
    parser.add_argument("--out-of-domain", default="nfcorpus,arguana")
    parser.add_argument("--eval-queries", type=int, default=100)
    parser.add_argument("--eval-docs", type=int, default=1000)
    parser.add_argument("--full-eval", action="store_true", help="whole test sets (slow on a CPU)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output", default=str(REPO / "runs" / "bench-minilm-triplet"))
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch_size, args.max_length, args.warmup_steps = 3, 8, 64, 1
        args.eval_queries, args.eval_docs, args.mine_depth = 10, 60, 3
    if args.full_eval:
        args.eval_queries = args.eval_docs = None
    return args


def mine_negatives(embedder: Embedder, output: Path, depth: int, limit: int | None) -> Path:
    """Write SciFact train rows with positive-aware mined negatives; returns the JSONL path."""
    examples, corpus, _ = read_beir(SCIFACT, "train")
    if limit:  # quick runs: mine against a slice of the corpus that holds the positives
        positives = {p for e in examples for p in e.positives}
        corpus = list(dict.fromkeys([*positives, *corpus[:limit]]))
    docs = embedder.encode_corpus(corpus, batch_size=32)
    queries = embedder.encode_queries([e.query for e in examples], batch_size=32)
    index = {text: i for i, text in enumerate(corpus)}
    rows = []
    for example, query in zip(examples, queries, strict=True):
        scores = docs @ query
        floor = 0.95 * min(scores[index[p]] for p in example.positives)
        ranked = [int(i) for i in np.argsort(-scores)[: depth + len(example.positives)]]
        negatives = [corpus[i] for i in ranked if corpus[i] not in example.positives and scores[i] < floor][:depth]
        rows.append({"query": example.query, "positive": list(example.positives), "negatives": negatives})
    path = output / "scifact_train_mined.jsonl"
    output.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = sum(len(r["negatives"]) for r in rows) / len(rows)
    print(f"mined negatives: {kept:.1f} per query (depth {depth}, positive-aware threshold 95%)")
    return path


def evaluate(embedder: Embedder, tasks: list) -> tuple[dict[str, float], float]:
    started = time.perf_counter()
    return evaluate_retrieval(embedder, tasks, 32), time.perf_counter() - started


def main() -> None:
    args = parse_args()
    shared_or_exit("beir/scifact")
    if args.threads:
        torch.set_num_threads(args.threads)
    output = Path(args.output)
    names = {"in": [args.in_domain], "out": [n for n in args.out_of_domain.split(",") if n]}
    tasks = {
        side: load_eval_tasks(
            [str(DATA / "beir" / n) for n in sets],
            "test",
            max_queries=args.eval_queries,
            max_docs=args.eval_docs,
            seed=args.seed,
        )
        for side, sets in names.items()
    }
    untrained = Embedder.from_pretrained("minilm", max_length=args.max_length, show_progress=False)
    source = DataSource(str(SCIFACT), name="scifact-train")
    if args.mine_negatives:
        limit = 500 if args.quick else None
        source = DataSource(str(mine_negatives(untrained, output, args.mine_depth, limit)), name="scifact-mined")
    before = {side: evaluate(untrained, t) for side, t in tasks.items()}
    print(f"before: {before}")

    cfg = TrainConfig(
        model="minilm",
        data=[source],
        max_length=args.max_length,
        lora=False,
        loss="triplet",
        loss_kwargs={"distance": args.distance, "margin": args.margin},
        num_negatives=1,
        batch_size=args.batch_size,
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        device="cpu",
        output=str(output),
        progress=True,
    )
    started = time.perf_counter()
    result = Trainer(cfg).train()
    train_s = time.perf_counter() - started
    trained = Embedder.from_pretrained(str(result.model_dir), show_progress=False, cache=False)
    after = {side: evaluate(trained, t) for side, t in tasks.items()}
    report = build_report(before, after, result.losses, train_s, args)
    print_report(report)
    (output / "bench_results.json").write_text(json.dumps(report, indent=2))


def build_report(before: dict, after: dict, losses: list[float], train_s: float, args: argparse.Namespace) -> dict:
    rows = {}
    for side in before:
        for name, score in after[side][0].items():
            base = before[side][0][name]
            rows[name] = {"domain": side, "before": base, "after": score, "ratio": score / base if base else None}
    encode_s = sum(before[side][1] for side in before)
    return {
        "ndcg@10": rows,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "train_minutes": train_s / 60,
        "train_time_over_before_eval_time": train_s / encode_s if encode_s else None,
        "peak_rss_mb": peak_rss_mb(),
        "negatives": "mined" if args.mine_negatives else "random",
        "eval": {"queries": args.eval_queries, "docs": args.eval_docs},
    }


def print_report(report: dict) -> None:
    print("\n=== minilm + triplet loss on SciFact train ===")
    print(f"{'set':<10} {'domain':<7} {'before':>8} {'after':>8} {'after/before':>13}")
    for name, row in report["ndcg@10"].items():
        ratio = row["ratio"] if row["ratio"] is not None else float("nan")
        print(f"{name:<10} {row['domain']:<7} {row['before']:8.4f} {row['after']:8.4f} {ratio:13.3f}")
    print(
        f"loss {report['first_loss']:.4f} -> {report['last_loss']:.4f}; training took "
        f"{report['train_time_over_before_eval_time']:.2f} x the time of the 'before' evaluation; "
        f"negatives: {report['negatives']}; peak RSS {report['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
