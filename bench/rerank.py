"""Issue 29 benchmark: dense (minilm), BM25 and hybrid first stages, each + a cross-encoder trained here, on
SciFact, NFCorpus and ArguAna (full corpora, ../shared/datasets/beir), nDCG@10 in one table; an LLM reranker
(zero-shot yes/no) row; the cross-encoder's pairs/s in process and served through ``POST /v1/rerank`` (as a ratio).

0. train (not here): ``lmembed train --recipe recipes/reranker.yaml`` (the trainer's reranker mode: minilm + a new
   head, listwise softmax over 1 positive + 7 negatives mined by minilm from the SciFact and NFCorpus *train*
   splits); pass its ``model`` folder as ``--reranker``;
1. first stages, on every test query of each set: dense (minilm, exact search), BM25 (bm25s), hybrid (RRF, k=60,
   equal weights; or ``--fusion``), scored as MTEB scores retrieval;
2. fusion check (``--tune-fusion``): RRF's k and min-max's dense weight on a grid, each set's setting chosen on
   its *dev* queries (SciFact: train split; NFCorpus: dev split; ArguAna has only test queries, so it takes the
   setting that did best over the other two sets' dev queries), then scored once on test;
3. second stage: each first stage's top ``--rerank-top-k`` reranked for ``--rerank-queries`` test queries of each
   set (a seeded sample where a set has more; the first stage is scored on the same queries beside it); pairs
   shared by several first stages are scored once;
4. LLM reranker (``--llm``, default smollm2-135m, Qwen3-Reranker's prompt, untrained): the dense top
   ``--llm-top-k`` of ``--llm-queries`` queries per set;
5. throughput: the cross-encoder's in-process ``predict`` of ``--throughput-pairs`` SciFact pairs vs the same pairs
   sent to a server on loopback by ``--clients`` concurrent clients, ``--docs-per-request`` documents a request.

    python bench/rerank.py --reranker runs/recipes/reranker/cross-encoder/model [--rerank-top-k 20]
    python bench/rerank.py --first-stage-only --tune-fusion     # no reranker: steps 1-2 (fusion_tuning.json)

Results: bench/results/rerank/result.json and table.md (not written with --first-stage-only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, shared_or_exit
from lmembed import Embedder
from lmembed.evaluation.metrics import evaluate_run
from lmembed.evaluation.retrieval_data import load_beir
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.evaluation.two_stage import Run, bm25_run, dense_run, rerank_run
from lmembed.lexical.fusion import minmax_fusion, reciprocal_rank_fusion
from lmembed.rerank import Reranker, load_reranker

SETS = {"scifact": "SciFact", "nfcorpus": "NFCorpus", "arguana": "ArguAna"}
DEV_SPLITS = {"scifact": "train", "nfcorpus": "dev"}  # ArguAna has test queries only
IGNORE_IDENTICAL = {"arguana"}
RRF_KS = (5, 10, 20, 30, 60, 100)
DENSE_WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
OUT = REPO / "bench" / "results" / "rerank"


class MemoReranker:
    """A reranker's scores, each (query, document) pair computed once across first stages; times the scoring."""

    def __init__(self, reranker: Reranker) -> None:
        self.reranker, self.memo = reranker, {}
        self.seconds, self.scored = 0.0, 0

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        todo = list(dict.fromkeys(p for p in pairs if p not in self.memo))
        if todo:
            start = time.perf_counter()
            self.memo.update(zip(todo, self.reranker.score_pairs(todo).tolist(), strict=True))
            self.seconds += time.perf_counter() - start
            self.scored += len(todo)
        return np.array([self.memo[p] for p in pairs], dtype=np.float32)

    def pairs_per_s(self) -> float:
        return round(self.scored / self.seconds, 2) if self.seconds else 0.0


def load_task(key: str, split: str = "test") -> RetrievalTask:
    path = shared_or_exit(f"beir/{key}")
    return RetrievalTask.from_path(path, name=SETS[key], split=split, ignore_identical_ids=key in IGNORE_IDENTICAL)


