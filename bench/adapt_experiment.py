"""Issue 38's experiment, minilm arms: on each BEIR set, ``lmembed adapt`` with its defaults (corpus.jsonl only)
against the starting model and the title baseline, scored on that set's test queries with paired 95% intervals.

Per set (in order; every stage is kept in ``--work`` and skipped when done, so an interrupted run resumes):

1. ``adapt``: ``run_adapt("minilm", corpus)`` with the default recipe (``recipes/adapt/default.yaml``); its
   summary holds the time and peak memory.
2. ``title``: the issue's baseline: each document's title as a query for its body, in-batch negatives only, 150
   steps x 32, tau 0.05, lr 2e-5 (``lmembed train``'s Trainer), texts cut at the same training length as adapt's
   (``--train-max-length``, 128) so the two have the same budget.
3. test-split nDCG@10 per query of: ``start`` (minilm), ``title``, ``adapt`` (the saved, merged model), and two
   analysis arms, reported and never used to choose anything: ``adapt-unmerged`` (the kept step's weights as
   trained: the merge's other end) and ``title-merged`` (the title baseline merged with the start as adapt merges).

Figures are differences against the named baselines (start, title) measured in the same run, with paired bootstrap
intervals (``lmembed.experiments.stats.paired_bootstrap``, 10,000 resamples: percentile ones in the committed
results; studentized, bootstrap-t, since stop 59). Output:
``--out``/experiment.json and table.md; the log in ``--out``/experiment.log.

    python bench/adapt_experiment.py --sets scifact nfcorpus arguana --work runs/adapt-bench \
        --out bench/results/adapt

Choosing a recipe: ``--variant NAME=RECIPE`` (``--teacher NAME=TEACHER``) also adapts with that recipe file into
``--work/SET/NAME`` and scores it (arms NAME, NAME-unmerged, compared with start, title and adapt); ``--split`` scores
another qrels split (SciFact ``train``, NFCorpus ``dev``) into ``--out``/selection-SPLIT.json and .md, so recipes
are chosen on queries the test score never sees:

    python bench/adapt_experiment.py --sets scifact --split train --out bench/results/adapt/selection \
        --variant hybrid=bench/adapt_variants/hybrid.yaml --teacher hybrid=hybrid

ArguAna has no split but test, so its test queries are cut into two fixed halves by a hash of the query id
(``in_select_half``, fixed before any run used it): ``--split test-select`` scores the selection half (for choosing,
as SciFact train and NFCorpus dev), ``--split test-report`` the other half (the report). Per-query nDCG does not
depend on the other queries, so an arm already scored on the whole test split is sliced, not encoded again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.paths import shared_datasets_dir

log = logging.getLogger("adapt_experiment")
MODEL = "minilm"


def adapt_stage(
    corpus: Path, work: Path, variant: str = "adapt", recipe: Path | None = None, teacher: str | None = None
) -> dict[str, Any]:
    from lmembed.training.adapt_run import run_adapt

    out = work / variant
    summary = out / "adapt_summary.json"
    if summary.exists():
        return json.loads(summary.read_text())
    started = time.perf_counter()
    result = run_adapt(
        MODEL, corpus, out, recipe=recipe, teacher=teacher, device="cpu", progress=False, resume=out.exists()
    )
    log.info("adapt %s: %.0f s", corpus.parent.name, time.perf_counter() - started)
    return result.summary


def title_stage(corpus: Path, work: Path, max_length: int) -> dict[str, Any]:
    from lmembed.embedder import Embedder
    from lmembed.training.adapt import peak_memory_mb, read_adapt_corpus
    from lmembed.training.rows import TrainDataset, parse_row
    from lmembed.training.train_config import TrainConfig
    from lmembed.training.trainer import Trainer

    out = work / "title"
    done = out / "title_summary.json"
    if done.exists():
        return json.loads(done.read_text())
    docs = read_adapt_corpus(corpus)
    rows = [{"query": d.title, "positive": d.text} for d in docs if d.title.strip() and d.text.strip()]
    started = time.perf_counter()
    embedder = Embedder.from_pretrained(MODEL, device="cpu", show_progress=False)
    config = TrainConfig(
        model=MODEL,
        output=str(out),
        steps=150,
        batch_size=32,
        lr=2e-5,
        warmup_steps=15,
        temperature=0.05,
        num_negatives=0,
        loss="infonce",
        save_every=150,
        seed=42,
        device="cpu",
        lora=False,
        resume=False,
        progress=False,
    )
    dataset = TrainDataset("titles", [parse_row(r) for r in rows], sorted({d.full for d in docs}))
    trainer = Trainer(config, model=embedder, datasets=[dataset])
    trainer.model.train_max_length = max_length
    result = trainer.train()
    summary = {
        "rows": len(rows),
        "seconds": round(time.perf_counter() - started, 2),
        "peak_memory_mb": peak_memory_mb(),
        "model_dir": str(result.model_dir),
        "train_max_length": max_length,
    }
    atomic_write_json(done, summary)
    return summary


def _unmerged(model_dir: Path, best_state: Path) -> Any:
    """The adapted model with the kept step's trained weights (merge 1)."""
    from safetensors.torch import load_file

    from lmembed.embedder import Embedder
    from lmembed.training.trainable import TrainableEmbedder

    embedder = Embedder.from_pretrained(str(model_dir), device="cpu", show_progress=False, cache=False)
    trainable = TrainableEmbedder(embedder)
    trainable.load_trainable_state_dict(load_file(str(best_state)))
    trainable.eval()
    return embedder


