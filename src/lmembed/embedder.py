"""The public entry point: ``Embedder`` = backbone + extraction strategy (+ optional pooling head).

    >>> from lmembed import Embedder
    >>> emb = Embedder.from_pretrained("minilm")
    >>> vectors = emb.encode(["a sentence", "another one"])

``save(dir)`` writes the backbone, the tokenizer, the strategy (``lmembed.json``), a trained pooling
head, and — where the strategy is one sentence-transformers can express — the files that let
``SentenceTransformer(dir)`` load the same model and give the same vectors.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, overload

import numpy as np
from safetensors.torch import save_file
from torch import Tensor, nn

from lmembed.atomic import atomic_folder
from lmembed.config import EmbeddingConfig, for_side, sentence_transformers_expressible
from lmembed.encoding.backends import Backend, make_backend
from lmembed.encoding.chunking import ChunkedEmbeddings, Chunking, split_documents
from lmembed.encoding.engine import EncodingEngine, resolve_max_length
from lmembed.encoding.inputs import tokenizer_lock, validate_texts, wants_eos
from lmembed.errors import ConfigError, InputError, ModelLoadError
from lmembed.io import read_json
from lmembed.load_plan import HEAD_FILE, check_replaceable, plan_load, write_strategy_file
from lmembed.load_spec import LoadSpec
from lmembed.model_card import CARD_FILE, ExportRecord, TrainingRecord, card_text
from lmembed.models import presets
from lmembed.models.attention import check_bidirectional_supported
from lmembed.models.bundled import BUNDLED
from lmembed.models.context import PositionInterpolationError, interpolate_positions, interpolation_factor
from lmembed.models.loading import Backbone, backbone_from_model, is_hub_id
from lmembed.models.sentence_transformers_folder import (
    ST_POOLING_MODES,
    PublishedModel,
    apply_lowercase,
    save_head_layers,
    write_sentence_transformers_files,
)
from lmembed.pooling.head import PostPoolingHead
from lmembed.pooling.latent_attention import build_latent_head
from lmembed.pooling.layers import LayerSelectionError, find_final_norm, normalize_layer
from lmembed.pooling.normalize import unit_rows
from lmembed.pooling.terms import TermChannel, fit_terms, save_terms
from lmembed.protocols import ENCODE_BATCH_SIZE

log = logging.getLogger(__name__)

#: texts a saved folder's prompts are tried on: does sentence-transformers leave out what lmembed leaves out?
PROMPT_PROBE_TEXTS = ("what is the answer", "Hello world", "2 cats", "éclair recipe")


def postprocess(raw: np.ndarray, config: EmbeddingConfig) -> np.ndarray:
    """Matryoshka truncation to ``config.dim``, then L2 normalisation if asked."""
    out = raw[:, : config.dim] if config.dim else raw
    out = np.ascontiguousarray(out, dtype=np.float32)
    return unit_rows(out) if config.normalize else out


def _dim_problem(dim: int | None, width: int, what: str) -> str | None:
    """Why a Matryoshka ``dim`` cannot be read from vectors ``width`` wide (the model's ``what``); None if it can."""
    if dim is None or dim <= width:
        return None
    return (
        f"dim={dim} is larger than the model's {what} ({width}); Matryoshka truncation can only shorten vectors: "
        f"choose dim <= {width} or leave it unset"
    )


def _positions_past(backbone: Backbone, max_length: Any) -> int | None:
    """The model's positions when ``max_length`` asks for more of them; None when it does not (or either is unset)."""
    positions = getattr(backbone.model.config, "max_position_embeddings", None)
    if isinstance(max_length, int) and isinstance(positions, int) and 0 < positions < max_length:
        return positions
    return None


def check_strategy(backbone: Backbone, config: EmbeddingConfig, width: int | None = None) -> None:
    """Refuse a strategy this backbone cannot honour, before anything is encoded or labelled with it (``width``:
    the pooled vectors' width where a post-pooling head changes it)."""
    what = "hidden size" if width is None else "vector width"
    problem = _dim_problem(config.dim, width or backbone.hidden_size, what)
    if problem:
        raise ConfigError(problem)
    if backbone.is_decoder and config.attention == "bidirectional":
        check_bidirectional_supported(backbone.model)
    for layer in config.layers:  # said here, not at the first encode (doctor ran its checks on it first)
        normalize_layer(layer, backbone.num_layers)


def check_chunk_fits(backbone: Backbone, config: EmbeddingConfig, chunking: Chunking) -> None:
    """Raise :class:`ConfigError` when a chunk of ``chunking.tokens`` text tokens plus the special tokens would
    be truncated at the strategy's ``max_length``."""
    limit = resolve_max_length(backbone, config.max_length)
    with tokenizer_lock(backbone.tokenizer):  # the call resets the backend's truncation, which a builder may use
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
        value = read_json(st_config, error=ModelLoadError, what="sentence-transformers config").get("max_seq_length")
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


def _model_window(backbone: Backbone, config: EmbeddingConfig) -> EmbeddingConfig:
    """``config`` with ``max_length`` None read as the model's window: its folder's ``max_seq_length``, else its
    positions (512 at most)."""
    if config.max_length is not None:
        return config
    return config.with_options(max_length=resolve_max_length(backbone, default_max_length(backbone.path, None)))


class Embedder:
    """A text-embedding model: a transformer backbone read out with one extraction strategy, encoded by an
    :class:`Executor` (this process by default).

    ``engine`` shares the :class:`~lmembed.encoding.engine.EncodingEngine` of another Embedder over the same
    backbone (its head, cache and backend too: nothing is rebuilt, ``config`` is taken as given); that is how
    :meth:`with_config` and :meth:`with_executor` make their Embedders.
    """

    published: presets.Resolution | None = None  # the published family it was loaded as (from_pretrained)
    published_folder: PublishedModel | None = None  # the sentence-transformers folder it was read from
    checkpoint_sources: dict[str, str] | None = None  # fields a published checkpoint's own files decided
    source: str | None = None  # where from_pretrained read it (bundled name, absolute folder, Hub id); None: in memory
    #: the model a saved folder was made from (its lmembed.json's ``base_model``), which saving it again keeps as its
    #: base; None: the backbone itself is the base
    base_model: str | None = None
    attn_implementation: str | None = "sdpa"  # the attention kernel transformers was asked for

    def __init__(
        self,
        backbone: Backbone,
        config: EmbeddingConfig | None = None,
        *,
        pooling_head: nn.Module | None = None,
        terms: TermChannel | None = None,
        use_cache: bool = True,
        cache_dir: str | Path | None = None,
        show_progress: bool = True,
        backend: str | Backend | None = None,
        precision: str | None = None,
        threads: int | None = None,
        max_batch_tokens: int | None = None,
        plan_window: int | None = None,
        engine: EncodingEngine | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.backbone = backbone
        self.executor = executor or LOCAL
        self.config = _model_window(backbone, config or EmbeddingConfig())
        if engine is not None:
            check_strategy(backbone, self.config, _head_width(pooling_head, backbone, self.config))
            self.pooling_head, self.engine = pooling_head, engine
            return
        if not backbone.is_decoder and self.config.attention != "bidirectional":
            # Encoders always attend bidirectionally; record what really happens.
            self.config = self.config.with_options(attention="bidirectional")
        self.config = _as_run(backbone, self.config)
        if self.config.head and pooling_head is None:
            raise ConfigError("the strategy has a post-pooling head but no head weights were given (pooling_head)")
        check_strategy(backbone, self.config, _head_width(pooling_head, backbone, self.config))
        if self.config.pooling == "latent_attention" and pooling_head is None:
            pooling_head = build_latent_head(backbone.hidden_size, self.config.latent)
            pooling_head.to(device=backbone.device, dtype=backbone.dtype)
        self.pooling_head = pooling_head
        if not isinstance(backend, Backend):
            backend = make_backend(backbone, backend, precision, threads=threads)
        if self.config.terms is not None and (terms is None or terms.config != self.config.terms):
            raise ConfigError("the strategy names a term channel but its fitted table was not given (terms)")
        _check_terms(backbone, terms)
        self.engine = EncodingEngine(
            backbone,
            pooling_head=pooling_head,
            terms=terms,
            cache_dir=cache_dir,
            use_cache=use_cache,
            show_progress=show_progress,
            backend=backend,
            max_batch_tokens=max_batch_tokens,
            plan_window=plan_window,
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
        plan_window: int | None = None,
        rope_scale: float | None = None,
        config: EmbeddingConfig | None = None,
        **strategy: Any,
    ) -> Embedder:
        """Load a bundled name (``minilm``, ``smollm2-135m``, ``gemma3-270m``), a directory (a saved
        Embedder or any transformers checkpoint) or a Hub id.

        ``backend`` runs the transformer: ``"torch"`` (default; the reference, CPU or GPU), ``"onnx"`` (ONNX
        Runtime on the CPU: the model is exported once, cached, and run as a fused graph; vectors agree with
        torch's to cosine >= 0.9999) or ``"cuda-graphs"`` (the torch model on a GPU, each batch widened to a bucketed
        shape whose pass is captured once as a CUDA graph and replayed:
        :mod:`lmembed.encoding.backends.cuda_graphs`). ``precision="int8"`` quantises (on ONNX Runtime unless
        ``backend="torch"``, which uses torch's dynamic int8): it is calibrated on the first texts encoded (or
        on :meth:`calibrate`'s) and checked by a quality gate that warns with the gap when int8 vectors drift
        from float32 ones (torch's, which has nothing to calibrate, is gated at load on ``quality.GATE_TEXTS``);
        on ONNX Runtime each token row is quantised on its own range, so an int8 vector does not
        depend on which texts share its batch beyond float32's own rounding (measured per model by
        ``bench/int8_products.py --graphs``: bench/results/int8-products/). ``quantize="int8"`` is the older spelling of
        ``precision="int8"``. ``threads`` sets the ONNX Runtime threads (default: torch's); ``max_batch_tokens``
        bounds batches by padded tokens as well as by ``batch_size``; ``plan_window`` tokenises and plans that many
        texts at a time, the next window tokenised while the current one computes (``EncodingEngine.plan_window``:
        for long texts on a small model on a GPU). ``rope_scale`` (> 1) interpolates a RoPE
        decoder's positions linearly (:func:`lmembed.models.context.interpolate_positions`: Llama, Mistral, Qwen2,
        Qwen3) so that ``rope_scale`` times its trained window can be read; other models refuse it.

        Strategy options left as ``None`` come from a saved Embedder's ``lmembed.json`` when there
        is one, else from :class:`EmbeddingConfig`'s defaults (mean pooling, last layer, causal,
        normalised, the model's own max length).
        """
        if quantize is not None:
            if quantize != "int8":
                raise ConfigError(f"quantize={quantize!r} is unknown; the only scheme is 'int8'")
            if precision not in (None, "int8"):
                raise ConfigError(f"quantize='int8' and precision={precision!r} ask for two precisions; give one")
            precision = "int8"
        torch_int8 = precision == "int8" and backend == "torch"
        plan = plan_load(name_or_path, torch_int8=torch_int8)  # the first source reader that knows it
        backbone = plan.load_backbone(
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            quantize="int8" if torch_int8 else None,
        )
        if rope_scale is not None:
            _interpolate(backbone, rope_scale)
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
        _check_given(backbone, given)
        base = config.to_dict() if config else {}
        base.update(plan.options)  # the source's own conventions, then the caller's options over them
        base.update(given)
        strategy = EmbeddingConfig.from_dict(base)  # an option that is refused is not first said to override
        if "layer" not in given and "layer" in plan.sources:  # a layer the source's own files chose: named there
            try:
                for chosen in strategy.layers:
                    normalize_layer(chosen, backbone.num_layers)
            except LayerSelectionError as exc:
                raise ModelLoadError(f"{plan.sources['layer']}: strategy.layer: {exc}") from None
        plan.warn_overrides(given)
        head = plan.head(backbone, base)
        terms = plan.terms(backbone, base)
        if plan.saved is not None:  # a saved folder's lmembed.json (a published folder's files are the authors')
            _check_recorded(backbone, plan.options, given, plan.sources, strategy, head)
        if base.get("lowercase"):
            apply_lowercase(backbone.tokenizer)
        embedder = cls(
            backbone,
            strategy,
            pooling_head=head,
            terms=terms,
            use_cache=cache,
            cache_dir=cache_dir,
            show_progress=show_progress,
            backend=backend,
            precision=precision,
            threads=threads,
            max_batch_tokens=max_batch_tokens,
            plan_window=plan_window,
        )
        if backbone.float_reference is not None:
            _gate_torch_int8(embedder, head, terms)
        embedder.published = plan.published  # the published family it was loaded as
        embedder.published_folder = plan.folder  # what a sentence-transformers folder decided, and which file did
        embedder.checkpoint_sources = plan.checkpoint_sources
        embedder.source = _source_of(plan.where)
        embedder.attn_implementation = attn_implementation
        embedder.base_model = plan.base_model
        return embedder

    @classmethod
    def from_spec(
        cls,
        spec: LoadSpec,
        *,
        source: str | None = None,
        device: str = "cpu",
        cache: bool = True,
        cache_dir: str | Path | None = None,
        show_progress: bool = True,
        threads: int | None = None,
        max_batch_tokens: int | None = None,
        plan_window: int | None = None,
    ) -> Embedder:
        """The Embedder ``spec`` describes (:mod:`lmembed.load_spec`), loaded from ``source`` when given (a copy of
        the same model elsewhere), else from ``spec.source``; what is local to this process (device, cache,
        progress, threads, batching) is the caller's. int8 is calibrated on the recorded texts, so it quantises
        exactly as the original did."""
        where = source or spec.source
        if where is None:
            raise ConfigError("this load spec describes a model built in memory (source=None); pass a source")
        loaded = cls.from_pretrained(
            where,
            device=device,
            cache=cache,
            cache_dir=cache_dir,
            show_progress=show_progress,
            threads=threads,
            max_batch_tokens=max_batch_tokens,
            plan_window=plan_window,
            **spec.loading(),
        )
        if spec.calibration:
            loaded.calibrate(list(spec.calibration))
        return loaded if loaded.config == spec.config else loaded.with_config(spec.config)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as how to load it again (its :attr:`load_spec`, this process's settings) and what it must then be
        (its cache key: the weights', head's and backend's fingerprint), not as its weights: a transformers model
        does not pickle (its hooks are local functions), and a worker process reads the weights itself. Unpickling
        loads the model from its source and refuses it when it is not the one pickled (changed in memory since it
        was loaded, or its folder changed); a model built in memory is not pickled (save it first)."""
        spec = self.load_spec
        if spec.source is None:
            raise TypeError(
                "an Embedder of a model built in memory is not pickled (its weights would travel whole): save it "
                "(Embedder.save(folder)) and load the folder where it is needed, or send Embedder.load_spec of a "
                "saved one (Embedder.from_spec loads it)"
            )
        engine = self.engine
        if engine.backend.needs_calibration:
            raise TypeError(
                "an int8 Embedder is pickled once calibrated (its vectors depend on the calibration texts): call "
                "Embedder.calibrate(texts), or encode some texts, first"
            )
        local = {
            "device": str(self.backbone.device),
            "cache": engine.use_cache,
            "cache_dir": str(engine.cache_dir),
            "show_progress": engine.show_progress,
            "max_batch_tokens": engine.max_batch_tokens,
            "plan_window": engine.plan_window,
        }
        return _unpickle_embedder, (spec.to_dict(), engine.cache_model_key(self.config), local)

    @property
    def load_spec(self) -> LoadSpec:
        """How to load this Embedder again elsewhere: the one record an index, Ray's workers and an export keep
        (:class:`~lmembed.load_spec.LoadSpec`)."""
        runner = self.backend
        calibration = runner.calibration_texts if runner.precision == "int8" else None
        return LoadSpec(
            source=self.source or _backbone_source(self.backbone),
            config=self.config,
            dtype=str(self.backbone.dtype).removeprefix("torch."),
            backend=runner.name,
            precision=runner.precision,
            calibration=tuple(calibration) if calibration is not None else None,
            rope_scale=interpolation_factor(self.backbone.model),
            attn_implementation=self.attn_implementation,
        )

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
        batch_size: int = ENCODE_BATCH_SIZE,
        *,
        instruction: str | None = None,
        prompt_name: str | None = None,
    ) -> np.ndarray:
        """Embed texts as they are (with ``instruction`` kept out of pooling if given). A published model's
        prompt can be named (``prompt_name``, one of ``config.prompts``); without either, its default prompt
        (``default_prompt_name``) applies, as in sentence-transformers' ``encode``. Giving both is refused: which one
        was meant cannot be told (sentence-transformers warns and drops ``prompt_name``)."""
        return self._encode_as(texts, batch_size, self._prompt(instruction, prompt_name), self.config)

    def _prompt(self, instruction: str | None, prompt_name: str | None) -> str | None:
        """The text before each input of :meth:`encode`: ``instruction``, else the named (or default) prompt."""
        if instruction is not None and prompt_name is not None:
            raise ConfigError(
                f"instruction and prompt_name={prompt_name!r} both set the text before each input; give one"
            )
        return instruction if instruction is not None else self.config.named_prompt(prompt_name)

    def encode_tokens(
        self,
        texts: Sequence[str],
        batch_size: int = ENCODE_BATCH_SIZE,
        *,
        side: str | None = None,
        instruction: str | None = None,
        prompt_name: str | None = None,
    ) -> list[np.ndarray]:
        """Token-level vectors, as sentence-transformers' ``encode(output_value="token_embeddings")`` gives them: for
        each text an array ``(tokens, hidden)`` of the states the strategy pools from (its layer, attention and
        final norm), one row per token the model reads, special tokens and the instruction included, padding out.
        Nothing after the states applies (pooling, head, term channel, normalisation, ``dim``).

        The text before each input is chosen as :meth:`encode` chooses it (``instruction`` or ``prompt_name``), or
        with ``side`` (``"query"``/``"document"``) as :meth:`encode_queries`/:meth:`encode_corpus` do."""
        if side is None:
            config, instruction = self.config, self._prompt(instruction, prompt_name)
        elif prompt_name is not None:
            raise ConfigError(f"side={side!r} chooses the prompt itself; prompt_name={prompt_name!r} cannot")
        else:
            config, instruction = for_side(self.config, side, instruction)
        return self.engine.encode_token_states(texts, config, instruction=instruction, batch_size=batch_size)

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = ENCODE_BATCH_SIZE
    ) -> np.ndarray:
        """Embed queries; ``instruction`` (or the strategy's ``query_instruction``: a published model's query
        prompt) is prepended."""
        config, prefix = for_side(self.config, "query", instruction)
        return self._encode_as(texts, batch_size, prefix, config)

    @overload
    def encode_corpus(
        self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE, chunking: None = None
    ) -> np.ndarray: ...

    @overload
    def encode_corpus(
        self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE, chunking: Chunking
    ) -> ChunkedEmbeddings: ...

    def encode_corpus(
        self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE, chunking: Chunking | None = None
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
        batch_size: int = ENCODE_BATCH_SIZE,
    ) -> ChunkedEmbeddings:
        """Chunk vectors of ``texts`` under ``config`` (this Embedder's strategy by default): see
        :meth:`encode_corpus`."""
        if not isinstance(chunking, Chunking):
            raise ConfigError(
                f"chunking={chunking!r:.40} must be a Chunking (lmembed.encoding.chunking), e.g. Chunking('maxp')"
            )
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
        batch_size: int = ENCODE_BATCH_SIZE,
    ) -> list[np.ndarray]:
        """Embed with several strategies at once, sharing forward passes where they can."""
        configs = _strategies(configs, "configs")  # a generator is read once, here
        configs = [self._own_length(cfg) for cfg in configs]
        for cfg in configs:
            check_strategy(self.backbone, cfg, _head_width(self.pooling_head, self.backbone, cfg))
        return self.executor.run(self, texts, configs, instruction=instruction, batch_size=batch_size)

    def texts_per_second(self, texts: Sequence[str], *, batch_size: int = ENCODE_BATCH_SIZE) -> float:
        """Measured speed of this strategy: ``texts`` encoded once with the embedding cache bypassed (tokenisation,
        forward passes, which stop at the strategy's deepest layer, and pooling), in texts per second."""
        engine = self.engine.without_cache()  # the shared engine's cache stays on for every other caller
        start = time.perf_counter()
        engine.encode_raw(texts, [self.config], batch_size=batch_size)
        return len(texts) / max(time.perf_counter() - start, 1e-9)

    def with_config(self, config: EmbeddingConfig) -> Embedder:
        """The same backbone, engine and executor (no reload) read out with another strategy; an option this model
        cannot take effect as it says is refused, as ``from_pretrained`` refuses it."""
        if not isinstance(config, EmbeddingConfig):
            raise ConfigError(
                f"config is {type(config).__name__}; expected an EmbeddingConfig (EmbeddingConfig.from_dict reads "
                "a dict)"
            )
        if not self.backbone.is_decoder and config.attention != "bidirectional":
            config = config.with_options(attention="bidirectional")  # what an encoder does, as __init__ records it
        config = self._own_length(config)
        _check_given(self.backbone, _changed(self.config, config))
        return self._sharing(config, self.executor)

    def _own_length(self, config: EmbeddingConfig) -> EmbeddingConfig:
        """``config`` with ``max_length`` None read as this Embedder's window (its folder's ``max_seq_length``, its
        preset's, or its positions): a config made by hand for ``with_config`` or ``encode_strategies`` was read at
        the engine's fallback (512, or the positions: twice minilm's 256), under the same strategy label."""
        return config if config.max_length is not None else config.with_options(max_length=self.config.max_length)

    def with_terms(self, channel: TermChannel | None) -> Embedder:
        """This model with ``channel`` appended to its vectors (None: without a term channel): the backbone is
        shared, the engine is new (its cache keys on the channel's table)."""
        config = self.config.with_options(terms=None if channel is None else channel.config, route=None)
        _check_terms(self.backbone, channel)
        engine = self.engine.with_terms(channel)
        embedder = Embedder(
            self.backbone, config, pooling_head=self.pooling_head, engine=engine, executor=self.executor
        )
        embedder.source, embedder.attn_implementation = self.source, self.attn_implementation
        embedder.base_model = self.base_model
        return embedder

    def fit_terms(self, documents: Sequence[str], *, dims: int = 4096, weight: float = 0.5, seed: int = 0) -> Embedder:
        """This model with a term channel fitted on ``documents`` (:mod:`lmembed.pooling.terms`): the idf of each
        token id over the tokens the model pools when it reads them as documents, ``dims`` hashed buckets weighed
        ``weight`` against the dense vector in the cosine."""
        documents = validate_texts(documents, "documents")  # a str would be fitted character by character
        if not documents:
            raise InputError("documents is empty; a term channel is fitted on the corpus it will search")
        plain = self.config.with_options(terms=None, route=None)
        config, instruction = for_side(plain, "document")
        builder = self.engine.input_builder(config)
        rows = (
            [t for t, keep in zip(f.input_ids, f.pool_mask, strict=True) if keep]
            for start in range(0, len(documents), 4096)
            for f in builder.build_all(documents[start : start + 4096], instruction)
        )
        tokenizer = self.backbone.tokenizer
        channel = fit_terms(
            rows, len(tokenizer), dims=dims, weight=weight, special_ids=tokenizer.all_special_ids, seed=seed
        )
        return self.with_terms(channel.to(self.backbone.device))

    def without_cache(self) -> Embedder:
        """The same model and strategy with an engine that caches nothing (the backbone, backend and executor
        shared): for work that must compute every vector, without switching off the cache of the engine this
        Embedder shares with its ``with_config`` siblings."""
        return self._sharing(self.config, self.executor, self.engine.without_cache())

    def with_executor(self, executor: Executor) -> Embedder:
        """The same model and strategy, encoded by ``executor`` (e.g. sharded jobs on a cluster)."""
        return self._sharing(self.config, executor)

    def _sharing(self, config: EmbeddingConfig, executor: Executor, engine: EncodingEngine | None = None) -> Embedder:
        embedder = Embedder(
            self.backbone, config, pooling_head=self.pooling_head, engine=engine or self.engine, executor=executor
        )
        embedder.published, embedder.published_folder = self.published, self.published_folder
        embedder.checkpoint_sources = self.checkpoint_sources
        embedder.source, embedder.attn_implementation = self.source, self.attn_implementation
        embedder.base_model = self.base_model
        return embedder

    # ------------------------------------------------------------------ saving
    def export(self, directory: str | Path, format: str = "onnx", *, calibration: Sequence[str] | None = None) -> Path:
        """Write a deployable graph of this Embedder's strategy to ``directory``: ``model.onnx`` returns exactly the
        hidden states the strategy pools (pooling stays in lmembed), with ``manifest.json`` (what it was built from;
        for int8 the quality-gate report), the tokenizer, ``lmembed.json`` (the strategy) and what acts after
        pooling (a pooling head's weights, a term channel's table), in the files ``save`` gives them. The graph
        comes from the export cache (built there first if absent), so ``backend="onnx"`` runs this very graph.
        ``directory`` is filled under a temporary name and renamed into place. int8 needs ``calibration`` texts (or
        a previous :meth:`calibrate`)."""
        if format != "onnx":
            raise ConfigError(f"format={format!r} is unknown; the only export format is 'onnx'")
        backend = self.engine.backend
        if backend.name != "onnx":
            raise ConfigError("export needs an Embedder loaded with backend='onnx' (or precision='int8')")
        if calibration is not None:
            self.calibrate(calibration)
        source = self.engine.prepare_backend([self.config])
        return _copy_export(source, Path(directory), self)

    def _save_after_pooling(self, directory: Path, head_state: dict[str, Tensor] | None = None) -> None:
        """Write what turns pooled states into this Embedder's vectors: its head's weights and its term table."""
        if isinstance(self.pooling_head, PostPoolingHead):
            save_head_layers(self.pooling_head, directory, head_state)
        elif self.pooling_head is not None:
            head = self.pooling_head.state_dict() if head_state is None else head_state
            state = {k: v.detach().cpu().contiguous() for k, v in head.items()}
            save_file(state, str(directory / HEAD_FILE))
        if self.config.terms is not None and self.engine.terms is not None:
            save_terms(self.engine.terms, directory)

    def save(
        self,
        directory: str | Path,
        *,
        backbone_state: dict[str, Tensor] | None = None,
        head_state: dict[str, Tensor] | None = None,
        extra: Callable[[Path], None] | None = None,
        training: TrainingRecord | None = None,
        name: str | None = None,
    ) -> Path:
        """Write everything needed to reload this Embedder exactly (see the module doc), atomically: the folder is
        filled under a temporary name beside ``directory`` and renamed into place once ``lmembed.json``, written
        last, records the sha256 of every other file (checked whenever the folder is loaded). An existing
        ``directory`` is replaced whole, so it must be empty or a folder an Embedder was saved to.

        ``backbone_state`` and ``head_state`` are whole tensors to write instead of the modules' own state
        dicts (a model sharded over processes is saved from its gathered state this way); ``extra`` writes more
        files into the folder before they are recorded (a LoRA adapter beside the weights). A model card,
        ``README.md`` (:mod:`lmembed.model_card`), says how to load the model, its strategy, its ``training`` when
        given, and the papers to cite; it calls the model ``name`` (default: the folder's name; a caller that saves
        into a scratch folder renamed into place later gives the final one).
        """
        directory = Path(directory)
        check_replaceable(directory)
        with atomic_folder(directory) as tmp:
            model = self.backbone.model
            model.save_pretrained(tmp, state_dict=backbone_state)
            self.backbone.tokenizer.save_pretrained(tmp)
            self._save_after_pooling(tmp, head_state)
            compatible = self.sentence_transformers_compatible()
            if compatible:
                max_length = resolve_max_length(self.backbone, self.config.max_length)
                write_sentence_transformers_files(tmp, self.config, self.backbone.hidden_size, max_length)
            if extra is not None:
                extra(tmp)
            card = self._card(name or directory.name, sentence_transformers=compatible, training=training)
            (tmp / CARD_FILE).write_text(card, encoding="utf-8")
            meta = {
                "base_model": self.base_model or self.backbone.name,
                "is_decoder": self.backbone.is_decoder,
                "strategy": self.config.to_dict(),
            }
            write_strategy_file(tmp, meta)
        return directory

    def _card(self, name: str, *, sentence_transformers: bool = False, **kinds: Any) -> str:
        """The model card of a folder this Embedder is saved or exported to, called ``name`` (``kinds``:
        :func:`card_text`'s ``training`` or ``export``)."""
        base = self.base_model or self.backbone.name
        hub_id = BUNDLED[base].hub_id if base in BUNDLED else base
        return card_text(
            name=name,
            base_model=hub_id,
            hub_id=hub_id if is_hub_id(hub_id) and not Path(hub_id).expanduser().exists() else None,
            config=self.config,
            is_decoder=self.backbone.is_decoder,
            dim=self.dim,
            sentence_transformers=sentence_transformers,
            family_cites=self.published.preset.cites if self.published else (),
            **kinds,
        )

    def sentence_transformers_compatible(self) -> bool:
        """True when sentence-transformers can reproduce this strategy exactly: each strategy field's own rule
        (declared on the field, :func:`lmembed.config.sentence_transformers_expressible`), then the fields whose
        rule needs the model (``ST_BY_EMBEDDER``): the pooling, the attention and the appended EOS."""
        cfg = self.config
        uses_eos = wants_eos(cfg, self.backbone.is_decoder)  # add_eos, eos_token (and pooling="last" on a decoder)
        return (
            sentence_transformers_expressible(cfg)
            and cfg.pooling in ST_POOLING_MODES
            and not (self.backbone.is_decoder and cfg.attention == "bidirectional")
            and not uses_eos
            and _prompts_pool_as_sentence_transformers(self)
        )


def _prompts_pool_as_sentence_transformers(embedder: Embedder) -> bool:
    """Whether sentence-transformers leaves out of pooling the positions lmembed leaves out for each prompt the
    folder would record. It leaves out the first ``len(tokenize(prompt))`` positions (less a closing special
    token) and weighs ``weighted_mean`` by position in the whole sequence; lmembed leaves out the tokens that end
    inside the prompt and weighs by position in the text. A byte-level BPE joins a prompt's closing space to the
    text's first word ("Query: " + "what" -> ... "Query", ":", "Ġwhat"), so sentence-transformers dropped that
    word (query cosine 0.84-0.98 on Llama-style tokenizers), and weighted_mean weighed otherwise (0.96-0.99)."""
    cfg = embedder.config
    if cfg.prompt_style != "lmembed" or cfg.include_prompt or cfg.pooling in ("cls", "last"):
        return True  # a published folder's own style, or nothing left out (cls reads position 0 either way)
    instructions = [i for i in (cfg.query_instruction, cfg.document_instruction) if i]
    if not instructions:
        return True
    if cfg.pooling == "weighted_mean":
        return False
    builder = embedder.engine.input_builder(cfg)
    tokenizer = embedder.backbone.tokenizer
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    for instruction in instructions:
        prompt = cfg.instruction_template.format(instruction=instruction)
        with tokenizer_lock(tokenizer):
            ids = tokenizer(prompt)["input_ids"]
        counted = len(ids) - (1 if ids and ids[-1] in specials else 0)
        for text in PROMPT_PROBE_TEXTS:
            mask = builder.build(text, instruction).pool_mask
            left_out = next((i for i, m in enumerate(mask) if m), len(mask))
            if left_out != counted:
                return False
    return True


def _strategies(configs: Any, argument: str) -> list[EmbeddingConfig]:
    """``configs`` as a list of :class:`EmbeddingConfig` (a generator read once), each checked by type."""
    if isinstance(configs, EmbeddingConfig | str | dict) or configs is None:
        raise ConfigError(f"{argument} must be a list of EmbeddingConfig, got {type(configs).__name__}")
    listed = list(configs)
    for i, config in enumerate(listed):
        if not isinstance(config, EmbeddingConfig):
            raise ConfigError(
                f"{argument}[{i}] is {type(config).__name__}; expected an EmbeddingConfig (EmbeddingConfig.from_dict "
                "reads a dict)"
            )
    if not listed:
        raise ConfigError(f"{argument} is empty; give at least one strategy")
    return listed


def _changed(current: EmbeddingConfig, config: EmbeddingConfig) -> dict[str, Any]:
    """The fields ``config`` sets otherwise than ``current``: what a caller asks of the same model anew."""
    before, after = current.to_dict(), config.to_dict()
    return {k: v for k, v in after.items() if before.get(k) != v}


def _check_given(backbone: Backbone, given: dict[str, Any]) -> None:
    """Refuse an option the caller gave that this model cannot take effect as it says (never approximated in
    silence): causal attention on an encoder, a max_length beyond the model's positions, final_norm on a model
    without a final norm."""
    kind = f"{backbone.name} (model_type={backbone.model_type!r})"
    if given.get("attention") == "causal" and not backbone.is_decoder:
        raise ConfigError(
            f"attention='causal': {kind} is an encoder, whose tokens attend both ways by construction; it is not "
            "run causally (leave attention unset)"
        )
    max_length = given.get("max_length")
    positions = _positions_past(backbone, max_length)
    if positions is not None:
        raise ConfigError(
            f"max_length={max_length}: {kind} has {positions} positions, so at most {positions} tokens are read "
            "(rope_scale reads more of a RoPE decoder)"
        )
    if given.get("final_norm") is not None and find_final_norm(backbone.model) is None:
        raise ConfigError(
            f"final_norm={given['final_norm']}: {kind} has no final norm after its last layer; the states are "
            "read as they are (leave final_norm unset)"
        )


def _check_recorded(
    backbone: Backbone,
    recorded: dict[str, Any],
    given: dict[str, Any],
    sources: dict[str, str],
    strategy: EmbeddingConfig,
    head: nn.Module | None,
) -> None:
    """The options a saved folder's ``lmembed.json`` sets, held to the rules a caller's options are held to, naming
    the file and the field: one the model cannot take as it says (a ``max_length`` past its positions, which loaded
    in silence) is said in a warning and read as the model runs it (a folder an earlier lmembed saved so still
    loads); a ``dim`` past the vectors' width is refused (it was refused naming neither)."""
    for option, value in recorded.items():
        if option in given:
            continue
        where = f"{sources.get(option, backbone.name)}: strategy.{option}"
        try:
            _check_given(backbone, {option: value})
        except ConfigError as exc:
            log.warning("%s: %s; it is read as the model runs it", where, exc)
    width = _head_width(head, backbone, strategy) or backbone.hidden_size
    problem = _dim_problem(strategy.dim, width, "vector width") if "dim" in recorded and "dim" not in given else None
    if problem:
        raise ModelLoadError(f"{sources.get('dim', backbone.name)}: strategy.dim: {problem}")


def _as_run(backbone: Backbone, config: EmbeddingConfig) -> EmbeddingConfig:
    """``config`` as this model runs it, as an encoder's attention is recorded as bidirectional: a window past the
    model's positions is the positions (a published preset's window on a smaller copy of its model), ``final_norm``
    on a model without a final norm is unset. Kept as given, the strategy said what did not happen, was saved so, and
    the saved folder was then refused on load. An option the caller gives is refused instead (:func:`_check_given`)."""
    changes: dict[str, Any] = {}
    positions = _positions_past(backbone, config.max_length)
    if positions is not None:
        changes["max_length"] = positions
    if config.final_norm is not None and find_final_norm(backbone.model) is None:
        changes["final_norm"] = None
    if not changes:
        return config
    log.info("%s runs %s (the strategy said %s)", backbone.name, changes, {k: getattr(config, k) for k in changes})
    return config.with_options(**changes)


def _check_terms(backbone: Backbone, terms: TermChannel | None) -> None:
    """A term channel's table must cover exactly the tokenizer's ids (checked once here, not per batch)."""
    if terms is not None and terms.vocab_size != len(backbone.tokenizer):
        raise ConfigError(
            f"the term channel's table has {terms.vocab_size} token ids, the model's tokenizer "
            f"{len(backbone.tokenizer)}: the channel was fitted with another tokenizer"
        )


def _head_width(head: nn.Module | None, backbone: Backbone, config: EmbeddingConfig) -> int | None:
    if config.head and isinstance(head, PostPoolingHead):
        return head.output_dim(backbone.hidden_size, config.route)
    return None


def _copy_export(source: Path, directory: Path, embedder: Embedder) -> Path:
    """Fill ``directory`` with the export folder ``source`` + tokenizer + strategy, atomically (temporary sibling,
    then one rename; an existing ``directory`` is replaced only once the new one is complete)."""
    directory = directory.expanduser().resolve()
    check_replaceable(directory)
    with atomic_folder(directory) as tmp:
        for item in source.iterdir():
            shutil.copy2(item, tmp / item.name)
        embedder.backbone.tokenizer.save_pretrained(tmp)
        embedder._save_after_pooling(tmp)  # the graph stops where pooling starts: the head and term table travel
        graph = ExportRecord(embedder.load_spec.source, embedder.load_spec.precision)
        (tmp / CARD_FILE).write_text(embedder._card(directory.name, export=graph), encoding="utf-8")
        meta = {
            "base_model": embedder.backbone.name,
            "is_decoder": embedder.backbone.is_decoder,
            "strategy": embedder.config.to_dict(),
            "backend": embedder.backend.describe(),
            "load": embedder.load_spec.to_dict(),  # what was exported, and how to load its source again
        }
        write_strategy_file(tmp, meta)
    return directory


def _source_of(name_or_path: str) -> str:
    """Where a model was read from, as another process can find it again: a local folder made absolute; a
    bundled name or a Hub id as given."""
    path = Path(name_or_path).expanduser()
    if name_or_path not in BUNDLED and path.exists():
        return str(path.resolve())
    return name_or_path


def _unpickle_embedder(spec: dict[str, Any], identity: str, local: dict[str, Any]) -> Embedder:
    """An Embedder unpickled (:meth:`Embedder.__reduce__`): loaded from its source, and refused unless it is the
    model that was pickled."""
    loaded = Embedder.from_spec(LoadSpec.from_dict(spec), **local)
    found = loaded.engine.cache_model_key(loaded.config)
    if found != identity:
        raise ModelLoadError(
            f"{spec.get('source')}: the model loaded from there is not the one that was pickled (its weights, head "
            "or backend differ: it was changed in memory after it was loaded, or the folder changed since); save the "
            "model (Embedder.save) and pickle the Embedder loaded from that folder"
        )
    return loaded


def _backbone_source(backbone: Backbone) -> str | None:
    """The source of an Embedder built around a loaded backbone (not by ``from_pretrained``): its folder made
    absolute, or its name; ``None`` for a model built in memory."""
    if not backbone.path:
        return None
    return str(Path(backbone.name).resolve()) if Path(backbone.name).is_dir() else backbone.name


def _interpolate(backbone: Backbone, factor: float) -> None:
    """``rope_scale``: position interpolation by ``factor``, its refusal naming the option."""
    try:
        interpolate_positions(backbone, factor)
    except PositionInterpolationError as exc:
        raise PositionInterpolationError(f"rope_scale={factor:g}: {exc}") from exc


def _gate_torch_int8(embedder: Embedder, head: nn.Module | None, terms: TermChannel | None) -> None:
    """torch's dynamic int8 checked as ONNX Runtime's int8 is: the quantised model's vectors of
    :data:`~lmembed.encoding.backends.quality.GATE_TEXTS` against those of the float model it was made from
    (``Backbone.float_reference``, dropped after), with a warning that gives the gap when they drift. It had no gate:
    ``minilm`` in torch int8 reads at a min cosine of 0.96 to float32 without a word."""
    from dataclasses import replace

    from lmembed.encoding.backends.quality import GATE_TEXTS, announce, gate

    backbone = embedder.backbone
    reference = replace(
        backbone, model=backbone.float_reference, quantization=None, _fingerprint=None, float_reference=None
    )
    backbone.float_reference = None  # the float model is not kept past its gate
    factor = interpolation_factor(backbone.model)
    if factor is not None and interpolation_factor(reference.model) != factor:
        interpolate_positions(reference, factor)
    texts = list(GATE_TEXTS)
    options = {"pooling_head": head, "terms": terms, "use_cache": False, "show_progress": False}
    expected = Embedder(reference, embedder.config, **options).encode(texts)
    report = gate(expected, embedder.without_cache().encode(texts))
    label = embedder.config.label()
    embedder.backend.quality = {label: report}
    advice = "backend='onnx' with precision='int8' quantises by a calibrated recipe; or use float32 where this matters"
    announce(report, label, "torch int8", advice, stacklevel=3)
