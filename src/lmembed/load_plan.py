"""Where a model comes from and what its own files decide: the ordered source readers of ``Embedder.from_pretrained``.

Each reader looks at a name or folder and, when it recognises it, returns one :class:`LoadPlan`: the backbone
loader and what it reads, the strategy fields the source decides (and which file or preset decided each), and how
to build the head once the backbone is loaded. The readers are tried in order, the first that recognises the
source wins:

1. a saved lmembed folder (``lmembed.json``: the strategy it was saved with, its head);
2. a published family's preset (:mod:`lmembed.models.presets`: e5-mistral, NV-Embed, LLM2Vec adapter stacks ...);
   then a Hub repository an Embedder was saved to (its ``lmembed.json``), read as 1 from its snapshot;
3. a sentence-transformers folder (``modules.json``: pooling, prompts, Dense/Normalize head ...; bundled ``minilm``);
4. a plain transformers checkpoint (a folder or a Hub id; a Hub repository in sentence-transformers' layout is read
   as 3 once its files are fetched).

``Embedder.from_pretrained`` runs the plan, lays the caller's options over the source's, and records the result as
the Embedder's :class:`~lmembed.load_spec.LoadSpec`: how to load the same model again anywhere.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.atomic import atomic_write_text
from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError, ModelLoadError
from lmembed.io import check_recorded_files, loads_json, read_json, sha256_file
from lmembed.load_spec import STRATEGY_FILE
from lmembed.model_card import CARD_FILE, CARD_KEY
from lmembed.models import presets
from lmembed.models.adapters import load_adapter_stack
from lmembed.models.bundled import BUNDLED, resolve_bundled
from lmembed.models.loading import Backbone, find_model_dir, is_hub_id, load_backbone
from lmembed.models.nvembed import NVEmbedCheckpoint, load_nvembed
from lmembed.models.sentence_transformers_folder import (
    MODULES_FILE,
    PublishedModel,
    download_published_folder,
    is_sentence_transformers_folder,
    load_weights,
    read_published_folder,
)
from lmembed.models.weights import check_head_shapes, load_weights_file, read_safetensors_header
from lmembed.paths import inside
from lmembed.pooling.head import PostPoolingHead
from lmembed.pooling.latent_attention import build_latent_head
from lmembed.pooling.terms import TermChannel, load_terms

log = logging.getLogger(__name__)

#: lmembed.json's format: 2 records the sha256 of every other file of the folder (``files``); 1 (before) did not
SAVED_FORMAT = 2
FILES_KEY = "files"
#: the fields of a saved folder's ``lmembed.json`` (:func:`write_strategy_file`): another is refused by name
SAVED_KEYS = frozenset({"format", "base_model", "is_decoder", "strategy", FILES_KEY, CARD_KEY})
#: files a saved folder may gain after it was written without being recorded (a Hub repository's card and
#: attributes, a licence): nothing lmembed or transformers loads; hidden files and folders are left alone too
UNRECORDED_OK = (CARD_FILE, ".gitattributes", "LICENSE", "LICENSE.md", "LICENSE.txt", "NOTICE")
HEAD_FILE = "pooling_head.safetensors"  # a saved Embedder's trained latent-attention head


@dataclass
class LoadPlan:
    """What one source reader decided (see the module doc): the backbone loader and the path it reads, the strategy
    fields the source's own files or preset decide, and who decided each (``sources``: field → file or preset)."""

    reader: str  # "saved", "preset", "sentence-transformers" or "transformers"
    path: str
    loader: Callable[..., Backbone] = load_backbone
    options: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    exact_tokenizer: bool = False  # a saved folder's tokenizer is read exactly as saved
    name: str | None = None  # the name the backbone is known by (a bundled name read from its folder)
    saved: dict[str, Any] | None = None  # a saved folder's lmembed.json
    published: presets.Resolution | None = None  # a published family's preset
    folder: PublishedModel | None = None  # a sentence-transformers folder's conventions
    nvembed: _NVEmbedLoad | None = None
    checkpoint_sources: dict[str, str] | None = None  # what a checkpoint's own files decided (NV-Embed, LLM2Vec)
    where: str = ""  # the name or folder read (a run folder's model folder): the Embedder's source

    def load_backbone(self, **kwargs: Any) -> Backbone:
        """Load the backbone (``kwargs``: dtype, device, attention kernel, torch int8) and finish what the source
        decides once it is loaded: a saved folder's kind is checked, an NV-Embed checkpoint's strategy read, and a
        Hub id in sentence-transformers' layout read as such."""
        backbone = self.loader(self.path, exact_tokenizer=self.exact_tokenizer, **kwargs)
        if self.name is not None:
            backbone.name = self.name
        if self.saved is not None:
            _check_saved_kind(self.path, self.saved, backbone)
        if self.nvembed is not None:
            self.options.update(self.nvembed.checkpoint.strategy)
            self.checkpoint_sources = dict(self.nvembed.checkpoint.sources)
            self.sources.update(self.checkpoint_sources)
        if self.reader == "transformers" and not Path(backbone.path).exists():
            folder = _read_hub_published(backbone.path)
            if folder is not None:
                self._read_folder(folder, "sentence-transformers")
        return backbone

    def _read_folder(self, folder: PublishedModel, reader: str) -> None:
        presets.add_registry_prompts(folder, self.where)  # no prompts in the folder: mteb's record of them
        self.reader, self.folder = reader, folder
        self.options = dict(folder.options)
        self.sources = {k: str(folder.sources.get(k, folder.root)) for k in folder.options}

    def warn_overrides(self, given: dict[str, Any]) -> None:
        """One warning per option the caller gives that differs from the source's own (the caller wins)."""
        if self.published is not None:
            presets.warn_overrides(self.published, given, self.options)
        if self.folder is not None:
            _warn_overrides(self.folder, given)
        if self.saved is not None and isinstance(self.saved.get("strategy"), dict):
            recorded = self.saved["strategy"]
            for option, value in given.items():
                if option in recorded and recorded[option] != _as_recorded(value):
                    log.info(  # a saved folder's strategy is overridden on purpose by experiments and grids
                        "%s=%r (given) overrides the saved strategy's %s=%r (from %s)",
                        option,
                        value,
                        option,
                        recorded[option],
                        Path(self.path) / STRATEGY_FILE,
                    )

    def head(self, backbone: Backbone, strategy: dict[str, Any]) -> nn.Module | None:
        """The source's pooling or post-pooling head for the final ``strategy``, with its weights (None: none);
        a sentence-transformers folder also sets its tokenizer's truncation side here."""
        if self.saved is not None:
            recorded = self.saved["strategy"].get("pooling") == "latent_attention"
            return _load_head(self.path, backbone, strategy, recorded_latent=recorded)
        if self.folder is not None:
            head = _published_head(self.folder, backbone, strategy)
            _adapt_tokenizer(backbone, self.folder)
            return head
        if self.nvembed is not None:
            return self.nvembed.head(backbone, strategy)
        return None

    @property
    def base_model(self) -> str | None:
        """The model a saved folder was made from (its lmembed.json's ``base_model``, checked when it was read), or
        None for another source."""
        return None if self.saved is None else self.saved.get("base_model")

    def terms(self, backbone: Backbone, strategy: dict[str, Any]) -> TermChannel | None:
        """The term channel the final ``strategy`` names, read from a saved folder and checked (None: none)."""
        if not strategy.get("terms"):
            return None
        file = Path(self.path) / STRATEGY_FILE
        if self.saved is None:
            raise ConfigError(
                f"{self.where or self.path}: a term channel (strategy option terms) is read only from a folder an "
                "Embedder was saved to with one (its terms.safetensors)"
            )
        config = EmbeddingConfig.from_dict(strategy).terms
        assert config is not None
        return load_terms(Path(self.path), config, len(backbone.tokenizer), file).to(backbone.device)


