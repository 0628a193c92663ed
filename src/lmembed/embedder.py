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
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lmembed.atomic import atomic_folder, atomic_write_text
from lmembed.config import EmbeddingConfig, for_side
from lmembed.encoding.backends import Backend, make_backend
from lmembed.encoding.chunking import ChunkedEmbeddings, Chunking, split_documents
from lmembed.encoding.engine import EncodingEngine, resolve_max_length
from lmembed.encoding.inputs import validate_texts, wants_eos
from lmembed.errors import ConfigError, ModelLoadError
from lmembed.models import presets
from lmembed.models.adapters import load_adapter_stack
from lmembed.models.attention import check_bidirectional_supported
from lmembed.models.bundled import BUNDLED, resolve_bundled
from lmembed.models.context import PositionInterpolationError, interpolate_positions
from lmembed.models.loading import Backbone, backbone_from_model, find_model_dir, load_backbone
from lmembed.models.nvembed import NVEmbedCheckpoint, load_nvembed
from lmembed.models.sentence_transformers_folder import (
    ACTIVATION_PATHS,
    PublishedModel,
    apply_lowercase,
    download_published_folder,
    is_sentence_transformers_folder,
    load_weights,
    read_published_folder,
)
from lmembed.pooling.head import PostPoolingHead
from lmembed.pooling.latent_attention import build_latent_head

log = logging.getLogger(__name__)

STRATEGY_FILE = "lmembed.json"
HEAD_FILE = "pooling_head.safetensors"
FORMAT_VERSION = 1
ST_POOLING_MODES = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "last": "pooling_mode_lasttoken",
    "weighted_mean": "pooling_mode_weightedmean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
}


def postprocess(raw: np.ndarray, config: EmbeddingConfig) -> np.ndarray:
    """Matryoshka truncation to ``config.dim``, then L2 normalisation if asked."""
    out = raw[:, : config.dim] if config.dim else raw
    out = np.ascontiguousarray(out, dtype=np.float32)
    if config.normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
    return out.astype(np.float32, copy=False)


def check_strategy(backbone: Backbone, config: EmbeddingConfig, width: int | None = None) -> None:
    """Refuse a strategy this backbone cannot honour, before anything is encoded or labelled with it (``width``:
    the pooled vectors' width where a post-pooling head changes it)."""
    hidden = width or backbone.hidden_size
    if config.dim is not None and config.dim > hidden:
        what = "hidden size" if width is None else "vector width"
        raise ConfigError(
            f"dim={config.dim} is larger than the model's {what} ({hidden}); Matryoshka truncation can only "
            f"shorten vectors: choose dim <= {hidden} or leave it unset"
        )
    if backbone.is_decoder and config.attention == "bidirectional":
        check_bidirectional_supported(backbone.model)


def check_chunk_fits(backbone: Backbone, config: EmbeddingConfig, chunking: Chunking) -> None:
    """Raise :class:`ConfigError` when a chunk of ``chunking.tokens`` text tokens plus the special tokens would
    be truncated at the strategy's ``max_length``."""
    limit = resolve_max_length(backbone, config.max_length)
    special = len(backbone.tokenizer("", add_special_tokens=True)["input_ids"])
    if chunking.tokens + special > limit:
        raise ConfigError(
            f"chunk tokens={chunking.tokens} (+{special} special) exceed the strategy's max_length={limit}; "
            "use smaller chunks or a larger max_length"
        )


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


class Executor(Protocol):
    """What runs an Embedder's encoding: :class:`LocalExecutor` (its own engine, in this process) or a sharded
    job on a cluster (``lmembed.scale.ShardedExecutor``). Returns one postprocessed matrix per strategy;
    ``corpus`` marks documents (an executor may store those differently)."""

    def run(
        self,
        embedder: Embedder,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None,
        batch_size: int,
        corpus: bool = False,
    ) -> list[np.ndarray]: ...


