"""Find datasets by name: turn a short name or a path into a local folder, downloading it if need be.

:func:`resolve_dataset` turns a short name (``"scifact"``, ``"sick-r"``) or a path into a local
directory. It looks, in order, at:

1. the argument itself, when it is an existing path;
2. ``$LMEMBED_DATA/<name>`` (also ``$LMEMBED_DATA/<relative path>``, e.g. ``beir/scifact``);
3. the project's shared data folder, ``../shared/datasets`` next to the checkout (found from the
   package's location and from the working directory);
4. the download cache (``$LMEMBED_DATA``, else ``$LMEMBED_HOME/datasets``, else
   ``~/.cache/lmembed/datasets``), filling it from the dataset's official public archive when one is
   known. Archives are checked against pinned checksums before anything is extracted.

When every step fails, :class:`DatasetNotFoundError` lists each place that was tried. The folders
and environment variables come from :mod:`lmembed.paths`; reading the files is :mod:`lmembed.io`'s.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lmembed import paths, task_registry
from lmembed.errors import LmembedError

logger = logging.getLogger(__name__)

#: Known dataset short names and where each lives under a data root (``shared/datasets`` or
#: ``$LMEMBED_DATA``); derived, live, from the task registry (:mod:`lmembed.task_registry`).
KNOWN_DATASETS: Mapping[str, str] = task_registry.dataset_locations()

#: Other spellings accepted for a known name (``sick-r`` → ``sickr``), from the task registry too.
ALIASES: Mapping[str, str] = task_registry.dataset_aliases()

BEIR_URL_TEMPLATE = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{name}.zip"


@dataclass(frozen=True)
class ArchiveSpec:
    """An official archive for one dataset and the checksums that identify it.

    ``md5`` is the value BEIR publishes for its zips. ``sha256`` and ``size`` are pinned where an
    independent record of them exists; an archive must match every value that is given, and at
    least one checksum must be given.
    """

    url: str
    md5: str | None = None
    sha256: str | None = None
    size: int | None = None


#: Official download sources. Only the BEIR retrieval sets have a single official archive.
ARCHIVES: dict[str, ArchiveSpec] = {
    "scifact": ArchiveSpec(
        url=BEIR_URL_TEMPLATE.format(name="scifact"),
        md5="5f7d1de60b170fc8027bb7898e2efca1",
        sha256="536e14446a0ba56ed1398ab1055f39fe852686ecad24a6306c80c490fa8e0165",
        size=2_816_079,
    ),
    "nfcorpus": ArchiveSpec(
        url=BEIR_URL_TEMPLATE.format(name="nfcorpus"),
        md5="a89dba18a62ef92f7d323ec890a0d38d",
        size=2_448_432,
    ),
    "arguana": ArchiveSpec(
        url=BEIR_URL_TEMPLATE.format(name="arguana"),
        md5="8ad3e3c2a5867cdced806d6503f29b99",
        size=3_773_617,
    ),
}


class DatasetNotFoundError(LmembedError, FileNotFoundError):
    """No local copy of a dataset was found and it could not be downloaded."""


class ChecksumMismatchError(LmembedError, RuntimeError):
    """A downloaded archive does not match its pinned checksum."""


def canonical_name(name: str) -> str:
    """Lower-case ``name`` and map aliases (``sick-r`` → ``sickr``)."""
    key = name.strip().lower()
    return ALIASES.get(key, key)


def _relative_paths(name: str) -> list[str]:
    """Relative locations worth trying for ``name`` inside a data root."""
    key = canonical_name(name)
    relative = [name]
    if key != name:
        relative.append(key)
    if key in KNOWN_DATASETS:
        relative.append(KNOWN_DATASETS[key])
    return list(dict.fromkeys(relative))


def _local_candidates(name: str) -> list[Path]:
    """Every local directory :func:`resolve_dataset` looks at, in order."""
    candidates: list[Path] = []
    env = paths.data_env_dir()
    if env is not None:
        candidates.extend(env / rel for rel in _relative_paths(name))
    for root in paths.shared_candidates():
        candidates.extend(root / rel for rel in _relative_paths(name))
    candidates.append(paths.dataset_cache_dir() / canonical_name(name))
    return list(dict.fromkeys(candidates))


def resolve_dataset(name_or_path: str | os.PathLike[str], *, download: bool = True) -> Path:
    """Return a local directory (or file) holding the dataset ``name_or_path``.

    Raises :class:`DatasetNotFoundError` naming every location tried (and the download error,
    if a download was attempted) when the dataset cannot be found.
    """
    as_path = Path(name_or_path).expanduser()
    if as_path.exists():
        return as_path.resolve()
    if as_path.is_absolute():  # an absolute path means exactly that path
        raise DatasetNotFoundError(f"{as_path}: no such file or folder")
    name = str(name_or_path)
    tried: list[str] = [f"path {as_path}"]
    for candidate in _local_candidates(name):
        if candidate.exists():
            logger.debug("dataset %r resolved to %s", name, candidate)
            return candidate.resolve()
        tried.append(str(candidate))
    if paths.shared_datasets_dir() is None:
        tried.append("shared datasets folder: none found (looked for ../shared/datasets)")
    key = canonical_name(name)
    spec = ARCHIVES.get(key)
    if spec is None:
        tried.append(f"download: no official archive is known for {key!r}")
    elif not download:
        tried.append(f"download: disabled (would fetch {spec.url})")
    else:
        try:
            return download_archive(key, spec, paths.dataset_cache_dir())
        except Exception as exc:
            tried.append(f"download {spec.url}: {type(exc).__name__}: {exc}")
    lines = "\n  - ".join(tried)
    raise DatasetNotFoundError(
        f"Dataset {name!r} not found. Tried:\n  - {lines}\n"
        f"Set ${paths.DATA_ENV_VAR} to a folder holding it, or pass its path."
    )


def resolve_local(spec: str | os.PathLike[str]) -> Path:
    """An existing path (as given), else a dataset found locally by :func:`resolve_dataset` (no
    download), else ``NAME/REST`` inside a locally found dataset folder ``NAME`` (e.g.
    ``training/nli_triplets.jsonl``). Raises :class:`DatasetNotFoundError` listing where it looked."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if path.is_absolute():  # an absolute path means exactly that path, never a name to look up elsewhere
        raise DatasetNotFoundError(f"{path}: no such file or folder")
    try:
        return resolve_dataset(spec, download=False)
    except DatasetNotFoundError:
        head, _, rest = str(spec).partition("/")
        if head and rest:
            try:
                return resolve_dataset(head, download=False) / rest
            except DatasetNotFoundError:
                pass
        raise


