"""Training at scale stays on accelerate/torchrun: the three launch configurations in configs/accelerate/.

* DDP (``ddp.yaml``): ``accelerate launch`` with the file starts two CPU processes (gloo) that train a tiny model
  with full fine-tuning; the saved weights equal those of one process on the same global batches.
* FSDP (``fsdp.yaml``): ``accelerate launch`` with the file starts two CPU processes whose Trainer shards the model
  with FSDP2 (``fully_shard`` on each decoder layer, then on the whole model: parameters, gradients and optimizer
  state sharded, in-batch negatives gathered across processes), LoRA off; the weights and checkpoint it saves
  equal one process's and the saved model loads and encodes. In-process, one Trainer step under FSDP equals the
  single-process step, and LoRA is refused.
* DeepSpeed ZeRO-2 (``deepspeed-zero2.yaml``): ``accelerate launch`` with the file starts two CPU processes (gloo)
  whose Trainer hands the model and AdamW to ``deepspeed.initialize`` (optimizer state and gradients partitioned,
  in-batch negatives gathered across processes), LoRA off; the saved weights equal one process's and the saved
  model loads and encodes. Skipped when DeepSpeed (the optional ``deepspeed`` extra) is not installed.

The launches leave out accelerate's ``--cpu``: with it accelerate starts a single process (several CPU processes
need MPI). Without a GPU (or with ``--device cpu``) the two processes torchrun starts train on the CPU with gloo.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from conftest import build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.training.distributed import DeepSpeedSettings, FsdpSettings
from lmembed.training.train_config import TrainConfig
from lmembed.training.trainer import Trainer
from test_trainer import ROWS

REPO = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------------------------- launches
def _train(
    command: list[str], output: Path, data_file: str, model: str, *, checkpoint: bool = True
) -> tuple[dict[str, torch.Tensor], dict]:
    """Train 2 steps (with ``checkpoint``, one at step 2); the saved weights and the checkpoint's state.json
    (without one: the launch's stdout and stderr, as ``{"log": ...}``)."""
    args = ["--model", model, "--data", data_file, "--steps", "2", "--batch-size", str(GLOBAL_BATCH), "--no-lora"]
    args += ["--lr", "1e-2", "--warmup-steps", "0", "--pooling", "mean", "--device", "cpu", "--output", str(output)]
    args += ["--save-every", "2" if checkpoint else "0", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([*command, "-m", "lmembed.cli.train", *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    if checkpoint:
        state = json.loads((output / "checkpoints" / "step-0000002" / "state.json").read_text())
    else:
        state = {"log": run.stdout + run.stderr}
    return load_file(str(output / "model" / "model.safetensors")), state


def _accelerate(config: str) -> list[str]:
    """``accelerate launch`` of two processes with configs/accelerate/<config> (no ``--cpu``: see the module doc)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    return [*launch, "--num_processes", "2", "--main_process_port", str(_free_port())]


def _tiny_llama(folder: Path) -> str:
    tokenizer = build_tokenizer()
    model = Embedder.from_model(
        tiny_model("llama", len(tokenizer)), tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False
    )
    return str(model.save(folder))


def _assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=2e-6, rtol=1e-4, msg=name)


@pytest.fixture
def single_run(tmp_path, data_file) -> tuple[str, dict[str, torch.Tensor], dict]:
    """The tiny model's folder, and the weights and checkpoint state of one process training it as ``_train``
    does (in this process, which saves a second of imports per launch)."""
    saved = _tiny_llama(tmp_path / "tiny")
    output = tmp_path / "single"
    cfg = TrainConfig(
        model=saved,
        data=[data_file],
        output=str(output),
        batch_size=GLOBAL_BATCH,
        steps=2,
        lr=1e-2,
        warmup_steps=0,
        lora=False,
        pooling="mean",
        device="cpu",
        save_every=2,
        progress=False,
    )
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(cfg).train()
    finally:
        torch.set_num_threads(previous)
    state = json.loads((output / "checkpoints" / "step-0000002" / "state.json").read_text())
    return saved, load_file(str(output / "model" / "model.safetensors")), state


# ---------------------------------------------------------------------------------------------- DDP
@pytest.mark.slow
def test_ddp_configuration_launches_processes_that_take_the_single_process_steps(tmp_path, data_file, single_run):
    saved, one, single_state = single_run
    two, state = _train(_accelerate("ddp.yaml"), tmp_path / "ddp", data_file, saved)
    assert (state["world_size"], state["parallelism"]) == (2, "ddp")
    assert (single_state["world_size"], single_state["parallelism"]) == (1, "single")
    _assert_same_weights(two, one)


# ---------------------------------------------------------------------------------------------- FSDP
@pytest.mark.slow  # about 15 s of launched processes; the FSDP step and resume stay in the default run
def test_fsdp_configuration_launches_processes_that_shard_and_save_whole_tensors(tmp_path, data_file, single_run):
    saved, one, _ = single_run
    two, state = _train(_accelerate("fsdp.yaml"), tmp_path / "fsdp", data_file, saved)
    assert (state["world_size"], state["parallelism"]) == (2, "fsdp")
    _assert_same_weights(two, one)
    checkpoint = load_file(str(tmp_path / "fsdp" / "checkpoints" / "step-0000002" / "trainable.safetensors"))
    expected = load_file(str(tmp_path / "single" / "checkpoints" / "step-0000002" / "trainable.safetensors"))
    _assert_same_weights(checkpoint, expected)
    _assert_same_model_folder(tmp_path / "fsdp" / "model", tmp_path / "single" / "model")


FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "true"}  # as accelerate


def _trainer(data: str, output: Path, **options) -> Trainer:
    tokenizer = build_tokenizer()
    config = EmbeddingConfig(pooling="mean", attention="bidirectional")
    embedder = Embedder.from_model(tiny_model("llama", len(tokenizer)), tokenizer, config, use_cache=False)
    settings = dict(batch_size=GLOBAL_BATCH, steps=2, lr=1e-2, warmup_steps=0, lora=False, progress=False, seed=3)
    cfg = TrainConfig(data=[data], output=str(output), device="cpu", **{**settings, **options})
    return Trainer(cfg, model=embedder)


def _step(trainer: Trainer) -> tuple[float, dict[str, torch.Tensor], bool]:
    """The next step's loss, the whole parameters after it, and whether they are sharded (DTensors)."""
    loss = trainer.train_step()["loss"]
    params = dict(trainer.model.named_parameters())
    sharded = all(isinstance(param, DTensor) for param in params.values())
    return loss, {name: (p.full_tensor() if sharded else p).detach().clone() for name, p in params.items()}, sharded


def _assert_same_model_folder(folder: Path, reference: Path) -> None:
    """Same files as ``reference``, and the model loads and encodes as it does."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in reference.iterdir())
    texts = ["a query about cats", "dogs"]
    vectors = Embedder.from_pretrained(str(folder), device="cpu").encode(texts)
    expected = Embedder.from_pretrained(str(reference), device="cpu").encode(texts)
    assert vectors.shape == expected.shape
    np.testing.assert_allclose(vectors, expected, atol=1e-4)


def _fsdp_rank(rank: int, world: int, port: int, data: str, folder: str) -> None:
    """One process under accelerate's FSDP settings (the Trainer shards the model itself): a step, a checkpoint,
    the next step; a Trainer resumed from the checkpoint takes that next step too; LoRA is refused."""
    torch.set_num_threads(1)
    os.environ.update(FSDP_ENV)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        trainer = _trainer(data, Path(folder) / "fsdp")
        first = _step(trainer)
        trainer.save_checkpoint()
        second = _step(trainer)
        resumed = _trainer(data, Path(folder) / "fsdp", resume=True)
        assert resumed.resume() and resumed.step == 1
        again = _step(resumed)
        try:
            _trainer(data, Path(folder) / "lora", lora=True)
            refusal = ""
        except ConfigError as error:
            refusal = str(error)
        if rank == 0:
            torch.save((first, second, again, refusal), Path(folder) / "fsdp.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_fsdp_trainer_step_equals_the_single_process_step_and_resumes(tmp_path, data_file):
    mp.spawn(_fsdp_rank, args=(2, _free_port(), data_file, str(tmp_path)), nprocs=2, join=True)
    first, second, again, refusal = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    assert "--no-lora" in refusal
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loss, state, sharded = _step(_trainer(data_file, tmp_path / "single"))
    finally:
        torch.set_num_threads(previous)
    assert first[2] and not sharded
    assert first[0] == pytest.approx(loss, rel=1e-5)
    _assert_same_weights(first[1], state)
    assert again[0] == pytest.approx(second[0], rel=1e-6)  # resuming continues the run exactly
    _assert_same_weights(again[1], second[1])


def test_fsdp_settings_come_from_accelerates_environment(monkeypatch):
    for name in ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_OFFLOAD_PARAMS", "FSDP_TRANSFORMER_CLS_TO_WRAP"):
        monkeypatch.delenv(name, raising=False)
    assert FsdpSettings.from_environment() is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ConfigError, match="fsdp_version: 2"):
        FsdpSettings.from_environment()
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "LlamaDecoderLayer, BertLayer")
    assert FsdpSettings.from_environment() == FsdpSettings(False, ("LlamaDecoderLayer", "BertLayer"))
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    with pytest.raises(ConfigError, match="fsdp_offload_params"):
        FsdpSettings.from_environment()


# ---------------------------------------------------------------------------------------------- DeepSpeed
@pytest.mark.slow  # DeepSpeed is an optional extra, and its first run compiles a CPU communication op (minutes)
def test_deepspeed_zero2_configuration_launches_processes_that_take_the_single_process_steps(
    tmp_path, data_file, single_run
):
    """Run with ``pip install 'lmembed[deepspeed]'`` and ``pytest -m slow``."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install lmembed[deepspeed])")
    saved, one, _ = single_run
    two, state = _train(_accelerate("deepspeed-zero2.yaml"), tmp_path / "zero2", data_file, saved, checkpoint=False)
    # DeepSpeed's CPU communication op loads when deepspeed.initialize joins the process group: the engine ran
    assert "deepspeed_shm_comm_op" in state["log"]
    _assert_same_weights(two, one)
    single_model = tmp_path / "single" / "model"
    _assert_same_model_folder(tmp_path / "zero2" / "model", single_model)


def test_deepspeed_settings_come_from_accelerates_environment(monkeypatch):
    names = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_DEEPSPEED_CONFIG_FILE")
    names += ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    for name in (*names, "ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    assert DeepSpeedSettings.from_environment() is None
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "1.0")
    assert DeepSpeedSettings.from_environment() == DeepSpeedSettings(2, 1.0)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(ConfigError, match=r"fsdp\.yaml"):
        DeepSpeedSettings.from_environment()
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu")
    with pytest.raises(ConfigError, match="offload_optimizer_device"):
        DeepSpeedSettings.from_environment()


def test_deepspeed_refuses_lora_and_checkpoints_before_loading_the_model(tmp_path, data_file):
    common = dict(data=[data_file], output=str(tmp_path), device="cpu", batch_size=GLOBAL_BATCH, steps=2)
    with pytest.raises(ConfigError, match="--no-lora"):
        Trainer._check_deepspeed_options(TrainConfig(lora=True, **common))
    with pytest.raises(ConfigError, match="save_every"):
        Trainer._check_deepspeed_options(TrainConfig(lora=False, save_every=1, **common))
    Trainer._check_deepspeed_options(TrainConfig(lora=False, **common))
