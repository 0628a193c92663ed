"""Gradient caching for large contrastive batches (Gao et al., 2021, "Scaling Deep Contrastive Learning
Batch Size under Memory Limited Setup").

In-batch-negative losses couple every row of a batch, so the batch cannot simply be split into
gradient-accumulation steps. GradCache splits the *encoder* work instead and keeps the loss global:

1. embed every chunk of ``chunk_size`` rows with gradients off, remembering the RNG state before each
   chunk, and concatenate the results;
2. compute the loss on those detached embeddings and backpropagate it only as far as the embeddings,
   which yields ``d loss / d embedding`` for every row (cheap: no encoder graph exists);
3. run each chunk through the encoder again, this time building the graph, with the RNG state of step
   1 restored so dropout draws the same masks, and push the cached gradient into it with
   ``torch.autograd.backward(embedding, cached_grad)``.

Parameter gradients end up identical to a single backward over the whole batch (up to float
rounding), while the encoder's activation memory is that of one chunk. The price is a second forward
pass.

Typical trainer use::

    cache = GradCache(embed_fn=lambda features: pool(model(**features), features), loss=InfoNCELoss(),
                      chunk_size=16, no_sync=model.no_sync)   # no_sync only under DDP
    loss = cache(query_features, positive_features, negative_features)  # grads are now in .grad
    optimizer.step(); optimizer.zero_grad()

``negative_features`` holds ``B * N`` rows, query-major (rows ``i*N .. i*N + N - 1`` belong to query
``i``). For losses with another signature (AnglE) use :meth:`GradCache.run` with your own loss closure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor

from lmembed.errors import ConfigError

__all__ = ["EmbedFn", "Features", "GradCache", "RngSnapshot", "num_rows", "split_features"]

Features = Tensor | Mapping[str, Any]
EmbedFn = Callable[[Features], Tensor]
LossFn = Callable[[list[Tensor | None]], Tensor]


def num_rows(features: Features) -> int:
    """Batch size of a tensor or of a tokenised mapping (first tensor's leading dimension)."""
    if isinstance(features, Tensor):
        return features.size(0)
    for key in ("input_ids", "attention_mask"):
        value = features.get(key)
        if isinstance(value, Tensor):
            return value.size(0)
    for value in features.values():
        if isinstance(value, Tensor) and value.dim() > 0:
            return value.size(0)
    raise ValueError("features contain no tensor to take a batch size from")


def _slice_rows(features: Features, start: int, stop: int, rows: int) -> Features:
    if isinstance(features, Tensor):
        return features[start:stop]
    return {
        key: value[start:stop] if isinstance(value, Tensor) and value.dim() > 0 and value.size(0) == rows else value
        for key, value in features.items()
    }


def split_features(features: Features, chunk_size: int) -> list[Features]:
    """Cut a batch into consecutive chunks of at most ``chunk_size`` rows.

    Tensors whose leading dimension equals the batch size are sliced; other values (flags, scalars)
    are shared by every chunk.
    """
    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    rows = num_rows(features)
    return [_slice_rows(features, start, min(start + chunk_size, rows), rows) for start in range(0, rows, chunk_size)]


def _tensors_in(features: Features) -> Iterable[Tensor]:
    if isinstance(features, Tensor):
        return [features]
    return [value for value in features.values() if isinstance(value, Tensor)]


class RngSnapshot:
    """The CPU RNG state, plus CUDA states of the devices in use, captured at construction."""

    def __init__(self, tensors: Iterable[Tensor] = ()) -> None:
        self.cpu_state = torch.get_rng_state()
        self.cuda_devices = self._cuda_devices(tensors)
        self.cuda_states = [torch.cuda.get_rng_state(device) for device in self.cuda_devices]

    @staticmethod
    def _cuda_devices(tensors: Iterable[Tensor]) -> list[int]:
        devices = {t.device.index for t in tensors if t.is_cuda and t.device.index is not None}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            devices.add(torch.cuda.current_device())  # the model may sit on the GPU even if inputs do not
        return sorted(devices)

    @contextmanager
    def replay(self) -> Iterator[None]:
        """Run the block from the captured state; the surrounding RNG state is restored afterwards."""
        with torch.random.fork_rng(devices=self.cuda_devices):
            torch.set_rng_state(self.cpu_state)
            for device, state in zip(self.cuda_devices, self.cuda_states, strict=True):
                torch.cuda.set_rng_state(state, device)
            yield


class GradCache:
    """Memory-bounded forward/backward for losses that couple all rows of a batch.

    Args:
        embed_fn: maps one chunk of features (a tensor or a tokenised mapping) to its embeddings,
            with autograd enabled; it is called twice per chunk.
        loss: the objective applied to the full batch of embeddings by :meth:`__call__`
            (any retrieval loss of :mod:`lmembed.training.losses`); optional when only :meth:`run` is used.
        chunk_size: rows per encoder call.
        no_sync: under DDP pass ``model.no_sync`` so gradients are all-reduced once, at the last chunk.

    Calling the object performs the whole backward pass and returns the detached loss value.
    Gradients accumulate into ``.grad`` like ``loss.backward()`` would; zeroing them is the caller's job.
    """

    def __init__(
        self,
        embed_fn: EmbedFn,
        loss: Callable[..., Tensor] | None = None,
        chunk_size: int = 32,
        *,
        no_sync: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        if chunk_size <= 0:
            raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
        self.embed_fn = embed_fn
        self.loss = loss
        self.chunk_size = chunk_size
        self.no_sync = no_sync

    def __call__(
        self, queries: Features, positives: Features, negatives: Features | None = None, **loss_kwargs: Any
    ) -> Tensor:
        """Query/positive/hard-negative step with ``self.loss`` (``loss_kwargs``, e.g. a distillation loss's
        ``teacher_scores``, go to it as they are); returns the detached loss."""
        if self.loss is None:
            raise ValueError("GradCache was built without a loss; pass one or use run()")
        loss = self.loss
        batch = num_rows(queries)

        def loss_fn(embeddings: list[Tensor | None]) -> Tensor:
            query, positive, negative = embeddings
            if negative is not None:
                if negative.size(0) % batch:
                    raise ValueError(f"{negative.size(0)} negative rows do not split over {batch} queries")
                negative = negative.reshape(batch, -1, negative.size(-1))
            return loss(query, positive, negative, **loss_kwargs)

        return self.run([queries, positives, negatives], loss_fn)

    def run(self, groups: Sequence[Features | None], loss_fn: LossFn) -> Tensor:
        """Generic GradCache step over several groups of rows (e.g. text1/text2 for AnglE).

        ``loss_fn`` receives one embedding tensor per group, in order (``None`` for a group that is
        ``None`` or empty) and returns a scalar. Returns the loss, detached.
        """
        present = [g if g is not None and num_rows(g) > 0 else None for g in groups]
        chunks = [split_features(g, self.chunk_size) if g is not None else [] for g in present]
        cached, snapshots = self._embed_without_grad(chunks)
        loss, grads = self._embedding_gradients(cached, loss_fn)
        self._replay_with_grad(chunks, snapshots, grads)
        return loss

    def _embed_without_grad(self, chunks: list[list[Features]]) -> tuple[list[list[Tensor]], list[list[RngSnapshot]]]:
        """Step 1: embeddings of every chunk, plus the RNG state each chunk started from."""
        embeddings: list[list[Tensor]] = []
        snapshots: list[list[RngSnapshot]] = []
        with torch.no_grad():
            for group in chunks:
                group_embeddings, group_snapshots = [], []
                for chunk in group:
                    group_snapshots.append(RngSnapshot(_tensors_in(chunk)))
                    group_embeddings.append(self.embed_fn(chunk))
                embeddings.append(group_embeddings)
                snapshots.append(group_snapshots)
        return embeddings, snapshots

    @staticmethod
    def _embedding_gradients(cached: list[list[Tensor]], loss_fn: LossFn) -> tuple[Tensor, list[list[Tensor | None]]]:
        """Step 2: loss on the detached embeddings and its gradient w.r.t. each chunk's embedding."""
        leaves: list[Tensor | None] = [
            torch.cat(group).detach().requires_grad_(True) if group else None for group in cached
        ]
        loss = loss_fn(leaves)
        loss.backward()  # also reaches any parameters of the loss itself (e.g. a learnable scale)
        grads: list[list[Tensor | None]] = []
        for group, leaf in zip(cached, leaves, strict=True):
            if leaf is None or leaf.grad is None:
                grads.append([None] * len(group))
                continue
            grads.append(list(leaf.grad.split([len(e) for e in group])))
        return loss.detach(), grads

    def _replay_with_grad(
        self,
        chunks: list[list[Features]],
        snapshots: list[list[RngSnapshot]],
        grads: list[list[Tensor | None]],
    ) -> None:
        """Step 3: re-embed each chunk with the same randomness and feed in its cached gradient."""
        work = [
            (chunk, snapshot, grad)
            for group, group_snapshots, group_grads in zip(chunks, snapshots, grads, strict=True)
            for chunk, snapshot, grad in zip(group, group_snapshots, group_grads, strict=True)
            if grad is not None
        ]
        for position, (chunk, snapshot, grad) in enumerate(work):
            is_last = position == len(work) - 1
            sync = nullcontext() if self.no_sync is None or is_last else self.no_sync()
            with sync, snapshot.replay():
                embedding = self.embed_fn(chunk)
                torch.autograd.backward(embedding, grad_tensors=grad)