def _last_step(model_dir: Path, weight: float) -> Any:
    """The run's last checkpoint (``checkpoints/step-*/trainable.safetensors``), merged with the start by ``weight``
    (1: as trained): the training's effect where the held-back selection kept an earlier step."""
    from safetensors.torch import load_file

    from lmembed.embedder import Embedder
    from lmembed.training.trainable import TrainableEmbedder

    last = sorted((model_dir.parent / "checkpoints").glob("step-*"))[-1]
    embedder = Embedder.from_pretrained(str(model_dir), device="cpu", show_progress=False, cache=False)
    trainable = TrainableEmbedder(embedder)
    trainable.load_trainable_state_dict(load_file(str(last / "trainable.safetensors")))
    trainable.eval()
    return _merge_with_start(embedder, weight) if weight < 1 else embedder


def _merged(model_dir: Path, weight: float = 0.5) -> Any:
    """``model_dir``'s weights merged with the starting model's as adapt merges (start + weight x (trained -
    start)): the title baseline given adapt's last step, to tell the merge's share from the rest."""
    from lmembed.embedder import Embedder

    trained = Embedder.from_pretrained(str(model_dir), device="cpu", show_progress=False, cache=False)
    return _merge_with_start(trained, weight)


def _merge_with_start(embedder: Any, weight: float) -> Any:
    """``embedder`` with its weights set to start + weight x (its own - start), as adapt merges."""
    from lmembed.embedder import Embedder
    from lmembed.training.adapt_run import merge_states

    start = Embedder.from_pretrained(MODEL, device="cpu", show_progress=False, cache=False)
    model = embedder.backbone.model
    model.load_state_dict(merge_states(start.backbone.model.state_dict(), model.state_dict(), weight, lora=False))
    embedder.backbone.invalidate_fingerprint()
    return embedder


def _with_terms(model: str, corpus: Path) -> Any:
    """``model`` with the default recipe's term channel fitted on ``corpus`` (what adapt's last stage adds): an
    arm that tells the channel's share from the training's."""
    from lmembed.embedder import Embedder
    from lmembed.training.adapt import read_adapt_corpus
    from lmembed.training.adapt_recipe import AdaptRecipe

    terms = AdaptRecipe().terms
    embedder = Embedder.from_pretrained(model, device="cpu", show_progress=False)
    return embedder.fit_terms([d.full for d in read_adapt_corpus(corpus)], dims=terms.dims, weight=terms.weight)


HALVES = ("select", "report")


def in_select_half(query_id: str) -> bool:
    """Whether a test query belongs to the selection half (``--split test-select``); the rest is the report half."""
    return hashlib.sha256(f"lmembed-adapt-select:{query_id}".encode()).digest()[0] % 2 == 0


def _keep_half(task: Any, half: str) -> None:
    if half not in HALVES:
        raise SystemExit(f"--split test-{half}: the halves are {', '.join('test-' + h for h in HALVES)}")
    data = task.data
    keep = [
        (i, t)
        for i, t in zip(data.query_ids, data.query_texts, strict=True)
        if in_select_half(i) == (half == HALVES[0])
    ]
    ids = {i for i, _ in keep}
    task.data = dataclasses.replace(
        data,
        query_ids=[i for i, _ in keep],
        query_texts=[t for _, t in keep],
        qrels={q: r for q, r in data.qrels.items() if q in ids},
    )


