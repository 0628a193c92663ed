"""Re-judge the committed experiment summaries as ``lmembed experiment`` now judges them: p-values adjusted by
Holm's method over each experiment's comparisons (:func:`lmembed.experiments.stats.holm`), from the p-values,
intervals and differences each ``summary.json`` holds. The baseline is each summary's own verdicts (each p judged
alone), read in the same run. Also lists the multi-seed Spearman/AP comparisons whose difference is not the
difference of the printed means (judged on averaged ranks before the fix of stop 58).

    python bench/experiments_rejudge.py --out bench/results/experiments-rejudge
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from lmembed.atomic import atomic_write_json, atomic_write_text
from lmembed.experiments.stats import NOT_DISTINGUISHABLE, holm, verdict

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summaries", type=Path, default=REPO / "bench/results/experiments")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/experiments-rejudge")
    args = parser.parse_args()
    rows, changed, rank_gaps = [], [], []
    for path in sorted(args.summaries.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        judged = [c for c in summary["comparisons"] if isinstance(c.get("p_value"), float) and c["low"] is not None]
        adjusted = holm([c["p_value"] for c in judged])
        before = sum(c["verdict"] != NOT_DISTINGUISHABLE for c in judged)
        after = 0
        for c, p in zip(judged, adjusted, strict=True):
            now = verdict(c["difference"], c["low"], c["high"], p, c["expected"])
            after += now != NOT_DISTINGUISHABLE
            if now != c["verdict"]:
                changed.append(
                    {
                        "experiment": path.parent.name,
                        "a": c["a"],
                        "b": c["b"],
                        "task": c["task"],
                        "p": c["p_value"],
                        "p_holm": p,
                        "m": len(judged),
                        "was": c["verdict"],
                        "now": now,
                    }
                )
            several = max(c.get("seeds") or [1]) > 1
            if several and c.get("statistic") in ("spearman", "ap") and not c.get("minus"):
                means = c["a_mean"] - c["b_mean"]  # the scores table's means, on the difference's scale
                if not math.isclose(c["difference"], means, abs_tol=5e-4):
                    rank_gaps.append(
                        {
                            "experiment": path.parent.name,
                            "a": c["a"],
                            "b": c["b"],
                            "task": c["task"],
                            "difference": round(100 * c["difference"], 2),
                            "of_means": round(100 * means, 2),
                        }
                    )
        rows.append(
            {"experiment": path.parent.name, "comparisons": len(judged), "distinguishable": before, "with_holm": after}
        )
    total = {k: sum(r[k] for r in rows) for k in ("comparisons", "distinguishable", "with_holm")}
    result = {"experiments": rows, "total": total, "changed": changed, "rank_statistics_over_seeds": rank_gaps}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "rejudge.json", result)
    lines = ["| experiment | comparisons | distinguishable (each p alone) | with Holm |", "|---|---|---|---|"]
    lines += [f"| {r['experiment']} | {r['comparisons']} | {r['distinguishable']} | {r['with_holm']} |" for r in rows]
    lines += [f"| **all** | {total['comparisons']} | {total['distinguishable']} | {total['with_holm']} |", ""]
    lines += ["| experiment | a | b | task | p | p (Holm) | of | was | now |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [
        f"| {c['experiment']} | {c['a']} | {c['b']} | {c['task']} | {c['p']:.4f} | {c['p_holm']:.4f} | "
        f"{c['m']} | {c['was']} | {c['now']} |"
        for c in changed
    ]
    lines += [
        "",
        "| experiment | a | b | task | difference (averaged ranks) | difference of the means |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {g['experiment']} | {g['a']} | {g['b']} | {g['task']} | {g['difference']} | {g['of_means']} |"
        for g in rank_gaps
    ]
    atomic_write_text(args.out / "rejudge.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
