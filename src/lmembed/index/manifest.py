"""The manifest of an index folder: what its vectors are, so nothing is ever searched with other ones.

``manifest.json`` records the Embedder the vectors came from (where to reload it, the fingerprint of its
weights, its dtype), its extraction strategy (``EmbeddingConfig.to_dict()``), the index kind and the
build parameters actually used, the dimension and the count, and the names of the data files of the
current *generation* with the sha256 of each (checked on open, see :mod:`lmembed.index.integrity`). It is
the folder's commit point: data files are written first under new generation names, then the manifest is
replaced atomically (the one it replaces is kept as ``manifest.previous.json``), then the files of
generations older than the previous one are removed. A crash at any moment leaves the folder at the old
generation or the new one, never between. :meth:`Manifest.from_dict` checks each field's type and value (a
positive whole ``dim``, a known ``similarity``, a ``kind`` equal to ``params.kind`` ...) and names the one it refuses.

:func:`check_embedder` compares an Embedder with the manifest (weights fingerprint and the whole
strategy) and refuses a mismatch with an :class:`IndexMismatchError` that names what differs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmembed import __version__
from lmembed.atomic import atomic_write_json
from lmembed.config import EmbeddingConfig
from lmembed.encoding.cache import ENCODING_VERSION
from lmembed.errors import ConfigError
from lmembed.index.errors import IndexFormatError, IndexMismatchError
from lmembed.index.kinds import IndexParams
from lmembed.io import is_whole_number, read_json
from lmembed.load_spec import LoadSpec, load_field_names

if TYPE_CHECKING:  # the Embedder pulls in torch; an index folder can be inspected without it
    from lmembed.embedder import Embedder

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
SIMILARITY = "cosine"
#: The similarities an index may record (every kind scores by cosine, see :mod:`lmembed.index.kinds`).
SIMILARITIES = (SIMILARITY,)


def _names_to_strings(value: Any) -> bool:
    """Whether ``value`` is an object whose keys and values are all strings."""
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


@dataclass(frozen=True)
class ModelRecord:
    """The model an index's vectors came from: ``name`` (as shown), ``fingerprint`` (every weight, a trained pooling
    head's, the model config and tokenizer, as the embedding cache keys them), ``is_decoder``, and ``load``, the
    :class:`~lmembed.load_spec.LoadSpec` that reloads it exactly (source, strategy, dtype, backend and precision,
    int8 calibration texts, RoPE factor ...; ``load.source`` is ``None`` for a model built in memory, whose index
    can only be searched with the Embedder passed in).

    In ``manifest.json`` the spec's model fields sit beside ``name``/``fingerprint``/``is_decoder`` under ``model``
    and its strategy under ``strategy``, so every field of the spec is written and read without being named here.
    """

    name: str
    fingerprint: str
    is_decoder: bool
    load: LoadSpec

    def to_dict(self) -> dict[str, Any]:
        """The ``model`` object of ``manifest.json`` (the strategy is written apart, under ``strategy``)."""
        own = {"name": self.name, "fingerprint": self.fingerprint, "is_decoder": self.is_decoder}
        return own | self.load.model_fields()

    @classmethod
    def from_parts(cls, model: dict[str, Any], strategy: dict[str, Any], where: str) -> ModelRecord:
        if not isinstance(model, dict):
            raise IndexFormatError(f"{where}: model must be an object")
        own = {"name", "fingerprint", "is_decoder"}
        unknown = sorted(set(model) - own - set(load_field_names()))
        if unknown:
            raise IndexFormatError(f"{where}: unknown field(s) model.{', model.'.join(unknown)}")
        name, fingerprint, is_decoder = model.get("name"), model.get("fingerprint"), model.get("is_decoder")
        if not isinstance(name, str) or not isinstance(fingerprint, str) or not isinstance(is_decoder, bool):
            raise IndexFormatError(
                f"{where}: model.name and model.fingerprint must be strings, model.is_decoder a bool"
            )
        load = LoadSpec.from_parts(model, strategy, key_prefix="model.")
        return cls(name=name, fingerprint=fingerprint, is_decoder=is_decoder, load=load)


def model_fingerprint(embedder: Embedder) -> str:
    """The backbone's weights fingerprint, joined with a hash of a pooling head's weights if it has one."""
    fingerprint = embedder.backbone.fingerprint()
    head = embedder.pooling_head
    if head is not None and (embedder.config.pooling == "latent_attention" or embedder.config.head):
        digest = hashlib.blake2b(digest_size=16)
        for name, tensor in sorted(head.state_dict().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        fingerprint += "-" + digest.hexdigest()
    return fingerprint


def describe_model(embedder: Embedder) -> ModelRecord:
    """The record of ``embedder``: its name, fingerprint and kind, and its own load spec."""
    backbone = embedder.backbone
    return ModelRecord(
        name=backbone.name,
        fingerprint=model_fingerprint(embedder),
        is_decoder=bool(backbone.is_decoder),
        load=embedder.load_spec,
    )


def _plain(data: Any) -> Any:
    """JSON-normalised (tuples become lists), so a strategy read from disk compares equal to a live one."""
    return json.loads(json.dumps(data))


@dataclass
class Manifest:
    """The contents of ``manifest.json`` (see the module doc)."""

    params: IndexParams
    dim: int
    count: int
    model: ModelRecord  # with its load spec, whose config is the strategy of every vector
    generation: int = 0
    files: dict[str, str] = field(default_factory=dict)
    checksums: dict[str, str] | None = None  # {file name: sha256}; None in an index written before they existed
    created: str = ""
    updated: str = ""
    similarity: str = SIMILARITY
    format: int = FORMAT_VERSION
    lmembed_version: str = __version__
    #: the version of lmembed's input building that made the vectors (encoding.cache.ENCODING_VERSION; 1 before
    #: the field): another one reads a query or a new document slightly otherwise than the indexed documents were
    encoding: int = ENCODING_VERSION
    chunking: dict[str, Any] | None = None  # long documents: vectors are chunks (encoding.chunking), count documents

    @property
    def config(self) -> EmbeddingConfig:
        return self.model.load.config

    @property
    def strategy(self) -> dict[str, Any]:
        """The strategy as ``manifest.json`` holds it (``EmbeddingConfig.to_dict()``, JSON-normalised)."""
        return _plain(self.config.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "kind": self.params.kind,
            "params": self.params.to_dict(),
            "dim": self.dim,
            "count": self.count,
            "similarity": self.similarity,
            "model": self.model.to_dict(),
            "strategy": _plain(self.strategy),
            "strategy_label": self.config.label(),
            "generation": self.generation,
            "files": dict(self.files),
            **({"checksums": dict(self.checksums)} if self.checksums is not None else {}),
            "created": self.created,
            "updated": self.updated,
            "lmembed_version": self.lmembed_version,
            "encoding": self.encoding,
            **({"chunking": dict(self.chunking)} if self.chunking is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
        """The manifest ``data`` (read from ``where``), each field checked for its type and value first: a bad one
        is an :class:`IndexFormatError` naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise IndexFormatError(f"{where}: must hold an object, not {type(data).__name__}")
        if not is_whole_number(data.get("format")) or data["format"] != FORMAT_VERSION:
            raise IndexFormatError(f"{where}: format {data.get('format')!r} is not {FORMAT_VERSION}")
        for name in ("params", "dim", "count", "model", "strategy", "generation", "files"):
            if name not in data:
                raise IndexFormatError(f"{where}: {name} is missing")
        if not isinstance(data["params"], dict):
            raise IndexFormatError(f"{where}: params must be an object")
        try:
            params = IndexParams.from_dict(data["params"])
        except (ConfigError, TypeError) as exc:
            raise IndexFormatError(f"{where}: params: {exc}") from None
        if data.get("kind", params.kind) != params.kind:
            raise IndexFormatError(f"{where}: kind is {data['kind']!r}, but params.kind is {params.kind!r}")
        dim, count, generation = data["dim"], data["count"], data["generation"]
        for name, value, least in (("dim", dim, 1), ("count", count, 0), ("generation", generation, 0)):
            if not is_whole_number(value) or value < least:
                raise IndexFormatError(f"{where}: {name} must be a whole number >= {least}, not {value!r}")
        similarity = data.get("similarity", SIMILARITY)
        if similarity not in SIMILARITIES:
            raise IndexFormatError(
                f"{where}: similarity {similarity!r} is unknown; lmembed indexes score by {', '.join(SIMILARITIES)}"
            )
        files, checksums = data["files"], data.get("checksums")
        if not _names_to_strings(files):
            raise IndexFormatError(f"{where}: files must map each role to a file name")
        if checksums is not None and not _names_to_strings(checksums):
            raise IndexFormatError(f"{where}: checksums must map each file name to its sha256")
        for name in ("created", "updated", "lmembed_version"):
            if not isinstance(data.get(name, ""), str):
                raise IndexFormatError(f"{where}: {name} must be a string, not {data[name]!r}")
        encoding = data.get("encoding", 1)
        if not is_whole_number(encoding) or encoding < 1:
            raise IndexFormatError(f"{where}: encoding must be a whole number >= 1, not {encoding!r}")
        chunking = data.get("chunking")
        if chunking is not None and not isinstance(chunking, dict):
            raise IndexFormatError(f"{where}: chunking must be an object")
        try:
            model = ModelRecord.from_parts(data["model"], data["strategy"], where)
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            if isinstance(exc, IndexFormatError):
                raise
            raise IndexFormatError(f"{where}: not a valid lmembed index manifest ({exc!r})") from exc
        return cls(
            params=params,
            dim=dim,
            count=count,
            model=model,
            generation=generation,
            files=dict(files),
            checksums=dict(checksums) if checksums is not None else None,
            created=data.get("created", ""),
            updated=data.get("updated", ""),
            similarity=similarity,
            lmembed_version=data.get("lmembed_version", ""),
            encoding=encoding,
            chunking=dict(chunking) if chunking is not None else None,
        )

    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        path = Path(folder) / MANIFEST_FILE
        if not path.is_file():
            raise IndexFormatError(f"{folder} is not an lmembed index (no {MANIFEST_FILE}); build one first")
        return cls.from_dict(read_json(path, error=IndexFormatError, what="index manifest"), str(path))

    def write(self, folder: str | Path) -> None:
        now = datetime.now(UTC).isoformat(timespec="seconds")
        self.created = self.created or now
        self.updated = now
        atomic_write_json(Path(folder) / MANIFEST_FILE, self.to_dict())


