"""What a generator's synthetic rows look like: per ``<name>.jsonl`` of ``lmembed synthesize`` (and its
``.stats.json``), the rows kept of the passages tried, the rejections by reason, rows/s, how many kept queries
are questions (end with "?") and how many open with the most common two words; for Gecko rows, how often the
relabelled positive is not the seed passage and how far query likelihood and relevance separate the positive from
the hard negative. Reads files, runs nothing.

    python bench/synthetic_rows.py                           # bench/results/synthesis/*.jsonl
    python bench/synthetic_rows.py path/to/rows.jsonl ...

Prints a Markdown table per kind of figure (the synthesis README quotes them).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from _common import REPO


def describe(path: Path) -> dict:
    stats = json.loads(path.with_name(path.name + ".stats.json").read_text())
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    openings = Counter(" ".join(r["query"].split()[:2]) for r in rows)
    out = {
        "file": path.name,
        "rows": len(rows),
        "attempted": stats["attempted"],
        "rejected": stats["rejected"],
        "seconds": stats["seconds_now"],
        "rows_per_s": stats["rows_per_second_now"],
        "questions": sum(r["query"].rstrip().endswith("?") for r in rows),
        "top_opening": openings.most_common(1)[0] if openings else ("", 0),
    }
    relabelled = [r["provenance"] for r in rows if "positive_is_seed" in r["provenance"]]
    if relabelled:
        out["gecko"] = {
            "positive_not_seed": sum(not p["positive_is_seed"] for p in relabelled),
            "relevance": [p["positive"]["relevance"] for p in relabelled],
            "relevance_neg": [p["negative"]["relevance"] for p in relabelled],
            "ql": [p["positive"]["query_likelihood"] for p in relabelled if p["positive"]["query_likelihood"]],
            "ql_neg": [p["negative"]["query_likelihood"] for p in relabelled if p["negative"]["query_likelihood"]],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    files = args.files or sorted((REPO / "bench" / "results" / "synthesis").glob("*.jsonl"))
    found = [describe(f) for f in files]
    print("| rows file | rows / tried | acceptance | rejected | s | rows/s | questions | commonest opening |")
    print("|---|---|---|---|---|---|---|---|")
    for d in found:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(d["rejected"].items(), key=lambda kv: -kv[1]))
        opening, count = d["top_opening"]
        print(
            f"| {d['file']} | {d['rows']} / {d['attempted']} | {d['rows'] / d['attempted']:.0%} | {reasons} | "
            f"{d['seconds']:.0f} | {d['rows_per_s']} | {d['questions']} / {d['rows']} | {opening!r} {count} |"
        )
    gecko = [d for d in found if "gecko" in d]
    if gecko:
        print(
            "\n| Gecko rows file | positive is not the seed | p(yes) positive vs negative (positive higher) "
            "| log p(query) positive vs negative (positive higher) |"
        )
        print("|---|---|---|---|")
        for d in gecko:
            g = d["gecko"]
            rel = sum(a > b for a, b in zip(g["relevance"], g["relevance_neg"], strict=True))
            ql = sum(a > b for a, b in zip(g["ql"], g["ql_neg"], strict=True))
            print(
                f"| {d['file']} | {g['positive_not_seed']} / {d['rows']} | {statistics.mean(g['relevance']):.3f} vs "
                f"{statistics.mean(g['relevance_neg']):.3f} ({rel} / {d['rows']}) | {statistics.mean(g['ql']):.1f} vs "
                f"{statistics.mean(g['ql_neg']):.1f} ({ql} / {len(g['ql'])}) |"
            )


if __name__ == "__main__":
    main()
