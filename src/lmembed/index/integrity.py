"""Index files that check themselves: a sha256 per data file in the manifest, verified on open.

Each save records ``checksums = {file name: sha256 hex}`` for the files of the new generation, and keeps
the previous generation's files and manifest (``manifest.previous.json``) beside it, so a damaged index
can go back one step (:func:`restore_previous`) instead of being rebuilt. An index written before
checksums existed still opens; a warning says so once per folder and process, and its next save adds them.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lmembed.index.errors import IndexFormatError, IndexIntegrityError

if TYPE_CHECKING:
    from lmembed.index.manifest import Manifest

logger = logging.getLogger(__name__)

PREVIOUS_MANIFEST = "manifest.previous.json"
_CHUNK = 1 << 20
_warned_unchecked: set[str] = set()


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checksums(folder: Path, names: list[str]) -> dict[str, str]:
    """``{name: sha256}`` for the named files in ``folder``."""
    return {name: sha256_file(folder / name) for name in sorted(names)}


def remedy(folder: Path) -> str:
    """What to do about a damaged index: rebuild it, or restore the previous generation where one is kept."""
    rebuild = f"rebuild it (`lmembed index build ... -o {folder} --overwrite`)"
    if (folder / PREVIOUS_MANIFEST).is_file():
        return (
            f"{rebuild}, or go back to the previous generation kept by `index add` with "
            f"`lmembed index restore {folder}` (documents added since are lost)"
        )
    return rebuild


def check_files(folder: Path, manifest: Manifest) -> list[str]:
    """The names of the manifest's data files that are missing or whose sha256 differs from the manifest's.

    A manifest without checksums (an index written before they existed) is accepted; a warning says so once."""
    missing = [name for name in manifest.files.values() if not (folder / name).is_file()]
    if missing:
        raise IndexFormatError(f"{folder}: data file(s) missing: {', '.join(missing)}; {remedy(folder)}")
    if manifest.checksums is None:
        key = str(folder.resolve())
        if key not in _warned_unchecked:
            _warned_unchecked.add(key)
            logger.warning(
                "%s: this index was written without checksums (before lmembed kept them), so its files are not "
                "verified; its next save (`lmembed index add`) adds them",
                folder,
            )
        return []
    damaged = []
    for name in manifest.files.values():
        expected = manifest.checksums.get(name)
        if expected is None or sha256_file(folder / name) != expected:
            damaged.append(name)
    return damaged


def verify(folder: Path, manifest: Manifest) -> None:
    """Raise :class:`IndexIntegrityError` naming the first damaged data file and what to do."""
    damaged = check_files(folder, manifest)
    if damaged:
        names = ", ".join(str(folder / name) for name in damaged)
        raise IndexIntegrityError(
            f"{names}: damaged (its sha256 is not the one recorded in {folder / 'manifest.json'}); "
            f"the index cannot be trusted: {remedy(folder)}"
        )


def keep_previous(folder: Path, manifest_file: Path) -> None:
    """Keep the manifest about to be replaced as ``manifest.previous.json`` (a hard link, else a copy)."""
    target = folder / PREVIOUS_MANIFEST
    tmp = folder / f".tmp-{PREVIOUS_MANIFEST}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(manifest_file, tmp)
    except OSError:
        tmp.write_bytes(manifest_file.read_bytes())
    os.replace(tmp, target)
