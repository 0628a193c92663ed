"""Data-parallel training: two CPU processes (gloo) must take the same step as one process on the global batch.

In-batch negatives are gathered across processes, so each process's queries compete with the positives
and negatives of both shards; the mean of the per-process losses then equals the single-process loss,
and DDP's averaged gradients equal the single-process gradient. Checked for the plain step and for
GradCache.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer
from test_trainer import ROWS

GLOBAL_BATCH = 8
CHUNKS = (None, 2)  # plain step, then GradCache with chunks of two rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_step(data: str, output: Path, chunk: int | None) -> tuple[float, dict[str, torch.Tensor]]:
    tokenizer = build_tokenizer()
    config = EmbeddingConfig(pooling="mean", attention="bidirectional")
    embedder = Embedder.from_model(tiny_model("llama", len(tokenizer)), tokenizer, config, use_cache=False)
    cfg = TrainConfig(
        data=[data],
        output=str(output),
        batch_size=GLOBAL_BATCH,
        steps=1,
        lr=1e-2,
        warmup_steps=0,
        lora=True,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        grad_cache_chunk=chunk,
        device="cpu",
        progress=False,
        seed=3,
    )
    trainer = Trainer(cfg, model=embedder)
    record = trainer.train_step()
    return record["loss"], trainer.model.trainable_state_dict()


def _run(rank: int, world: int, port: int, data: str, folder: str) -> None:
    """Worker: join the group, take one step per variant, rank 0 saves the results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = {str(chunk): _one_step(data, Path(folder) / f"run-{chunk}", chunk) for chunk in CHUNKS}
        if rank == 0:
            torch.save(results, Path(folder) / "ddp.pt")
        # Both ranks leave together: a rank that tears gloo down while its peer is still inside a
        # collective (or saving) makes the peer's transport thread abort the process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture
def data_file(tmp_path) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"query": q, "positive": p, "negatives": [n]}) + "\n" for q, p, n in ROWS))
    return str(path)


@pytest.mark.slow  # about 9 s of two launched processes; the gathered losses and the FSDP step stay in the default run
def test_two_processes_take_the_single_process_step(tmp_path, data_file):
    mp.spawn(_run, args=(2, _free_port(), data_file, str(tmp_path)), nprocs=2, join=True)
    distributed = torch.load(tmp_path / "ddp.pt", weights_only=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for chunk in CHUNKS:
            loss, state = _one_step(data_file, tmp_path / f"single-{chunk}", chunk)
            ddp_loss, ddp_state = distributed[str(chunk)]
            assert ddp_loss == pytest.approx(loss, rel=1e-5), f"grad_cache_chunk={chunk}"
            assert state.keys() == ddp_state.keys()
            for name, tensor in state.items():
                torch.testing.assert_close(ddp_state[name], tensor, atol=2e-6, rtol=1e-4, msg=f"{chunk}: {name}")
    finally:
        torch.set_num_threads(previous)