def fewer_queries(task: RetrievalTask, count: int | None, seed: int) -> RetrievalTask:
    """The task on ``count`` of its queries (a seeded sample; the whole corpus kept), or as it is."""
    data = task.data
    if count is None or len(data.query_ids) <= count:
        return task
    keep = sorted(random.Random(seed).sample(range(len(data.query_ids)), count))
    ids = [data.query_ids[i] for i in keep]
    data = dataclasses.replace(
        data, query_ids=ids, query_texts=[data.query_texts[i] for i in keep], qrels={q: data.qrels[q] for q in ids}
    )
    return dataclasses.replace(task, data=data, mteb_dataset_revision=None)


def ndcg(task: RetrievalTask, run: Run) -> float:
    scores = evaluate_run(task.data.qrels, run, task.k_values, ignore_identical_ids=task.ignore_identical_ids)
    return float(scores.scores["ndcg_at_10"])


def fused(task: RetrievalTask, dense: Run, lexical: Run, method: str, value: float) -> Run:
    """Hybrid run: RRF with ``k=value``, or min-max with dense weight ``value`` (BM25: ``1 - value``)."""
    out = {}
    for qid in task.data.query_ids:
        runs = [dense.get(qid, {}), lexical.get(qid, {})]
        if method == "rrf":
            scores = reciprocal_rank_fusion(runs, k=int(value))
        else:
            scores = minmax_fusion(runs, weights=[value, 1.0 - value])
        out[qid] = dict(sorted(scores.items(), key=lambda item: -item[1])[: task.top_k])
    return out


def first_stages(
    task: RetrievalTask, embedder: Embedder, fusion: tuple[str, float], stages: list[str]
) -> dict[str, Run]:
    """The runs of ``stages`` (dense is computed when dense or hybrid is asked for)."""
    lexical = bm25_run(task)
    if stages == ["bm25"]:
        return {"bm25": lexical}
    dense = dense_run(task, embedder)
    runs = {"dense": dense, "bm25": lexical, "hybrid": fused(task, dense, lexical, *fusion)}
    return {name: run for name, run in runs.items() if name in stages}


def grid() -> list[tuple[str, float]]:
    return [("rrf", k) for k in RRF_KS] + [("minmax", w) for w in DENSE_WEIGHTS]


def tune_fusion(keys: list[str], embedder: Embedder) -> dict[str, Any]:
    """nDCG@10 of every fusion setting on each set's dev queries; the setting chosen for each set (see step 2)."""
    dev: dict[str, dict[str, float]] = {}
    for key, split in DEV_SPLITS.items():
        task = load_task(key, split)
        dense, lexical = dense_run(task, embedder), bm25_run(task)
        dev[key] = {f"{m}:{v}": ndcg(task, fused(task, dense, lexical, m, v)) for m, v in grid()}
        dev[key]["dense"], dev[key]["bm25"] = ndcg(task, dense), ndcg(task, lexical)
        print(json.dumps({"dev": key, "split": split, "queries": len(task.data.query_ids), **dev[key]}), flush=True)
    settings = [f"{m}:{v}" for m, v in grid()]
    pooled = max(settings, key=lambda s: float(np.mean([dev[k][s] for k in dev])))
    chosen = {key: max(settings, key=lambda s: dev[key][s]) if key in dev else pooled for key in keys}
    return {"dev": dev, "chosen": chosen, "pooled_choice": pooled}


def parse_setting(text: str) -> tuple[str, float]:
    method, _, value = text.partition(":")
    return method, float(value)