def read_saved(name_or_path: str, torch_int8: bool) -> LoadPlan | None:
    """1. A folder an Embedder was saved to (``lmembed.json``)."""
    saved = _read_saved(name_or_path)
    if saved is None:
        return None
    options = dict(saved["strategy"])
    file = str(Path(name_or_path) / STRATEGY_FILE)
    _check_agrees_with_sentence_transformers(Path(name_or_path), options)
    return LoadPlan(
        "saved",
        name_or_path,
        options=options,
        sources=dict.fromkeys(options, file),
        exact_tokenizer=True,
        saved=saved,
        where=name_or_path,
    )


def _check_agrees_with_sentence_transformers(folder: Path, strategy: dict[str, Any]) -> None:
    """A saved folder that is also sentence-transformers' says its strategy twice: ``lmembed.json`` for lmembed, the
    module files for sentence-transformers. Both were written from one strategy; where they differ now (the pooling
    changed by hand in one of them) each library would read its own, and the two give other vectors of one folder
    (cosine 0.78 for mean against cls), so the folder is refused naming both. (The window is not compared: the
    module files hold the one the model runs, which an earlier lmembed's ``lmembed.json`` may exceed.)"""
    if not is_sentence_transformers_folder(folder):
        return
    record = folder / STRATEGY_FILE
    published = read_published_folder(folder)
    theirs = published.options
    config = EmbeddingConfig.from_dict(strategy)
    ours: dict[str, Any] = {"pooling": config.pooling, "include_prompt": config.include_prompt}
    prompts = dict(theirs.get("prompts") or {})
    for side, instruction in (("query", config.query_instruction), ("document", config.document_instruction)):
        if instruction and side in prompts:
            ours[f"{side} prompt"] = config.instruction_template.format(instruction=instruction)
            theirs = {**theirs, f"{side} prompt": prompts[side]}
    for option, value in ours.items():
        if option in theirs and theirs[option] != value:
            source = published.sources.get(option.replace(" prompt", "_instruction"), folder / MODULES_FILE)
            raise ModelLoadError(
                f"{record}: strategy says {option}={value!r}, but {source} says {theirs[option]!r}: the folder's two "
                "records of its strategy disagree (one was changed after it was saved), so lmembed and "
                "sentence-transformers would read it otherwise; save the model again from its source"
            )