class LocalExecutor:
    """Encodes with the Embedder's own :class:`~lmembed.encoding.engine.EncodingEngine`, in this process."""

    def run(
        self,
        embedder: Embedder,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None,
        batch_size: int,
        corpus: bool = False,
    ) -> list[np.ndarray]:
        raws = embedder.engine.encode_raw(texts, configs, instruction=instruction, batch_size=batch_size)
        return [postprocess(raw, cfg) for raw, cfg in zip(raws, configs, strict=True)]


LOCAL = LocalExecutor()


class Embedder:
    """A text-embedding model: a transformer backbone read out with one extraction strategy, encoded by an
    :class:`Executor` (this process by default).

    ``engine`` shares the :class:`~lmembed.encoding.engine.EncodingEngine` of another Embedder over the same
    backbone (its head, cache and backend too: nothing is rebuilt, ``config`` is taken as given); that is how
    :meth:`with_config` and :meth:`with_executor` make their Embedders.
    """

    published: presets.Resolution | None = None  # the published family it was loaded as (from_pretrained)
    published_folder: PublishedModel | None = None  # the sentence-transformers folder it was read from
    checkpoint_sources: dict[str, str] | None = None  # fields a published checkpoint's own files decided (NV-Embed)

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
        engine: EncodingEngine | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.backbone = backbone
        self.executor = executor or LOCAL
        if engine is not None:
            self.config = config or EmbeddingConfig()
            check_strategy(backbone, self.config, _head_width(pooling_head, backbone, self.config))
            self.pooling_head, self.engine = pooling_head, engine
            return
        self.config = config or EmbeddingConfig()
        if self.config.max_length is None:
            limit = resolve_max_length(backbone, default_max_length(backbone.path, None))
            self.config = self.config.with_options(max_length=limit)
        if not backbone.is_decoder and self.config.attention != "bidirectional":
            # Encoders always attend bidirectionally; record what really happens.
            self.config = self.config.with_options(attention="bidirectional")
        if self.config.head and pooling_head is None:
            raise ConfigError("the strategy has a post-pooling head but no head weights were given (pooling_head)")
        check_strategy(backbone, self.config, _head_width(pooling_head, backbone, self.config))
        if self.config.pooling == "latent_attention" and pooling_head is None:
            pooling_head = build_latent_head(backbone.hidden_size, self.config.latent)
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
        rope_scale: float | None = None,
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
        bounds batches by padded tokens as well as by ``batch_size``. ``rope_scale`` (> 1) interpolates a RoPE
        decoder's positions linearly (:func:`lmembed.models.context.interpolate_positions`: Llama, Mistral, Qwen2,
        Qwen3) so that ``rope_scale`` times its trained window can be read; other models refuse it.

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
        # a sentence-transformers folder's own files, where no preset describes the family
        folder = None if saved or published else _read_local_published(name_or_path)
        if quantize is not None:
            if quantize != "int8":
                raise ConfigError(f"quantize={quantize!r} is unknown; the only scheme is 'int8'")
            precision = precision or "int8"
        torch_int8 = precision == "int8" and backend == "torch"
        load = load_backbone
        if published and published.preset.loader == "llm2vec":
            load = partial(_load_llm2vec, quantize=torch_int8)
        nvembed = None
        if published and published.preset.loader == "nvembed":  # the decoder and head of one NVEmbedModel file set
            load = nvembed = _NVEmbedLoad()
        backbone = load(
            str(folder.model_dir) if folder else name_or_path,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            quantize="int8" if torch_int8 else None,
            exact_tokenizer=saved is not None,
        )
        if rope_scale is not None:
            _interpolate(backbone, rope_scale)
        if folder and name_or_path in BUNDLED:
            backbone.name = name_or_path  # read from its sentence-transformers folder, still known by its bundled name
        if saved:
            _check_saved_kind(name_or_path, saved, backbone)
        if not saved and not published and not folder and not Path(backbone.path).exists():
            folder = _read_hub_published(backbone.path)
        options = dict(saved["strategy"]) if saved else dict(published.preset.strategy) if published else {}
        if folder:
            options = dict(folder.options)
        if nvembed:
            options.update(nvembed.checkpoint.strategy)
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
        if folder:
            _warn_overrides(folder, given)
        options.update(given)
        base = config.to_dict() if config else {}
        base.update(options)
        head = _load_head(name_or_path, backbone, base) if saved else None
        if folder:
            head = _published_head(folder, backbone, base)
            _adapt_tokenizer(backbone, folder)
        if nvembed:
            head = nvembed.head(backbone, base)
        if base.get("lowercase"):
            apply_lowercase(backbone.tokenizer)
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
        embedder.published_folder = folder  # what a sentence-transformers folder decided, and which file did
        if nvembed:
            embedder.checkpoint_sources = nvembed.checkpoint.sources
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
        return self.config.dim or self.engine.output_dim(self.config)

    @property
    def name(self) -> str:
        return self.backbone.name

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        *,
        instruction: str | None = None,
        prompt_name: str | None = None,
    ) -> np.ndarray:
        """Embed texts as they are (with ``instruction`` kept out of pooling if given). A published model's
        prompt can be named (``prompt_name``, one of ``config.prompts``); without either, its default prompt
        (``default_prompt_name``) applies, as in sentence-transformers' ``encode``."""
        if instruction is None:
            instruction = self.config.named_prompt(prompt_name)
        return self._encode_as(texts, batch_size, instruction, self.config)

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32
    ) -> np.ndarray:
        """Embed queries; ``instruction`` (or the strategy's ``query_instruction``: a published model's query
        prompt) is prepended."""
        config, prefix = for_side(self.config, "query", instruction)
        return self._encode_as(texts, batch_size, prefix, config)

    @overload
    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32, chunking: None = None) -> np.ndarray: ...

    @overload
    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32, chunking: Chunking) -> ChunkedEmbeddings: ...

    def encode_corpus(
        self, texts: Sequence[str], *, batch_size: int = 32, chunking: Chunking | None = None
    ) -> np.ndarray | ChunkedEmbeddings:
        """Embed documents: with the strategy's ``document_instruction`` (a published model's document prompt)
        where it has one, else as they are (truncated at ``max_length``).

        With ``chunking`` (:class:`~lmembed.encoding.chunking.Chunking`) each document is cut into token windows
        and the chunks are embedded (apart, or with ``late=True`` pooled from one forward pass over the document):
        the result is a :class:`~lmembed.encoding.chunking.ChunkedEmbeddings`, whose ``document_scores(queries)``
        scores documents by their first chunk, best chunk (MaxP) or the chunks' mean."""
        config, prefix = for_side(self.config, "document")
        if chunking is None:
            return self._encode_as(texts, batch_size, prefix, config, corpus=True)
        return self.encode_chunks(texts, chunking, config=config, instruction=prefix, batch_size=batch_size)

    def encode_chunks(
        self,
        texts: Sequence[str],
        chunking: Chunking,
        *,
        config: EmbeddingConfig | None = None,
        instruction: str | None = None,
        batch_size: int = 32,
    ) -> ChunkedEmbeddings:
        """Chunk vectors of ``texts`` under ``config`` (this Embedder's strategy by default): see
        :meth:`encode_corpus`."""
        config = config or self.config
        texts = validate_texts(texts)
        if chunking.late:
            raw, doc_index = self.engine.encode_late_chunks(
                texts, config, chunking, instruction=instruction, batch_size=batch_size
            )
            return ChunkedEmbeddings(postprocess(raw, config), doc_index, len(texts), chunking.aggregate)
        check_chunk_fits(self.backbone, config, chunking)
        chunks = split_documents(self.backbone.tokenizer, texts, chunking)
        vectors = self._encode_as(chunks.texts, batch_size, instruction, config, corpus=True)
        return ChunkedEmbeddings(vectors, chunks.doc_index, len(texts), chunking.aggregate)

    def _encode_as(
        self,
        texts: Sequence[str],
        batch_size: int,
        instruction: str | None,
        config: EmbeddingConfig,
        *,
        corpus: bool = False,
    ) -> np.ndarray:
        return self.executor.run(self, texts, [config], instruction=instruction, batch_size=batch_size, corpus=corpus)[
            0
        ]

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
            check_strategy(self.backbone, cfg, _head_width(self.pooling_head, self.backbone, cfg))
        return self.executor.run(self, texts, configs, instruction=instruction, batch_size=batch_size)

    def texts_per_second(self, texts: Sequence[str], *, batch_size: int = 32) -> float:
        """Measured speed of this strategy: ``texts`` encoded once with the embedding cache bypassed (tokenisation,
        forward passes, which stop at the strategy's deepest layer, and pooling), in texts per second."""
        engine = self.engine
        previous, engine.use_cache = engine.use_cache, False
        try:
            start = time.perf_counter()
            engine.encode_raw(texts, [self.config], batch_size=batch_size)
            return len(texts) / max(time.perf_counter() - start, 1e-9)
        finally:
            engine.use_cache = previous

    def with_config(self, config: EmbeddingConfig) -> Embedder:
        """The same backbone, engine and executor (no reload) read out with another strategy."""
        return self._sharing(config, self.executor)

    def with_executor(self, executor: Executor) -> Embedder:
        """The same model and strategy, encoded by ``executor`` (e.g. sharded jobs on a cluster)."""
        return self._sharing(self.config, executor)

    def _sharing(self, config: EmbeddingConfig, executor: Executor) -> Embedder:
        embedder = Embedder(
            self.backbone, config, pooling_head=self.pooling_head, engine=self.engine, executor=executor
        )
        embedder.published, embedder.published_folder = self.published, self.published_folder
        embedder.checkpoint_sources = self.checkpoint_sources
        return embedder

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
        if isinstance(self.pooling_head, PostPoolingHead):
            _save_post_head(self.pooling_head, directory, head_state)
        elif self.pooling_head is not None:
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
            and not cfg.instruction_suffix
            and cfg.pool_special_tokens
            and not any(layer.get("route") for layer in cfg.head)
        )

    def _write_sentence_transformers_files(self, directory: Path) -> None:
        cfg = self.config
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        for layer in cfg.head:  # their weights and configs were written by _save_post_head
            path = layer.get("path", f"{len(modules)}_Normalize")
            modules.append(
                {"idx": len(modules), "name": str(len(modules)), "path": path, "type": ST_HEAD[layer["type"]]}
            )
        if cfg.normalize:
            path = f"{len(modules)}_Normalize"
            modules.append({"idx": len(modules), "name": str(len(modules)), "path": path, "type": ST_HEAD["normalize"]})
        for module in modules[2:]:
            (directory / module["path"]).mkdir(exist_ok=True)
        include_prompt = cfg.include_prompt and cfg.prompt_style == "sentence_transformers"
        pooling = {"word_embedding_dimension": self.backbone.hidden_size, "include_prompt": include_prompt}
        pooling.update({mode: name == cfg.pooling for name, mode in ST_POOLING_MODES.items()})
        (directory / "1_Pooling").mkdir(exist_ok=True)
        max_length = resolve_max_length(self.backbone, cfg.max_length)
        files: dict[str, Any] = {
            "modules.json": modules,
            "1_Pooling/config.json": pooling,
            "sentence_bert_config.json": {"max_seq_length": max_length, "do_lower_case": cfg.lowercase},
        }
        model_config = _st_model_config(cfg)
        if model_config:
            files["config_sentence_transformers.json"] = model_config
        for name, content in files.items():
            atomic_write_text(directory / name, json.dumps(content, indent=2))


