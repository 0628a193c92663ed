"""``load_reranker``: the right kind of reranker for a model, decided by what its folder holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmembed.errors import ConfigError, ModelLoadError
from lmembed.models.loading import resolve_model_path
from lmembed.rerank.base import RERANKER_FILE, Reranker
from lmembed.rerank.cross_encoder import CrossEncoderReranker
from lmembed.rerank.llm import LLMReranker

KINDS: dict[str, type[Reranker]] = {"cross-encoder": CrossEncoderReranker, "llm": LLMReranker}


def detect_kind(path: str) -> str:
    """``lmembed_reranker.json``'s kind; else ``llm`` for a ``...ForCausalLM`` checkpoint, else ``cross-encoder``
    (a sequence-classification model, or a bare backbone that gets a new head)."""
    folder = Path(path)
    recorded = folder / RERANKER_FILE
    if recorded.is_file():
        try:
            kind = json.loads(recorded.read_text(encoding="utf-8")).get("kind")
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{recorded}: line {exc.lineno}: invalid JSON ({exc.msg})") from exc
        if kind not in KINDS:
            raise ModelLoadError(f"{recorded}: kind {kind!r} is unknown; expected one of {', '.join(KINDS)}")
        return kind
    config = folder / "config.json"
    if config.is_file():
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
        if any(a.endswith("ForCausalLM") for a in architectures):
            return "llm"
    return "cross-encoder"


def load_reranker(name_or_path: str, *, kind: str | None = None, **options: Any) -> Reranker:
    """A reranker from a folder, a bundled name or a Hub id; ``kind`` (``cross-encoder`` or ``llm``) overrides
    the detection; ``options`` go to that class's ``from_pretrained`` (``device``, ``max_length`` ...)."""
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"kind={kind!r} is unknown; choose one of {', '.join(KINDS)}")
    chosen = kind or detect_kind(resolve_model_path(name_or_path))
    return KINDS[chosen].from_pretrained(name_or_path, **options)