def read_hub_saved(name_or_path: str, torch_int8: bool) -> LoadPlan | None:
    """1b. A Hub repository an Embedder was saved to and uploaded (it holds ``lmembed.json``): the files its record
    names are fetched, then read as 1 from the snapshot (every file checked against the record), known by its Hub
    id."""
    folder = _download_saved_folder(name_or_path)
    if folder is None:
        return None
    plan = read_saved(str(folder), torch_int8)
    assert plan is not None  # the snapshot holds lmembed.json
    plan.name = plan.where = name_or_path
    return plan


def read_preset(name_or_path: str, torch_int8: bool) -> LoadPlan | None:
    """2. A published family lmembed has a preset for (a Hub id, or a folder whose files name one)."""
    published = presets.resolve(name_or_path)
    if published is None:
        return None
    published.preset.check_reproducible(name_or_path)
    options = dict(published.preset.strategy)
    sources = dict.fromkeys(options, f"preset {published.preset.family}")
    own: dict[str, str] = {}  # what the folder's own llm2vec settings decided
    if published.preset.loader == "llm2vec" and Path(name_or_path).is_dir():
        saved = presets.llm2vec_settings(Path(name_or_path))
        options.update(saved)
        own = dict.fromkeys(saved, str(Path(name_or_path) / presets.LLM2VEC_CONFIG))
        sources.update(own)
    plan = LoadPlan(
        "preset",
        name_or_path,
        options=options,
        sources=sources,
        published=published,
        where=name_or_path,
        checkpoint_sources=own or None,
    )
    if published.preset.loader == "llm2vec":
        plan.loader = partial(_load_llm2vec, quantize=torch_int8)
    if published.preset.loader == "nvembed":  # the decoder and head of one NVEmbedModel file set
        plan.loader = plan.nvembed = _NVEmbedLoad()
    return plan


def read_sentence_transformers(name_or_path: str, torch_int8: bool) -> LoadPlan | None:
    """3. A local (or bundled) sentence-transformers folder, where no preset describes the family."""
    folder = _read_local_published(name_or_path)
    if folder is None:
        return None
    plan = LoadPlan("sentence-transformers", str(folder.model_dir), where=name_or_path)
    plan._read_folder(folder, "sentence-transformers")
    if name_or_path in BUNDLED:
        plan.name = name_or_path  # read from its sentence-transformers folder, still known by its bundled name
    return plan


def read_transformers(name_or_path: str, torch_int8: bool) -> LoadPlan:
    """4. Any transformers checkpoint: a folder or a Hub id (read as 3 once loaded, if its repository is a
    sentence-transformers model)."""
    return LoadPlan("transformers", name_or_path, where=name_or_path)