def evaluate_set(args: argparse.Namespace, key: str, reranker: Reranker | None, tuning: dict | None) -> dict:
    """One set: every first stage on all test queries, and (with a reranker) its top ``--rerank-top-k`` reranked
    for ``--rerank-queries`` of them, the first stage scored on the same queries beside it."""
    embedder = Embedder.from_pretrained("minilm", device=args.device)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    task = load_task(key)
    runs = first_stages(task, embedder, parse_setting(args.fusion), args.first_stages)
    if tuning and "dense" in runs:
        runs["hybrid (dev-tuned)"] = fused(task, runs["dense"], runs["bm25"], *parse_setting(tuning["chosen"][key]))
    subset = fewer_queries(task, args.rerank_queries, args.seed)
    memo = MemoReranker(reranker) if reranker is not None else None
    rows = []
    for stage, run in runs.items():
        row: dict[str, Any] = {"first_stage": stage, "ndcg_at_10": ndcg(task, run)}
        if stage == "hybrid (dev-tuned)":
            row["fusion"] = tuning["chosen"][key]
        if memo is not None and stage in STAGE_NAMES:
            reranked = rerank_run(memo, subset, run, args.rerank_top_k)
            row.update(subset_ndcg_at_10=ndcg(subset, run), reranked_ndcg_at_10=ndcg(subset, reranked))
        rows.append(row)
        print(json.dumps({"set": task.name, **row}), flush=True)
    result = {
        "set": task.name,
        "key": key,
        "queries": len(task.data.query_ids),
        "documents": len(task.data.corpus_ids),
        "rows": rows,
        "fusion": args.fusion,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if memo is not None:
        result.update(
            label=args.label,
            reranker=args.reranker,
            reranker_kind=reranker.kind,
            max_length=reranker.max_length,
            rerank_top_k=args.rerank_top_k,
            reranked_queries=len(subset.data.query_ids),
            pairs_scored=memo.scored,
            pairs_per_s=memo.pairs_per_s(),
        )
    if tuning:
        result["fusion_tuning"] = tuning
    return result


def throughput(args: argparse.Namespace, reranker: Reranker) -> dict:
    data = load_beir(shared_or_exit("beir/scifact"), "test")
    rng = random.Random(args.seed)
    queries = [rng.choice(data.query_texts) for _ in range(args.throughput_pairs // args.docs_per_request)]
    requests = [(q, rng.sample(data.corpus_texts, args.docs_per_request)) for q in queries]
    pairs = [(q, d) for q, docs in requests for d in docs]
    start = time.perf_counter()
    reranker.score_pairs(pairs)
    local = len(pairs) / (time.perf_counter() - start)
    import httpx  # the serve extra: only this step needs it (a GPU image without FastAPI runs the rest)

    from lmembed.serving.app import create_app
    from lmembed.serving.server import BackgroundServer

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


STAGE_NAMES = {"dense": "dense (minilm)", "bm25": "BM25", "hybrid": "hybrid (RRF k=60)"}


def table(results: list[dict], throughput_record: dict | None) -> str:
    """One row per set and first stage: nDCG@10 on all test queries, then each reranker's run on its queries."""
    by_set: dict[str, list[dict]] = {}
    for result in results:
        by_set.setdefault(result["key"], []).append(result)
    lines = [
        "| set (docs) | first stage | nDCG@10, all test queries | reranker | reranked queries × top-k | "
        "first stage on them | reranked | gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in SETS:
        found = by_set.get(key, [])
        if not found:
            continue
        base = max(found, key=lambda r: len(r["rows"]))  # the run with every first stage
        for row in base["rows"]:
            stage = STAGE_NAMES.get(row["first_stage"], row["first_stage"])
            if "fusion" in row:
                stage += f" ({row['fusion']})"
            first = f"{100 * row['ndcg_at_10']:.2f} ({base['queries']} q)"
            head = f"| {base['set']} ({base['documents']:,}) | {stage} | {first}"
            reranked = [
                (r, x)
                for r in found
                if "label" in r
                for x in r["rows"]
                if x["first_stage"] == row["first_stage"] and "reranked_ndcg_at_10" in x
            ]
            if not reranked:
                lines.append(head + " | | | | | |")
            for r, x in reranked:
                sub, second = 100 * x["subset_ndcg_at_10"], 100 * x["reranked_ndcg_at_10"]
                lines.append(
                    f"{head} | {r['label']} | {r['reranked_queries']} × {r['rerank_top_k']} | {sub:.2f} | "
                    f"{second:.2f} | {second - sub:+.2f} |"
                )
    lines += [
        "",
        "| reranker | set | kind | max_length | pairs scored | pairs/s (in the run) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if "label" in r:
            lines.append(
                f"| {r['label']} ({r['reranker']}) | {r['set']} | {r['reranker_kind']} | {r['max_length']} | "
                f"{r['pairs_scored']} | {r['pairs_per_s']} |"
            )
    if throughput_record:
        t = throughput_record
        lines += [
            "",
            f"served: {t['label']} through POST /v1/rerank: {t['served_pairs_per_s']} pairs/s = {t['served_ratio']}x "
            f"in-process ({t['in_process_pairs_per_s']} pairs/s, the same {t['pairs']} SciFact pairs, same run; "
            f"{t['clients']} clients, {t['docs_per_request']} documents a request, max_length {t['max_length']})",
        ]
    return "\n".join(lines) + "\n"


def write_table() -> str:
    results = [json.loads(p.read_text()) for p in sorted((OUT / "sets").glob("*.json"))]
    throughput_file = OUT / "throughput.json"
    record = json.loads(throughput_file.read_text()) if throughput_file.is_file() else None
    text = table(results, record)
    (OUT / "table.md").write_text(text)
    (OUT / "result.json").write_text(json.dumps({"sets": results, "throughput": record}, indent=2) + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reranker", help="A reranker folder or name (the trained cross-encoder; smollm2-135m).")
    parser.add_argument("--reranker-kind", choices=["cross-encoder", "llm"], default=None)
    parser.add_argument("--label", default="ce", help="The reranker's name in the table and result file.")
    parser.add_argument("--first-stage-only", action="store_true", help="No reranker; nothing written.")
    parser.add_argument("--tune-fusion", action="store_true", help="Fusion settings chosen on dev queries.")
    parser.add_argument("--fusion", default="rrf:60", help="The hybrid row's fusion, METHOD:VALUE (rrf:60).")
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    parser.add_argument("--first-stages", nargs="+", choices=list(STAGE_NAMES), default=list(STAGE_NAMES))
    parser.add_argument("--rerank-top-k", type=int, default=20)
    parser.add_argument("--rerank-queries", type=int, default=None, help="Per set (default: all test queries).")
    parser.add_argument("--max-length", type=int, default=None, help="The reranker's max_length (its own).")
    parser.add_argument("--throughput", action="store_true", help="Also measure in-process vs served pairs/s.")
    parser.add_argument("--throughput-pairs", type=int, default=128)
    parser.add_argument("--docs-per-request", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--table", action="store_true", help="Only assemble table.md from the results written.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="Where minilm and the reranker run (cpu, cuda).")
    args = parser.parse_args()
    if args.table:
        print(write_table())
        return
    if not args.first_stage_only and not args.reranker:
        parser.error("--reranker is needed (train one: lmembed train --recipe recipes/reranker.yaml)")
    torch.manual_seed(args.seed)
    tuning = tune_fusion(args.sets, Embedder.from_pretrained("minilm")) if args.tune_fusion else None
    if tuning:
        print(json.dumps({"chosen": tuning["chosen"], "pooled_choice": tuning["pooled_choice"]}), flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "fusion_tuning.json").write_text(json.dumps(tuning, indent=2) + "\n")
    options = {"device": args.device} | ({"max_length": args.max_length} if args.max_length else {})
    reranker = None if args.first_stage_only else load_reranker(args.reranker, kind=args.reranker_kind, **options)
    (OUT / "sets").mkdir(parents=True, exist_ok=True)
    for key in args.sets:
        result = evaluate_set(args, key, reranker, tuning)
        if reranker is not None:
            result["args"] = vars(args)
            name = f"{key}-{args.label.replace(' ', '-')}.json"
            (OUT / "sets" / name).write_text(json.dumps(result, indent=2) + "\n")
    if reranker is not None and args.throughput:
        record = {"label": args.label, **throughput(args, reranker)}
        (OUT / "throughput.json").write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record), flush=True)
    if reranker is not None and reranker.kind == "cross-encoder":
        metrics = Path(args.reranker) / ".." / "metrics.jsonl"
        if metrics.is_file():  # the training run's loss curve, kept beside the results
            (OUT / "train_metrics.jsonl").write_text(metrics.read_text())
    if reranker is not None:
        print(write_table())


if __name__ == "__main__":
    main()
