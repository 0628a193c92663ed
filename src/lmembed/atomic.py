"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

The same holds for a folder written by :func:`atomic_folder`: it is filled under a temporary name beside its
place and renamed into it once complete.

A temporary name says whose it is (``.tmp-<name>-<host>-<pid>-<random>``): a write killed before its rename
leaves it behind, and the next write of the same name on the same machine removes those whose process has
ended (:func:`sweep_leftovers`); a live writer's, or another machine's, is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

#: the process's umask, read once: temporary files and folders are made private (0600 / 0700), and a file or
#: folder renamed into place gets the modes a plain ``open``/``mkdir`` would have given it, so others who may read
#: the folder (a shared drive, a served index) still can
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE, FOLDER_MODE = 0o666 & ~_UMASK, 0o777 & ~_UMASK


_HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def temp_prefix(name: str, kind: str = "tmp") -> str:
    """The start of this process's temporary names for ``name`` (see the module doc)."""
    return f".{kind}-{name}-{_HOST}-{os.getpid()}-"


def temp_path(target: Path) -> Path:
    """A fresh temporary path beside ``target``, named as this process's (see the module doc)."""
    return target.with_name(f"{temp_prefix(target.name)}{uuid.uuid4().hex[:8]}")


def _ended(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False
    return False


def sweep_leftovers(target: Path) -> list[Path]:
    """Remove the temporary files and folders beside ``target`` that a write of the same name left when its process
    was killed (on this machine, their process gone); returns what was removed. Links are unlinked, never followed."""
    pattern = re.compile(rf"\.(?:tmp|old)-{re.escape(target.name)}-{re.escape(_HOST)}-(\d+)-")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        found = pattern.match(entry.name)
        if found is None or not _ended(int(found.group(1))):
            continue
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write`` on a temporary file beside ``path``, fsync it, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, FILE_MODE)
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


def _open_modes(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes of a plain write (temporary files, ours or a library's, are
    private); links are left alone."""
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(FOLDER_MODE if path.is_dir() else FILE_MODE)
    folder.chmod(FOLDER_MODE)


@contextmanager
def atomic_folder(target: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target`` to fill; when the block ends, give what it holds the modes of a
    plain write (see ``FILE_MODE``) and rename it into place. An existing
    ``target`` is moved aside only then, and removed after the rename; if the block raises, the temporary
    folder is removed and ``target`` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target.name), dir=target.parent))
    try:
        yield tmp
        _open_modes(tmp)
        if target.exists():
            old = target.with_name(f"{temp_prefix(target.name, 'old')}{tmp.name[-8:]}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