#: the readers, in the order they are tried (the last one always answers)
READERS: tuple[Callable[[str, bool], LoadPlan | None], ...] = (
    read_saved,
    read_preset,
    read_hub_saved,
    read_sentence_transformers,
    read_transformers,
)


def plan_load(name_or_path: str, *, torch_int8: bool = False) -> LoadPlan:
    """The plan of the first reader that recognises ``name_or_path`` (a run folder is read as the model in it)."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ModelLoadError(
            f"name_or_path={name_or_path!r}: give a bundled model's name, a local folder or a Hub id (a string)"
        )
    adapters = name_or_path not in BUNDLED and presets.is_adapter_stack(name_or_path)  # LLM2Vec: no config.json
    if name_or_path not in BUNDLED and Path(name_or_path).expanduser().exists() and not adapters:
        name_or_path = str(find_model_dir(Path(name_or_path).expanduser()))  # a run folder → its model
    for reader in READERS:
        plan = reader(name_or_path, torch_int8)
        if plan is not None:
            return plan
    raise AssertionError("read_transformers answers every name")  # pragma: no cover


# ---------------------------------------------------------------------------------------------- what the readers use


def _read_local_published(name_or_path: str) -> PublishedModel | None:
    """The conventions of a local (or bundled) sentence-transformers folder, if ``name_or_path`` is one."""
    folder = Path(resolve_bundled(name_or_path)) if name_or_path in BUNDLED else Path(name_or_path).expanduser()
    return read_published_folder(folder) if is_sentence_transformers_folder(folder) else None


def _download_saved_folder(name: str) -> Path | None:
    """The local snapshot of Hub repository ``name`` when it holds ``lmembed.json`` (None: ``name`` is a local path,
    a bundled model, no repository id, or a repository without one; an unreachable Hub is left to the transformers
    reader, which says so)."""
    if name in BUNDLED or Path(name).expanduser().exists() or not is_hub_id(name):
        return None
    from huggingface_hub import hf_hub_download, snapshot_download  # lazy: only Hub ids need it
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        record = Path(hf_hub_download(name, STRATEGY_FILE))
    except (EntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        return None  # not there, no such repository, or no Hub: not a saved folder lmembed can read
    try:  # the files it records, and nothing else the repository holds (a folder of format 1: all of them)
        files = read_json(record, kind=dict).get(FILES_KEY)
    except ValueError:
        files = None  # read again, and refused by name, as the snapshot's lmembed.json
    wanted = [STRATEGY_FILE, *map(glob.escape, files)] if isinstance(files, dict) else None
    return Path(snapshot_download(name, allow_patterns=wanted))


def _read_hub_published(repo_id: str) -> PublishedModel | None:
    """The conventions of Hub model ``repo_id`` when it is a sentence-transformers model."""
    folder = download_published_folder(repo_id)
    if folder is None:
        return None
    published = read_published_folder(folder)
    if published.model_dir != folder:
        raise ModelLoadError(
            f"{repo_id}: the Transformer module lives in {published.model_dir.name}/; download the repository and "
            "load the folder instead"
        )
    return published


def _as_recorded(value: Any) -> Any:
    """An option value as ``lmembed.json`` records it (JSON: tuples are lists)."""
    return json.loads(json.dumps(value)) if isinstance(value, tuple | list | dict) else value


def _warn_overrides(published: PublishedModel, given: dict[str, Any]) -> None:
    """One warning per option the caller gives that differs from the model's own convention (the caller wins)."""
    for option, value in given.items():
        own = published.options.get(option)
        if option in published.options and own != value:
            log.warning(
                "%s=%r (given) overrides the model's own %s=%r (from %s)",
                option,
                value,
                option,
                own,
                published.sources.get(option, published.root),
            )


def _published_head(published: PublishedModel, backbone: Backbone, strategy: dict[str, Any]) -> nn.Module | None:
    """The post-pooling head of a published model, with its weights (None when it has none)."""
    specs = strategy.get("head") or ()
    if not specs:
        return None
    head = PostPoolingHead(specs)
    for i, (spec, state) in enumerate(zip(specs, published.head_weights, strict=True)):
        if spec["type"] != "normalize":
            head.load_layer_state(i, state, str(published.root / spec["path"]))
    return head.to(device=backbone.device, dtype=backbone.dtype).eval()


