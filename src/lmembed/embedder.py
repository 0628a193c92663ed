"""The public entry point: ``Embedder`` = backbone + extraction strategy (+ optional pooling head).

    >>> from lmembed import Embedder
    >>> emb = Embedder.from_pretrained("minilm")
    >>> vectors = emb.encode(["a sentence", "another one"])

``save(dir)`` writes the backbone, the tokenizer, the strategy (``lmembed.json``), a trained pooling
head, and — where the strategy is one sentence-transformers can express — the files that let
``SentenceTransformer(dir)`` load the same model and give the same vectors.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lmembed.atomic import atomic_write_text
from lmembed.config import EmbeddingConfig
from lmembed.encoding.backends import Backend, make_backend
from lmembed.encoding.engine import EncodingEngine, resolve_max_length
from lmembed.encoding.inputs import wants_eos
from lmembed.errors import ConfigError, ModelLoadError
from lmembed.models import presets
from lmembed.models.adapters import load_adapter_stack
from lmembed.models.attention import check_bidirectional_supported
from lmembed.models.bundled import BUNDLED
from lmembed.models.loading import Backbone, backbone_from_model, find_model_dir, load_backbone
from lmembed.pooling.latent_attention import LatentAttentionPooling

log = logging.getLogger(__name__)

STRATEGY_FILE = "lmembed.json"
HEAD_FILE = "pooling_head.safetensors"
FORMAT_VERSION = 1
ST_POOLING_MODES = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "last": "pooling_mode_lasttoken",
    "weighted_mean": "pooling_mode_weightedmean_tokens",
}


def postprocess(raw: np.ndarray, config: EmbeddingConfig) -> np.ndarray:
    """Matryoshka truncation to ``config.dim``, then L2 normalisation if asked."""
    out = raw[:, : config.dim] if config.dim else raw
    out = np.ascontiguousarray(out, dtype=np.float32)
    if config.normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
    return out.astype(np.float32, copy=False)


def check_strategy(backbone: Backbone, config: EmbeddingConfig) -> None:
    """Refuse a strategy this backbone cannot honour, before anything is encoded or labelled with it."""
    hidden = backbone.hidden_size
    if config.dim is not None and config.dim > hidden:
        raise ConfigError(
            f"dim={config.dim} is larger than the model's hidden size ({hidden}); Matryoshka truncation can only "
            f"shorten vectors: choose dim <= {hidden} or leave it unset"
        )
    if backbone.is_decoder and config.attention == "bidirectional":
        check_bidirectional_supported(backbone.model)


def default_max_length(path: str, requested: int | None) -> int:
    """The model's own sequence limit where it declares one (sentence-transformers config), else 512."""
    if requested is not None:
        return requested
    st_config = Path(path) / "sentence_bert_config.json" if path else None
    if st_config is not None and st_config.exists():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if isinstance(value, int):
            return value
    return 512


