"""Issue 29 benchmark: dense (minilm), BM25 and hybrid first stages, each + a cross-encoder trained here, on
SciFact, NFCorpus and ArguAna (../shared/datasets/beir), nDCG@10 in one table; the reranker's pairs/s in process
and served through ``POST /v1/rerank`` (as a ratio).

1. train: the bundled ``minilm`` with a new one-label head, as a cross-encoder, on SciFact's *train* split: each
   judged query with its relevant abstract and ``--negatives-pool`` BM25-mined negatives (the top BM25 hits that
   are not judged relevant), listwise softmax over 1 positive + 3 negatives, ``--train-steps`` steps of
   ``--train-batch`` queries (lmembed.training.reranker);
2. evaluate: for each set's test split (queries cut to ``--max-queries`` by a seeded sample where a set has more),
   the first stages' runs (lmembed.evaluation.two_stage; hybrid = RRF of dense and BM25), scored as MTEB scores
   retrieval, then each first stage's top ``--rerank-top-k`` reranked (pairs shared by several first stages are
   scored once);
3. throughput: in-process ``predict`` of ``--throughput-pairs`` SciFact pairs vs the same pairs sent to a server
   on loopback by ``--clients`` concurrent clients, ``--docs-per-request`` documents a request.

    python bench/rerank.py [--train-steps 150] [--max-queries 300] [--rerank-top-k 20]

Results: bench/results/rerank/result.json and table.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, shared_or_exit
from lmembed import Embedder
from lmembed.evaluation.retrieval_data import load_beir
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.evaluation.two_stage import _result, first_stage_run, rerank_run
from lmembed.lexical.bm25 import LexicalIndex
from lmembed.rerank import CrossEncoderReranker
from lmembed.serving.app import create_app
from lmembed.serving.server import BackgroundServer
from lmembed.training.reranker import RerankRow, RerankTrainConfig, train_reranker

SETS = {"scifact": "SciFact", "nfcorpus": "NFCorpus", "arguana": "ArguAna"}
IGNORE_IDENTICAL = {"arguana"}
OUT = REPO / "bench" / "results" / "rerank"


class MemoReranker:
    """A reranker's scores, each (query, document) pair computed once across first stages."""

    def __init__(self, reranker: CrossEncoderReranker) -> None:
        self.reranker, self.name, self.memo = reranker, "minilm-ce (trained here)", {}
        self.seconds, self.scored = 0.0, 0

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        todo = list(dict.fromkeys(p for p in pairs if p not in self.memo))
        if todo:
            start = time.perf_counter()
            self.memo.update(zip(todo, self.reranker.score_pairs(todo).tolist(), strict=True))
            self.seconds += time.perf_counter() - start
            self.scored += len(todo)
        return np.array([self.memo[p] for p in pairs], dtype=np.float32)


def mined_rows(folder: Path, pool: int, seed: int) -> list[RerankRow]:
    """SciFact train queries with their relevant document and BM25-mined negatives."""
    data = load_beir(folder, "train")
    bm25 = LexicalIndex.build(data.corpus_texts, data.corpus_ids)
    _, rows = bm25.search(data.query_texts, pool + 5)
    rng = random.Random(seed)
    out = []
    for i, qid in enumerate(data.query_ids):
        relevant = [d for d, s in data.qrels[qid].items() if s > 0]
        texts = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
        negatives = [data.corpus_texts[r] for r in rows[i] if r >= 0 and data.corpus_ids[r] not in relevant][:pool]
        if relevant and negatives:
            out.append(RerankRow(data.query_texts[i], texts[rng.choice(relevant)], negatives))
    return out


def train(args: argparse.Namespace) -> tuple[CrossEncoderReranker, dict]:
    rows = mined_rows(shared_or_exit("beir/scifact"), args.negatives_pool, args.seed)
    reranker = CrossEncoderReranker.from_pretrained("minilm", num_labels=1, max_length=args.max_length)
    config = RerankTrainConfig(
        steps=args.train_steps,
        batch_size=args.train_batch,
        negatives=3,
        lr=args.lr,
        warmup_steps=args.train_steps // 10,
    )
    start = time.perf_counter()
    train_reranker(reranker, rows, config, OUT / "reranker")
    return reranker, {"rows": len(rows), "steps": args.train_steps, "seconds": round(time.perf_counter() - start, 1)}


def fewer_queries(task: RetrievalTask, count: int, seed: int) -> RetrievalTask:
    """The task on ``count`` of its queries (a seeded sample; the whole corpus kept), named for it."""
    data = task.data
    keep = sorted(random.Random(seed).sample(range(len(data.query_ids)), count))
    ids = [data.query_ids[i] for i in keep]
    name = f"{task.name}[{count} queries]"
    data = dataclasses.replace(
        data,
        name=name,
        query_ids=ids,
        query_texts=[data.query_texts[i] for i in keep],
        qrels={q: data.qrels[q] for q in ids},
    )
    return dataclasses.replace(task, data=data, name=name, mteb_dataset_revision=None)


