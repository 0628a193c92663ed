"""Index files that check themselves: a sha256 per file in the manifest, verified on open.

Each save records ``checksums = {file name: sha256 hex}`` for the files of the new generation, and keeps
the previous generation's files and manifest (``manifest.previous.json``) beside it, so a damaged index
can go back one step (:func:`restore_previous`) instead of being rebuilt. An index written before
checksums existed still opens; a warning says so once per folder and process, and its next save adds them.

The BM25 index kept in ``bm25/`` (built at the first BM25 search, :mod:`lmembed.lexical.bm25`) is covered too:
each of its files is in the checksums under ``bm25/<name>`` once it is saved. A ``bm25/`` folder holding a file
the checksums do not list, or one whose sha256 differs, is refused; without a ``bm25/`` folder the entries are
unused (it is rebuilt from the verified documents at the next BM25 search).

Every name a manifest holds, and every file of ``bm25/``, must lie inside the index folder once links are
followed (:func:`lmembed.paths.inside`): one that leaves it is an :class:`IndexPathError`, raised before
anything is read there.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from lmembed.index.errors import IndexFormatError, IndexIntegrityError, IndexPathError
from lmembed.index.manifest import MANIFEST_FILE
from lmembed.io import sha256_file
from lmembed.lexical.bm25 import LEXICAL_DIR
from lmembed.paths import inside

if TYPE_CHECKING:
    from lmembed.index.manifest import Manifest

logger = logging.getLogger(__name__)

PREVIOUS_MANIFEST = "manifest.previous.json"


def checksums(folder: Path, names: list[str]) -> dict[str, str]:
    """``{name: sha256}`` for the named files in ``folder``."""
    return {name: sha256_file(folder / name) for name in sorted(names)}


# ---------------------------------------------------------------------------------------------- confinement
def confined(folder: Path, name: str, field: str, source: str = MANIFEST_FILE) -> Path:
    """``folder / name`` for a name that ``source`` (the manifest) holds in ``field``; refused unless it lies inside
    ``folder`` once links are followed."""
    return inside(folder, name, file=folder / source, field=field, error=IndexPathError)


def check_paths(folder: Path, manifest: Manifest, source: str = MANIFEST_FILE) -> None:
    """Refuse a manifest that names a file outside ``folder`` (in ``files`` or ``checksums``), or lacks one."""
    where = folder / source
    for role in ("documents", *(("chunks",) if manifest.chunking is not None else ())):
        if not isinstance(manifest.files.get(role), str):
            raise IndexFormatError(f"{where}: files.{role} is missing; {remedy(folder)}")
    for role, name in manifest.files.items():
        if not isinstance(name, str):
            raise IndexFormatError(f"{where}: files.{role} must be a file name, got {name!r}")
        confined(folder, name, f"files.{role}", source)
    lexical_folder(folder)
    for name in manifest.checksums or {}:
        confined(folder, name, f"checksums[{name!r}]", source)


def is_lexical(name: str) -> bool:
    """True for a checksum entry of a ``bm25/`` file."""
    return name.startswith(f"{LEXICAL_DIR}/")


LEXICAL_FIELD = "the BM25 index"


def lexical_folder(folder: Path) -> Path | None:
    """``folder/bm25`` (None without one), refused when it leads outside ``folder`` (a link to elsewhere)."""
    root = folder / LEXICAL_DIR
    if not root.exists() and not root.is_symlink():
        return None
    return inside(folder, LEXICAL_DIR, file=folder, field=LEXICAL_FIELD, error=IndexPathError)


def lexical_files(folder: Path) -> list[str]:
    """``bm25/<name>`` for every file of ``folder/bm25`` (none without one); the folder, each file and each folder
    in it must lie inside ``folder`` once links are followed (checked before anything is read)."""
    root = lexical_folder(folder)
    if root is None:
        return []
    if not root.is_dir():
        raise IndexFormatError(f"{root}: expected the BM25 index's folder; {lexical_remedy(folder)}")
    names = []
    for top, dirs, files in os.walk(root):  # links are listed, never followed
        for entry in sorted(dirs + files):
            relative = (Path(top) / entry).relative_to(folder).as_posix()
            inside(folder, relative, file=folder, field=LEXICAL_FIELD, error=IndexPathError)
            if entry in files:
                names.append(relative)
    return sorted(names)


def lexical_checksums(folder: Path) -> dict[str, str]:
    """``{bm25/<name>: sha256}`` for every file of ``folder/bm25``."""
    return checksums(folder, lexical_files(folder))


def lexical_remedy(folder: Path) -> str:
    return (
        f"remove {folder / LEXICAL_DIR}: the BM25 index is derived from the documents (verified on their own) and "
        "is rebuilt, with its checksums, at the next BM25 search"
    )


def check_lexical(folder: Path, manifest: Manifest, source: str = MANIFEST_FILE) -> list[str]:
    """The ``bm25/`` files whose sha256 differs from the manifest's, or that it records but are gone; a file that
    it does not record at all is refused (:class:`IndexIntegrityError`). No ``bm25/`` folder: nothing to check."""
    on_disk = lexical_files(folder)
    if not on_disk or manifest.checksums is None:
        return []
    unlisted = [name for name in on_disk if name not in manifest.checksums]
    if unlisted:
        raise IndexIntegrityError(
            f"{', '.join(str(folder / name) for name in unlisted)}: not in the checksums of {folder / source}, so "
            f"the BM25 index cannot be trusted: {lexical_remedy(folder)}"
        )
    recorded = [name for name in manifest.checksums if is_lexical(name)]
    present = set(on_disk)
    return [n for n in recorded if n not in present or sha256_file(folder / n) != manifest.checksums[n]]


def verify_lexical(folder: Path, manifest: Manifest) -> None:
    """Raise :class:`IndexIntegrityError` naming the damaged ``bm25/`` files and what to do."""
    damaged = check_lexical(folder, manifest)
    if damaged:
        raise IndexIntegrityError(
            f"{', '.join(str(folder / name) for name in damaged)}: damaged (its sha256 is not the one recorded in "
            f"{folder / MANIFEST_FILE}); the BM25 index cannot be trusted: {lexical_remedy(folder)}"
        )


def drop_lexical(folder: Path) -> None:
    """Remove ``folder/bm25`` (a link there is removed, never what it leads to)."""
    root = folder / LEXICAL_DIR
    if root.is_symlink() or root.is_file():
        root.unlink()
    elif root.is_dir():
        shutil.rmtree(root)


def remedy(folder: Path) -> str:
    """What to do about a damaged index: rebuild it, or restore the previous generation where one is kept."""
    rebuild = f"rebuild it (`lmembed index build ... -o {folder} --overwrite`)"
    if (folder / PREVIOUS_MANIFEST).is_file():
        return (
            f"{rebuild}, or go back to the previous generation kept by `index add` with "
            f"`lmembed index restore {folder}` (documents added since are lost)"
        )
    return rebuild


def check_files(folder: Path, manifest: Manifest, source: str = MANIFEST_FILE) -> list[str]:
    """The names of the manifest's data files that are missing or whose sha256 differs from the manifest's (the
    ``bm25/`` files included, see :func:`check_lexical`). A name leading outside ``folder`` is refused first.

    A manifest without checksums (an index written before they existed, or edited) is refused: nothing in it
    could be verified."""
    check_paths(folder, manifest, source)
    missing = [name for name in manifest.files.values() if not (folder / name).is_file()]
    if missing:
        raise IndexFormatError(f"{folder}: data file(s) missing: {', '.join(missing)}; {remedy(folder)}")
    if manifest.checksums is None:
        raise IndexFormatError(
            f"{folder / source}: checksums: none recorded, so its data files cannot be verified (an index written "
            f"before lmembed kept checksums, or a manifest edited by hand); {remedy(folder)}"
        )
    damaged = []
    for name in manifest.files.values():
        expected = manifest.checksums.get(name)
        if expected is None or sha256_file(folder / name) != expected:
            damaged.append(name)
    return damaged + check_lexical(folder, manifest, source)


def verify(folder: Path, manifest: Manifest) -> None:
    """Raise :class:`IndexIntegrityError` naming the damaged files and what to do."""
    damaged = check_files(folder, manifest)
    if damaged:
        names = ", ".join(str(folder / name) for name in damaged)
        what = "the BM25 index" if all(is_lexical(n) for n in damaged) else "the index"
        fix = lexical_remedy(folder) if what == "the BM25 index" else remedy(folder)
        raise IndexIntegrityError(
            f"{names}: damaged (its sha256 is not the one recorded in {folder / MANIFEST_FILE}); "
            f"{what} cannot be trusted: {fix}"
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
