"""Where lmembed keeps and finds things on disk, and every ``LMEMBED_*`` environment variable.

This is the one module that reads lmembed's environment variables and computes its folders; other
modules call these functions instead of looking at ``os.environ`` or building ``~/.cache`` paths.

===================== ======================================================================
variable              what it sets
===================== ======================================================================
``LMEMBED_HOME``      root of lmembed's caches (default ``~/.cache/lmembed``)
``LMEMBED_DATA``      a folder of datasets, searched first and used as the download cache
``LMEMBED_CACHE``     the embedding cache (default ``$LMEMBED_HOME/embeddings``)
``LMEMBED_DEBUG``     a true value (``1``, ``true``, ``yes``, ``on``) shows tracebacks on errors
===================== ======================================================================

Folders, each with the precedence it follows (the first that applies wins):

* :func:`dataset_cache_dir`, where downloaded datasets are extracted: ``$LMEMBED_DATA``, then
  ``$LMEMBED_HOME/datasets``, then ``~/.cache/lmembed/datasets``;
* :func:`embedding_cache_dir`: ``$LMEMBED_CACHE``, then ``$LMEMBED_HOME/embeddings``, then
  ``~/.cache/lmembed/embeddings``;
* :func:`converted_model_dir` (bundled GGUF models converted to safetensors) and :func:`gguf_dir`
  (assembled GGUF files): ``$LMEMBED_HOME/models/<name>`` and ``$LMEMBED_HOME/gguf``, with the home
  defaulting to ``~/.cache/lmembed``;
* :func:`shared_datasets_dir`, the project's shared data: ``../shared/datasets`` beside the checkout
  this package was loaded from, else beside the working directory;
* :func:`default_data_root`, where suites look for task data: ``$LMEMBED_DATA``, then the shared
  data folder.

An environment variable that is set but empty counts as unset; ``~`` in a value is expanded.

:func:`inside` is the one check of a path that a folder's own file names (a module of ``modules.json``, an
index's data file, an adapter's base): it must resolve inside that folder once links are followed (a Hugging Face
cache snapshot's links to its repository's blobs count as inside).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePath

from lmembed.errors import LmembedError, UnsafeFileError

HOME_ENV_VAR = "LMEMBED_HOME"
DATA_ENV_VAR = "LMEMBED_DATA"
CACHE_ENV_VAR = "LMEMBED_CACHE"
DEBUG_ENV_VAR = "LMEMBED_DEBUG"
VERBOSE_ENV_VAR = "LMEMBED_VERBOSE"
API_KEY_ENV_VAR = "LMEMBED_API_KEY"  # lmembed serve's --api-key

#: Every environment variable lmembed reads.
ENV_VARS = (HOME_ENV_VAR, DATA_ENV_VAR, CACHE_ENV_VAR, DEBUG_ENV_VAR, VERBOSE_ENV_VAR, API_KEY_ENV_VAR)

_TRUE_WORDS = ("1", "true", "yes", "on")
#: a Hugging Face cache repository's folders: its revisions' snapshots, whose files link to its blobs
HUB_SNAPSHOTS, HUB_BLOBS = "snapshots", "blobs"


def env_path(name: str) -> Path | None:
    """The folder named by environment variable ``name`` (``~`` expanded), or ``None`` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def verbose_from_env() -> bool:
    """True when ``$LMEMBED_VERBOSE`` holds a true value (``1``, ``true``, ``yes`` or ``on``)."""
    return os.environ.get(VERBOSE_ENV_VAR, "").strip().lower() in _TRUE_WORDS


def debug_from_env() -> bool:
    """True when ``$LMEMBED_DEBUG`` holds a true value (``1``, ``true``, ``yes`` or ``on``)."""
    return os.environ.get(DEBUG_ENV_VAR, "").strip().lower() in _TRUE_WORDS


# ---------------------------------------------------------------------------------------------- caches
def lmembed_home() -> Path:
    """Root of lmembed's caches: ``$LMEMBED_HOME``, else ``~/.cache/lmembed``."""
    return env_path(HOME_ENV_VAR) or Path.home() / ".cache" / "lmembed"


def data_env_dir() -> Path | None:
    """``$LMEMBED_DATA``, or ``None`` when it is not set."""
    return env_path(DATA_ENV_VAR)


def dataset_cache_dir() -> Path:
    """Where downloaded datasets are extracted: ``$LMEMBED_DATA``, else ``$LMEMBED_HOME/datasets``,
    else ``~/.cache/lmembed/datasets``."""
    return data_env_dir() or lmembed_home() / "datasets"


def embedding_cache_dir() -> Path:
    """The embedding cache: ``$LMEMBED_CACHE``, else ``$LMEMBED_HOME/embeddings``."""
    return env_path(CACHE_ENV_VAR) or lmembed_home() / "embeddings"


def models_dir() -> Path:
    """Where converted bundled models are saved: ``$LMEMBED_HOME/models``."""
    return lmembed_home() / "models"


def converted_model_dir(name: str) -> Path:
    """The converted (safetensors) checkpoint of bundled model ``name``: ``$LMEMBED_HOME/models/<name>``."""
    return models_dir() / name


def gguf_dir() -> Path:
    """Where GGUF files shipped in several parts are assembled: ``$LMEMBED_HOME/gguf``."""
    return lmembed_home() / "gguf"


# ---------------------------------------------------------------------------------------------- shared data
def repo_root() -> Path:
    """The checkout this package was loaded from (``src/lmembed/paths.py`` → the checkout)."""
    return Path(__file__).resolve().parents[2]


