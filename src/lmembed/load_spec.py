"""What was loaded and how to load it again: :class:`LoadSpec`, one frozen, serialisable record.

An :class:`~lmembed.embedder.Embedder` made by ``from_pretrained`` knows its own ``load_spec``: the source it was
read from, the extraction strategy it ended with, the dtype, the backend and precision that ran it (with int8's
calibration texts), the RoPE interpolation factor and the attention kernel. Everyone who has to load *the same
model again somewhere else* reads and writes this one record instead of copying fields by hand:

* an index manifest (``model`` and ``strategy`` in ``manifest.json``), so ``lmembed search``, ``index add`` and
  ``serve --index`` reload exactly the model that built the index;
* Ray workers (``lmembed.scale.EmbedderSpec``), which load the driver's model on their own device;
* an exported graph's ``lmembed.json`` and a saved folder's provenance;
* ``Embedder.from_spec``, the one function that turns a spec back into an Embedder.

A field added here travels to all of them without further edits: they serialise the whole record
(:meth:`LoadSpec.to_dict` / :meth:`LoadSpec.from_dict`), and ``tests/test_load_spec.py`` round-trips every field
through each of them. Only what is *local* to a process stays out of it: the device, the caches, progress bars,
thread counts and batch sizes.

This module does not import torch: an index folder can be inspected without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError

#: the file a folder lmembed saved or exported carries its strategy and provenance in (``Embedder.save``, export)
STRATEGY_FILE = "lmembed.json"
STRATEGY_KEY = "strategy"  # the key the strategy is written under (the rest are the model fields)


def _rope_scale(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 1:
        raise ConfigError(f"{where}rope_scale={value!r} must be a number > 1 or null")
    return float(value)


def _text(value: Any, name: str, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}{name}={value!r} must be a non-empty string{' or null' if optional else ''}")
    return value


def _texts(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ConfigError(f"{where}calibration must be a list of texts or null")
    return tuple(value)


@dataclass(frozen=True)
class LoadSpec:
    """How to load one Embedder again, in another process or another session (see the module doc).

    ``source``: a bundled name, an absolute folder or a Hub id (``None``: a model built in memory, which cannot
    be reloaded from a spec). ``config``: the extraction strategy the Embedder ended with (a preset's, a saved
    folder's, or the caller's). ``dtype``: the weights' dtype. ``backend``/``precision``: what runs the
    transformer; ``calibration``: int8's calibration texts, so a reload quantises exactly as the original did.
    ``rope_scale``: the factor its RoPE positions were interpolated by. ``attn_implementation``: the attention
    kernel transformers was asked for.
    """

    source: str | None
    config: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    dtype: str = "float32"
    backend: str = "torch"
    precision: str = "float32"
    calibration: tuple[str, ...] | None = None
    rope_scale: float | None = None
    attn_implementation: str | None = "sdpa"

    def __post_init__(self) -> None:
        _rope_scale(self.rope_scale, "")
        if self.calibration is not None and not isinstance(self.calibration, tuple):
            object.__setattr__(self, "calibration", tuple(self.calibration))

    # ------------------------------------------------------------------ (de)serialisation
    def model_fields(self) -> dict[str, Any]:
        """Every field but the strategy, JSON-ready (an index manifest writes them under ``model``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        data["calibration"] = list(self.calibration) if self.calibration is not None else None
        return data

    def to_dict(self) -> dict[str, Any]:
        """The whole spec, JSON-ready: the model fields plus ``strategy`` (``EmbeddingConfig.to_dict()``)."""
        return {**self.model_fields(), STRATEGY_KEY: self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "", *, key_prefix: str = "") -> LoadSpec:
        """Read :meth:`to_dict`'s output back, checking every field; an error names ``where`` (a file) and the
        field (after ``key_prefix``, the key path to the spec inside the file). Unknown keys are refused."""
        prefix = (f"{where}: " if where else "") + key_prefix
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix}expected an object with the load fields, got {type(data).__name__}")
        known = {f.name for f in fields(cls) if f.name != "config"} | {STRATEGY_KEY}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{prefix}unknown load field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        strategy = data.get(STRATEGY_KEY, {})
        at = (f"{where}: " if where else "") + STRATEGY_KEY  # the strategy sits beside the model fields
        if not isinstance(strategy, Mapping):
            raise ConfigError(f"{at} must be an object")
        try:
            config = EmbeddingConfig.from_dict(dict(strategy))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{at}: {exc}") from exc
        return cls(
            source=_text(data.get("source"), "source", prefix, optional=True),
            config=config,
            dtype=_text(data.get("dtype", "float32"), "dtype", prefix) or "float32",
            backend=_text(data.get("backend", "torch"), "backend", prefix) or "torch",
            precision=_text(data.get("precision", "float32"), "precision", prefix) or "float32",
            calibration=_texts(data.get("calibration"), prefix),
            rope_scale=_rope_scale(data.get("rope_scale"), prefix),
            attn_implementation=_text(
                data.get("attn_implementation", "sdpa"), "attn_implementation", prefix, optional=True
            ),
        )

    @classmethod
    def from_parts(
        cls, model: Mapping[str, Any], strategy: Mapping[str, Any], where: str = "", *, key_prefix: str = ""
    ) -> LoadSpec:
        """A spec from its two halves as a manifest keeps them (``model`` fields, ``strategy``); keys of ``model``
        that are not load fields (a manifest's name and fingerprint) are left to the caller."""
        load_keys = set(load_field_names())
        data = {**{k: v for k, v in model.items() if k in load_keys}, STRATEGY_KEY: strategy}
        return cls.from_dict(data, where, key_prefix=key_prefix)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    # ------------------------------------------------------------------ use
    def loading(self) -> dict[str, Any]:
        """Keyword arguments of ``Embedder.from_pretrained`` that reproduce the model (the strategy is applied
        after loading, and int8's calibration by ``Embedder.calibrate``: see ``Embedder.from_spec``)."""
        return {
            "dtype": self.dtype,
            "backend": self.backend,
            "precision": self.precision,
            "rope_scale": self.rope_scale,
            "attn_implementation": self.attn_implementation,
        }

    def with_source(self, source: str | None) -> LoadSpec:
        return replace(self, source=source)

    def with_config(self, config: EmbeddingConfig) -> LoadSpec:
        return replace(self, config=config)


def load_field_names() -> tuple[str, ...]:
    """The names of the model fields of a spec (all but the strategy), in order: the one list of them."""
    return tuple(f.name for f in fields(LoadSpec) if f.name != "config")


__all__ = ["STRATEGY_KEY", "LoadSpec", "load_field_names"]
