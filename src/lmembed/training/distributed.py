"""Data parallelism: joining the process group, and cross-process helpers for contrastive losses.

:func:`setup_distributed` joins the process group that ``accelerate launch``/``torchrun`` describe in
the environment (if any) and returns this process's :class:`DistContext` (rank, world size, device).

With in-batch negatives, a bigger candidate pool means a harder and more useful objective. Under DDP
every process only sees its own shard of the batch, so the losses gather the candidate embeddings of
all processes before scoring them. Two things must hold for that to train correctly:

* the gathered tensor has to stay differentiable for the rows this process produced, so that the
  gradient that *other* processes' losses send to our embeddings reaches our parameters; and
* the classification targets have to index the global rows, which is what ``global_batch_offset``
  supplies.

Gradient bookkeeping: each process computes the mean loss over its own queries. ``gather_with_grad``
sums the gradient of every process's loss with respect to the gathered tensor and keeps the slice
that belongs to the local rows. DDP then averages parameter gradients over processes, which yields
exactly the gradient of the global-batch mean loss (with equal local batch sizes).

Everything degrades to the identity when ``torch.distributed`` is not initialised, so single-process
code can call these helpers unconditionally.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "DistContext",
    "gather_with_grad",
    "global_batch_offset",
    "is_distributed",
    "rank",
    "setup_distributed",
    "world_size",
]


def is_distributed() -> bool:
    """True when ``torch.distributed`` has an initialised default process group."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes in the default group; 1 when not distributed."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """Rank of this process in the default group; 0 when not distributed."""
    return dist.get_rank() if is_distributed() else 0


def _collective_device(hint: torch.device | None = None) -> torch.device:
    """Device on which small bookkeeping tensors must live for the active backend."""
    if hint is not None:
        return hint
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class DistContext:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def mean(self, value: Tensor) -> float:
        """Average of a scalar over processes."""
        if self.world_size == 1:
            return float(value)
        total = value.detach().clone().reshape(1).to(_collective_device())
        dist.all_reduce(total)
        return float(total) / self.world_size


def setup_distributed(device: str = "auto") -> DistContext:
    """Join the process group that ``accelerate launch``/``torchrun`` describe in the environment, if any.

    ``device`` is ``auto`` (this process's GPU when there is one, else the CPU), ``cpu``, ``cuda``
    (this process's GPU) or an explicit ``cuda:N``.
    """
    if not is_distributed() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState  # lazy: accelerate is slow to import and only multi-process runs need it

        PartialState(cpu=device == "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif device == "cuda":  # an explicit index: torch.cuda.set_device rejects a bare "cuda" on some versions
        device = f"cuda:{local_rank}"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    return DistContext(rank(), world_size(), device)


def _gather_row_counts(local_rows: int, device: torch.device | None = None) -> list[int]:
    """Number of rows every process holds, in rank order (one tiny all-gather)."""
    count = torch.tensor([local_rows], dtype=torch.long, device=_collective_device(device))
    counts = [torch.zeros_like(count) for _ in range(world_size())]
    dist.all_gather(counts, count)
    return [int(c.item()) for c in counts]


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums gradients over processes and keeps the local slice."""

    @staticmethod
    def forward(ctx, tensor: Tensor, counts: tuple[int, ...]) -> Tensor:  # type: ignore[override]
        me = dist.get_rank()
        ctx.start = sum(counts[:me])
        ctx.rows = counts[me]
        longest = max(counts)
        padded = tensor.contiguous()
        if tensor.size(0) < longest:  # all_gather needs equal shapes: pad, then cut back
            filler = tensor.new_zeros((longest - tensor.size(0), *tensor.shape[1:]))
            padded = torch.cat([padded, filler])
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded)
        return torch.cat([piece[:n] for piece, n in zip(pieces, counts, strict=True)])

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        total = grad_output.contiguous().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[ctx.start : ctx.start + ctx.rows], None


def gather_with_grad(tensor: Tensor) -> Tensor:
    """Concatenate ``tensor`` from every process along dim 0, in rank order.

    The result is differentiable with respect to the local input: in backward the gradients that
    all processes computed for the gathered tensor are summed, and this process receives the rows
    it contributed. Processes may hold different numbers of rows; trailing dimensions must match.
    Returns ``tensor`` unchanged when ``torch.distributed`` is not initialised.
    """
    if not is_distributed() or world_size() == 1:
        return tensor
    counts = tuple(_gather_row_counts(tensor.size(0), tensor.device))
    return _GatherRows.apply(tensor, counts)


def global_batch_offset(local_batch_size: int, device: torch.device | None = None) -> int:
    """Index of this process's first row inside a tensor produced by :func:`gather_with_grad`.

    A loss that scores local queries against gathered candidates adds this offset to its local
    targets (``arange(B) + offset``). Uneven shards are handled by exchanging the row counts.
    Returns 0 when not distributed.
    """
    if not is_distributed() or world_size() == 1:
        return 0
    counts = _gather_row_counts(local_batch_size, device)
    return sum(counts[: rank()])
