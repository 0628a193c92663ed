"""Layer-wise probe of a decoder (or encoder): nDCG@10, MAP@10 and MRR@10 for every layer's pooled
embedding and a few fused layer sets, all from one forward pass per batch.

Writes ``sweep.json``, ``sweep.md`` and ``sweep.png`` (metric by layer, fused sets as markers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lmembed import terminal
from lmembed.atomic import atomic_savefig, atomic_write_text
from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.evaluation.runner import StrategyResult, evaluate_strategies, sweep_configs, write_all
from lmembed.evaluation.suites import resolve_task
from lmembed.evaluation.tasks.retrieval import RetrievalTask
from lmembed.protocols import ENCODE_BATCH_SIZE

METRICS = ("ndcg_at_10", "map_at_10", "mrr_at_10")
console = terminal.console(stderr=True)


def sweep_rows(results: Sequence[StrategyResult]) -> list[dict]:
    rows = []
    for item in results:
        layers = item.config.layers
        rows.append(
            {
                "task": item.result.task_name,
                "layer": layers[0] if len(layers) == 1 else list(layers),
                "label": item.config.label(),
                "final_norm": bool(item.config.final_norm),
                **{m: item.result.scores.get(m) for m in METRICS},
            }
        )
    return rows


def sweep_markdown(rows: Sequence[dict], model: str) -> str:
    lines = [
        f"# Layer sweep: {model}",
        "",
        "| task | layer(s) | final norm | nDCG@10 | MAP@10 | MRR@10 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        layer = r["layer"] if isinstance(r["layer"], int) else "+".join(map(str, r["layer"]))
        lines.append(
            f"| {r['task']} | {layer} | {'yes' if r['final_norm'] else 'no'} | {100 * r['ndcg_at_10']:.2f} "
            f"| {100 * r['map_at_10']:.2f} "
            f"| {100 * r['mrr_at_10']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot_sweep(rows: Sequence[dict], model: str, path: Path) -> Path:
    import matplotlib  # lazy: loads only when a chart is drawn (keeps the CLI's start fast)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy, after the backend is chosen

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for normed, dash in ((False, "-"), (True, "--")):
            picked = [r for r in rows if r["task"] == task and r["final_norm"] == normed]
            single = [r for r in picked if isinstance(r["layer"], int)]
            suffix = " (final norm)" if normed else ""
            for metric, marker in zip(METRICS, ("o", "s", "^"), strict=True):
                if single:
                    xs = [r["layer"] for r in single]
                    ax.plot(xs, [100 * r[metric] for r in single], dash + marker, label=metric + suffix, markersize=3)
            for r in (r for r in picked if not isinstance(r["layer"], int)):
                x = sum(r["layer"]) / len(r["layer"])
                ax.scatter([x], [100 * r["ndcg_at_10"]], marker="*", s=110, zorder=3)
                name = "+".join(map(str, r["layer"])) if len(r["layer"]) < 5 else "all"
                ax.annotate(
                    name + ("·n" if normed else ""),
                    (x, 100 * r["ndcg_at_10"]),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
        ax.set_title(f"{model} on {task}")
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("score (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
    return path


def retrieval_task(data: str) -> RetrievalTask:
    """The retrieval task named by ``data`` (a known name or a BEIR folder); the sweep scores retrieval only."""
    task = resolve_task(data)
    if not isinstance(task, RetrievalTask):
        raise ConfigError(f"{data}: a layer sweep needs a retrieval task, this is {task.task_type}")
    return task


def run_sweep(
    model: str,
    data: Sequence[str],
    *,
    pooling: str = "mean",
    attention: str | None = None,
    max_length: int | None = None,
    corpus_sample: int | None = None,
    output: Path = Path("results/sweep"),
    batch_size: int = ENCODE_BATCH_SIZE,
) -> list[dict]:
    from lmembed import Embedder  # lazy: torch loads only when a sweep runs

    tasks = [retrieval_task(d) for d in data]
    if corpus_sample:
        tasks = [t.subsample(max_docs=corpus_sample, policy="all-judged") for t in tasks]
    embedder = Embedder.from_pretrained(model, pooling=pooling, attention=attention, max_length=max_length)
    base: EmbeddingConfig = embedder.config
    configs = sweep_configs(base, embedder.backbone.num_layers, with_final_norm=embedder.backbone.is_decoder)
    console.print(f"sweep: {model}, {len(configs)} read-outs × {len(tasks)} task(s), one forward pass per batch")
    results = evaluate_strategies(embedder, tasks, configs, batch_size=batch_size)
    write_all(results, output / "results")
    rows = sweep_rows(results)
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / "sweep.json", json.dumps({"model": model, "rows": rows}, indent=2))
    markdown = sweep_markdown(rows, model)
    atomic_write_text(output / "sweep.md", markdown)
    plot_sweep(rows, model, output / "sweep.png")
    terminal.console().print(markdown)
    console.print(f"wrote {output}/sweep.json, sweep.md, sweep.png")
    return rows
