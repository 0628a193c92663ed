"""CUDA graphs: the torch backend's forward pass recorded once per batch shape, then replayed with one launch.

On a GPU a small model's forward pass is bound by the host, not the device: Python launches each of the model's
kernels one by one, and at a few hundred tokens a batch the device finishes each kernel before the next is launched
(on an H200, a 30-layer SmolLM2-135M shape took ~30 ms a batch for 32 or for 128 short texts alike:
``bench/results/gpu-throughput/h200-stop48``). A CUDA graph records the kernels of one pass over fixed input
buffers; a replay launches them all at once, and the host is free to tokenise the next batches.

**Shapes.** A graph replays one shape, so each batch is widened to a *bucket*: its rows and its tokens rounded up
by :func:`bucket` (a bucket is less than an eighth larger than the batch; tokens in steps of at least
:data:`MIN_WIDTH_STEP`, never past the model's position table), so the shapes a run meets stay few, about eight per
doubling of the length. The added rows and columns are masked padding on the right: no real token attends to
them, each keeps its position (counted from the mask, or from 0 on the left of the row), and the engine pools the
batch's own columns. Each text's states are therefore the torch backend's up to float rounding (the kernels see
larger shapes and may split their sums differently): ``tests/encoding/test_cuda_graphs.py`` and the family matrix
check this on every encoder family and on decoders in both attention modes.

**Graphs.** A bucket's graph is captured the first time the bucket is met, after one eager pass of the same shape
on a side stream (lazy initialisation and kernel choices happen outside the graph), into one memory pool that all
of the backend's graphs share: a replay's states are copied out before anything else replays, under a lock, so
engines on several threads may share the backend. At most ``max_graphs`` are kept; a shape met after that runs
eagerly at its bucket's size. The graphs read the weights where they were at capture: :meth:`CudaGraphBackend.prepare`
(before every encode call) drops them when the model's parameters or buffers have moved (``model.to``, weights
loaded into new tensors); values changed in place (an optimizer's step) are read as they are.

A model whose forward pass cannot be captured (it reads device values on the host: data-dependent shapes, an
``.item()``) is refused when its first graph is captured, naming the model type and CUDA's error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmembed.config import EmbeddingConfig
from lmembed.encoding.backends.base import Backend, BackendError, BatchMaker, Pooler, TorchBackend
from lmembed.models.families import check_verified
from lmembed.models.loading import Backbone

log = logging.getLogger(__name__)

__all__ = ["MAX_GRAPHS", "MIN_WIDTH_STEP", "CudaGraphBackend", "bucket"]

#: Graphs one backend keeps (each holds its own output states in the shared pool); shapes beyond run eagerly.
MAX_GRAPHS = 64
#: Tokens are bucketed in steps of at least this many (rows in steps of at least one).
MIN_WIDTH_STEP = 8


def bucket(n: int, min_step: int = 1) -> int:
    """``n`` rounded up to a multiple of ``min_step`` or of a sixteenth of the power of two at or above ``n``,
    whichever is larger: less than ``max(min_step, n / 8)`` added, and eight buckets per doubling (65 to 128 round
    up to 72, 80, ..., 128)."""
    if n < 1:
        raise ValueError(f"a batch of {n} rows or tokens has no bucket")
    step = max(min_step, 1 << max(0, (n - 1).bit_length() - 4))
    return -(-n // step) * step


@dataclass
class _Graph:
    """One bucket's captured pass: its fixed input buffers and the states it leaves (in the shared pool)."""

    replay: Callable[[], None]  # the CUDA graph's replay
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    states: list[torch.Tensor]


