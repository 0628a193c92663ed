"""How long the main job (``lmembed eval`` with no arguments, what ``bash run.sh`` runs after installing) takes
cold, on each backend, against the torch float32 main job in the same run.

Each arm runs ``lmembed --verbose eval -o DIR [--backend B] [--precision P]`` in a fresh process with an empty
``LMEMBED_HOME`` (so the embedding cache, the assembled GGUF model and the ONNX exports all start empty: a fresh
machine after ``pip install``), and reports its wall time, the ratio torch / arm, and every row's nDCG@10 next to
torch's. The arms run one after another on the same machine; ``--repeats`` alternates them. From the step log
(``--verbose``) it also splits each arm's time into model loading (GGUF conversion included), tokenisation,
backend preparation (ONNX export, int8 calibration and quality gate), the forward passes, and the rest (imports,
scoring, writing), so the table says where a cold run's minutes go.

    python bench/main_job_time.py                      # torch, onnx, int8 (about 20 minutes here)
    python bench/main_job_time.py --arms torch,int8

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


def split_phases(log: str, seconds: float) -> dict[str, float]:
    """Seconds per phase from a ``--verbose`` step log; ``other`` is the wall time the log does not account for."""
    phases = dict.fromkeys(PHASE_LINES, 0.0)
    for line in log.splitlines():
        for phase, pattern in PHASE_LINES.items():
            if found := pattern.search(line):
                phases[phase] += float(found.group(1))
    phases["other"] = seconds - sum(phases[p] for p in WALL_PHASES)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="torch,onnx,int8", help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or "torch" not in arms:
        parser.error(f"--arms: choose among {', '.join(ARMS)}, torch included (the baseline); got {args.arms!r}")
    if args.repeats < 1:
        parser.error(f"--repeats: must be at least 1, got {args.repeats}")
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    for _ in range(args.repeats):
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
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.json").write_text(json.dumps({"repeats": args.repeats, "arms": summary}, indent=2) + "\n")
    lines = [
        f"# Main job, cold (empty LMEMBED_HOME), best of {args.repeats}; baseline: torch float32 in the same run",
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
    lines += ["", "| model \\| strategy \\| task | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    for key in reference:
        cells = " | ".join(f"{summary[a]['ndcg_at_10'].get(key, float('nan')):.2f}" for a in arms)
        lines.append(f"| {key.replace('|', chr(92) + '|')} | {cells} |")
    (OUT / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
