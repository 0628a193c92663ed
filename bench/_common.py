"""Helpers shared by the benchmark scripts: locating ../shared/datasets and printing results."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from lmembed.io import read_jsonl as _read_all_jsonl
from lmembed.paths import shared_candidates, shared_datasets_dir

REPO = Path(__file__).resolve().parents[1]
SHARED = shared_datasets_dir() or shared_candidates()[0]


def shared_or_exit(relative: str = "") -> Path:
    """The shared data folder (or a path inside it); exit with a clear message when it is absent."""
    path = SHARED / relative
    if not path.exists():
        sys.exit(f"skipped: real data not found at {path} (expected ../shared/datasets beside the checkout)")
    return path


def peak_rss_mb() -> float:
    """The largest resident set size this process has had so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    """The rows of a JSON-lines file (lmembed's one reader: errors name file and line), the first ``limit``."""
    rows = _read_all_jsonl(path)
    return rows if limit is None else rows[:limit]


def save_json(data: dict, name: str) -> Path:
    out = REPO / "bench" / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


def published_scores(task: str, model: str = "sentence-transformers/all-MiniLM-L6-v2") -> dict[str, float]:
    """MTEB's published metrics for ``model`` on ``task`` (../shared/datasets/reference_scores.json),
    with ``main_score`` included."""
    data = json.loads(shared_or_exit("reference_scores.json").read_text())
    for entry in data["scores"]:
        if entry["model"] == model and entry["task"] == task:
            return {"main_score": float(entry["main_score"]), **{k: float(v) for k, v in entry["metrics"].items()}}
    return {}


def write_report(folder: Path, name: str, result: dict, lines: list[str]) -> None:
    """A benchmark's figures as ``folder/name.json`` and its table as ``folder/name.md``, the table printed too."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def markdown_table(header: list[str], rows: list[list[object]]) -> list[str]:
    """The lines of a Markdown table: ``header``, then one line per row (cells as they are printed)."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(str, r)) + " |" for r in rows),
    ]


def run_cell(code: str, *args: object) -> dict:
    """Run ``code`` (a script whose last line of output is a JSON object) in a fresh Python process with ``args``,
    from the repository's root; its JSON. A measurement of a process's own peak memory needs a process of its own."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
