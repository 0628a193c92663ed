"""The encoding engine: batching, forward passes, pooling and the cache.

One call can serve several strategies at once. Strategies that share their forward fields
(attention, echo, instruction, truncation) share forward passes: one pass yields every hidden state,
and each strategy pools the layers it wants. Texts are sorted by length and padded per batch, so
little compute goes to padding; results come back in input order as float32 numpy arrays.

The transformer itself runs on a backend (:mod:`lmembed.encoding.backends`: torch, or ONNX Runtime in float32 or
int8); the engine tokenises (in batches), batches, pools and caches, the same for every backend. Batches are
bounded by ``batch_size`` texts and, when ``max_batch_tokens`` is given, by that many padded tokens (texts x
the longest of them), so short texts share large batches and long ones small ones.

Finished batches go to the embedding cache while the call is still running (a shard at least every
:data:`CACHE_FLUSH_ROWS` texts or :data:`CACHE_FLUSH_SECONDS` seconds, each written atomically), so a
run that is killed part-way keeps most of its work: the next call computes only what was not written.

The stages run pipelined by default (``EncodingEngine.pipelined``; :mod:`lmembed.encoding.pipeline`): a worker thread
tokenises and collates ahead of the forward passes (on CUDA into pinned memory, copied without blocking), and on
CUDA a batch is read back while the next one computes. ``pipelined=False`` runs them in series, the reference: the
same batches and kernels, so the same vectors bit for bit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
from torch import nn

from lmembed import terminal
from lmembed.config import ConfigError, EmbeddingConfig
from lmembed.encoding.backends import Backend, TorchBackend
from lmembed.encoding.backends.graph import position_ids_from_mask
from lmembed.encoding.cache import EmbeddingCache, default_cache_dir, model_key, text_key
from lmembed.encoding.chunking import Chunking, token_windows
from lmembed.encoding.inputs import Features, InputBuilder, check_encodable, validate_texts
from lmembed.encoding.pipeline import COLLATE_THREAD, QUEUE_DEPTH, TOKENISE_THREAD, Prefetcher, ReadBack
from lmembed.errors import ModelLoadError
from lmembed.io import is_whole_number
from lmembed.models.families import reads_padding
from lmembed.models.loading import Backbone, weights_fingerprint
from lmembed.pooling.poolers import STATELESS_POOLERS
from lmembed.pooling.terms import TermChannel
from lmembed.protocols import ENCODE_BATCH_SIZE

log = logging.getLogger(__name__)

PROGRESS_MIN_TEXTS = 256
CACHE_FLUSH_ROWS = 2048  # a cache shard is written at least this often (in texts) ...
CACHE_FLUSH_SECONDS = 30.0  # ... and at least this often (in seconds) while an encode call runs
TOKENISE_CHUNK = 4096  # the pipelined path tokenises this many texts per call (a stop is seen between calls)
#: Without a ``plan_window`` the pipelined path plans batches over this many texts at a time (by their lengths, as
#: it planned the whole call before): every text's features (Python lists of token ids) were held until the call
#: ended, which a corpus of millions of documents in one call does not fit in memory.
DEFAULT_PLAN_WINDOW = 65_536


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pool_mask: torch.Tensor
    rows: list[int]


def collate_host(
    features: Sequence[Features], pad_id: int, side: str, *, pin: bool = False
) -> tuple[torch.Tensor, ...]:
    """Token ids, attention mask and pool mask of a batch in host memory, padded to its longest sequence on the
    given side; with ``pin``, in pinned (page-locked) memory, for a non-blocking copy to a CUDA device."""
    width = max(len(f) for f in features)
    tensors = tuple(torch.empty((len(features), width), dtype=torch.int64, pin_memory=pin) for _ in range(3))
    ids, attn, pool = (t.numpy() for t in tensors)  # numpy views: the rows are written in place
    ids.fill(pad_id)
    attn.fill(0)
    pool.fill(0)
    for row, feat in enumerate(features):  # numpy takes a list into a slice in one call (no tensor per row)
        n = len(feat)
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[row, cols] = feat.input_ids
        attn[row, cols] = 1
        pool[row, cols] = feat.pool_mask
    return tensors


def collate(features: Sequence[Features], pad_id: int, side: str, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Pad token ids and masks to the longest sequence of the batch, on the given side."""
    return tuple(t.to(device) for t in collate_host(features, pad_id, side))


__all__ = [
    "Batch",
    "EncodingEngine",
    "RunStats",
    "collate",
    "collate_host",
    "plan_batches",
    "position_ids_from_mask",
    "resolve_max_length",
]