def _scores_path(work: Path, split: str) -> Path:
    """Where a set's per-query scores of ``split`` are kept (and read back: scoring resumes arm by arm)."""
    return work / ("scores.json" if split == "test" else f"scores-{split}.json")


def score_stage(
    name: str, folder: Path, arms: dict[str, Any], work: Path, split: str = "test"
) -> dict[str, dict[str, float]]:
    import torch

    from lmembed.embedder import Embedder
    from lmembed.training.dev_eval import load_eval_tasks

    done = _scores_path(work, split)
    scores: dict[str, dict[str, float]] = json.loads(done.read_text()) if done.exists() else {}
    base, _, half = split.partition("-")
    task = load_eval_tasks([str(folder)], base)[0]  # the set's MTEB settings (ArguAna: self-hits dropped)
    whole: dict[str, dict[str, float]] = {}
    if half:
        _keep_half(task, half)
        whole_path = _scores_path(work, base)
        whole = json.loads(whole_path.read_text()) if whole_path.exists() else {}
    for arm, model in arms.items():
        if arm in scores:
            continue
        if arm in whole:  # per-query scores of the whole split, sliced to the half
            scores[arm] = {q: whole[arm][q] for q in task.data.query_ids}
            log.info("%s %s: sliced from the whole %s split's scores", name, arm, base)
            atomic_write_json(done, scores)
            continue
        started = time.perf_counter()
        embedder = model() if callable(model) else Embedder.from_pretrained(model, device="cpu", show_progress=False)
        with torch.no_grad():
            result = task.evaluate(embedder, batch_size=32)
        scores[arm] = dict(zip(result.items.ids, result.items.values, strict=True))
        log.info("%s %s: nDCG@10 %.4f (%.0f s)", name, arm, result.scores["ndcg_at_10"], time.perf_counter() - started)
        atomic_write_json(done, scores)
    return scores