ST_HEAD = {
    "dense": "sentence_transformers.models.Dense",
    "layer_norm": "sentence_transformers.models.LayerNorm",
    "normalize": "sentence_transformers.models.Normalize",
}


def _st_model_config(cfg: EmbeddingConfig) -> dict[str, Any]:
    """``config_sentence_transformers.json``: the prompts (a published model's own, with the strategy's query and
    document prompts), the default prompt and the similarity."""
    prompts = dict(cfg.prompts)
    if cfg.query_instruction:
        prompts["query"] = cfg.instruction_template.format(instruction=cfg.query_instruction)
    if cfg.document_instruction:
        prompts["document"] = cfg.instruction_template.format(instruction=cfg.document_instruction)
    if not prompts and cfg.similarity == "cosine":
        return {}
    if prompts:
        prompts.setdefault("query", "")
        prompts.setdefault("document", "")
    data: dict[str, Any] = {"prompts": prompts, "similarity_fn_name": cfg.similarity}
    if cfg.default_prompt_name is not None:
        data["default_prompt_name"] = cfg.default_prompt_name
    return data


def _save_post_head(head: PostPoolingHead, directory: Path, state: dict[str, Tensor] | None) -> None:
    """Each Dense/LayerNorm layer of ``head`` into its module folder, as sentence-transformers lays it out
    (``state``: whole tensors named ``layers.I.*`` to write instead of the head's own)."""
    for i, spec in enumerate(head.specs):
        if spec["type"] == "normalize":
            continue
        folder = directory / spec["path"]
        folder.mkdir(parents=True, exist_ok=True)
        layer_state = head.layer_state(i)
        if state is not None:
            prefix = f"layers.{i}."
            layer_state = {
                k[len(prefix) :]: v.detach().cpu().contiguous() for k, v in state.items() if k.startswith(prefix)
            }
        save_file(layer_state, str(folder / "model.safetensors"))
        atomic_write_text(folder / "config.json", json.dumps(_st_layer_config(spec), indent=2))