def _adapt_tokenizer(backbone: Backbone, published: PublishedModel) -> None:
    """Tokenizer settings a published model decides beyond the strategy: the truncation side."""
    side = published.tokenizer_settings.get("truncation_side")
    if side is not None:
        backbone.tokenizer.truncation_side = side


def _read_saved(name_or_path: str) -> dict[str, Any] | None:
    """``lmembed.json`` of a saved folder, its strategy checked as a whole before anything is loaded (a refusal
    names the file and the option)."""
    path = Path(name_or_path) / STRATEGY_FILE
    if not path.exists():
        return None
    saved = read_json(path, error=ModelLoadError, what="saved strategy record", kind=None)
    if not isinstance(saved, dict) or not isinstance(saved.get("strategy"), dict):
        raise ModelLoadError(f"{path}: strategy: not an object of strategy options (not as Embedder.save writes it)")
    unknown = sorted(set(saved) - SAVED_KEYS)
    if unknown:
        raise ModelLoadError(
            f"{path}: {unknown[0]}: not a field of a saved strategy record (it holds {', '.join(sorted(SAVED_KEYS))})"
        )
    try:
        EmbeddingConfig.from_dict(saved["strategy"])
    except (ConfigError, TypeError) as exc:
        raise ModelLoadError(f"{path}: strategy: {exc}") from exc
    base = saved.get("base_model")
    if base is not None and (not isinstance(base, str) or not base or len(base) > 300 or not base.isprintable()):
        raise ModelLoadError(
            f"{path}: base_model={base!r:.80} must be the name of the model the folder was made from (a printable "
            "string of at most 300 characters)"
        )
    check_saved_files(Path(name_or_path), saved)
    return saved


def write_strategy_file(directory: Path, meta: dict[str, Any]) -> Path:
    """Write ``lmembed.json`` (``meta``: the strategy and what else the folder records) as the last file of a saved
    or exported folder, with the sha256 of every other file in it (``files``), so that a folder loads only as it was
    written: :func:`check_saved_files` checks them before anything in it is read. The model card is recorded apart
    (``card``: no loader reads it, and its user may edit it)."""
    skipped = {directory / STRATEGY_FILE, directory / CARD_FILE}
    files = {
        p.relative_to(directory).as_posix(): sha256_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p not in skipped
    }
    card = directory / CARD_FILE
    if card.is_file():
        meta = {**meta, CARD_KEY: sha256_file(card)}
    return atomic_write_text(
        directory / STRATEGY_FILE, json.dumps({"format": SAVED_FORMAT, **meta, FILES_KEY: files}, indent=2)
    )


def check_replaceable(directory: Path) -> None:
    """Saving or exporting replaces ``directory`` whole: allowed for a new or empty folder, or one lmembed saved or
    exported to that holds nothing its ``lmembed.json`` does not record; anything else is refused (its files would
    be lost), naming what is in the way. A file merely named ``lmembed.json`` does not make a folder replaceable."""
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise ConfigError(f"{directory}: not a folder; an Embedder is saved to a folder")
    if not directory.is_dir() or not any(directory.iterdir()):
        return
    record = directory / STRATEGY_FILE
    refusal = (
        f"{directory}: writing an Embedder replaces the folder whole, and %s; write to a new or empty folder, "
        "or to one an Embedder was saved or exported to"
    )
    try:
        saved = loads_json(record.read_bytes()) if record.is_file() and not record.is_symlink() else None
    except (OSError, ValueError):
        saved = None
    files = saved.get(FILES_KEY) if isinstance(saved, dict) and "strategy" in saved else None
    if not isinstance(files, dict):
        raise ConfigError(refusal % f"it holds files that are not a saved Embedder's ({record.name} records none)")
    others = sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if (path.is_symlink() or not path.is_dir()) and path != record
    )
    own_card = isinstance(saved.get(CARD_KEY), str) and (directory / CARD_FILE).is_file()
    if own_card and sha256_file(directory / CARD_FILE) == saved[CARD_KEY]:  # lmembed's card, unedited
        others.remove(CARD_FILE)
    elif own_card:
        raise ConfigError(
            f"{directory}: its {CARD_FILE} was edited since lmembed wrote it ({record.name} records the card's "
            "sha256), and writing an Embedder replaces the folder whole: keep the edits elsewhere first, or write to "
            "a new folder"
        )
    if lost := [name for name in others if name not in files]:
        shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
        raise ConfigError(refusal % f"it holds files its {record.name} does not record, which would be lost: {shown}")