def plan_batches(
    lengths: Sequence[int],
    batch_size: int,
    max_batch_tokens: int | None = None,
    window: int | None = None,
    *,
    unpadded: bool = False,
) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches: longest first (an out-of-memory error shows early), at most
    ``batch_size`` per batch and, with ``max_batch_tokens``, at most that many padded tokens (a text longer
    than the budget goes alone). With ``window``, each run of ``window`` consecutive texts is planned on its own
    (sorted within it), in order: what lets the pipelined engine start computing before every text is tokenised.
    ``unpadded``: a batch holds texts of one length only (a model that reads padding, ``families.reads_padding``)."""
    _check_window(window)
    if window is not None and window < len(lengths):
        return [
            [first + j for j in chunk]
            for first in range(0, len(lengths), window)
            for chunk in plan_batches(lengths[first : first + window], batch_size, max_batch_tokens, unpadded=unpadded)
        ]
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    batches: list[list[int]] = []
    current: list[int] = []
    for j in order:
        width = lengths[current[0]] if current else lengths[j]
        full = (
            len(current) >= batch_size
            or (max_batch_tokens is not None and current and (len(current) + 1) * width > max_batch_tokens)
            or (unpadded and lengths[j] != width)
        )
        if full:
            batches.append(current)
            current = []
        current.append(j)
    if current:
        batches.append(current)
    return batches


def check_batch_size(batch_size: Any) -> None:
    """Refuse a batch size that is not a whole number >= 1 (naming the argument)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")


def _check_window(window: int | None) -> None:
    if window is not None and window < 1:
        raise ConfigError(f"plan_window={window!r} must be a number of texts (>= 1) or None")


class _CacheWriter:
    """Collects finished rows of one strategy and writes them to its cache in shards as the call goes."""

    def __init__(
        self,
        cache: EmbeddingCache | None,
        keys: list[bytes],
        wanted: list[int],
        out: np.ndarray,
        flush_rows: int,
        flush_seconds: float,
    ) -> None:
        self.cache = cache
        self.keys = keys
        self.wanted = set(wanted)
        self.out = out
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.pending: list[int] = []
        self.last_flush = time.monotonic()

    def add(self, rows: Sequence[int]) -> None:
        if self.cache is None:
            return
        self.pending.extend(r for r in rows if r in self.wanted)
        due = time.monotonic() - self.last_flush >= self.flush_seconds
        if self.pending and (len(self.pending) >= self.flush_rows or due):
            self.flush()

    def flush(self) -> None:
        if self.cache is not None and self.pending:
            rows = sorted(self.pending)
            self.cache.store([self.keys[i] for i in rows], self.out[rows])
        self.pending = []
        self.last_flush = time.monotonic()


@dataclass
class RunStats:
    """What one compute call of the engine did (:attr:`EncodingEngine.last_run`, and the log line at ``-v``): the
    real and the padded tokens of its batches, its seconds computing (after tokenising and preparing, as the serial
    path counts them), tokenising every text (on the pipelined path on the producer thread: before the first batch
    can compute, batches being planned from every length, unless ``plan_window`` plans window by window) and
    preparing the backend (an export, int8 calibration)."""

    tokens: int = 0
    padded: int = 0
    seconds: float = 0.0
    tokenise_seconds: float = 0.0
    prepare_seconds: float = 0.0


@dataclass(frozen=True)
class _Job:
    """One call of :meth:`EncodingEngine._compute`: what both paths (serial, pipelined) read. ``outputs`` are filled
    at ``rows``; ``on_batch(rows)`` follows each batch written; ``features``, when given, are ``texts`` tokenised."""

    builder: InputBuilder
    mode: str
    texts: Sequence[str]
    rows: list[int]
    configs: list[EmbeddingConfig]
    outputs: list[np.ndarray]
    instruction: str | None
    batch_size: int
    on_batch: Callable[[list[int]], None] | None
    features: Sequence[Features] | None

    def features_of_rows(
        self, build: Callable[[list[str]], list[Features]], rows: Sequence[int] | None = None
    ) -> list[Features]:
        """The features of ``rows`` (default: all the job's rows): the given ones, else ``build`` of their texts."""
        rows = self.rows if rows is None else rows
        if self.features is not None:
            return [self.features[i] for i in rows]
        return build([self.texts[i] for i in rows])


def resolve_max_length(backbone: Backbone, requested: int | None) -> int:
    limits = [requested or 512]
    model_max = getattr(backbone.model.config, "max_position_embeddings", None)
    if isinstance(model_max, int) and model_max > 0:
        limits.append(model_max)
    return min(limits)


