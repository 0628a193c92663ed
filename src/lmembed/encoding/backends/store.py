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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmembed.atomic import atomic_write_json
from lmembed.paths import lmembed_home

MANIFEST = "manifest.json"
GRAPH_FILE = "model.onnx"
_TMP_PREFIX = ".tmp-"


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
    if manifest_path.exists():
        return final, json.loads(manifest_path.read_text())
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        extra = build(tmp) or {}
        manifest = {"key": final.name, "parts": parts, **extra}
        atomic_write_json(tmp / MANIFEST, manifest)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same export first: keep its folder
            if not manifest_path.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return final, json.loads(manifest_path.read_text())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, manifest


def update_manifest(folder: Path, **fields: Any) -> dict[str, Any]:
    """Add ``fields`` to a finished export's manifest (atomically); returns the new manifest."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    atomic_write_json(path, manifest)
    return manifest
