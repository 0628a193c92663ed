"""What checking a saved folder's file digests costs at load time.

Saves each model with ``Embedder.save`` (its ``lmembed.json`` records every file's sha256, checked on every load),
copies the folder and strips the record from the copy (format 1: what an older lmembed saved, loaded unchecked, the
baseline), then times ``Embedder.from_pretrained`` on both, alternating, and prints the checked load's time as a
ratio of the unchecked one, with the megabytes hashed.

    python bench/saved_folder_load.py [--models minilm smollm2-135m] [--repeats 5]

Results: bench/results/saved-folder-load/load.json and load.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import REPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2-135m"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import lmembed
    from lmembed import Embedder
    from lmembed.load_plan import FILES_KEY, check_saved_files
    from lmembed.load_spec import STRATEGY_FILE

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            checked = Path(scratch) / f"{name}-checked"
            Embedder.from_pretrained(name, cache=False, show_progress=False).save(checked)
            unchecked = Path(scratch) / f"{name}-unchecked"
            shutil.copytree(checked, unchecked)
            meta = json.loads((unchecked / STRATEGY_FILE).read_text())
            del meta[FILES_KEY]
            (unchecked / STRATEGY_FILE).write_text(json.dumps({**meta, "format": 1}))
            hashed = sum(p.stat().st_size for p in checked.rglob("*") if p.is_file()) / 1e6
            times: dict[str, list[float]] = {"checked": [], "unchecked": []}
            for _ in range(args.repeats + 1):  # the first pair warms the page cache and imports
                for label, folder in (("unchecked", unchecked), ("checked", checked)):
                    start = time.perf_counter()
                    Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
                    times[label].append(time.perf_counter() - start)
            saved = json.loads((checked / STRATEGY_FILE).read_text())
            for _ in range(args.repeats + 1):  # the check alone, as a load runs it
                start = time.perf_counter()
                check_saved_files(checked, saved)
                times.setdefault("check", []).append(time.perf_counter() - start)
            median = {k: statistics.median(v[1:]) for k, v in times.items()}
            rows.append(
                {
                    "model": name,
                    "mb_hashed": round(hashed, 1),
                    "unchecked_s": round(median["unchecked"], 3),
                    "checked_s": round(median["checked"], 3),
                    "ratio": round(median["checked"] / median["unchecked"], 3),
                    "check_alone_s": round(median["check"], 3),
                    "hash_gb_per_s": round(hashed / 1e3 / median["check"], 2),
                }
            )
            print(
                f"{name}: {hashed:.0f} MB hashed; load {median['checked']:.3f} s checked vs "
                f"{median['unchecked']:.3f} s unchecked (baseline) = {rows[-1]['ratio']:.2f}x; the check alone "
                f"{median['check']:.3f} s ({rows[-1]['hash_gb_per_s']} GB/s)"
            )
    out = REPO / "bench" / "results" / "saved-folder-load"
    out.mkdir(parents=True, exist_ok=True)
    record = {"lmembed": lmembed.__version__, "repeats": args.repeats, "rows": rows}
    (out / "load.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        "| model | MB hashed | unchecked load (s, baseline) | checked load (s) | checked / unchecked | check (s) |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['mb_hashed']} | {r['unchecked_s']} | {r['checked_s']} | {r['ratio']:.2f}x "
            f"| {r['check_alone_s']} |"
            for r in rows
        ),
    ]
    (out / "load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
