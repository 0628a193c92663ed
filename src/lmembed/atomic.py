"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half of one.

The same holds for a folder written by :func:`atomic_folder`: it is filled under a temporary name beside its
place and renamed into it once complete.

A temporary name says whose it is (``.tmp-<name>-<host>.<tag>-<pid>-<random>``, the tag a digest of the host's
name, its boot and the PID namespace): a write killed before its rename leaves it behind, and the next write of the
same name by the same machine (or container) removes those whose process has ended (:func:`sweep_leftovers`); a
live writer's, or another machine's, is never touched. What a restarted container left is not recognised as its own:
it stays until removed by hand.
"""

from __future__ import annotations

import fcntl
import hashlib
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


def _owner() -> str:
    """Who writes here: the host's name (made safe for a file name) and a digest of the exact name, the boot and the
    PID namespace, so that two machines (or containers of one name) never take each other's temporaries as their own."""
    host = socket.gethostname()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    tag = hashlib.blake2b(f"{host}\0{boot}\0{namespace}".encode(), digest_size=4).hexdigest()
    return f"{re.sub(r'[^A-Za-z0-9_.]', '_', host)[:24]}.{tag}"


_OWNER = _owner()
#: how every temporary name begins (``temp_prefix``'s, and lmembed's other scratch names): a reader of a folder skips
#: such names, which are half-written work
TEMP_PREFIX = ".tmp-"
#: a target name longer than this is shortened in its temporary names (a file name has at most 255 bytes)
_NAME_IN_TEMP = 80


def _short(name: str) -> str:
    if len(name.encode()) <= _NAME_IN_TEMP:
        return name
    return f"{name[:40]}~{hashlib.blake2b(name.encode(), digest_size=4).hexdigest()}"


def temp_prefix(name: str, kind: str = "tmp") -> str:
    """The start of this process's temporary names for ``name`` (see the module doc)."""
    return f".{kind}-{_short(name)}-{_OWNER}-{os.getpid()}-"


def temp_path(target: Path) -> Path:
    """A fresh temporary path beside ``target``, named as this process's (see the module doc)."""
    return target.with_name(f"{temp_prefix(target.name)}{uuid.uuid4().hex[:8]}")


def _ended(pid: int) -> bool:
    """Whether no process of this PID namespace has ``pid`` (one beyond any pid the kernel gives has ended)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return True
    except OSError:  # PermissionError: alive, someone else's
        return False
    return False


def sweep_leftovers(target: Path) -> list[Path]:
    """Remove the temporary files and folders beside ``target`` that a write of the same name left when its process
    was killed (this machine's and PID namespace's, their process gone); returns what was removed. The whole name
    must be one of ours for ``target`` (a longer target name that contains it is another's). Links are unlinked,
    never followed."""
    pattern = re.compile(
        rf"\.(?:tmp|old)-{re.escape(_short(target.name))}-{re.escape(_OWNER)}-([0-9]{{1,10}})-[A-Za-z0-9_]{{8}}"
        rf"(?:{re.escape(target.suffix)})?"
    )
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        found = pattern.fullmatch(entry.name)
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


@contextmanager
def file_lock(path: str | Path, *, shared: bool = False, wait: bool = True) -> Iterator[bool]:
    """Hold an advisory lock on ``path`` (made if absent) for the block: exclusive, or ``shared`` with other shared
    holders. Yields True once held; with ``wait=False`` yields False at once when another process holds it. A lock
    file that a holder removed (:func:`remove_lock`) while this one waited is not taken: the lock is taken again on
    the file now at ``path``, so two processes never both believe they hold it."""
    path = Path(path)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
        try:
            fcntl.flock(handle, mode if wait else mode | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            yield False
            return
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()  # removed (or replaced) while we waited: take the lock on the file there now
    try:
        yield True
    finally:
        handle.close()


def remove_lock(path: str | Path) -> None:
    """Remove a lock file while holding it exclusively (:func:`file_lock`): processes waiting on it take the lock on
    a new file instead."""
    Path(path).unlink(missing_ok=True)