def strategy_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """``field: index=… embedder=…`` for each strategy field that differs."""
    expected, actual = _plain(expected), _plain(actual)
    return [
        f"{key}: index={expected.get(key)!r} embedder={actual.get(key)!r}"
        for key in sorted(set(expected) | set(actual))
        if expected.get(key) != actual.get(key)
    ]


def _differing(fingerprint: str, other: str) -> str:
    """The parts of ``fingerprint`` (weights, ``-pi`` RoPE factor, ``-c`` config and tokenizer) unlike ``other``'s,
    each cut to 12 characters, so a message shows what differs."""
    theirs = set(other.split("-"))
    parts = [part[:12] for part in fingerprint.split("-") if part not in theirs]
    return "-".join(parts) or fingerprint[:12]


def check_embedder(manifest: Manifest, embedder: Embedder, where: str | Path) -> None:
    """Refuse an Embedder that would embed queries differently from the index's documents."""
    problems = strategy_differences(manifest.strategy, embedder.config.to_dict())
    record, runner = manifest.model.load, embedder.backend
    # float32 on torch and on ONNX Runtime agree to cosine 0.9999; int8 vectors depend on who quantised them
    same_runner = record.backend == runner.name or record.precision != "int8"
    if record.precision != runner.precision or not same_runner:
        problems.insert(
            0, f"backend: index={record.backend} {record.precision} embedder={runner.name} {runner.precision}"
        )
    factor = embedder.load_spec.rope_scale
    if factor != record.rope_scale:
        shown = ["none" if f is None else f"{f:g}" for f in (record.rope_scale, factor)]
        problems.insert(0, f"rope_scale: index={shown[0]} embedder={shown[1]}")
    fingerprint, recorded = model_fingerprint(embedder), manifest.model.fingerprint
    if fingerprint != recorded:
        if "-c" not in recorded and fingerprint.split("-")[0] == recorded.split("-")[0]:
            raise IndexMismatchError(
                f"index {where} was built by an older lmembed, whose fingerprint covered the weights only, not the "
                "model config and tokenizer that also decide a vector; its vectors cannot be checked against this "
                "model. Rebuild the index (`lmembed index build`) to record the whole fingerprint."
            )
        problems.insert(
            0,
            f"model (weights, config and tokenizer): index={manifest.model.name} ({_differing(recorded, fingerprint)}) "
            f"embedder={embedder.backbone.name} ({_differing(fingerprint, recorded)})",
        )
    if problems:
        raise IndexMismatchError(
            f"index {where} was built with another model or strategy than this embedder; "
            f"queries would be embedded unlike its documents. Differences: {'; '.join(problems)}. "
            "Search it with the model and strategy it was built with (see `lmembed index info`), or rebuild it."
        )
