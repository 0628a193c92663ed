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
manifest is readable, is the one of its key, every recorded file is a plain file inside it with its recorded
digest, it holds no file the manifest does not record, and its graph parses with every tensor's data where the
manifest's files hold it (:func:`check_graph`: a resealed manifest is trusted no further than that); otherwise
(damaged, changed, or written before digests were recorded) it is said, removed and built again. A graph ONNX
Runtime cannot load, or whose outputs are not the model's width, is treated the same way by the backend.
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

import numpy as np

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
            discard_export(final, exc)
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


def discard_export(folder: Path, why: Exception) -> None:
    """Say why the export ``folder`` cannot be used and remove it, so that it is built again."""
    log.warning("%s; the export is built again", why)
    if folder.is_symlink():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)


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
    for entry in sorted(folder.iterdir()):
        if entry.name != MANIFEST and not entry.name.startswith(".") and entry.name not in manifest["files"]:
            raise ExportFileError(
                f"{entry}: a file {path} does not record (files); an export is used only with the files it wrote"
            )
    check_graph(folder, manifest["files"])
    return manifest


def check_graph(folder: Path, files: dict[str, str]) -> None:
    """Read the export's graph (without its weights) and refuse it when it does not parse, when a tensor's weights
    lie in a file other than a plain name the manifest records, or when a tensor declares more bytes than its
    data holds (ONNX Runtime would fail or read outside the export)."""
    # lazy: onnx is an optional extra
    import onnx

    path = folder / GRAPH_FILE
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # any parse failure of a hostile file is damage
        raise ExportFileError(f"{path}: not an ONNX graph ({type(exc).__name__}: {exc})") from None
    for tensor in _tensors(model.graph):
        problem = _tensor_problem(tensor, folder, files)
        if problem:
            raise ExportFileError(f"{path}: initializer {tensor.name!r}: {problem}")


def _tensors(graph: Any) -> list[Any]:
    """Every tensor a graph holds: initializers, sparse ones, and those in node attributes and subgraphs."""
    out = list(graph.initializer)
    for sparse in graph.sparse_initializer:
        out += [sparse.values, sparse.indices]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                out.append(attr.t)
            out += list(attr.tensors)
            if attr.HasField("g"):
                out += _tensors(attr.g)
            for sub in attr.graphs:
                out += _tensors(sub)
    return out


def _tensor_problem(tensor: Any, folder: Path, files: dict[str, str]) -> str | None:
    """Why ``tensor`` cannot be loaded as lmembed wrote it, or None."""
    # lazy: onnx is an optional extra
    import onnx

    if any(d < 0 for d in tensor.dims):
        return f"dims {list(tensor.dims)} are negative"
    count = int(np.prod(np.array(tensor.dims, dtype=object), initial=1))
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None if tensor.data_location != onnx.TensorProto.EXTERNAL else "string data held outside the graph"
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return f"data type {tensor.data_type} is unknown"
    bits = {getattr(onnx.TensorProto, n, -1) for n in ("INT4", "UINT4", "FLOAT4E2M1")}
    size = (count + 1) // 2 if tensor.data_type in bits else count * itemsize
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        if location not in files or Path(location).name != location or location in (GRAPH_FILE, MANIFEST):
            return f"its weights lie in {location!r}, not a file of the export that {MANIFEST} records"
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError:
            return f"external data offset/length {info.get('offset')!r}/{info.get('length')!r} are not numbers"
        held = (folder / location).stat().st_size
        if offset < 0 or (length >= 0 and offset + length > held) or offset + size > held:
            return f"declares {size} bytes at offset {offset} of {location}, which holds {held}"
        return None
    held = len(tensor.raw_data) if tensor.HasField("raw_data") else _typed_count(tensor) * itemsize
    if held < size:
        return f"dims {list(tensor.dims)} declare {size} bytes, the graph holds {held}"
    return None


def _typed_count(tensor: Any) -> int:
    """How many values a tensor holds in its typed fields (each counted once: complex pairs and packed halves are
    rare enough that holding fewer bytes than declared is what matters)."""
    fields = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")
    return max(len(getattr(tensor, f)) for f in fields)


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
