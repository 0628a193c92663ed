"""How long the main job (``lmembed eval`` with no arguments, what ``bash run.sh`` runs after installing) takes
cold, on each backend, against the torch float32 main job in the same run.

Each arm runs ``lmembed --verbose eval -o DIR [--backend B] [--precision P]`` in a fresh process with an empty
``LMEMBED_HOME`` (so the embedding cache, the assembled GGUF model and the ONNX exports all start empty: a fresh
machine after ``pip install``), and reports its wall time, the ratio torch / arm, and every row's nDCG@10 next to
torch's. The arms run one after another on the same machine; ``--repeats`` alternates them. From the step log
(``--verbose``) it also splits each arm's time into model loading (GGUF conversion included), tokenisation,
backend preparation (ONNX export, int8 calibration and quality gate), the forward passes, and the rest (imports,
scoring, writing), so the table says where a cold run's minutes go.

It also puts a floor under the torch arm: the float32 arithmetic of its forward passes (the real tokens each model
encoded, from the step log, times that model's FLOPs per token: 2 per weight of its linear layers plus the
attention products at the mean text length) divided by this machine's float32 matrix-product peak, measured in the
same run with ``torch.mm``. No float32 backend can run the main job's forward passes faster than that floor; the
table adds the arm's measured load, tokenisation and other time to it.

    python bench/main_job_time.py                      # torch, onnx, int8 (about 20 minutes here)
    python bench/main_job_time.py --arms torch,int8
    python bench/main_job_time.py --from-results       # re-render from the last run's table.json and logs

Results: ``bench/results/main-job-time/table.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO
from lmembed.evaluation.results import load_results

OUT = REPO / "bench" / "results" / "main-job-time"
#: arm name -> extra ``lmembed eval`` options
ARMS = {
    "torch": [],
    "onnx": ["--backend", "onnx"],
    "int8": ["--precision", "int8"],
}


def run_arm(name: str, options: list[str]) -> dict:
    """One cold main job: wall seconds and nDCG@10 per (model, strategy, task)."""
    with tempfile.TemporaryDirectory(prefix=f"main-job-{name}-") as tmp:
        env = {**os.environ, "LMEMBED_HOME": str(Path(tmp) / "home")}
        env.pop("LMEMBED_CACHE", None)
        out = Path(tmp) / "results"
        command = [sys.executable, "-m", "lmembed.cli", "--verbose", "eval", "-o", str(out), *options]
        print(f"[{name}] {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            sys.exit(f"[{name}] failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        phases = split_phases(done.stderr, seconds)
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"log-{name}.txt").write_text(step_lines(done.stderr))
        rows = {
            f"{r.model_name} | {r.extra.get('strategy_label', '')} | {r.task_name}": 100 * r.main_score
            for r in load_results(out)
        }
    print(f"[{name}] {seconds:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items()), flush=True)
    return {"seconds": seconds, "ndcg_at_10": rows, "phases": phases}


#: step-log lines (``lmembed --verbose``) and the phase each one's seconds belong to
PHASE_LINES = {
    "load": re.compile(r"lmembed\.models\.loading: loaded .* in ([\d.]+) s"),
    "export": re.compile(r"exported .* to ONNX in ([\d.]+) s"),
    "quantise": re.compile(r"quantised .* to int8 in ([\d.]+) s"),
    "gate": re.compile(r"int8 quality gate measured in ([\d.]+) s"),
    "encode": re.compile(r"encoded \d+ texts .* in ([\d.]+) s \("),
    "tokenise": re.compile(r"; tokenised in ([\d.]+) s"),
    "prepare": re.compile(r"backend prepared in ([\d.]+) s"),
}
#: the phases that add up to the wall time (export, quantise and gate are parts of prepare)
WALL_PHASES = ("load", "tokenise", "prepare", "encode")


def step_lines(log: str) -> str:
    """The timed step-log lines of a run (progress bars and warnings left out)."""
    return "".join(line + "\n" for line in log.splitlines() if re.match(r"\d\d:\d\d:\d\d lmembed", line))


def split_phases(log: str, seconds: float) -> dict[str, float]:
    """Seconds per phase from a ``--verbose`` step log; ``other`` is the wall time the log does not account for."""
    phases = dict.fromkeys(PHASE_LINES, 0.0)
    for line in log.splitlines():
        for phase, pattern in PHASE_LINES.items():
            if found := pattern.search(line):
                phases[phase] += float(found.group(1))
    phases["other"] = seconds - sum(phases[p] for p in WALL_PHASES)
    return phases


#: "loaded NAME in" opens a model's steps; its encode lines follow
LOADED = re.compile(r"lmembed\.models\.loading: loaded (\S+) in")
ENCODED = re.compile(r"encoded (\d+) texts \((\d+) tokens")


def matmul_peak_gflops(seconds: float = 3.0) -> float:
    """The best float32 ``torch.mm`` rate over a few square sizes, in GFLOP/s (torch's default threads)."""
    import torch

    best = 0.0
    for size in (768, 1536, 2048):
        a, b = torch.randn(size, size), torch.randn(size, size)
        out = torch.empty(size, size)
        torch.mm(a, b, out=out)  # warm-up
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            torch.mm(a, b, out=out)
            count += 1
        best = max(best, 2 * size**3 * count / elapsed / 1e9)
    return best


def encodes_per_model(log: str) -> dict[str, dict[str, float]]:
    """Texts, real tokens and forward seconds each model encoded, from a ``--verbose`` step log."""
    totals: dict[str, dict[str, float]] = {}
    model = None
    for line in log.splitlines():
        if found := LOADED.search(line):
            model = found.group(1)
        elif (found := ENCODED.search(line)) and model is not None:
            seconds = PHASE_LINES["encode"].search(line)
            row = totals.setdefault(model, {"texts": 0, "tokens": 0, "seconds": 0.0})
            row["texts"] += int(found.group(1))
            row["tokens"] += int(found.group(2))
            row["seconds"] += float(seconds.group(1)) if seconds else 0.0
    return totals


def float32_floor(log: str, peak_gflops: float) -> dict[str, dict[str, float]]:
    """Per model: texts, tokens, GFLOP per token and the seconds its forward passes need at ``peak_gflops``."""
    from torch import nn

    from lmembed.models.loading import load_backbone

    floors = {}
    for model, done in encodes_per_model(log).items():
        texts, tokens = int(done["texts"]), int(done["tokens"])
        backbone = load_backbone(model)
        linear = sum(  # BERT's pooler reads one token per text, and lmembed's graphs leave it out
            m.weight.numel()
            for name, m in backbone.model.named_modules()
            if isinstance(m, nn.Linear) and "pooler" not in name
        )
        config = backbone.model.config
        mean_length = tokens / max(texts, 1)
        attention = 4 * config.num_hidden_layers * config.hidden_size * mean_length  # QK^T and AV, per token
        per_token = 2 * linear + attention
        floors[model] = {
            "texts": texts,
            "tokens": tokens,
            "gflop_per_token": per_token / 1e9,
            "seconds": tokens * per_token / (peak_gflops * 1e9),
            "measured_seconds": done["seconds"],
        }
    return floors


def run_arms(arms: list[str], repeats: int) -> dict[str, dict]:
    """Run every arm ``repeats`` times, alternating; per arm its best time, ratio to torch, scores and phases."""
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    for _ in range(repeats):
        for arm in arms:
            runs[arm].append(run_arm(arm, ARMS[arm]))
    base = min(r["seconds"] for r in runs["torch"])
    reference = runs["torch"][0]["ndcg_at_10"]
    summary = {}
    for arm, results in runs.items():
        seconds = min(r["seconds"] for r in results)
        scores = results[0]["ndcg_at_10"]
        summary[arm] = {
            "seconds": seconds,
            "all_seconds": [r["seconds"] for r in results],
            "speed_vs_torch": base / seconds,
            "ndcg_at_10": scores,
            "max_abs_diff_vs_torch": max(abs(scores[k] - reference[k]) for k in reference),
            "phases": min(results, key=lambda r: r["seconds"])["phases"],
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="torch,onnx,int8", help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="re-render the tables and the float32 floor from the last run's table.json and logs, running no arm",
    )
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or "torch" not in arms:
        parser.error(f"--arms: choose among {', '.join(ARMS)}, torch included (the baseline); got {args.arms!r}")
    if args.repeats < 1:
        parser.error(f"--repeats: must be at least 1, got {args.repeats}")
    if args.from_results:
        missing = [f for f in (OUT / "table.json", OUT / "log-torch.txt") if not f.exists()]
        if missing:
            parser.error(f"--from-results: no earlier run to re-render ({', '.join(map(str, missing))} absent)")
        saved = json.loads((OUT / "table.json").read_text())
        summary, repeats = saved["arms"], saved["repeats"]
    else:
        summary, repeats = run_arms(arms, args.repeats), args.repeats
    arms = list(summary)
    reference = summary["torch"]["ndcg_at_10"]
    peak = matmul_peak_gflops()
    floors = float32_floor((OUT / "log-torch.txt").read_text(), peak)
    torch_phases = summary["torch"]["phases"]
    overhead = sum(torch_phases[p] for p in ("load", "tokenise", "prepare", "other"))
    floor = {
        "matmul_peak_gflops": peak,
        "models": floors,
        "forward_seconds": sum(f["seconds"] for f in floors.values()),
        "torch_overhead_seconds": overhead,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.json").write_text(
        json.dumps({"repeats": repeats, "arms": summary, "float32_floor": floor}, indent=2) + "\n"
    )
    lines = [
        f"# Main job, cold (empty LMEMBED_HOME), best of {repeats}; baseline: torch float32 in the same run",
        "",
        "| arm | seconds | speed vs torch | max |nDCG@10 change| vs torch (points) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {arm} | {s['seconds']:.0f} | {s['speed_vs_torch']:.2f}x | {s['max_abs_diff_vs_torch']:.2f} |"
        for arm, s in summary.items()
    ]
    names = [*WALL_PHASES, "other", "export", "quantise", "gate"]
    lines += [
        "",
        "Where the time goes (seconds; export, quantise and gate are parts of prepare):",
        "",
        "| arm | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    lines += [f"| {arm} | " + " | ".join(f"{s['phases'][n]:.0f}" for n in names) + " |" for arm, s in summary.items()]
    lines += [
        "",
        f"Float32 floor (torch arm's tokens at this machine's measured matmul peak, {peak:.0f} GFLOP/s):",
        "",
        "| model | texts | tokens | GFLOP/token | forward floor (s) | torch arm encode (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {m} | {f['texts']} | {f['tokens']} | {f['gflop_per_token']:.4f} | {f['seconds']:.0f} | "
        f"{f['measured_seconds']:.0f} |"
        for m, f in floors.items()
    ]
    lines += [
        "",
        f"Forward floor {floor['forward_seconds']:.0f} s + the torch arm's load, tokenisation and other time "
        f"{overhead:.0f} s = {floor['forward_seconds'] + overhead:.0f} s: no float32 run of this main job on this "
        "machine can be faster.",
    ]
    lines += ["", "| model \\| strategy \\| task | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for key in reference:
        cells = " | ".join(f"{summary[a]['ndcg_at_10'].get(key, float('nan')):.2f}" for a in arms)
        lines.append(f"| {key.replace('|', chr(92) + '|')} | {cells} |")
    (OUT / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