def compare(scores: dict[str, dict[str, float]], a: str, b: str) -> dict[str, float]:
    from lmembed.experiments.stats import paired_bootstrap

    ids = sorted(scores[b])
    x, y = [scores[a][q] for q in ids], [scores[b][q] for q in ids]
    interval = paired_bootstrap(x, y, resamples=10_000, seed=0)
    return {
        "a": a,
        "b": b,
        "a_mean": 100 * sum(x) / len(x),
        "b_mean": 100 * sum(y) / len(y),
        "difference": 100 * interval.difference,
        "low": 100 * interval.low,
        "high": 100 * interval.high,
        "queries": len(ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["scifact", "nfcorpus", "arguana"])
    parser.add_argument("--work", type=Path, default=Path("runs/adapt-bench"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/adapt"))
    parser.add_argument("--train-max-length", type=int, default=128)
    parser.add_argument("--skip-title", nargs="*", default=[], help="sets whose title baseline is not run")
    parser.add_argument("--arms", nargs="*", default=None, help="score only these arms (default: all)")
    parser.add_argument(
        "--split",
        default="test",
        help="qrels split scored: test for the report; train (SciFact), dev (NFCorpus) or test-select (ArguAna's "
        "selection half) to choose between variants; test-report: the other half",
    )
    parser.add_argument(
        "--variant",
        nargs="*",
        default=[],
        metavar="NAME=RECIPE",
        help="also adapt with this recipe file into --work/SET/NAME and score it (arms NAME, NAME-unmerged)",
    )
    parser.add_argument(
        "--teacher", nargs="*", default=[], metavar="NAME=TEACHER", help="a variant's --teacher (e.g. hybrid)"
    )
    parser.add_argument(
        "--terms-arms",
        nargs="*",
        default=[],
        metavar="ARM",
        help="also score ARM+terms: that arm's model with the default term channel fitted on the set's corpus",
    )
    parser.add_argument(
        "--stage",
        choices=["adapt", "title", "all"],
        default="all",
        help="adapt or title: only that stage for each set (one process per stage keeps peak memory its own)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        handlers=[logging.StreamHandler(), logging.FileHandler(args.out / "experiment.log")],
    )
    beir = shared_datasets_dir() / "beir"
    variants = dict(v.split("=", 1) for v in args.variant)
    teachers = dict(v.split("=", 1) for v in args.teacher)
    path = args.out / ("experiment.json" if args.split == "test" else f"selection-{args.split}.json")
    report: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"model": MODEL, "sets": {}}
    for name in args.sets:
        folder = beir / name
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        if args.stage == "title":
            title_stage(folder / "corpus.jsonl", work, args.train_max_length)
            continue
        adapt = adapt_stage(folder / "corpus.jsonl", work)
        runs = {"adapt": adapt}
        for variant, recipe in variants.items():
            runs[variant] = adapt_stage(folder / "corpus.jsonl", work, variant, Path(recipe), teachers.get(variant))
        if args.stage == "adapt":
            continue
        arms: dict[str, Any] = {"start": MODEL}
        for variant, run in runs.items():
            arms[variant] = run["model_dir"]
            best = Path(run["model_dir"]).parent / "best_state.safetensors"
            if run["selection"]["best_step"] > 0 and run["recipe"]["training"]["merge"] < 1:
                arms[f"{variant}-unmerged"] = lambda d=run["model_dir"], b=best: _unmerged(Path(d), b)
            if run["selection"]["best_step"] < run["selection"]["last_step"]:  # the training's own effect
                merge = run["recipe"]["training"]["merge"]
                arms[f"{variant}-last"] = lambda d=run["model_dir"], w=merge: _last_step(Path(d), w)
                arms[f"{variant}-last-unmerged"] = lambda d=run["model_dir"]: _last_step(Path(d), 1.0)
        title = None
        if name not in args.skip_title:
            title = title_stage(folder / "corpus.jsonl", work, args.train_max_length)
            arms["title"] = title["model_dir"]
            arms["title-merged"] = lambda d=title["model_dir"]: _merged(Path(d))
        for arm in args.terms_arms:
            model = arms[arm]
            if callable(model):
                raise SystemExit(f"--terms-arms {arm}: only an arm saved as a folder (or the start) can take a channel")
            arms[f"{arm}+terms"] = lambda m=str(model), c=folder / "corpus.jsonl": _with_terms(m, c)
        if args.arms:
            arms = {k: v for k, v in arms.items() if k in args.arms}
        scores = score_stage(name, folder, arms, work, args.split)
        pairs = [(f"{v}{x}", b) for v in variants for x in ("", "-last") for b in ("start", "title", "adapt")] + [
            ("adapt", "start"),
            ("title", "start"),
            ("adapt", "title"),
            ("adapt-unmerged", "start"),
            ("adapt", "adapt-unmerged"),
            ("title-merged", "start"),
            ("title-merged", "title"),
        ]
        pairs += [(f"{a}+terms", b) for a in args.terms_arms for b in dict.fromkeys((a, "start", "title"))]
        pairs += [("adapt", f"{a}+terms") for a in args.terms_arms]
        report["sets"][name] = {
            "split": args.split,
            **{
                v: {k: r[k] for k in ("seconds", "peak_memory_mb", "timings", "report", "selection")}
                for v, r in runs.items()
            },
            "title": title,
            "comparisons": [compare(scores, a, b) for a, b in pairs if a in scores and b in scores],
        }
        atomic_write_json(path, report)
    if args.stage != "all":
        return
    lines = [
        "| set | comparison | a | b | a − b [95% CI] | queries |",
        "|---|---|---|---|---|---|",
    ]
    for name, data in report["sets"].items():
        for c in data["comparisons"]:
            lines.append(
                f"| {name} | {c['a']} vs {c['b']} | {c['a_mean']:.2f} | {c['b_mean']:.2f} | "
                f"{c['difference']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] | {c['queries']} |"
            )
    lines += ["", "| set | run | time (s) | peak memory (MB) |", "|---|---|---|---|"]
    for name, data in report["sets"].items():
        for run in ("adapt", *variants):
            if run in data:
                lines.append(f"| {name} | {run} | {data[run]['seconds']:.0f} | {data[run]['peak_memory_mb']:.0f} |")
        if data.get("title"):
            lines.append(f"| {name} | title | {data['title']['seconds']:.0f} | {data['title']['peak_memory_mb']:.0f} |")
    table = "table.md" if args.split == "test" else f"selection-{args.split}.md"
    atomic_write_text(args.out / table, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