def check_saved_files(folder: Path, saved: dict[str, Any]) -> None:
    """Every file ``lmembed.json`` records lies in ``folder`` with its sha256, and the folder holds no other file a
    loader could read (only a card, a licence or hidden files may be added); else :class:`ModelLoadError` naming
    the file. A folder saved before lmembed recorded its files (format 1) loads with a warning."""
    record = folder / STRATEGY_FILE
    version = saved.get("format", 1)
    if version not in (1, SAVED_FORMAT) or isinstance(version, bool):
        raise ModelLoadError(
            f"{record}: format={version!r}: this lmembed reads formats 1 and {SAVED_FORMAT}; the folder was written "
            "by another version"
        )
    if version == 1 and FILES_KEY not in saved:
        log.warning(
            "%s was saved before lmembed recorded the sha256 of a saved folder's files: damaged files cannot be "
            "detected; save it again to record them",
            folder,
        )
        return
    files = saved.get(FILES_KEY)
    if files is None:
        raise ModelLoadError(f"{record}: {FILES_KEY} is missing; a saved folder records the sha256 of its files")
    check_recorded_files(
        folder, record, files, sorted(files) if isinstance(files, dict) else [], key=FILES_KEY, error=ModelLoadError
    )
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts) or path.is_dir() or path == record:
            continue
        if relative.as_posix() not in files and relative.as_posix() not in UNRECORDED_OK:
            raise ModelLoadError(
                f"{path}: a file {record} does not record ({FILES_KEY}); a saved folder is loaded only with the files "
                "it was saved with"
            )


def _check_saved_kind(directory: str, saved: dict[str, Any], backbone: Backbone) -> None:
    """The saved ``is_decoder`` must match what the loaded model is; otherwise the saved strategy was
    recorded for a different kind of model (older lmembed versions took GPT-NeoX, Falcon, StableLM,
    OLMo ... for encoders) and its vectors cannot be reproduced."""
    recorded = saved.get("is_decoder")
    if recorded is not None and not isinstance(recorded, bool):
        raise ModelLoadError(f"{Path(directory) / STRATEGY_FILE}: is_decoder={recorded!r} must be true or false")
    if recorded is None or recorded == backbone.is_decoder:
        return
    raise ModelLoadError(
        f"{Path(directory) / STRATEGY_FILE} records {_kind(recorded)}, but the saved model "
        f"(model_type={backbone.model_type!r}) is {_kind(backbone.is_decoder)}; the strategy was saved for "
        "a misclassified model and its vectors cannot be reproduced: wrap the base model again and save it anew"
    )


def _kind(is_decoder: bool) -> str:
    return "a decoder (causal attention)" if is_decoder else "an encoder (bidirectional attention)"


def _load_llm2vec(name_or_path: str, *, quantize: bool, **kwargs: Any) -> Backbone:
    """An LLM2Vec checkpoint: base model + MNTP adapter + supervised adapter (:mod:`lmembed.models.adapters`); or
    a folder ``LLM2Vec.save(merge_before_save=True)`` wrote, whose weights are the merged model itself (no
    ``adapter_config.json``), read as any transformers folder."""
    folder = Path(name_or_path)
    if folder.is_dir() and presets.adapter_base(folder) is None and (folder / "config.json").is_file():
        return load_backbone(name_or_path, quantize="int8" if quantize else None, **kwargs)
    if quantize:
        raise ConfigError("torch int8 is not available for an adapter stack (LLM2Vec); use backend='onnx'")
    keep = {k: kwargs[k] for k in ("dtype", "device", "attn_implementation")}
    return load_adapter_stack(name_or_path, **keep)


