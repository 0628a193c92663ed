"""Plain helpers shared by test files in several folders (fixtures live in conftest.py).

tests/ is on ``sys.path`` while the suite runs (pytest puts conftest.py's folder there), so any test file
imports these as ``from helpers import write_jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list) -> Path:
    """Write ``rows`` one per line: dicts as JSON, strings as they are (to plant malformed lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