def recipe_dirs(kind: str) -> list[Path]:
    """Where a recipe of ``kind`` (``adapt``, ``synthesis``) given by name is looked for: ``recipes/KIND/`` in the
    working directory, then in the checkout lmembed runs from."""
    return [Path.cwd() / "recipes" / kind, repo_root() / "recipes" / kind]


def find_named_recipe(kind: str, name: str | Path) -> Path | list[str]:
    """A recipe file: ``name`` itself when it is a file, else ``NAME.yaml`` in :func:`recipe_dirs`; when there is
    none, the names there are (for the caller's error)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    for folder in recipe_dirs(kind):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return sorted({p.stem for folder in recipe_dirs(kind) if folder.is_dir() for p in folder.glob("*.yaml")})


def shared_candidates() -> list[Path]:
    """Where the project's shared data folder may be, in the order tried: ``../shared/datasets``
    beside the checkout, then beside the working directory."""
    roots = [repo_root().parent / "shared" / "datasets", Path.cwd().parent / "shared" / "datasets"]
    return list(dict.fromkeys(roots))


def shared_datasets_dir() -> Path | None:
    """The project's ``shared/datasets`` folder, or ``None`` when there is none."""
    for candidate in shared_candidates():
        if candidate.is_dir():
            return candidate.resolve()
    return None


def default_data_root() -> Path | None:
    """Where task data is looked up: ``$LMEMBED_DATA``, else the shared data folder (``None``: neither)."""
    return data_env_dir() or shared_datasets_dir()


# ---------------------------------------------------------------------------------------------- confinement
def inside(
    folder: str | Path,
    relative: str | PurePath,
    *,
    file: str | Path,
    field: str,
    error: type[LmembedError] = UnsafeFileError,
) -> Path:
    """``folder / relative`` when it lies inside ``folder`` once every link is followed; else ``error``.

    ``relative`` is a path that ``file`` (a file of the folder, e.g. ``modules.json``) names in ``field`` (e.g.
    ``modules[2].path``). An absolute path (``~`` included), a ``..`` that climbs out of the folder and a link
    (the named entry or any folder on the way) leading outside are refused by name, before anything there is
    opened. ``""`` and ``"."`` name the folder itself. The path returned is the unresolved one (``folder /
    relative``), so messages keep the names the user knows."""
    folder = Path(folder)
    text = os.fspath(relative)
    named = f"{file}: {field}={text!r}"
    if "\0" in text:
        raise error(f"{named} holds a NUL character; it cannot name a file of {folder}")
    if PurePath(text).is_absolute() or text.startswith("~"):
        raise error(f"{named} is an absolute path; a path it names must lie inside {folder}")
    candidate = folder / text
    if os.path.normpath(text).split(os.sep, 1)[0] == "..":
        raise error(f"{named} climbs out of {folder} through '..'; a path it names must lie inside the folder")
    base = folder.resolve()
    try:
        target = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop
        raise error(f"{named} cannot be resolved inside {folder} ({exc})") from exc
    if _leaves(base, target):
        raise error(
            f"{named} leads outside {folder} through a link (to {target}); a path it names must lie inside the folder"
        )
    return candidate


def check_links_inside(folder: str | Path, *, error: type[LmembedError] = UnsafeFileError) -> None:
    """Refuse ``folder`` when a link in it (a file or a folder, at any depth) leads outside it: a loader that opens
    the folder's files by name (transformers reading ``tokenizer.json`` or ``model.safetensors``) would read what the
    link points at. A Hugging Face cache snapshot's links to its own repository's blobs are the folder's own. A file
    that is not a plain file (a named pipe, a socket, a device: a reader of ``config.json`` would wait on a pipe
    forever) is refused too."""
    folder = Path(folder)
    base = folder.resolve()
    for top, dirs, files in os.walk(folder):  # links to folders are listed, not followed
        for name in (*dirs, *files):
            path = Path(top, name)
            if not path.is_symlink():
                if name in files and not stat.S_ISREG(path.lstat().st_mode):
                    raise error(f"{path}: not a plain file (a pipe, socket or device); the folder is not loaded")
                continue
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:  # dangling, or a loop
                raise error(f"{path}: a link that cannot be resolved ({exc}); the folder is not loaded") from exc
            if _leaves(base, target):
                raise error(
                    f"{path}: a link leading outside {folder} (to {target}); a model folder is loaded only with "
                    "files of its own"
                )
            if not target.is_dir() and not stat.S_ISREG(target.stat().st_mode):
                raise error(f"{path}: a link to {target}, not a plain file (a pipe, socket or device)")


def _leaves(base: Path, target: Path) -> bool:
    """Whether ``target`` (resolved) lies outside the folder ``base`` (resolved), a snapshot's own blobs counting as
    inside."""
    return target != base and base not in target.parents and not _a_blob_of_its_snapshot(base, target)


def _a_blob_of_its_snapshot(base: Path, target: Path) -> bool:
    """True when ``base`` lies in a Hugging Face cache snapshot (``<repo>/snapshots/<revision>/...``) and ``target``
    is a file of that same repository's ``<repo>/blobs/``: huggingface_hub keeps each downloaded file once there and
    links the snapshot's entries to it, so such a link is the repository's own file."""
    for folder in (base, *base.parents):
        if folder.parent.name == HUB_SNAPSHOTS:
            blobs = folder.parent.parent / HUB_BLOBS
            return target.parent == blobs and target.is_file()
    return False
