"""Crash-safe training checkpoints.

A checkpoint is a folder ``<output>/checkpoints/step-0000123/`` holding everything needed to continue
the run exactly where it stood after that step:

* ``trainable.safetensors``: the trained tensors (LoRA adapters or the whole backbone, and the head);
* ``optimizer.pt`` and ``scheduler.pt``: their ``state_dict``;
* ``rng-rank<r>.pt``: every random generator of process ``r`` (python, numpy, torch, CUDA);
* ``state.json``: the step number and run facts; written last.

The folder is assembled under a temporary name and renamed into place in one step, so a process
killed at any moment (even ``kill -9``) leaves either a complete checkpoint or none; leftovers of an
interrupted write are removed on the next save. Old checkpoints are renamed away before deletion,
for the same reason. Under several processes rank 0 writes the shared files and every rank writes
its own RNG file; ``barrier`` keeps them in step.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from lmembed.atomic import atomic_write, atomic_write_json

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.json"
WEIGHTS_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
_NAME = re.compile(r"^step-(\d+)$")


@dataclass
class Checkpoint:
    """A loaded checkpoint."""

    path: Path
    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    scheduler_state: dict[str, Any]
    rng_state: dict[str, Any] | None
    info: dict[str, Any]


def checkpoint_dir(output: str | Path) -> Path:
    return Path(output) / CHECKPOINTS


def step_name(step: int) -> str:
    return f"step-{step:07d}"


def list_checkpoints(output: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``output``, oldest first."""
    root = checkpoint_dir(output)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _NAME.match(entry.name)
        if match and (entry / STATE_FILE).exists():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(output: str | Path) -> Path | None:
    found = list_checkpoints(output)
    return found[-1][1] if found else None


# ---------------------------------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """The state of every random generator this process uses."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- saving
def _no_barrier() -> None:
    return None


def _save_torch(path: Path, obj: Any) -> None:
    atomic_write(path, lambda handle: torch.save(obj, handle))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    output: str | Path,
    step: int,
    *,
    model_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    info: dict[str, Any] | None = None,
    rank: int = 0,
    barrier: Callable[[], None] = _no_barrier,
    keep: int = 0,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and return its final path.

    Every process must call this (with its own ``rank``); ``model_state`` is only used on rank 0, and so is
    ``optimizer_state`` (written instead of ``optimizer.state_dict()`` when given: a sharded optimizer's
    gathered state).
    ``keep > 0`` deletes all but the newest ``keep`` checkpoints afterwards.
    """
    root = checkpoint_dir(output)
    final = root / step_name(step)
    scratch = root / f".tmp-{step_name(step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
    barrier()
    _save_torch(scratch / f"rng-rank{rank}.pt", capture_rng())
    barrier()
    if rank == 0:
        tensors = {name: t.contiguous() for name, t in model_state.items()}
        payload = safetensors_bytes(tensors)
        atomic_write(scratch / WEIGHTS_FILE, lambda handle: handle.write(payload))
        _save_torch(scratch / OPTIMIZER_FILE, optimizer.state_dict() if optimizer_state is None else optimizer_state)
        _save_torch(scratch / SCHEDULER_FILE, scheduler.state_dict())
        atomic_write_json(scratch / STATE_FILE, {"step": step, **(info or {})})
        _fsync_dir(scratch)
        if final.exists():  # a checkpoint of this step from an earlier, interrupted life of the run
            discard_dir(final)
        os.replace(scratch, final)
        _fsync_dir(root)
        if keep > 0:
            prune_checkpoints(output, keep)
        _clean_leftovers(root)
    barrier()
    return final


def discard_dir(path: Path) -> None:
    """Rename away, then delete: an interrupted delete never leaves a half checkpoint under a valid name."""
    doomed = path.with_name(f".trash-{path.name}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _clean_leftovers(root: Path) -> None:
    for entry in root.iterdir():
        if entry.name.startswith(".trash-"):
            shutil.rmtree(entry, ignore_errors=True)


def prune_checkpoints(output: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints."""
    found = list_checkpoints(output)
    for _, path in found[: max(0, len(found) - keep)]:
        discard_dir(path)


# ---------------------------------------------------------------------------------------------- loading
def load_checkpoint(path: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint folder; ``rng_state`` is ``None`` when this rank has no RNG file in it."""
    path = Path(path)
    info = json.loads((path / STATE_FILE).read_text())
    rng_file = path / f"rng-rank{rank}.pt"
    rng_state = torch.load(rng_file, weights_only=False) if rng_file.exists() else None
    return Checkpoint(
        path=path,
        step=int(info["step"]),
        model_state=load_file(str(path / WEIGHTS_FILE)),
        optimizer_state=torch.load(path / OPTIMIZER_FILE, map_location=map_location, weights_only=False),
        scheduler_state=torch.load(path / SCHEDULER_FILE, weights_only=False),
        rng_state=rng_state,
        info=info,
    )
