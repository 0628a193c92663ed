"""Training at scale stays on accelerate/torchrun: the three launch configurations in configs/accelerate/.

* DDP (``ddp.yaml``): ``accelerate launch`` with the file starts two CPU processes (gloo) that train a tiny model
  with full fine-tuning; the saved weights equal those of one process on the same global batches.
* FSDP (``fsdp.yaml``): lmembed's training step with FSDP2 (``fully_shard`` on each decoder layer, then on the
  whole model: parameters, gradients and optimizer state sharded over two CPU processes, in-batch negatives
  gathered across them), LoRA off, equals the single-process step. The Trainer does not read accelerate's FSDP
  settings yet, so the test shards the model where the Trainer would (before its optimizer is built).
* DeepSpeed ZeRO-2 (``deepspeed-zero2.yaml``): only its content is checked here. DeepSpeed is not installed on
  this machine, its CPU accelerator needs oneCCL, and no GPU was lent; besides, the Trainer steps its own
  optimizer, which ZeRO-2 must do itself (engine backward/step), so there is no path to test yet.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from conftest import build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer
from test_trainer import ROWS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "accelerate"
GLOBAL_BATCH = 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def data_file(tmp_path) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"query": q, "positive": p, "negatives": [n]}) + "\n" for q, p, n in ROWS))
    return str(path)


def test_each_configuration_names_its_mode():
    ddp, fsdp, zero2 = (
        yaml.safe_load((CONFIGS / name).read_text()) for name in ("ddp.yaml", "fsdp.yaml", "deepspeed-zero2.yaml")
    )
    assert ddp["distributed_type"] == "MULTI_GPU"
    assert fsdp["distributed_type"] == "FSDP" and fsdp["fsdp_config"]["fsdp_version"] == 2
    assert fsdp["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert zero2["distributed_type"] == "DEEPSPEED" and zero2["deepspeed_config"]["zero_stage"] == 2
    for name in ("ddp.yaml", "fsdp.yaml", "deepspeed-zero2.yaml"):
        assert f"accelerate launch --config_file configs/accelerate/{name}" in (CONFIGS / name).read_text()


# ---------------------------------------------------------------------------------------------- DDP
def _train(command: list[str], output: Path, data_file: str, model: str) -> dict[str, torch.Tensor]:
    args = ["--model", model, "--data", data_file, "--steps", "2", "--batch-size", str(GLOBAL_BATCH), "--no-lora"]
    args += ["--lr", "1e-2", "--warmup-steps", "0", "--pooling", "mean", "--device", "cpu", "--output", str(output)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([*command, "-m", "lmembed.cli.train", *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return load_file(str(output / "model" / "model.safetensors"))


@pytest.mark.slow
def test_ddp_configuration_launches_processes_that_take_the_single_process_steps(tmp_path, data_file):
    tokenizer = build_tokenizer()
    model = Embedder.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False
    )
    saved = str(model.save(tmp_path / "tiny"))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml")]
    launch += ["--cpu", "--num_processes", "2"]
    two = _train(launch, tmp_path / "ddp", data_file, saved)
    one = _train([sys.executable], tmp_path / "single", data_file, saved)
    assert two.keys() == one.keys()
    for name, tensor in one.items():
        torch.testing.assert_close(two[name], tensor, atol=2e-6, rtol=1e-4, msg=name)


# ---------------------------------------------------------------------------------------------- FSDP
def shard_with_fsdp2(trainable: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over all processes: one unit per decoder layer, then the rest of the model (embeddings, norm)."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: only the FSDP processes need it
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in trainable.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(trainable, mesh=mesh)
    return trainable


def _one_step(data: str, output: Path) -> tuple[float, dict[str, torch.Tensor]]:
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
        lora=False,
        device="cpu",
        progress=False,
        seed=3,
    )
    trainer = Trainer(cfg, model=embedder)
    record = trainer.train_step()
    state = {}
    for name, param in trainer.model.named_parameters():
        full = param.full_tensor() if hasattr(param, "full_tensor") else param  # DTensor shards → whole tensor
        state[name] = full.detach().clone()
    return record["loss"], state


def _fsdp_rank(rank: int, world: int, port: int, data: str, folder: str) -> None:
    """One FSDP process: the Trainer builds its model, which is sharded before the optimizer is made."""
    import lmembed.training.trainer as trainer_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    build = trainer_module.build_trainable
    trainer_module.build_trainable = lambda *args, **kwargs: shard_with_fsdp2(build(*args, **kwargs))
    trainer_module.Trainer._wrap = lambda self, model: model  # FSDP replaces DDP
    try:
        result = _one_step(data, Path(folder) / "fsdp")
        if rank == 0:
            torch.save(result, Path(folder) / "fsdp.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp2_step_equals_the_single_process_step(tmp_path, data_file):
    mp.spawn(_fsdp_rank, args=(2, _free_port(), data_file, str(tmp_path)), nprocs=2, join=True)
    fsdp_loss, fsdp_state = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss, state = _one_step(data_file, tmp_path / "single")
    finally:
        torch.set_num_threads(previous)
    assert fsdp_loss == pytest.approx(loss, rel=1e-5)
    assert state.keys() == fsdp_state.keys()
    for name, tensor in state.items():
        torch.testing.assert_close(fsdp_state[name], tensor, atol=2e-6, rtol=1e-4, msg=name)
