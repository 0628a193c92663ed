"""The export cache: one folder per exported graph, keyed by what decides its outputs.

``<LMEMBED_HOME>/exports/<key>/`` holds ``model.onnx`` (plus a weights side file for very large models) and
``manifest.json`` (what the key was made of, and for int8 graphs the quality-gate report). The key hashes the
backbone's fingerprint (its weights, model config and tokenizer: :meth:`lmembed.models.loading.Backbone.fingerprint`,
so the same weights under an edited ``config.json`` get their own graph), the graph's readouts and attention mode,
the precision (and, for int8, the calibration texts), and the versions of the exporter and runtime: a new torch
or ONNX Runtime builds a new graph rather than reusing one it did not make.

A folder is built under a temporary name beside its final place and renamed into place in one step, so a
process killed mid-export leaves no half-written graph that a later run would load; two processes exporting
the same key at once both succeed and one of the two identical folders is kept.

The manifest records the sha256 of every file the export wrote (``files``). A folder is used only when its
manifest is readable, is the one of its key, and every recorded file is a plain file inside it with its recorded
digest; otherwise (damaged, changed, or written before digests were recorded) it is said, removed and built again:
the graph ONNX Runtime loads is always the one lmembed exported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmembed.atomic import atomic_write_json, sweep_leftovers, temp_path
from lmembed.errors import LmembedError
from lmembed.io import check_recorded_files, sha256_file
from lmembed.paths import lmembed_home
from lmembed.schema import RecordModel, read_checked_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
GRAPH_FILE = "model.onnx"


def exports_dir() -> Path:
    """Root of the export cache: ``$LMEMBED_HOME/exports``."""
    return lmembed_home() / "exports"


def runtime_versions() -> dict[str, str]:
    """Versions of the exporter (torch, transformers) and runtime (onnxruntime) that shape a graph."""
    # lazy: onnxruntime is an optional extra; torch and transformers are loaded by then anyway
    import onnxruntime
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def export_key(parts: dict[str, Any]) -> str:
    """A stable 20-hex-digit key for the JSON-able ``parts``."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.blake2b(blob, digest_size=10).hexdigest()


def cached_export(
    parts: dict[str, Any], build: Callable[[Path], dict[str, Any] | None], root: Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """The folder of the export described by ``parts``, built by ``build(tmp_folder)`` if absent.

    ``build`` writes the graph into the folder it is given and may return extra manifest fields. Returns the
    final folder and its manifest.
    """
    root = Path(root) if root is not None else exports_dir()
    final = root / export_key(parts)
    manifest_path = final / MANIFEST
    if final.exists() or final.is_symlink():
        try:
            return final, read_export(final)
        except ExportFileError as exc:
            log.warning("%s; the export is built again", exc)
            if final.is_symlink():
                final.unlink()
            else:
                shutil.rmtree(final)
    root.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(final)  # what an export killed on this machine left
    tmp = temp_path(final)
    tmp.mkdir()
    try:
        extra = build(tmp) or {}
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {"key": final.name, "parts": parts, **extra, "files": files}
        atomic_write_json(tmp / MANIFEST, manifest)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same export first: keep its folder
            if not manifest_path.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return final, read_export(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, manifest


class ExportFileError(LmembedError, ValueError):
    """An export folder that is not as lmembed wrote it (damaged, changed, or without digests)."""


def read_export(folder: Path) -> dict[str, Any]:
    """The manifest of an export ``folder`` once the folder is as lmembed wrote it: a plain folder, a readable
    manifest of its own key, and every file it records present inside it with its recorded sha256."""
    path = folder / MANIFEST
    if folder.is_symlink() or not path.is_file():
        raise ExportFileError(f"{folder}: not an export folder lmembed wrote (no {MANIFEST}, or a link)")
    manifest = read_checked_json(path, _Manifest, ExportFileError, "an export manifest")
    if manifest["key"] != folder.name:
        raise ExportFileError(f"{path}: key: not the manifest of this export")
    if GRAPH_FILE not in manifest["files"]:
        raise ExportFileError(f"{path}: files: no sha256 of {GRAPH_FILE}")
    check_recorded_files(folder, path, manifest["files"], sorted(manifest["files"]), key="files", error=ExportFileError)
    return manifest


class _Manifest(RecordModel):
    """What :func:`read_export` reads of an export's manifest (the parts and the int8 report beside)."""

    key: str
    files: dict[str, str]  # each exported file -> its sha256


def update_manifest(folder: Path, **fields: Any) -> dict[str, Any]:
    """Add ``fields`` to the manifest of an export :func:`cached_export` has just returned (its files checked
    there, not hashed again), atomically; returns the new manifest."""
    path = Path(folder) / MANIFEST
    manifest = read_checked_json(path, _Manifest, ExportFileError, "an export manifest")
    manifest.update(fields)
    atomic_write_json(path, manifest)
    return manifest