def _st_layer_config(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["type"] == "layer_norm":
        return {"dimension": spec["dimension"]}
    config = {
        "in_features": spec["in_features"],
        "out_features": spec["out_features"],
        "bias": spec.get("bias", True),
        "activation_function": ACTIVATION_PATHS[spec.get("activation", "identity")],
    }
    if spec.get("residual"):
        config["use_residual"] = True
    return config


def _head_width(head: nn.Module | None, backbone: Backbone, config: EmbeddingConfig) -> int | None:
    if config.head and isinstance(head, PostPoolingHead):
        return head.output_dim(backbone.hidden_size, config.route)
    return None


def _read_local_published(name_or_path: str) -> PublishedModel | None:
    """The conventions of a local (or bundled) sentence-transformers folder, if ``name_or_path`` is one."""
    folder = Path(resolve_bundled(name_or_path)) if name_or_path in BUNDLED else Path(name_or_path).expanduser()
    return read_published_folder(folder) if is_sentence_transformers_folder(folder) else None


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


def _copy_export(source: Path, directory: Path, embedder: Embedder) -> Path:
    """Fill ``directory`` with the export folder ``source`` + tokenizer + strategy, atomically (temporary sibling,
    then one rename; an existing ``directory`` is replaced only once the new one is complete)."""
    directory = directory.expanduser().resolve()
    with atomic_folder(directory) as tmp:
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
    return directory


def _interpolate(backbone: Backbone, factor: float) -> None:
    """``rope_scale``: position interpolation by ``factor``, its refusal naming the option."""
    try:
        interpolate_positions(backbone, factor)
    except PositionInterpolationError as exc:
        raise PositionInterpolationError(f"rope_scale={factor:g}: {exc}") from exc


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


def _load_head(directory: str, backbone: Backbone, strategy: dict[str, Any]) -> nn.Module | None:
    if strategy.get("head"):  # a published model's post-pooling head, saved in sentence-transformers' layout
        head = PostPoolingHead(strategy["head"])
        for i, spec in enumerate(head.specs):
            if spec["type"] != "normalize":
                head.load_layer_state(
                    i, load_weights(Path(directory) / spec["path"]), str(Path(directory) / spec["path"])
                )
        return head.to(device=backbone.device, dtype=backbone.dtype).eval()
    path = Path(directory) / HEAD_FILE
    if not path.exists():
        return None
    cfg = EmbeddingConfig.from_dict(strategy)
    head = build_latent_head(backbone.hidden_size, cfg.latent)
    head.load_state_dict(load_file(str(path)))
    return head.to(device=backbone.device, dtype=backbone.dtype).eval()