def evaluate(args: argparse.Namespace, reranker: CrossEncoderReranker) -> list[dict]:
    embedder = Embedder.from_pretrained("minilm")
    memo = MemoReranker(reranker)
    rows = []
    for key in args.sets:
        name = SETS[key]
        task = RetrievalTask.from_path(
            shared_or_exit(f"beir/{key}"), name=name, ignore_identical_ids=key in IGNORE_IDENTICAL
        )
        if len(task.data.query_ids) > args.max_queries:
            task = fewer_queries(task, args.max_queries, args.seed)
        for stage in ("dense", "bm25", "hybrid"):
            start = time.perf_counter()
            run = first_stage_run(task, stage, encoder=embedder, fusion="rrf")
            first = _result(task, run, stage, time.perf_counter() - start, {})
            reranked = _result(task, rerank_run(memo, task, run, args.rerank_top_k), stage, 0.0, {})
            rows.append(
                {
                    "set": task.name,
                    "queries": len(task.data.query_ids),
                    "documents": len(task.data.corpus_ids),
                    "first_stage": stage,
                    "ndcg_at_10": first.scores["ndcg_at_10"],
                    "reranked_ndcg_at_10": reranked.scores["ndcg_at_10"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def throughput(args: argparse.Namespace, reranker: CrossEncoderReranker) -> dict:
    data = load_beir(shared_or_exit("beir/scifact"), "test")
    rng = random.Random(args.seed)
    queries = [rng.choice(data.query_texts) for _ in range(args.throughput_pairs // args.docs_per_request)]
    requests = [(q, rng.sample(data.corpus_texts, args.docs_per_request)) for q in queries]
    pairs = [(q, d) for q, docs in requests for d in docs]
    start = time.perf_counter()
    reranker.score_pairs(pairs)
    local = len(pairs) / (time.perf_counter() - start)
    app = create_app(Embedder.from_pretrained("minilm", cache=False), reranker=reranker, reranker_name="ce")
    with BackgroundServer(app) as server, httpx.Client(timeout=600) as client:
        while client.get(server.url + "/health").status_code != 200:
            time.sleep(0.05)

        def send(request: tuple[str, list[str]]) -> int:
            response = client.post(server.url + "/v1/rerank", json={"query": request[0], "documents": request[1]})
            response.raise_for_status()
            return len(response.json()["results"])

        start = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            done = sum(pool.map(send, requests))
        served = done / (time.perf_counter() - start)
    return {
        "pairs": len(pairs),
        "in_process_pairs_per_s": round(local, 1),
        "served_pairs_per_s": round(served, 1),
        "served_ratio": round(served / local, 3),
        "clients": args.clients,
        "docs_per_request": args.docs_per_request,
        "max_length": reranker.max_length,
    }


def table(rows: list[dict], meta: dict) -> str:
    lines = [
        "| set | queries | first stage | nDCG@10 | + trained minilm cross-encoder | gain |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        first, second = 100 * r["ndcg_at_10"], 100 * r["reranked_ndcg_at_10"]
        stage = "dense (minilm)" if r["first_stage"] == "dense" else r["first_stage"]
        lines.append(f"| {r['set']} | {r['queries']} | {stage} | {first:.2f} | {second:.2f} | {second - first:+.2f} |")
    t = meta["throughput"]
    lines += [
        "",
        f"reranker: pairs/s in process {t['in_process_pairs_per_s']}, served {t['served_pairs_per_s']} "
        f"({t['served_ratio']}x; {t['clients']} clients, {t['docs_per_request']} documents a request, "
        f"max_length {t['max_length']}); reranked: top {meta['rerank_top_k']} of each first stage",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--negatives-pool", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-queries", type=int, default=300)
    parser.add_argument("--rerank-top-k", type=int, default=20)
    parser.add_argument("--throughput-pairs", type=int, default=512)
    parser.add_argument("--docs-per-request", type=int, default=16)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reranker", help="Skip training: load this saved reranker (e.g. a previous run's).")
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.reranker:  # a reranker this script trained before (its metrics.jsonl beside it)
        reranker = CrossEncoderReranker.from_pretrained(args.reranker)
        trained = {"loaded": args.reranker}
    else:
        reranker, trained = train(args)
    print(json.dumps({"trained": trained}), flush=True)
    rows = evaluate(args, reranker)
    meta = {
        "trained": trained,
        "rerank_top_k": args.rerank_top_k,
        "args": vars(args),
        "torch_threads": torch.get_num_threads(),
    }
    meta["throughput"] = throughput(args, reranker)
    (OUT / "result.json").write_text(json.dumps({"rows": rows, **meta}, indent=2) + "\n")
    (OUT / "table.md").write_text(table(rows, meta))
    print(table(rows, meta))


if __name__ == "__main__":
    main()