def _fetch(url: str, dest: Path, *, timeout: float = 60.0) -> None:
    """Stream ``url`` into ``dest``."""
    with urllib.request.urlopen(url, timeout=timeout) as response, dest.open("wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)


def _digests(path: Path) -> tuple[str, str, int]:
    """MD5 and SHA-256 hex digests and the size of a file."""
    md5 = hashlib.md5(usedforsecurity=False)
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            md5.update(block)
            sha.update(block)
            size += len(block)
    return md5.hexdigest(), sha.hexdigest(), size


def verify_archive(path: Path, spec: ArchiveSpec) -> str:
    """Check ``path`` against every checksum pinned in ``spec``; return its SHA-256."""
    if spec.md5 is None and spec.sha256 is None:
        raise ChecksumMismatchError(f"no checksum is pinned for {spec.url}; refusing to use it")
    md5, sha, size = _digests(path)
    problems = []
    if spec.size is not None and size != spec.size:
        problems.append(f"size {size} != expected {spec.size}")
    if spec.sha256 is not None and sha != spec.sha256:
        problems.append(f"sha256 {sha} != expected {spec.sha256}")
    if spec.md5 is not None and md5 != spec.md5:
        problems.append(f"md5 {md5} != expected {spec.md5}")
    if problems:
        raise ChecksumMismatchError(f"{spec.url}: " + "; ".join(problems))
    return sha


def _safe_extract(archive: Path, dest: Path) -> None:
    """Extract a zip, refusing members that would land outside ``dest``."""
    root = dest.resolve()
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            target = (root / member).resolve()
            if not target.is_relative_to(root):
                raise ValueError(f"{archive.name}: member {member!r} escapes the extraction folder")
        zf.extractall(root)


def download_archive(name: str, spec: ArchiveSpec, target_root: Path) -> Path:
    """Download, verify and extract ``spec`` into ``target_root/<name>``; return that folder."""
    target_root.mkdir(parents=True, exist_ok=True)
    final = target_root / name
    with tempfile.TemporaryDirectory(dir=target_root, prefix=f".{name}-") as tmp:
        tmp_dir = Path(tmp)
        archive = tmp_dir / f"{name}.zip"
        logger.info("downloading %s", spec.url)
        _fetch(spec.url, archive)
        sha = verify_archive(archive, spec)
        logger.info("verified %s (sha256 %s)", spec.url, sha)
        extracted = tmp_dir / "extracted"
        extracted.mkdir()
        _safe_extract(archive, extracted)
        entries = [p for p in extracted.iterdir() if not p.name.startswith("__MACOSX")]
        source = entries[0] if len(entries) == 1 and entries[0].is_dir() else extracted
        if final.exists():  # another process finished first
            return final.resolve()
        os.replace(source, final)
    return final.resolve()
