"""``load_reranker``: the right kind of reranker for a model, decided by what its folder holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmembed.errors import ConfigError, ModelLoadError
from lmembed.io import READ_WITH_WRITER, check_format, read_json
from lmembed.models.loading import resolve_model_path
from lmembed.models.presets import reranker_max_length
from lmembed.rerank.base import RERANKER_FILE, RERANKER_FORMAT, Reranker
from lmembed.rerank.cross_encoder import CrossEncoderReranker
from lmembed.rerank.llm import LLMReranker

#: The reranker registry: each class under the ``kind`` it records in lmembed_reranker.json. Training's torch-free
#: ``RERANKER_KINDS`` (train_config.py) lists the same names plus ``auto``; a test checks the two agree.
KINDS: dict[str, type[Reranker]] = {cls.kind: cls for cls in (CrossEncoderReranker, LLMReranker)}


def detect_kind(path: str) -> str:
    """``lmembed_reranker.json``'s kind; else ``llm`` for a ``...ForCausalLM`` checkpoint, else ``cross-encoder``
    (a sequence-classification model, or a bare backbone that gets a new head)."""
    folder = Path(path)
    recorded = folder / RERANKER_FILE
    if recorded.is_file():
        record = read_json(recorded, error=ModelLoadError, what="reranker record")
        kind = record.get("kind")
        form = record.get("format", RERANKER_FORMAT)
        check_format(recorded, "format", form, RERANKER_FORMAT, "reranker folders", ModelLoadError, READ_WITH_WRITER)
        if kind not in KINDS:
            raise ModelLoadError(f"{recorded}: kind {kind!r} is unknown; expected one of {', '.join(KINDS)}")
        return kind
    config = folder / "config.json"
    if config.is_file():
        recorded_config = read_json(config, error=ModelLoadError, what="model config")
        architectures = recorded_config.get("architectures")
        if not isinstance(architectures, list):
            architectures = []
        if any(isinstance(a, str) and a.endswith("ForCausalLM") for a in architectures):
            return "llm"
    return "cross-encoder"


def load_reranker(name_or_path: str, *, kind: str | None = None, **options: Any) -> Reranker:
    """A reranker from a folder, a bundled name or a Hub id; ``kind`` (``cross-encoder`` or ``llm``) overrides
    the detection; ``options`` go to that class's ``from_pretrained`` (``device``, ``max_length`` ...)."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"kind={kind!r} is unknown; choose one of {', '.join(KINDS)}")
    path = resolve_model_path(name_or_path)
    chosen = kind or detect_kind(path)
    saved = (Path(path) / RERANKER_FILE).is_file()  # a reranker lmembed saved keeps its own max_length
    if options.get("max_length") is None and not saved and (card := reranker_max_length(name_or_path)):
        options["max_length"] = card  # a published reranker's own maximum length, from its model card
    return KINDS[chosen].from_pretrained(name_or_path, **options)