class _NVEmbedLoad:
    """Loads an NV-Embed checkpoint as a backbone (:func:`load_nvembed`), keeping its head's tensors for
    :meth:`head`."""

    checkpoint: NVEmbedCheckpoint

    def __call__(self, name_or_path: str, *, exact_tokenizer: bool, **kwargs: Any) -> Backbone:
        self.checkpoint = load_nvembed(name_or_path, **kwargs)
        return self.checkpoint.backbone

    def head(self, backbone: Backbone, strategy: dict[str, Any]) -> nn.Module | None:
        cfg = EmbeddingConfig.from_dict(strategy)
        if cfg.pooling != "latent_attention":
            return None
        head = build_latent_head(backbone.hidden_size, cfg.latent)
        try:
            head.load_state_dict(self.checkpoint.head_state)
        except RuntimeError as exc:
            raise ModelLoadError(f"{backbone.path}: latent_attention_model.* does not fit its config: {exc}") from exc
        return head.to(device=backbone.device, dtype=backbone.dtype).eval()


def _load_head(
    directory: str, backbone: Backbone, strategy: dict[str, Any], *, recorded_latent: bool = False
) -> nn.Module | None:
    """The head the final ``strategy`` pools with: a post-pooling head's layers, or the latent-attention head the
    folder holds (``recorded_latent``: its own strategy pools with one, so its weights must be there)."""
    if strategy.get("head"):  # a published model's post-pooling head, saved in sentence-transformers' layout
        for i, spec in enumerate(strategy["head"]):  # sizes against the weights, before any layer is built
            if spec["type"] != "normalize":
                layer = inside(
                    directory, spec["path"], file=Path(directory) / STRATEGY_FILE, field=f"strategy.head[{i}].path"
                )
                check_head_shapes(spec, layer, Path(directory) / STRATEGY_FILE)
        head = PostPoolingHead(strategy["head"])
        for i, spec in enumerate(head.specs):
            if spec["type"] != "normalize":  # a head layer's folder must lie inside the model folder
                layer = inside(
                    directory, spec["path"], file=Path(directory) / STRATEGY_FILE, field=f"strategy.head[{i}].path"
                )
                head.load_layer_state(i, load_weights(layer), str(layer))
        return head.to(device=backbone.device, dtype=backbone.dtype).eval()
    strategy_file = Path(directory) / STRATEGY_FILE
    if not (Path(directory) / HEAD_FILE).exists() and not (Path(directory) / HEAD_FILE).is_symlink():
        if recorded_latent:  # an untrained head would pool: refused, never approximated
            raise ModelLoadError(
                f"{strategy_file}: strategy.pooling is 'latent_attention', but the head's trained weights "
                f"({HEAD_FILE}) are not in {directory}"
            )
        return None
    path = inside(directory, HEAD_FILE, file=strategy_file, field=HEAD_FILE, error=ModelLoadError)
    cfg = EmbeddingConfig.from_dict(strategy)
    return _load_latent_head(path, backbone, cfg)


def _load_latent_head(path: Path, backbone: Backbone, cfg: EmbeddingConfig) -> nn.Module:
    """The latent-attention head of ``cfg`` with the weights of ``path``: the file's tensor names and shapes are
    checked against the head's (built on the meta device: nothing allocated) before any tensor is read, and every
    value must be finite; :class:`ModelLoadError` names the file and the tensor otherwise."""
    try:
        with torch.device("meta"):
            shapes = build_latent_head(backbone.hidden_size, cfg.latent).state_dict()
    except ConfigError as exc:  # the saved strategy's head cannot be built on this model (num_heads not dividing)
        raise ModelLoadError(f"{path.parent / STRATEGY_FILE}: strategy.latent: {exc}") from exc
    expected = {name: tuple(t.shape) for name, t in shapes.items()}
    recorded = read_safetensors_header(path)
    if set(recorded) != set(expected):
        missing, extra = sorted(set(expected) - set(recorded)), sorted(set(recorded) - set(expected))
        raise ModelLoadError(
            f"{path}: not the weights of this head (missing: {missing or 'none'}; unknown: {extra or 'none'})"
        )
    for name, shape in expected.items():
        if recorded[name] != shape:
            raise ModelLoadError(
                f"{path}: tensor {name!r} has shape {list(recorded[name])}; the strategy's head needs {list(shape)}"
            )
    weights = load_weights_file(path)
    for name, tensor in weights.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"{path}: tensor {name!r} is not finite floating-point weights ({tensor.dtype})")
    head = build_latent_head(backbone.hidden_size, cfg.latent)
    head.load_state_dict(weights)
    return head.to(device=backbone.device, dtype=backbone.dtype).eval()