class EncodingEngine:
    """Runs a backbone over texts for one or more extraction strategies.

    ``pipelined`` (default True) overlaps the host's work with the forward passes: a worker thread tokenises and
    collates the next batches (on CUDA into pinned memory, ``pin_inputs``, copied without blocking) while the
    current one computes, and on CUDA a batch's vectors are read back while the next one computes. False runs the
    stages in series, as the reference: both give the same batches and the same vectors, bit for bit. A call of one
    batch runs in series either way."""

    def __init__(
        self,
        backbone: Backbone,
        *,
        pooling_head: nn.Module | None = None,
        terms: TermChannel | None = None,
        cache_dir: Path | str | None = None,
        use_cache: bool = True,
        padding_side: str | None = None,
        show_progress: bool = True,
        backend: Backend | None = None,
        max_batch_tokens: int | None = None,
        pipelined: bool = True,
        plan_window: int | None = None,
        pin_inputs: bool = True,
    ) -> None:
        self.backbone = backbone
        # the switch between the two paths of _compute (same batches, same vectors bit for bit): True overlaps
        # tokenising/collating and the read-back with the forward passes; False runs every stage in series
        self.pipelined = pipelined
        # texts tokenised and planned together (plan_batches' window): None plans a call's texts DEFAULT_PLAN_WINDOW
        # at a time, all of a smaller call at once (every length known first: the least padding); N plans N at a
        # time, so on the pipelined path the first batches compute while the rest is tokenised. Either path gives
        # the same batches for the same setting.
        _check_window(plan_window)
        self.plan_window = plan_window
        # the pipelined path on CUDA collates into pinned (page-locked) memory, copied without blocking; False
        # collates into pageable memory (the driver stages the copy). Measured side by side on an H200, pinned was
        # as fast or faster in 7 of 11 cells (bench/results/gpu-throughput/h200-stop48, the -pinned row of run 2)
        self.pin_inputs = pin_inputs
        self.backend = backend or TorchBackend(backbone)
        # training's path (forward_pool's default) needs gradients: torch, whatever runs encode
        self.torch_backend = self.backend if self.backend.differentiable else TorchBackend(backbone)
        self.max_batch_tokens = max_batch_tokens
        self.pooling_head = pooling_head
        self.terms = terms  # a fitted term channel (lmembed.pooling.terms), appended to a strategy that names one
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._caches: dict[tuple[str, str, str, int], EmbeddingCache] = {}  # _cache_for's, kept across calls
        if use_cache and self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise ConfigError(f"cache_dir={str(self.cache_dir)!r} is a file; the embedding cache is a folder")
        if max_batch_tokens is not None and (not is_whole_number(max_batch_tokens) or max_batch_tokens < 1):
            raise ConfigError(f"max_batch_tokens={max_batch_tokens!r} must be a whole number of tokens >= 1, or None")
        self.use_cache = use_cache
        self.padding_side = padding_side or ("left" if backbone.is_decoder else "right")
        self.show_progress = show_progress
        self.cache_flush_rows = CACHE_FLUSH_ROWS
        self.cache_flush_seconds = CACHE_FLUSH_SECONDS
        tok = backbone.tokenizer
        self.pad_id = next((t for t in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) if t is not None), 0)
        # a model whose vectors depend on the padding beside a text (ConvBERT) is batched one length at a time
        self.unpadded = reads_padding(backbone.model, backbone.is_decoder)
        # what the last compute call did (the last to finish, where several threads share the engine); None before
        self.last_run: RunStats | None = None

    def uncached(self) -> EncodingEngine:
        """An engine over the same model, pooling head, backend (ONNX, int8 ...) and padding side, with no embedding
        cache, no progress bars and no token bound of its own: for callers that plan their own batches and keep
        their own results (the server's passes, a Ray worker's shards), whose vectors must be this engine's."""
        return self._like(use_cache=False, show_progress=False, max_batch_tokens=None)

    def without_cache(self) -> EncodingEngine:
        """This engine with no embedding cache, all else kept (batching, progress, backend): a measurement or a check
        that must compute every vector takes it, rather than switching off the cache of an engine other Embedders
        (``with_config`` siblings, other threads) share."""
        return self._like(use_cache=False)

    def with_terms(self, terms: TermChannel | None) -> EncodingEngine:
        """An engine like this one (model, head, backend, cache, padding, batching) appending ``terms`` instead."""
        return self._like(terms=terms)

    def _like(self, **changes: Any) -> EncodingEngine:
        """A new engine over the same backbone with this one's settings, ``changes`` over them."""
        options: dict[str, Any] = {
            "pooling_head": self.pooling_head,
            "terms": self.terms,
            "cache_dir": self.cache_dir,
            "use_cache": self.use_cache,
            "padding_side": self.padding_side,
            "show_progress": self.show_progress,
            "backend": self.backend,
            "max_batch_tokens": self.max_batch_tokens,
            "pipelined": self.pipelined,
            "plan_window": self.plan_window,
            "pin_inputs": self.pin_inputs,
        }
        return EncodingEngine(self.backbone, **{**options, **changes})

    # ------------------------------------------------------------------ public
    def encode_raw(
        self,
        texts: Sequence[str],
        configs: Sequence[EmbeddingConfig],
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
        features: Sequence[Features] | None = None,
    ) -> list[np.ndarray]:
        """Raw pooled float32 vectors (before normalisation/truncation), one array per config.

        ``features``, when given, are the texts already tokenised for ``configs`` (``input_builder(configs[0])
        .build_all(texts, instruction)``, as the server builds them to count tokens): they are used as they are,
        so each text is tokenised once. The configs must then share their forward passes (one forward key)."""
        texts = validate_texts(texts)
        if features is not None:
            if len(features) != len(texts):
                raise ConfigError(f"{len(features)} features for {len(texts)} texts; give one per text")
            if len(self._forward_groups(configs)) > 1:
                raise ConfigError("pre-built features are one tokenisation: the configs must share a forward key")
        if instruction is not None:
            check_encodable(instruction, "the instruction")
        check_batch_size(batch_size)
        outputs = [np.empty((len(texts), self.output_dim(cfg)), dtype=np.float32) for cfg in configs]
        if not texts:
            return outputs
        self.backend.ensure_calibration(texts)  # int8: calibrated on the first texts it sees unless told otherwise
        keys = [text_key(t, instruction) for t in texts]
        # A text that occurs several times is computed once, so its copies get identical vectors
        # (batch padding could otherwise make them differ in the last bits, and break score ties).
        first: dict[bytes, int] = {}
        source = [first.setdefault(k, i) for i, k in enumerate(keys)]
        caches = [self._cache_for(cfg) for cfg in configs]
        missing_by_config = [
            [i for i in self._fill_from_cache(out, cache, keys) if source[i] == i]
            for out, cache in zip(outputs, caches, strict=True)
        ]
        for group in self._forward_groups(configs):
            todo = sorted(set().union(*(missing_by_config[i] for i in group)))
            if not todo:
                continue
            writers = [
                _CacheWriter(
                    caches[i], keys, missing_by_config[i], outputs[i], self.cache_flush_rows, self.cache_flush_seconds
                )
                for i in group
            ]
            try:
                self._compute(
                    texts,
                    todo,
                    [configs[i] for i in group],
                    [outputs[i] for i in group],
                    instruction,
                    batch_size,
                    on_batch=partial(_add_rows, writers, [outputs[i] for i in group]),
                    features=features,
                )
            except BaseException:
                _flush_quietly(writers)  # keep the finished batches, then let the error through
                raise
            for writer in writers:
                writer.flush()
        for out in outputs:
            out[:] = out[source]
        return outputs

    def encode_late_chunks(
        self,
        texts: Sequence[str],
        config: EmbeddingConfig,
        chunking: Chunking,
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Late chunking: each text runs once through the model (truncated at ``config``'s ``max_length``), and
        its token states are pooled per ``chunking`` window over the pooled (text) tokens. Returns the raw chunk
        vectors and each chunk's text row. Not cached (the chunks depend on ``chunking``)."""
        texts = validate_texts(texts)
        features, mode = self._read_directly(texts, config, instruction, batch_size)
        spans = [_late_spans(f.pool_mask, chunking) for f in features]
        offsets = np.cumsum([0] + [len(s) for s in spans])
        out = np.empty((int(offsets[-1]), self.output_dim(config)), dtype=np.float32)
        with torch.inference_mode():
            for batch, states in self._states(features, config, mode, batch_size):
                width = batch.input_ids.shape[1]
                owner, masks = [], []
                for b, row in enumerate(batch.rows):
                    shift = width - len(features[row]) if self.padding_side == "left" else 0
                    for positions in spans[row]:
                        mask = torch.zeros(width, dtype=torch.long)
                        mask[[p + shift for p in positions]] = 1
                        owner.append(b)
                        masks.append(mask)
                pick = torch.tensor(owner, device=states.device)
                chunk_masks = torch.stack(masks).to(states.device)
                pooled = self._pool(states[pick], chunk_masks, config, batch.attention_mask[pick])
                pooled = self._with_terms(pooled, batch.input_ids[pick], chunk_masks, config)  # a chunk's own terms
                rows = [i for row in batch.rows for i in range(offsets[row], offsets[row + 1])]
                out[rows] = pooled.float().cpu().numpy()
        doc_index = np.repeat(np.arange(len(texts), dtype=np.int64), np.diff(offsets))
        return out, doc_index

    def encode_token_states(
        self,
        texts: Sequence[str],
        config: EmbeddingConfig,
        *,
        instruction: str | None = None,
        batch_size: int = ENCODE_BATCH_SIZE,
        features: Sequence[Features] | None = None,
    ) -> list[np.ndarray]:
        """The hidden states ``config`` pools from (its layer or fused layers, attention and final norm), one array
        ``(tokens, hidden)`` per text: every token the model reads (special tokens and ``instruction`` included,
        padding left out), in order. No pooling, head, term channel, normalisation or Matryoshka cut. Not cached.
        With ``features`` (one per text, built with ``instruction``), the texts are not tokenised again."""
        texts = validate_texts(texts)
        features, mode = self._read_directly(texts, config, instruction, batch_size, features)
        out: list[np.ndarray] = [np.empty((0, self.backbone.hidden_size), dtype=np.float32)] * len(texts)
        with torch.inference_mode():
            for batch, states in self._states(features, config, mode, batch_size):
                read = batch.attention_mask.to(states.device).bool()
                for b, row in enumerate(batch.rows):
                    out[row] = states[b][read[b]].float().cpu().numpy()
        return out

    def _read_directly(
        self,
        texts: list[str],
        config: EmbeddingConfig,
        instruction: str | None,
        batch_size: int,
        features: Sequence[Features] | None = None,
    ) -> tuple[list[Features], str]:
        """What the readings that take the states themselves (late chunks, token vectors) need first: the texts'
        features (``features`` when given, one per text) and the attention mode, with the backend ready for
        ``config`` as :meth:`encode_raw` readies it (int8 calibrated on the first texts it sees, the ONNX graph
        built)."""
        check_batch_size(batch_size)
        builder, mode = self._reading(config)
        if features is None:
            features = builder.build_all(texts, instruction)
        elif len(features) != len(texts):
            raise ConfigError(f"{len(features)} features for {len(texts)} texts")
        if texts:
            self.backend.ensure_calibration(texts)
            self._prepare(builder, [config], mode, batch_size)
        return list(features), mode

    def _states(
        self, features: list[Features], config: EmbeddingConfig, mode: str, batch_size: int
    ) -> Iterator[tuple[Batch, torch.Tensor]]:
        """Each batch of ``features`` (in input order) with the states ``config`` pools from."""
        with self.backbone.modes.hold(mode):
            self.backend.prepare([config], mode)  # again: a sibling of another mode may have run in between
            for batch in self._batches(features, list(range(len(features))), batch_size):
                yield batch, self.backend.states(batch.input_ids, batch.attention_mask, [config], mode)[0]

    # ------------------------------------------------------------------ cache
    def cache_model_key(self, config: EmbeddingConfig) -> str:
        """The model part of ``config``'s embedding-cache folder: the weights' fingerprint (with the pooling head's,
        where the strategy reads one) and what the backend adds (ONNX, int8 and its calibration)."""
        model_fp = self.backbone.fingerprint()
        if (config.pooling == "latent_attention" or config.head) and self.pooling_head is not None:
            model_fp += "-" + weights_fingerprint(self.pooling_head)
        return model_key(model_fp, self.backend.cache_tag())

    def _cache_for(self, config: EmbeddingConfig) -> EmbeddingCache | None:
        """The cache of ``config``'s vectors, kept across calls (each call then reads only the shards written since;
        a new one per call read every earlier call's shard again: many small calls slowed down without bound)."""
        if not self.use_cache:
            return None
        key = (str(self.cache_dir), self.cache_model_key(config), config.fingerprint(), self.output_dim(config))
        if key not in self._caches:
            self._caches[key] = EmbeddingCache(Path(key[0]), key[1], key[2], width=key[3])
        return self._caches[key]

    @staticmethod
    def _fill_from_cache(out: np.ndarray, cache: EmbeddingCache | None, keys: list[bytes]) -> list[int]:
        if cache is None:
            return list(range(len(keys)))
        return cache.fill(out, keys)

    # ------------------------------------------------------------------ grouping and batching
    @staticmethod
    def _forward_groups(configs: Sequence[EmbeddingConfig]) -> list[list[int]]:
        groups: dict[str, list[int]] = {}
        for i, cfg in enumerate(configs):
            groups.setdefault(json.dumps(cfg.forward_key(), sort_keys=True), []).append(i)
        return list(groups.values())

    def _batches(self, features: list[Features], rows: list[int], batch_size: int) -> Iterator[Batch]:
        window = DEFAULT_PLAN_WINDOW if self.plan_window is None else self.plan_window  # as the pipelined path plans
        lengths = [len(f) for f in features]
        for chunk in plan_batches(lengths, batch_size, self.max_batch_tokens, window, unpadded=self.unpadded):
            ids, attn, pool = collate(
                [features[j] for j in chunk], self.pad_id, self.padding_side, self.backbone.device
            )
            yield Batch(ids, attn, pool, [rows[j] for j in chunk])

    def _numpy_batches(self, builder: InputBuilder, texts: Sequence[str], batch_size: int) -> list[tuple]:
        """Padded numpy batches (ids, attention mask, pool mask) of ``texts``: calibration input for backends."""
        features = builder.build_all(texts)
        lengths = [len(f) for f in features]
        return [
            tuple(t.cpu().numpy() for t in collate([features[j] for j in chunk], self.pad_id, self.padding_side, "cpu"))
            for chunk in plan_batches(lengths, batch_size, self.max_batch_tokens, unpadded=self.unpadded)
        ]

    # ------------------------------------------------------------------ compute
    def input_builder(self, config: EmbeddingConfig, tokenizer=None, max_length: int | None = None) -> InputBuilder:
        """The input builder that tokenises texts for ``config`` (with ``tokenizer``, by default the backbone's;
        ``max_length``, by default the config's resolved against the model): what :meth:`encode_raw` builds its
        features with, and whoever builds them ahead of it (``features=``) must use."""
        return InputBuilder(
            tokenizer if tokenizer is not None else self.backbone.tokenizer,
            config,
            is_decoder=self.backbone.is_decoder,
            max_length=max_length or resolve_max_length(self.backbone, config.max_length),
        )

    def _reading(self, lead: EmbeddingConfig) -> tuple[InputBuilder, str]:
        """How texts are read for a group of strategies that share forward passes (``lead`` is the first):
        the input builder, and the attention mode of the forward pass."""
        return self.input_builder(lead), lead.attention if self.backbone.is_decoder else "bidirectional"

    def _compute(
        self,
        texts: Sequence[str],
        rows: list[int],
        configs: list[EmbeddingConfig],
        outputs: list[np.ndarray],
        instruction: str | None,
        batch_size: int,
        on_batch: Callable[[list[int]], None] | None = None,
        features: Sequence[Features] | None = None,
    ) -> None:
        """Fill ``outputs`` at ``rows``; ``on_batch(rows)`` is called after each batch is written there. With
        ``features`` (one per text of ``texts``), the texts are not tokenised again. Pipelined or in series
        (:attr:`pipelined`); a call of one batch has nothing to overlap and runs in series."""
        builder, mode = self._reading(configs[0])
        job = _Job(builder, mode, texts, rows, configs, outputs, instruction, batch_size, on_batch, features)
        several = len(rows) > batch_size or self.max_batch_tokens is not None
        run = self._run_pipelined if self.pipelined and several else self._run_serial
        with self.backbone.modes.hold(mode):  # the model's attention mode is the job's until it is done
            stats = run(job)
        self.last_run = stats
        log.info(
            "encoded %d texts (%d tokens, %.0f%% padding) on %s %s in %.1f s (%.1f texts/s, %s); tokenised in %.1f s, "
            "backend prepared in %.1f s",
            len(rows),
            stats.tokens,
            100 * (1 - stats.tokens / max(stats.padded, 1)),
            self.backend.name,
            self.backend.precision,
            stats.seconds,
            len(rows) / max(stats.seconds, 1e-9),
            "pipelined" if run == self._run_pipelined else "in series",
            stats.tokenise_seconds,
            stats.prepare_seconds,
        )

    def _prepare(self, builder: InputBuilder, configs: list[EmbeddingConfig], mode: str, batch_size: int) -> None:
        self.backend.prepare(
            configs, mode, batches_for=partial(self._numpy_batches, builder, batch_size=batch_size), pool=self._pool
        )

    def _run_serial(self, job: _Job) -> RunStats:
        """The reference path: tokenise everything, then per batch collate, compute and read back, in series."""
        stats = RunStats()
        start = time.perf_counter()
        features = job.features_of_rows(partial(job.builder.build_all, instruction=job.instruction))
        tokenised = time.perf_counter()
        self._prepare(job.builder, job.configs, job.mode, job.batch_size)
        prepared = time.perf_counter()
        with self._progress(job) as advance, torch.inference_mode():
            for batch in self._batches(features, job.rows, job.batch_size):
                pooled = self.forward_pool(
                    batch.input_ids, batch.attention_mask, batch.pool_mask, job.configs, backend=self.backend
                )
                for out, vectors in zip(job.outputs, pooled, strict=True):
                    out[batch.rows] = vectors.float().cpu().numpy()
                stats.padded += batch.attention_mask.numel()  # a shape: no device sync in the loop
                advance(batch.rows)
                if job.on_batch is not None:
                    job.on_batch(batch.rows)
        stats.seconds = time.perf_counter() - prepared
        stats.tokens = sum(len(f) for f in features)  # the attention mask's ones, counted without reading it
        stats.tokenise_seconds, stats.prepare_seconds = tokenised - start, prepared - tokenised
        return stats

    def _run_pipelined(self, job: _Job) -> RunStats:
        """The serial path's batches and kernels, its stages overlapped (:mod:`lmembed.encoding.pipeline`): a
        ``Prefetcher`` thread tokenises and collates ahead (bounded) while the device computes, and a ``ReadBack``
        brings each batch home while the next one computes (CUDA)."""
        stats = RunStats()
        start = time.perf_counter()
        # before the thread starts: calibration (int8) tokenises with the same tokenizer, which is not shared
        self._prepare(job.builder, job.configs, job.mode, job.batch_size)
        stats.prepare_seconds = time.perf_counter() - start
        device = self.backbone.device
        cuda = device.type == "cuda"
        with (
            Prefetcher(
                partial(self._feed, job, cuda and self.pin_inputs, stats), depth=QUEUE_DEPTH, name=COLLATE_THREAD
            ) as batches,
            self._progress(job) as advance,
            torch.inference_mode(),
        ):

            def done(finished: list[int]) -> None:
                advance(finished)
                if job.on_batch is not None:
                    job.on_batch(finished)

            readback = ReadBack(job.outputs, done, device)
            try:
                for batch in batches:
                    ids, attn, pool = (
                        t.to(device, non_blocking=cuda)
                        for t in (batch.input_ids, batch.attention_mask, batch.pool_mask)
                    )
                    pooled = self.forward_pool(ids, attn, pool, job.configs, backend=self.backend)
                    stats.padded += attn.numel()
                    readback.push(batch.rows, pooled)
                    readback.settle()  # the batch before this one, whose copy ran while this one computed
                readback.drain()
            except BaseException:
                readback.salvage()  # finished batches still reach on_batch (the cache), unless it is what failed
                raise
        # as serially: without windows every text is tokenised before the first batch; with them, while batches run
        waited = stats.tokenise_seconds if self.plan_window is None else 0.0
        stats.seconds = time.perf_counter() - start - stats.prepare_seconds - waited
        return stats

    def _feed(self, job: _Job, pin: bool, stats: RunStats, stop: threading.Event) -> Iterator[Batch]:
        """The producer of the pipelined path (on its own thread): tokenise (in chunks, so a stop is seen soon),
        plan the batches as the serial path does, then collate them one by one (in pinned memory with ``pin``). With a
        ``plan_window``, window after window, the next window tokenised on a thread of its own (``TOKENISE_THREAD``)
        while this one's batches are collated and computed: the tokenizer (Rust) runs beside the forward passes
        instead of behind the bounded queue."""

        def build(wanted: list[str]) -> list[Features]:
            built: list[Features] = []
            for first in range(0, len(wanted), TOKENISE_CHUNK):
                if stop.is_set():
                    break
                built.extend(job.builder.build_all(wanted[first : first + TOKENISE_CHUNK], job.instruction))
            return built

        def tokenise(first: int) -> tuple[list[Features], float]:
            start = time.perf_counter()
            features = job.features_of_rows(build, job.rows[first : first + window])
            return features, time.perf_counter() - start

        _check_window(self.plan_window)
        window = min(max(len(job.rows), 1), DEFAULT_PLAN_WINDOW) if self.plan_window is None else self.plan_window
        firsts = list(range(0, len(job.rows), window))
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=TOKENISE_THREAD) as ahead:
            pending = ahead.submit(tokenise, firsts[0]) if firsts else None
            for k, first in enumerate(firsts):
                assert pending is not None
                features, seconds = pending.result()
                if stop.is_set():
                    return
                pending = ahead.submit(tokenise, firsts[k + 1]) if k + 1 < len(firsts) else None
                stats.tokenise_seconds += seconds
                stats.tokens += sum(len(f) for f in features)
                lengths = [len(f) for f in features]
                for chunk in plan_batches(lengths, job.batch_size, self.max_batch_tokens, unpadded=self.unpadded):
                    if stop.is_set():
                        return
                    batch = [features[j] for j in chunk]
                    ids, attn, pool = collate_host(batch, self.pad_id, self.padding_side, pin=pin)
                    yield Batch(ids, attn, pool, [job.rows[first + j] for j in chunk])

    def prepare_backend(self, configs: Sequence[EmbeddingConfig], instruction: str | None = None) -> Path:
        """Build (or load) the backend's graph for ``configs`` without encoding anything; returns its export
        folder (a backend that exports one: ONNX)."""
        builder, mode = self._reading(configs[0])
        self.backend.prepare(
            configs,
            mode,
            batches_for=partial(self._numpy_batches, builder, batch_size=ENCODE_BATCH_SIZE),
            pool=self._pool,
        )
        folder = self.backend.graph_folder(configs, mode)
        if folder is None:
            raise ValueError(f"the {self.backend.name} backend has no exported graph")
        return folder

    def forward_pool(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pool_mask: torch.Tensor,
        configs: Sequence[EmbeddingConfig],
        *,
        backend: Backend | None = None,
    ) -> list[torch.Tensor]:
        """One forward pass on ``backend``, pooled once per config. The default, torch, is differentiable: training
        uses it whatever backend encodes."""
        mode = configs[0].attention if self.backbone.is_decoder else "bidirectional"
        states = (backend or self.torch_backend).states(input_ids, attention_mask, configs, mode)
        pooled = [self._pool(st, pool_mask, cfg, attention_mask) for st, cfg in zip(states, configs, strict=True)]
        return [self._with_terms(p, input_ids, pool_mask, cfg) for p, cfg in zip(pooled, configs, strict=True)]

    def _with_terms(
        self, pooled: torch.Tensor, input_ids: torch.Tensor, pool_mask: torch.Tensor, cfg: EmbeddingConfig
    ) -> torch.Tensor:
        """A strategy with a term channel: the dense vector, L2-normalised, then the text's term part (weighed)."""
        if cfg.terms is None:
            return pooled
        if self.terms is None or self.terms.config != cfg.terms:
            raise ValueError("the strategy names a term channel that this model does not hold (Embedder loads it)")
        dense = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
        terms = self.terms(input_ids.to(dense.device), pool_mask.to(dense.device), cfg.route)
        return torch.cat([dense, terms], dim=-1).to(pooled.dtype)

    def output_dim(self, cfg: EmbeddingConfig) -> int:
        """The width of ``cfg``'s raw vectors: the hidden size, or what a post-pooling head makes of it, and a term
        channel's buckets after it."""
        extra = cfg.terms.dims if cfg.terms is not None else 0
        if cfg.head and self.pooling_head is not None:
            return self.pooling_head.output_dim(self.backbone.hidden_size, cfg.route) + extra
        return self.backbone.hidden_size + extra

    def _pool(
        self,
        states: torch.Tensor,
        pool_mask: torch.Tensor,
        cfg: EmbeddingConfig,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if cfg.pooling == "latent_attention":
            if self.pooling_head is None:
                raise ValueError("pooling='latent_attention' needs a pooling head (Embedder creates one)")
            return self.pooling_head(states, pool_mask)
        if cfg.pooling == "weighted_mean" and cfg.prompt_style != "lmembed" and attention_mask is not None:
            pooled = STATELESS_POOLERS["weighted_mean"](states, pool_mask, attention_mask)
        else:
            pooled = STATELESS_POOLERS[cfg.pooling](states, pool_mask)
        if cfg.head:
            if self.pooling_head is None:
                raise ValueError("a strategy with a post-pooling head needs the head's weights (Embedder loads them)")
            pooled = self.pooling_head(pooled, cfg.route)
        return pooled

    @contextmanager
    def _progress(self, job: _Job):
        """``advance(rows)`` after each batch. The bar counts texts, while its percentage and time left follow the
        characters done (plus the instruction's, per text): batches run longest first, so a rate per text would
        make the first minutes promise too late an end."""
        total = len(job.rows)
        if not self.show_progress or total < PROGRESS_MIN_TEXTS:
            yield lambda rows: None
            return
        extra = len(job.instruction or "") + 1
        work = {row: len(job.texts[row]) + extra for row in job.rows}
        label = ", ".join(c.label() for c in job.configs[:3]) + (" ..." if len(job.configs) > 3 else "")
        counted = f"{{task.fields[{terminal.ITEMS}]}}/{{task.fields[{terminal.ITEMS_TOTAL}]}}"
        columns = (TextColumn(f"encoding [{label}]"), BarColumn(), TextColumn(counted), TimeRemainingColumn())
        with terminal.progress(*columns, label=f"encoding [{label}]", unit="texts", transient=True) as progress:
            fields = {terminal.ITEMS: 0, terminal.ITEMS_TOTAL: total}
            task = progress.add_task("encode", total=sum(work.values()), **fields)
            done = 0

            def advance(rows: Sequence[int]) -> None:
                nonlocal done
                done += len(rows)
                progress.update(task, advance=sum(work[row] for row in rows), **{terminal.ITEMS: done})

            yield advance


def _late_spans(pool_mask: Sequence[int], chunking: Chunking) -> list[list[int]]:
    """The positions of each chunk of one tokenised text: ``chunking``'s windows over its pooled positions (a text
    with none pools its whole pool mask as one chunk)."""
    pooled = [i for i, m in enumerate(pool_mask) if m]
    windows = token_windows(len(pooled), chunking.tokens, chunking.overlap)
    if chunking.aggregate == "first":
        windows = windows[:1]
    return [pooled[start:end] for start, end in windows] if pooled else [[]]


class NonFiniteVectorsError(ModelLoadError):
    """The model gave NaN or infinite values for some texts: no vector of them is returned or cached."""


def _add_rows(writers: Sequence[_CacheWriter], outputs: Sequence[np.ndarray], rows: list[int]) -> None:
    """After a batch: its rows must be finite in every output (checked before any is cached), then they are
    handed to the cache writers."""
    for out in outputs:
        block = out[rows]
        # a vector whose length overflows float32 is as bad: normalised, it came out all zeros
        with np.errstate(over="ignore", invalid="ignore"):
            bad = ~np.isfinite(block).all(axis=1) | ~np.isfinite(np.linalg.norm(block, axis=1))
        if bad.any():
            first = rows[int(np.argmax(bad))]
            raise NonFiniteVectorsError(
                f"the model gave NaN or infinite values (or vectors too long for float32) for {int(bad.sum())} of a "
                f"batch's {len(rows)} texts (the first: text {first}); its weights are not finite or are far past "
                "any trained model's, or its dtype overflows (float16: try bfloat16 or float32); nothing of them was "
                "returned or cached"
            )
    for writer in writers:
        writer.add(rows)


def _flush_quietly(writers: Sequence[_CacheWriter]) -> None:
    for writer in writers:
        try:
            writer.flush()
        except Exception as exc:  # the original error matters more than a failed cache write
            log.warning("could not write finished embeddings to the cache: %s", exc)