class Embedder:
    """A text-embedding model: a transformer backbone read out with one extraction strategy."""

    published: presets.Resolution | None = None  # the published family it was loaded as (from_pretrained)

    def __init__(
        self,
        backbone: Backbone,
        config: EmbeddingConfig | None = None,
        *,
        pooling_head: nn.Module | None = None,
        use_cache: bool = True,
        cache_dir: str | Path | None = None,
        show_progress: bool = True,
        backend: str | Backend | None = None,
        precision: str | None = None,
        threads: int | None = None,
        max_batch_tokens: int | None = None,
    ) -> None:
        self.backbone = backbone
        self.config = config or EmbeddingConfig()
        if self.config.max_length is None:
            limit = resolve_max_length(backbone, default_max_length(backbone.path, None))
            self.config = self.config.with_options(max_length=limit)
        if not backbone.is_decoder and self.config.attention != "bidirectional":
            # Encoders always attend bidirectionally; record what really happens.
            self.config = self.config.with_options(attention="bidirectional")
        check_strategy(backbone, self.config)
        if self.config.pooling == "latent_attention" and pooling_head is None:
            pooling_head = LatentAttentionPooling(backbone.hidden_size, self.config.latent)
            pooling_head.to(device=backbone.device, dtype=backbone.dtype)
        self.pooling_head = pooling_head
        if not isinstance(backend, Backend):
            backend = make_backend(backbone, backend, precision, threads=threads)
        self.engine = EncodingEngine(
            backbone,
            pooling_head=pooling_head,
            cache_dir=cache_dir,
            use_cache=use_cache,
            show_progress=show_progress,
            backend=backend,
            max_batch_tokens=max_batch_tokens,
        )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooling: str | None = None,
        layer: int | Sequence[int] | None = None,
        attention: str | None = None,
        echo: bool | None = None,
        normalize: bool | None = None,
        dim: int | None = None,
        max_length: int | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        cache: bool = True,
        cache_dir: str | Path | None = None,
        show_progress: bool = True,
        attn_implementation: str | None = "sdpa",
        quantize: str | None = None,
        backend: str | None = None,
        precision: str | None = None,
        threads: int | None = None,
        max_batch_tokens: int | None = None,
        config: EmbeddingConfig | None = None,
        **strategy: Any,
    ) -> Embedder:
        """Load a bundled name (``minilm``, ``smollm2-135m``, ``gemma3-270m``), a directory (a saved
        Embedder or any transformers checkpoint) or a Hub id.

        ``backend`` runs the transformer: ``"torch"`` (default; the reference, CPU or GPU) or ``"onnx"`` (ONNX
        Runtime on the CPU: the model is exported once, cached, and run as a fused graph; vectors agree with
        torch's to cosine >= 0.9999). ``precision="int8"`` quantises (on ONNX Runtime unless
        ``backend="torch"``, which uses torch's dynamic int8): it is calibrated on the first texts encoded (or
        on :meth:`calibrate`'s) and checked by a quality gate that warns with the gap when int8 vectors drift
        from float32 ones; on ONNX Runtime each token row is quantised on its own range, so an int8 vector does not
        depend on which texts share its batch beyond float32's own rounding (none for minilm; up to ~1e-2 for a
        left-padded decoder, ``bench/int8_products.py --graphs``). ``quantize="int8"`` is the older spelling of
        ``precision="int8"``. ``threads`` sets the ONNX Runtime threads (default: torch's); ``max_batch_tokens``
        bounds batches by padded tokens as well as by ``batch_size``.

        Strategy options left as ``None`` come from a saved Embedder's ``lmembed.json`` when there
        is one, else from :class:`EmbeddingConfig`'s defaults (mean pooling, last layer, causal,
        normalised, the model's own max length).
        """
        adapters = name_or_path not in BUNDLED and presets.is_adapter_stack(name_or_path)  # LLM2Vec: no config.json
        if name_or_path not in BUNDLED and Path(name_or_path).expanduser().exists() and not adapters:
            name_or_path = str(find_model_dir(Path(name_or_path).expanduser()))  # a run folder → its model
        saved = _read_saved(name_or_path)
        published = None if saved else presets.resolve(name_or_path)  # a published family's conventions
        if published:
            published.preset.check_reproducible(name_or_path)
        if quantize is not None:
            if quantize != "int8":
                raise ConfigError(f"quantize={quantize!r} is unknown; the only scheme is 'int8'")
            precision = precision or "int8"
        torch_int8 = precision == "int8" and backend == "torch"
        load = load_backbone
        if published and published.preset.loader == "llm2vec":
            load = partial(_load_llm2vec, quantize=torch_int8)
        backbone = load(
            name_or_path,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            quantize="int8" if torch_int8 else None,
            exact_tokenizer=saved is not None,
        )
        if saved:
            _check_saved_kind(name_or_path, saved, backbone)
        options = dict(saved["strategy"]) if saved else dict(published.preset.strategy) if published else {}
        given = {
            "pooling": pooling,
            "layer": tuple(layer) if isinstance(layer, list | tuple) else layer,
            "attention": attention,
            "echo": echo,
            "normalize": normalize,
            "dim": dim,
            "max_length": max_length,
            **strategy,
        }
        given = {k: v for k, v in given.items() if v is not None}
        if published:
            presets.warn_overrides(published, given)
        options.update(given)
        base = config.to_dict() if config else {}
        base.update(options)
        head = _load_head(name_or_path, backbone, base) if saved else None
        embedder = cls(
            backbone,
            EmbeddingConfig.from_dict(base),
            pooling_head=head,
            use_cache=cache,
            cache_dir=cache_dir,
            show_progress=show_progress,
            backend=backend,
            precision=precision,
            threads=threads,
            max_batch_tokens=max_batch_tokens,
        )
        embedder.published = published
        return embedder

    @classmethod
    def from_model(
        cls, model: nn.Module, tokenizer: Any, config: EmbeddingConfig | None = None, **kwargs: Any
    ) -> Embedder:
        """Wrap an in-memory transformers model (e.g. a tiny random model in a test)."""
        return cls(backbone_from_model(model, tokenizer), config, **kwargs)

    # ------------------------------------------------------------------ encoding
    @property
    def backend(self) -> Backend:
        """What runs the transformer (``backend.name``, ``backend.precision``; int8's ``backend.quality``)."""
        return self.engine.backend

    def calibrate(self, texts: Sequence[str]) -> Embedder:
        """Calibrate an int8 Embedder on ``texts`` (a few hundred of your own; a quarter is held out for the
        quality gate) instead of on the first texts it encodes. No effect at other precisions."""
        self.engine.backend.calibrate(list(texts))
        return self

    @property
    def dim(self) -> int:
        return self.config.dim or self.backbone.hidden_size

    @property
    def name(self) -> str:
        return self.backbone.name

    def encode(self, texts: Sequence[str], batch_size: int = 32, *, instruction: str | None = None) -> np.ndarray:
        """Embed texts as they are (with ``instruction`` kept out of pooling if given)."""
        raw = self.engine.encode_raw(texts, [self.config], instruction=instruction, batch_size=batch_size)[0]
        return postprocess(raw, self.config)

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32
    ) -> np.ndarray:
        """Embed queries; ``instruction`` (or the strategy's ``query_instruction``) is prepended."""
        return self.encode(texts, batch_size, instruction=instruction or self.config.query_instruction)

    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """Embed documents (never with an instruction)."""
        return self.encode(texts, batch_size)

    def encode_strategies(
        self,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None = None,
        batch_size: int = 32,
    ) -> list[np.ndarray]:
        """Embed with several strategies at once, sharing forward passes where they can."""
        for cfg in configs:
            check_strategy(self.backbone, cfg)
        raws = self.engine.encode_raw(texts, configs, instruction=instruction, batch_size=batch_size)
        return [postprocess(raw, cfg) for raw, cfg in zip(raws, configs, strict=True)]

    def with_config(self, config: EmbeddingConfig) -> Embedder:
        """The same backbone (no reload) read out with another strategy."""
        check_strategy(self.backbone, config)
        clone = object.__new__(Embedder)
        clone.__dict__.update(self.__dict__)
        clone.config = config
        return clone

    # ------------------------------------------------------------------ saving
    def export(self, directory: str | Path, format: str = "onnx", *, calibration: Sequence[str] | None = None) -> Path:
        """Write a deployable graph of this Embedder's strategy to ``directory``: ``model.onnx`` returns exactly the
        hidden states the strategy pools (pooling stays in lmembed), with ``manifest.json`` (what it was built from;
        for int8 the quality-gate report), the tokenizer and ``lmembed.json`` (the strategy). The graph comes from
        the export cache (built there first if absent), so ``backend="onnx"`` runs this very graph. ``directory``
        is filled under a temporary name and renamed into place. int8 needs ``calibration`` texts (or a
        previous :meth:`calibrate`)."""
        if format != "onnx":
            raise ConfigError(f"format={format!r} is unknown; the only export format is 'onnx'")
        backend = self.engine.backend
        if backend.name != "onnx":
            raise ConfigError("export needs an Embedder loaded with backend='onnx' (or precision='int8')")
        if calibration is not None:
            self.calibrate(calibration)
        source = self.engine.prepare_backend([self.config])
        return _copy_export(source, Path(directory), self)

    def save(
        self,
        directory: str | Path,
        *,
        backbone_state: dict[str, Tensor] | None = None,
        head_state: dict[str, Tensor] | None = None,
    ) -> Path:
        """Write everything needed to reload this Embedder exactly (see the module doc).

        ``backbone_state`` and ``head_state`` are whole tensors to write instead of the modules' own state
        dicts (a model sharded over processes is saved from its gathered state this way).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model = self.backbone.model
        model.save_pretrained(directory, state_dict=backbone_state)
        self.backbone.tokenizer.save_pretrained(directory)
        if self.pooling_head is not None:
            head = self.pooling_head.state_dict() if head_state is None else head_state
            state = {k: v.detach().cpu().contiguous() for k, v in head.items()}
            save_file(state, str(directory / HEAD_FILE))
        meta = {
            "format": FORMAT_VERSION,
            "base_model": self.backbone.name,
            "is_decoder": self.backbone.is_decoder,
            "strategy": self.config.to_dict(),
        }
        atomic_write_text(directory / STRATEGY_FILE, json.dumps(meta, indent=2))
        if self.sentence_transformers_compatible():
            self._write_sentence_transformers_files(directory)
        return directory

    def sentence_transformers_compatible(self) -> bool:
        """True when sentence-transformers can reproduce this strategy exactly."""
        cfg = self.config
        uses_eos = wants_eos(cfg, self.backbone.is_decoder)
        return (
            cfg.pooling in ST_POOLING_MODES
            and cfg.layers == (-1,)
            and cfg.final_norm is None
            and not cfg.echo
            and not (self.backbone.is_decoder and cfg.attention == "bidirectional")
            and not uses_eos
            and cfg.dim is None
            and not cfg.plain_prefix
            and cfg.pool_special_tokens
        )

    def _write_sentence_transformers_files(self, directory: Path) -> None:
        cfg = self.config
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        if cfg.normalize:
            modules.append(
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
            )
            (directory / "2_Normalize").mkdir(exist_ok=True)
        pooling = {"word_embedding_dimension": self.backbone.hidden_size, "include_prompt": False}
        pooling.update({mode: name == cfg.pooling for name, mode in ST_POOLING_MODES.items()})
        pooling.update({"pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})
        (directory / "1_Pooling").mkdir(exist_ok=True)
        max_length = resolve_max_length(self.backbone, cfg.max_length)
        files = {
            "modules.json": modules,
            "1_Pooling/config.json": pooling,
            "sentence_bert_config.json": {"max_seq_length": max_length, "do_lower_case": False},
        }
        if cfg.query_instruction:
            prompt = cfg.instruction_template.format(instruction=cfg.query_instruction)
            files["config_sentence_transformers.json"] = {"prompts": {"query": prompt, "document": ""}}
        for name, content in files.items():
            atomic_write_text(directory / name, json.dumps(content, indent=2))


def _copy_export(source: Path, directory: Path, embedder: Embedder) -> Path:
    """Fill ``directory`` with the export folder ``source`` + tokenizer + strategy, atomically (temporary sibling,
    then one rename; an existing ``directory`` is replaced only once the new one is complete)."""
    directory = directory.expanduser().resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}-", dir=directory.parent))
    try:
        for item in source.iterdir():
            shutil.copy2(item, tmp / item.name)
        embedder.backbone.tokenizer.save_pretrained(tmp)
        meta = {
            "format": FORMAT_VERSION,
            "base_model": embedder.backbone.name,
            "is_decoder": embedder.backbone.is_decoder,
            "strategy": embedder.config.to_dict(),
            "backend": embedder.backend.describe(),
        }
        atomic_write_text(tmp / STRATEGY_FILE, json.dumps(meta, indent=2))
        if directory.exists():
            old = directory.with_name(f".old-{directory.name}-{tmp.name[-8:]}")
            directory.rename(old)
            tmp.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def _read_saved(name_or_path: str) -> dict[str, Any] | None:
    path = Path(name_or_path) / STRATEGY_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: line {exc.lineno}: invalid JSON ({exc.msg})") from exc


def _check_saved_kind(directory: str, saved: dict[str, Any], backbone: Backbone) -> None:
    """The saved ``is_decoder`` must match what the loaded model is; otherwise the saved strategy was
    recorded for a different kind of model (older lmembed versions took GPT-NeoX, Falcon, StableLM,
    OLMo ... for encoders) and its vectors cannot be reproduced."""
    recorded = saved.get("is_decoder")
    if not isinstance(recorded, bool) or recorded == backbone.is_decoder:
        return
    raise ModelLoadError(
        f"{Path(directory) / STRATEGY_FILE} records {_kind(recorded)}, but the saved model "
        f"(model_type={backbone.model_type!r}) is {_kind(backbone.is_decoder)}; the strategy was saved for "
        "a misclassified model and its vectors cannot be reproduced: wrap the base model again and save it anew"
    )


def _kind(is_decoder: bool) -> str:
    return "a decoder (causal attention)" if is_decoder else "an encoder (bidirectional attention)"


def _load_llm2vec(name_or_path: str, *, quantize: bool, **kwargs: Any) -> Backbone:
    """An LLM2Vec checkpoint: base model + MNTP adapter + supervised adapter (:mod:`lmembed.models.adapters`)."""
    if quantize:
        raise ConfigError("torch int8 is not available for an adapter stack (LLM2Vec); use backend='onnx'")
    keep = {k: kwargs[k] for k in ("dtype", "device", "attn_implementation")}
    return load_adapter_stack(name_or_path, **keep)


def _load_head(directory: str, backbone: Backbone, strategy: dict[str, Any]) -> nn.Module | None:
    path = Path(directory) / HEAD_FILE
    if not path.exists():
        return None
    cfg = EmbeddingConfig.from_dict(strategy)
    head = LatentAttentionPooling(backbone.hidden_size, cfg.latent)
    head.load_state_dict(load_file(str(path)))
    return head.to(device=backbone.device, dtype=backbone.dtype).eval()
