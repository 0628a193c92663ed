"""Issue 11 benchmark: the index kinds measured, not assumed; flat search against `lmembed eval`.

1. exactness (full SciFact, NFCorpus, ArguAna, `minilm`): every retrieval metric `lmembed eval` reports,
   recomputed from a flat `Index` built over the same corpus (its vectors come through the embedding
   cache, as a user's would) and searched with the eval's queries; the largest difference is printed.
2. real corpus (ArguAna, the largest we hold: 8,674 documents, 1,406 queries, `minilm`, 384 dims): per
   kind, recall@10 against flat, queries/s as a ratio to flat's, nDCG@10 as a ratio to flat's, build time
   and memory.
3. synthetic (``--n`` vectors x 384, default 200,000; the issue's figure is ``--n 1000000``): clustered
   vectors (1,000 centres in a 64-dim latent space, projected to 384 dims, plus noise; real embeddings are
   similarly low-rank and clustered, unlike i.i.d. Gaussians), 1,000 held-out queries from the same
   distribution; recall@10 and queries/s per kind, as ratios to flat.

Queries/s: all queries in one search call, FAISS's default threads (this machine: 2 shared cores).

    python bench/index_recall.py [--n 200000] [--skip-exactness] [--skip-real] [--skip-synthetic]

Results: bench/results/index_recall/result.json and table.txt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from _common import REPO, shared_or_exit

OUT = REPO / "bench" / "results" / "index_recall"
DATASETS = {"scifact": False, "nfcorpus": False, "arguana": True}  # name: ignore_identical_ids (MTEB's setting)
K = 10


def kinds_for(n: int, hnsw_m: int | None = None, ef_construction: int | None = None) -> dict[str, dict]:
    """The configurations measured: each kind at its defaults, plus hnsw at a wider search beam.

    ``hnsw_m``/``ef_construction`` override the graph's build parameters (a 1M-vector graph at the defaults
    takes hours to build on 2 cores; a sparser one builds in minutes)."""
    graph = {"hnsw_m": hnsw_m or 32, "ef_construction": ef_construction or (100 if n > 300_000 else 200)}
    return {
        "flat": {"kind": "flat"},
        "hnsw (ef_search 64)": {"kind": "hnsw", **graph, "ef_search": 64},
        "hnsw (ef_search 128)": {"kind": "hnsw", **graph, "ef_search": 128},
        "ivf-pq (nprobe 16)": {"kind": "ivf-pq", "nprobe": 16},
        "binary + float rescoring": {"kind": "binary", "rescore": "float", "rescore_multiplier": 4},
        "binary + int8 rescoring": {"kind": "binary", "rescore": "int8", "rescore_multiplier": 4},
        "binary, no rescoring": {"kind": "binary", "rescore": "none"},
    }


def measure(name: str, spec: dict, docs: np.ndarray, queries: np.ndarray, built: dict) -> dict:
    """Build one kind (re-using an hnsw graph built with the same build parameters), search every query."""
    from lmembed.index import kinds

    params = kinds.IndexParams(**spec)
    build_key = json.dumps({k: v for k, v in spec.items() if k not in kinds.SEARCH_PARAMS}, sort_keys=True)
    if build_key in built:
        index, build_s = built[build_key]
        index.params = index.params.with_search(**{k: spec[k] for k in kinds.SEARCH_PARAMS if k in spec})
    else:
        start = time.perf_counter()
        index = kinds.create(params, docs.shape[1])
        index.add(docs)
        build_s = time.perf_counter() - start
        built[build_key] = (index, build_s)
    index.search(queries[:10], K)  # warm-up
    runs = []
    for _ in range(2):
        start = time.perf_counter()
        _, rows = index.search(queries, K)
        runs.append(time.perf_counter() - start)
    seconds = min(runs)
    print(f"  {name:28s} built in {build_s:7.1f} s, {len(queries) / seconds:9.0f} queries/s", flush=True)
    memory, on_disk = index.memory_bytes(), 0
    if params.kind == "binary":  # an opened binary index memory-maps its rescoring vectors: only the bits stay
        on_disk = np.asarray(index.rescore_vectors).nbytes
        memory = index.ntotal * index.dim // 8
    return {
        "name": name,
        "params": index.params.to_dict(),
        "build_s": build_s,
        "search_s": seconds,
        "qps": len(queries) / seconds,
        "memory_mb": memory / 2**20,
        "rescore_on_disk_mb": on_disk / 2**20,
        "rows": rows,
    }


def compare(results: list[dict]) -> None:
    """recall@10 and the queries/s ratio of every kind against flat (the first result)."""
    flat = results[0]
    for r in results:
        overlap = [len(set(a) & set(b)) / K for a, b in zip(r["rows"], flat["rows"], strict=True)]
        r["recall_at_10"] = float(np.mean(overlap))
        r["qps_ratio"] = r["qps"] / flat["qps"]


def exactness(emb) -> list[dict]:
    from lmembed.evaluation.metrics import evaluate_run
    from lmembed.evaluation.tasks.retrieval import RetrievalTask
    from lmembed.index import Index

    rows = []
    for name, ignore in DATASETS.items():
        start = time.perf_counter()
        task = RetrievalTask.from_path(shared_or_exit(f"beir/{name}"), ignore_identical_ids=ignore)
        expected = task.evaluate(emb).scores
        data = task.data
        index = Index.build(emb, list(zip(data.corpus_ids, data.corpus_texts, strict=True)))
        hits = index.search_batch(data.query_texts, k=task.top_k)
        run = {q: {h.id: h.score for h in found} for q, found in zip(data.query_ids, hits, strict=True)}
        got = evaluate_run(data.qrels, run, task.k_values, ignore_identical_ids=ignore).scores
        # nAUC is NaN on both sides where every query has the same metric value: that is agreement
        diffs = {
            key: 0.0 if np.isnan(value) and np.isnan(got[key]) else abs(got[key] - value)
            for key, value in expected.items()
        }
        worst = max(diffs, key=diffs.get)
        rows.append(
            {
                "dataset": name,
                "documents": len(data.corpus_ids),
                "queries": len(data.query_ids),
                "eval_ndcg_at_10": expected["ndcg_at_10"],
                "index_ndcg_at_10": got["ndcg_at_10"],
                "metrics_compared": len(diffs),
                "max_abs_diff": diffs[worst],
                "worst_metric": worst,
                "seconds": time.perf_counter() - start,
            }
        )
        print(
            f"  {name:9s} nDCG@10 eval {expected['ndcg_at_10']:.5f} index {got['ndcg_at_10']:.5f}; "
            f"largest difference over {len(diffs)} metrics: {diffs[worst]:.1e} ({worst})",
            flush=True,
        )
    return rows


def real_corpus(emb) -> dict:
    from lmembed.evaluation.metrics import evaluate_run
    from lmembed.evaluation.tasks.retrieval import RetrievalTask

    task = RetrievalTask.from_path(shared_or_exit("beir/arguana"), ignore_identical_ids=True)
    data = task.data
    docs = emb.encode_corpus(data.corpus_texts)  # from the cache after the exactness step
    queries = emb.encode_queries(data.query_texts)
    print(f"real: ArguAna, {len(docs)} documents x {docs.shape[1]}, {len(queries)} queries", flush=True)
    built: dict = {}
    results = [measure(name, spec, docs, queries, built) for name, spec in kinds_for(len(docs)).items()]
    compare(results)
    for r in results:
        run = {
            q: {data.corpus_ids[j]: float(K - rank) for rank, j in enumerate(row) if j >= 0}
            for q, row in zip(data.query_ids, r.pop("rows"), strict=True)
        }
        r["ndcg_at_10"] = evaluate_run(data.qrels, run, (10,), ignore_identical_ids=True).scores["ndcg_at_10"]
    for r in results:
        r["ndcg_ratio"] = r["ndcg_at_10"] / results[0]["ndcg_at_10"]
    return {
        "corpus": "arguana",
        "documents": len(docs),
        "queries": len(queries),
        "dim": docs.shape[1],
        "kinds": results,
    }


def synthetic_vectors(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    latent, clusters = 64, 1000
    centres = rng.standard_normal((clusters, latent)).astype(np.float32)
    projection = (rng.standard_normal((latent, dim)) / np.sqrt(latent)).astype(np.float32)

    def sample(m: int) -> np.ndarray:
        z = centres[rng.integers(0, clusters, m)] + 0.5 * rng.standard_normal((m, latent)).astype(np.float32)
        x = z @ projection + 0.1 * rng.standard_normal((m, dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    docs = np.concatenate([sample(min(100_000, n - i)) for i in range(0, n, 100_000)])
    return docs, sample(1000)


def synthetic(n: int, only: list[str] | None, hnsw_m: int | None, ef_construction: int | None) -> dict:
    docs, queries = synthetic_vectors(n, 384, seed=0)
    print(f"synthetic: {n} x 384, {len(queries)} queries", flush=True)
    built: dict = {}
    chosen = {
        name: spec
        for name, spec in kinds_for(n, hnsw_m, ef_construction).items()
        if name == "flat" or not only or spec["kind"] in only
    }
    results = [measure(name, spec, docs, queries, built) for name, spec in chosen.items()]
    compare(results)
    for r in results:
        del r["rows"]
    return {"documents": n, "queries": len(queries), "dim": 384, "kinds": results}


def table(result: dict) -> str:
    lines = [f"index_recall ({time.strftime('%Y-%m-%d %H:%M')}, {result['machine']})", ""]
    if result.get("exactness"):
        lines.append("flat Index vs `lmembed eval` (minilm, full test sets, every metric eval reports)")
        lines.append(
            f"{'dataset':10s} {'docs':>6s} {'queries':>7s} {'eval nDCG@10':>12s} {'index nDCG@10':>13s} "
            f"{'max |diff|':>10s}"
        )
        for r in result["exactness"]:
            lines.append(
                f"{r['dataset']:10s} {r['documents']:6d} {r['queries']:7d} {r['eval_ndcg_at_10']:12.5f} "
                f"{r['index_ndcg_at_10']:13.5f} {r['max_abs_diff']:10.1e}"
            )
        lines.append("")
    sizes = sorted(int(key.split("_")[1]) for key in result if key.startswith("synthetic_"))
    parts = [("real", "ArguAna, minilm")] + [(f"synthetic_{n}", "synthetic clustered") for n in sizes]
    for key, title in parts:
        part = result.get(key)
        if not part:
            continue
        graph = next((r["params"] for r in part["kinds"] if r.get("params", {}).get("kind") == "hnsw"), None)
        graph_text = f"; hnsw M={graph['hnsw_m']}, ef_construction={graph['ef_construction']}" if graph else ""
        lines.append(
            f"{title}: {part['documents']} x {part['dim']}, {part['queries']} queries; ratios are to flat{graph_text}"
        )
        header = f"{'kind':28s} {'recall@10':>9s} {'queries/s':>10s} {'x flat':>7s} {'build s':>8s} {'MiB':>8s}"
        lines.append(header + (f" {'nDCG@10':>8s} {'x flat':>7s}" if key == "real" else ""))
        for r in part["kinds"]:
            line = (
                f"{r['name']:28s} {r['recall_at_10']:9.3f} {r['qps']:10.0f} {r['qps_ratio']:7.1f} "
                f"{r['build_s']:8.1f} {r['memory_mb']:8.1f}"
            )
            if key == "real":
                line += f" {r['ndcg_at_10']:8.4f} {r['ndcg_ratio']:7.3f}"
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000, help="synthetic vectors (the issue's figure: 1000000)")
    parser.add_argument("--skip-exactness", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--kinds", help="synthetic part: only these kinds besides flat, comma-separated (e.g. hnsw)")
    parser.add_argument("--hnsw-m", type=int, help="synthetic part: hnsw links per node (default 32)")
    parser.add_argument("--ef-construction", type=int, help="synthetic part: hnsw build beam (default 200/100)")
    args = parser.parse_args()
    from lmembed.index.kinds import KINDS

    only = args.kinds.split(",") if args.kinds else None
    if only and not set(only) <= set(KINDS):  # refused before the slow sections run
        parser.error(f"--kinds: unknown kind(s) {sorted(set(only) - set(KINDS))}; choose from {', '.join(KINDS)}")
    import faiss

    result: dict = {"machine": f"{faiss.omp_get_max_threads()} FAISS threads"}
    if not (args.skip_exactness and args.skip_real):
        from lmembed import Embedder

        emb = Embedder.from_pretrained("minilm", show_progress=True)  # cached: eval and index share vectors
        if not args.skip_exactness:
            print("exactness: flat Index vs lmembed eval", flush=True)
            result["exactness"] = exactness(emb)
        if not args.skip_real:
            result["real"] = real_corpus(emb)
    if not args.skip_synthetic:
        result[f"synthetic_{args.n}"] = synthetic(args.n, only, args.hnsw_m, args.ef_construction)
    # sections run separately (the synthetic one takes long) accumulate in one result file
    OUT.mkdir(parents=True, exist_ok=True)
    earlier = json.loads((OUT / "result.json").read_text()) if (OUT / "result.json").exists() else {}
    if "synthetic" in earlier:  # results from before sizes were kept apart
        old = earlier.pop("synthetic")
        earlier[f"synthetic_{old['documents']}"] = old
    commands = [*earlier.get("commands", []), "python bench/index_recall.py " + " ".join(sys.argv[1:])]
    result = {**earlier, **result, "commands": commands}
    (OUT / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    text = table(result)
    (OUT / "table.txt").write_text(text + "\n")
    print()
    print(text)
    print(f"saved {OUT / 'result.json'} and {OUT / 'table.txt'}")


if __name__ == "__main__":
    main()
