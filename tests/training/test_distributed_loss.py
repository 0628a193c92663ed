"""Losses over gathered embeddings on 2 CPU processes equal the single-process global-batch loss
(InfoNCE, plain and symmetric, and GTE's query-query / document-document partition)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lmembed.training.distributed import gather_with_grad, global_batch_offset, rank, world_size
from lmembed.training.losses import GTELoss, InfoNCELoss

WORLD = 2
GLOBAL_BATCH, NEGATIVES, DIM_IN, DIM = 8, 2, 6, 5
LOSSES = {
    "infonce": lambda gather: InfoNCELoss(temperature=0.1, gather=gather),
    "infonce-symmetric": lambda gather: InfoNCELoss(temperature=0.1, symmetric=True, gather=gather),
    "gte": lambda gather: GTELoss(temperature=0.1, gather=gather),
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _shared_problem() -> dict[str, torch.Tensor]:
    """Inputs and a projection that every process rebuilds identically from one seed."""
    gen = torch.Generator().manual_seed(0)
    return {
        "query": torch.randn(GLOBAL_BATCH, DIM_IN, generator=gen),
        "positive": torch.randn(GLOBAL_BATCH, DIM_IN, generator=gen),
        "negatives": torch.randn(GLOBAL_BATCH, NEGATIVES, DIM_IN, generator=gen),
        "weight": torch.randn(DIM, DIM_IN, generator=gen),
    }


def _loss_and_grads(loss_fn: torch.nn.Module, rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss on ``rows`` of the shared inputs, and gradients w.r.t. all shared inputs and the weight."""
    leaves = {name: t.requires_grad_(True) for name, t in _shared_problem().items()}
    weight = leaves["weight"]
    loss = loss_fn(
        leaves["query"][rows] @ weight.T,
        leaves["positive"][rows] @ weight.T,
        leaves["negatives"][rows] @ weight.T,
    )
    loss.backward()
    return loss.detach(), {name: t.grad for name, t in leaves.items()}


def _check_uneven_gather(process: int) -> None:
    """Rank r holds r + 1 rows; each local row must receive the gradient of every process's loss."""
    local = torch.full((process + 1, 2), float(process), requires_grad=True)
    gathered = gather_with_grad(local)
    assert gathered.shape == (3, 2)
    assert gathered[:1].eq(0).all() and gathered[1:].eq(1).all()
    (gathered * torch.arange(1.0, 4.0).unsqueeze(1)).sum().backward()
    start = 0 if process == 0 else 1
    expected = WORLD * torch.arange(1.0, 4.0)[start : start + process + 1].unsqueeze(1).expand(-1, 2)
    assert torch.equal(local.grad, expected)
    assert global_batch_offset(process + 1) == start


def _worker(process: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=process, world_size=WORLD)
    try:
        _check_uneven_gather(process)
        local = GLOBAL_BATCH // WORLD
        rows = slice(process * local, (process + 1) * local)
        for name, make_loss in LOSSES.items():
            loss, grads = _loss_and_grads(make_loss(gather_with_grad), rows)
            # What DDP does: average the loss for logging and the gradients for the update.
            dist.all_reduce(loss)
            for grad in grads.values():
                dist.all_reduce(grad)
            result = {"loss": loss / WORLD, **{k: g / WORLD for k, g in grads.items()}}
            torch.save(result, Path(out_dir) / f"rank{process}-{name}.pt")
        dist.barrier()  # leave together: a rank tearing gloo down under a busy peer aborts it
    finally:
        dist.destroy_process_group()


def test_helpers_are_identity_when_not_distributed():
    t = torch.randn(3, 2)
    assert gather_with_grad(t) is t
    assert global_batch_offset(3) == 0 and rank() == 0 and world_size() == 1


def test_gathered_losses_match_single_process(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    for loss_name, make_loss in LOSSES.items():
        expected_loss, expected_grads = _loss_and_grads(make_loss(None), slice(None))
        for process in range(WORLD):
            result = torch.load(tmp_path / f"rank{process}-{loss_name}.pt")
            torch.testing.assert_close(result["loss"], expected_loss, atol=1e-6, rtol=1e-5, msg=loss_name)
            for name, grad in expected_grads.items():
                msg = f"{name} ({loss_name}, rank={process})"
                torch.testing.assert_close(result[name], grad, atol=1e-6, rtol=1e-5, msg=msg)
