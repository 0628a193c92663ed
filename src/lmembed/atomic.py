"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write`` on a temporary file beside ``path``, fsync it, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda handle: handle.write(text.encode()))


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_savefig(figure: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically (a crash never leaves half an image)."""
    return atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=dpi))