def _fill(ids: torch.Tensor, attn: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Write a batch into a bucket's buffers: its rows and columns top left, masked padding around them, and one
    unmasked token in each added row (a row with nothing to attend to gives NaN in some kernels)."""
    rows, width = input_ids.shape
    ids.zero_()
    attn.zero_()
    ids[:rows, :width].copy_(input_ids, non_blocking=True)
    attn[:rows, :width].copy_(attention_mask, non_blocking=True)
    if rows < attn.shape[0]:
        attn[rows:, 0] = 1


def _reads(configs: Sequence[EmbeddingConfig]) -> tuple:
    """What of ``configs`` decides the states a pass returns (the torch backend reads nothing else of them)."""
    return tuple((tuple(c.layers), c.final_norm) for c in configs)


def _weights_where(model: torch.nn.Module) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in (*model.parameters(), *model.buffers()))


class CudaGraphBackend(Backend):
    """The torch model on a CUDA device, each batch shape's forward pass captured once as a CUDA graph and replayed
    (see the module's text). Not differentiable: training runs on the torch backend.

    ``capture=False`` runs every batch eagerly at its bucket's shape (what a replay computes, on any device): the
    reference the tests compare with the torch backend on CPU. ``min_row_step`` / ``min_width_step`` set the
    smallest bucket steps (tests use large ones, so that every batch is widened)."""

    name = "cuda-graphs"

    def __init__(
        self,
        backbone: Backbone,
        *,
        capture: bool = True,
        max_graphs: int = MAX_GRAPHS,
        min_row_step: int = 1,
        min_width_step: int = MIN_WIDTH_STEP,
    ) -> None:
        super().__init__(backbone)
        if capture and backbone.device.type != "cuda":
            raise BackendError(
                f"backend={self.name!r} replays CUDA graphs: it needs the model on a CUDA device (device='cuda'); "
                f"this one is on {backbone.device.type!r}"
            )
        if max_graphs < 0:
            raise BackendError(f"max_graphs={max_graphs!r} must be a number of graphs (>= 0)")
        self.eager = TorchBackend(backbone)
        check_verified(backbone.model, backbone.is_decoder, self.name)
        self.precision = self.eager.precision
        self.capture = capture
        self.max_graphs = max_graphs
        self.min_row_step = min_row_step
        self.min_width_step = min_width_step
        positions = getattr(backbone.model.config, "max_position_embeddings", None)
        # a model that numbers its positions itself gives the added columns positions too: they must exist
        self.max_width = positions if isinstance(positions, int) and positions > 0 else None
        self.graphs: dict[tuple, _Graph] = {}
        self.eager_passes = 0  # passes run eagerly at a bucket's shape (capture off, or past max_graphs)
        self._lock = threading.Lock()
        self._pool: Any = None
        self._weights: tuple[int, ...] | None = None
        self._said_full = False

    def prepare(
        self,
        configs: Sequence[EmbeddingConfig],
        mode: str,
        batches_for: BatchMaker | None = None,
        pool: Pooler | None = None,
    ) -> None:
        """The torch backend's preparation (a decoder's attention mode), and the graphs dropped when the weights
        have moved since they were captured."""
        self.eager.prepare(configs, mode, batches_for, pool)
        where = _weights_where(self.backbone.model)
        with self._lock:
            if where != self._weights:
                if self.graphs:
                    log.info("%s: the weights moved; its %d graphs are captured again", self.name, len(self.graphs))
                self.graphs.clear()
                self._weights = where

    def shape_for(self, rows: int, width: int) -> tuple[int, int]:
        """The bucket a batch of ``rows`` texts padded to ``width`` tokens runs at."""
        wide = bucket(width, self.min_width_step)
        if self.max_width is not None and wide > self.max_width:
            wide = max(width, self.max_width)
        return bucket(rows, self.min_row_step), wide

    def states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, configs: Sequence[EmbeddingConfig], mode: str
    ) -> list[torch.Tensor]:
        rows, width = input_ids.shape
        shape = self.shape_for(rows, width)
        key = (mode, _reads(configs), *shape)
        with self._lock, torch.inference_mode():
            if self._weights is None:  # states before any prepare: the weights as they are now
                self._weights = _weights_where(self.backbone.model)
            graph = self.graphs.get(key)
            if graph is None and self.capture and len(self.graphs) < self.max_graphs:
                graph = self.graphs[key] = self._capture(shape, configs, mode)
            if graph is None:
                self._say_full()
                ids, attn = self._buffers(shape)
                _fill(ids, attn, input_ids, attention_mask)  # copy_ moves them to the buffers' device
                self.eager_passes += 1
                return [s[:rows, :width] for s in self.eager.states(ids, attn, configs, mode)]
            _fill(graph.input_ids, graph.attention_mask, input_ids, attention_mask)
            graph.replay()
            # copied out of the shared pool before another graph replays over it
            return [s[:rows, :width].clone() for s in graph.states]

    def _buffers(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.backbone.device
        return tuple(torch.zeros(shape, dtype=torch.long, device=device) for _ in range(2))  # type: ignore[return-value]

    def _capture(self, shape: tuple[int, int], configs: Sequence[EmbeddingConfig], mode: str) -> _Graph:
        ids, attn = self._buffers(shape)
        attn[:, 0] = 1
        try:
            replay, states = self._record(lambda: list(self.eager.states(ids, attn, configs, mode)))
        except RuntimeError as exc:
            raise BackendError(
                f"backend={self.name!r}: the forward pass of model_type={self.backbone.model_type!r} cannot be "
                f"captured as a CUDA graph at {shape[0]} x {shape[1]} tokens ({exc}); backend='torch' runs it"
            ) from exc
        log.info("%s: captured a graph of %d x %d tokens (%d kept)", self.name, *shape, len(self.graphs) + 1)
        return _Graph(replay, ids, attn, states)

    def _record(self, run: Callable[[], list[torch.Tensor]]) -> tuple[Callable[[], None], list[torch.Tensor]]:
        """``run`` (a pass over fixed buffers) captured as a CUDA graph: the graph's replay, and the tensors each
        replay writes ``run``'s results into. One eager pass on a side stream first, so that lazy initialisation
        (handles, workspaces) and kernel choices happen outside the graph."""
        device = self.backbone.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine's collating thread may allocate pinned memory while this thread captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            states = run()
        return graph.replay, states

    def _say_full(self) -> None:
        if self.capture and not self._said_full:
            self._said_full = True
            log.info("%s: %d graphs kept; other shapes run eagerly at their bucket's size", self.name, self.max_graphs)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_graphs": self.max_graphs}
