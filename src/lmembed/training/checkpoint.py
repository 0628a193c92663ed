"""Crash-safe training checkpoints.

A checkpoint is a folder ``<output>/checkpoints/step-0000123/`` holding everything needed to continue
the run exactly where it stood after that step:

* ``trainable.safetensors``: the trained tensors (LoRA adapters or the whole backbone, and the head);
* ``optimizer.safetensors`` and ``scheduler.safetensors``: their ``state_dict``;
* ``rng-rank<r>.safetensors``: every random generator of process ``r`` (python, numpy, torch, CUDA);
* ``state.json``: the step number and run facts, and ``files``: the sha256 of every other file of the folder;
  written last.

On load each file the checkpoint is read from must lie in the folder (a link out of it is refused) and hash to the
sha256 ``state.json`` records for it, before anything in it is read: a file damaged or changed after it was
written is refused, naming it. A checkpoint written before checksums existed still loads, with a warning (its
files cannot be checked), and the run's next checkpoint has them.

No file is a pickle: a run folder may be shared, and unpickling a file can run any code it names. A nested state
(an optimizer's, a scheduler's, the RNGs') is stored as safetensors: its tensors as tensors, and the structure
around them (dicts, lists, tuples, numbers, strings) as JSON in the file's metadata, with each tensor named by a
reference; :func:`read_state` rebuilds it, accepting nothing but those plain values. A checkpoint written by an
older lmembed as pickles (``optimizer.pt`` ...) is refused, naming the file, and never unpickled.

The folder is assembled under a temporary name and renamed into place in one step, so a process
killed at any moment (even ``kill -9``) leaves either a complete checkpoint or none; leftovers of an
interrupted write are removed on the next save. Old checkpoints are renamed away before deletion,
for the same reason. Under several processes rank 0 writes the shared files and every rank writes
its own RNG file; ``barrier`` keeps them in step.
"""

from __future__ import annotations

import hashlib
import json
import logging
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from lmembed.atomic import atomic_write, atomic_write_json
from lmembed.errors import LmembedError
from lmembed.io import (
    check_format,
    check_recorded_files,
    is_number,
    is_plain_file_name,
    loads_json,
    read_json,
    sha256_file,
)

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.json"
#: The format of a checkpoint folder this lmembed writes and reads (``format`` in :data:`STATE_FILE`; a state
#: without one was written before the field, in format 1).
CHECKPOINT_FORMAT = 1
WEIGHTS_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
SCHEDULER_FILE = "scheduler.safetensors"
RNG_FILE = "rng-rank{rank}.safetensors"
#: the pickled files of checkpoints written by older lmembed versions: refused, never unpickled
PICKLED_FILES = ("optimizer.pt", "scheduler.pt", "rng-rank{rank}.pt")
STATE_KEY = "lmembed.state"  # the metadata entry holding a state's JSON structure
STATE_FORMAT = 1
FILES_KEY = "files"  # state.json: {file name: sha256} of every other file of the checkpoint
_NAME = re.compile(r"^step-(\d+)$")


class CheckpointError(LmembedError, ValueError):
    """A checkpoint that cannot be resumed: written in the old pickled format, or a file in it malformed."""


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


def check_rng(state: Any, source: Path) -> dict[str, Any]:
    """``state`` when it has the shape :func:`capture_rng` gives (so :func:`restore_rng` cannot fail on it);
    else a :class:`CheckpointError` naming ``source``."""

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; the RNG state is malformed")

    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise bad("expected the python, numpy and torch generators")
    python = state["python"]
    if not (
        isinstance(python, tuple)
        and len(python) == 3
        and isinstance(python[1], tuple)
        and len(python[1]) == 625
        and all(isinstance(v, int) and 0 <= v < 2**32 for v in python[1])
        and (python[2] is None or isinstance(python[2], float))
    ):
        raise bad("'python' is not a Mersenne Twister state")
    numpy = state["numpy"]
    if not (
        isinstance(numpy, tuple)
        and len(numpy) == 5
        and numpy[0] == "MT19937"
        and isinstance(numpy[1], np.ndarray)
        and numpy[1].dtype == np.uint32
        and numpy[1].shape == (624,)
        and isinstance(numpy[2], int)
        and isinstance(numpy[3], int)
        and isinstance(numpy[4], float)
    ):
        raise bad("'numpy' is not a Mersenne Twister state")
    generators = [state["torch"], *(state.get("cuda") or [])]
    if not isinstance(state.get("cuda", []), list) or not all(
        isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 for t in generators
    ):
        raise bad("'torch' and 'cuda' must be byte tensors")
    if state["torch"].numel() != torch.get_rng_state().numel():
        raise bad(f"'torch' holds {state['torch'].numel()} bytes, not {torch.get_rng_state().numel()}")
    return state


# ---------------------------------------------------------------------------------------------- states without pickle
# A nested state is written as JSON in which every value is plain: null, a bool, a number, a string, a list, or one
# of these tagged objects: {"dict": [[key, value], ...]} (keys of any plain kind, in order), {"tuple": [...]},
# {"tensor": name} (a tensor of the same file), {"ndarray": [...], "dtype": name} (a small numpy array: the numpy RNG).
_NUMPY_DTYPES = {"uint32": np.uint32, "int64": np.int64, "float64": np.float64}


def _encode(value: Any, tensors: dict[str, torch.Tensor], storages: set[tuple[int, int]], where: str) -> Any:
    if value is None or isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu").contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        if key in storages or key[0] == 0:  # safetensors stores no shared memory: copy a tensor that shares
            tensor = tensor.clone()
        storages.add((tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()))
        name = f"t{len(tensors)}"
        tensors[name] = tensor
        return {"tensor": name}
    if isinstance(value, np.ndarray) and value.dtype.name in _NUMPY_DTYPES:
        return {"ndarray": value.tolist(), "dtype": value.dtype.name}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, tensors, storages, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, storages, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {
            "dict": [
                [_encode(k, tensors, storages, f"{where} key"), _encode(v, tensors, storages, f"{where}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    raise TypeError(f"{where}: a {type(value).__name__} cannot be stored in a checkpoint without pickle")


def _decode(value: Any, tensor: Callable[[str], torch.Tensor], source: Path, depth: int = 0) -> Any:
    if depth > 64:
        raise CheckpointError(f"{source}: the state is nested deeper than any optimizer state")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_decode(v, tensor, source, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("tuple"), list):
        return tuple(_decode(v, tensor, source, depth + 1) for v in value["tuple"])
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("dict"), list):
        decoded: dict[Any, Any] = {}
        for pair in value["dict"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise CheckpointError(f"{source}: a dict entry is not a [key, value] pair")
            key = _decode(pair[0], tensor, source, depth + 1)
            if not isinstance(key, str | int | float | tuple) and key is not None:
                raise CheckpointError(f"{source}: a dict key is a {type(key).__name__}")
            decoded[key] = _decode(pair[1], tensor, source, depth + 1)
        return decoded
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("tensor"), str):
        return tensor(value["tensor"])
    if isinstance(value, dict) and set(value) == {"ndarray", "dtype"} and value["dtype"] in _NUMPY_DTYPES:
        try:
            return np.asarray(value["ndarray"], dtype=_NUMPY_DTYPES[value["dtype"]])
        except (TypeError, ValueError, OverflowError) as exc:
            raise CheckpointError(f"{source}: an array of the state is malformed ({exc})") from exc
    raise CheckpointError(f"{source}: the state holds a value lmembed does not store ({str(value)[:80]})")


def state_bytes(state: Any) -> bytes:
    """``state`` (an optimizer's, a scheduler's, the RNGs') as safetensors bytes: tensors as tensors, the rest as
    JSON in the metadata; :func:`read_state` rebuilds it. Raises ``TypeError`` on a value that is not plain."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, tensors, set(), "state")
    text = json.dumps({"format": STATE_FORMAT, "state": structure}, allow_nan=True)
    return safetensors_bytes(tensors, metadata={STATE_KEY: text})


def write_state(path: Path, state: Any) -> str:
    """Write ``state`` to ``path`` (atomically) and return the sha256 of the bytes written."""
    payload = state_bytes(state)
    atomic_write(path, lambda handle: handle.write(payload))
    return hashlib.sha256(payload).hexdigest()


def read_state(path: Path, *, device: str | torch.device = "cpu") -> Any:
    """The state :func:`write_state` wrote to ``path``, its tensors on ``device``. Nothing in the file is run:
    a malformed file is a :class:`CheckpointError` naming it."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as tensors:
            text = (tensors.metadata() or {}).get(STATE_KEY)
            if text is None:
                raise CheckpointError(f"{path}: holds no lmembed state (no {STATE_KEY!r} metadata)")
            try:
                document = loads_json(text)
            except ValueError as exc:  # not JSON, or a key given twice
                raise CheckpointError(f"{path}: the state's JSON is malformed ({exc})") from exc
            if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
                raise CheckpointError(f"{path}: not a state of format {STATE_FORMAT}")
            names = set(tensors.keys())

            def tensor(name: str) -> torch.Tensor:
                if name not in names:
                    raise CheckpointError(f"{path}: the state names tensor {name!r}, which the file lacks")
                return tensors.get_tensor(name)

            return _decode(document.get("state"), tensor, path)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


# ---------------------------------------------------------------------------------------------- saving
def _no_barrier() -> None:
    return None


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
    write_state(scratch / RNG_FILE.format(rank=rank), capture_rng())
    barrier()
    if rank == 0:
        tensors = {name: t.contiguous() for name, t in model_state.items()}
        payload = safetensors_bytes(tensors)
        atomic_write(scratch / WEIGHTS_FILE, lambda handle: handle.write(payload))
        files = {WEIGHTS_FILE: hashlib.sha256(payload).hexdigest()}
        optimizer_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
        files[OPTIMIZER_FILE] = write_state(scratch / OPTIMIZER_FILE, optimizer_state)
        files[SCHEDULER_FILE] = write_state(scratch / SCHEDULER_FILE, scheduler.state_dict())
        for rng in sorted(scratch.glob(RNG_FILE.format(rank="*"))):  # every rank's, written before the barrier
            files[rng.name] = sha256_file(rng)
        state = {"format": CHECKPOINT_FORMAT, "step": step, **(info or {}), FILES_KEY: files}
        atomic_write_json(scratch / STATE_FILE, state)
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
def _verify(path: Path, info: dict[str, Any], names: list[str]) -> None:
    """Each of ``names`` lies in the checkpoint folder and hashes to the sha256 ``state.json`` records for it."""
    info_file = path / STATE_FILE
    if FILES_KEY not in info:
        log.warning(
            "%s was written without checksums (by an older lmembed): its files cannot be checked; "
            "the run's next checkpoint records them",
            info_file,
        )
        return
    files = info[FILES_KEY]
    if isinstance(files, dict):
        for name in files:
            if not is_plain_file_name(name):
                raise CheckpointError(f"{info_file}: {FILES_KEY} names {name!r}, which is not a file name of {path}")
            if not (path / name).is_file():
                raise CheckpointError(f"{info_file}: {FILES_KEY}.{name}: {path / name} is not a file of the checkpoint")
    check_recorded_files(path, info_file, files, names, key=FILES_KEY, error=CheckpointError)


def load_checkpoint(path: str | Path, *, rank: int = 0, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint folder; ``rng_state`` is ``None`` when this rank has no RNG file in it.

    Nothing is unpickled: a checkpoint of the old pickled format, a malformed file, or one whose sha256 is not the
    one ``state.json`` records, is a :class:`CheckpointError` naming the file."""
    path = Path(path)
    for name in PICKLED_FILES:
        old = path / name.format(rank=rank)
        if old.exists():
            raise CheckpointError(
                f"{old}: this checkpoint was written by an older lmembed as pickles, which can run code when loaded; "
                "lmembed does not load it. Start the run again in a new output folder (this version writes "
                "checkpoints without pickle)"
            )
    info_file = path / STATE_FILE
    info = read_json(info_file, error=CheckpointError, what="checkpoint state")
    advice = "resume it with the lmembed that wrote it"
    check_format(info_file, "format", info.get("format", CHECKPOINT_FORMAT), CHECKPOINT_FORMAT, "checkpoints",
                 CheckpointError, advice)  # fmt: skip
    if "step" not in info:
        raise CheckpointError(f"{info_file}: step: missing (not a checkpoint state as lmembed writes it)")
    step = info["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{info_file}: step={step!r} is not a step number")
    for name in (WEIGHTS_FILE, OPTIMIZER_FILE, SCHEDULER_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path / name}: missing; the checkpoint is incomplete")
    rng_name = RNG_FILE.format(rank=rank)
    rng_file = path / rng_name
    _verify(path, info, [WEIGHTS_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, *([rng_name] if rng_file.exists() else [])])
    rng_state = check_rng(read_state(rng_file), rng_file) if rng_file.exists() else None
    try:
        model_state = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path / WEIGHTS_FILE}: not a readable safetensors file ({exc})") from exc
    optimizer_state = read_state(path / OPTIMIZER_FILE, device=map_location)
    scheduler_state = read_state(path / SCHEDULER_FILE)
    for name, state in ((OPTIMIZER_FILE, optimizer_state), (SCHEDULER_FILE, scheduler_state)):
        if not isinstance(state, dict):
            raise CheckpointError(f"{path / name}: holds a {type(state).__name__}, not a state dict")
    return Checkpoint(
        path=path,
        step=step,
        model_state=model_state,
        optimizer_state=optimizer_state,
        scheduler_state=scheduler_state,
        rng_state=rng_state,
        info=info,
    )


# ---------------------------------------------------------------------------------------------- checking a loaded state
_GROUP_RANGES: dict[str, Callable[[float], bool]] = {
    "lr": lambda v: v >= 0,
    "initial_lr": lambda v: v >= 0,
    "eps": lambda v: v > 0,
    "weight_decay": lambda v: v >= 0,
    "betas": lambda v: 0 <= v < 1,
}


def _like(saved: Any, live: Any) -> bool:
    """``saved`` is a plain value of the kind ``live`` is (a number for a number, finite; a tuple of as many)."""
    if isinstance(live, bool) or live is None or isinstance(live, str):
        return type(saved) is type(live)
    if isinstance(live, int):
        return isinstance(saved, int) and not isinstance(saved, bool)
    if isinstance(live, float):
        return is_number(saved, finite=True)
    if isinstance(live, tuple | list):
        return (
            type(saved) is type(live)
            and len(saved) == len(live)
            and all(_like(s, v) for s, v in zip(saved, live, strict=True))
        )
    if isinstance(live, dict):
        return isinstance(saved, dict) and saved.keys() == live.keys() and all(_like(saved[k], live[k]) for k in live)
    return False


def _check_group(saved: Any, live: dict[str, Any], source: Path, where: str) -> None:
    if not isinstance(saved, dict) or set(saved) != set(live):
        keys = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(f"{source}: {where} holds {keys}, not the optimizer's {sorted(live)}")
    if saved["params"] != live["params"]:
        raise CheckpointError(f"{source}: {where}.params are not the parameters this run's optimizer holds there")
    for key, value in live.items():
        if key == "params":
            continue
        if not _like(saved[key], value):
            raise CheckpointError(
                f"{source}: {where}.{key}={saved[key]!r} is not a finite value of the type this run's optimizer "
                f"holds there ({value!r})"
            )
        check = _GROUP_RANGES.get(key)
        values = saved[key] if isinstance(saved[key], tuple) else (saved[key],)
        if check is not None and not all(check(v) for v in values):
            raise CheckpointError(f"{source}: {where}.{key}={saved[key]!r} is out of range")


def check_optimizer_state(saved: dict[str, Any], optimizer: torch.optim.Optimizer, source: Path) -> None:
    """Refuse (a :class:`CheckpointError` naming ``source``) an optimizer state that does not fit ``optimizer``
    before it is loaded: other groups or settings, a setting of another type or not finite, a parameter's moment
    of another shape, a value that is not finite."""
    live = optimizer.state_dict()
    if set(saved) != {"state", "param_groups"}:
        raise CheckpointError(f"{source}: holds {sorted(map(str, saved))}, not an optimizer's state and param_groups")
    groups = saved["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(live["param_groups"]):
        raise CheckpointError(
            f"{source}: param_groups: not the {len(live['param_groups'])} parameter groups this run's optimizer has"
        )
    for i, (group, live_group) in enumerate(zip(groups, live["param_groups"], strict=True)):
        _check_group(group, live_group, source, f"param_groups[{i}]")
    params = {
        index: p
        for group, live_group in zip(optimizer.param_groups, live["param_groups"], strict=True)
        for index, p in zip(live_group["params"], group["params"], strict=True)
    }
    state = saved["state"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: state is a {type(state).__name__}, not a dict")
    amsgrad = any(g.get("amsgrad") for g in live["param_groups"])
    moments = {"exp_avg", "exp_avg_sq", *(["max_exp_avg_sq"] if amsgrad else [])}
    for index, entry in state.items():
        if index not in params:
            raise CheckpointError(f"{source}: state[{index!r}] names no parameter of this run's optimizer")
        param = params[index]
        if not isinstance(entry, dict) or set(entry) != {"step", *moments}:
            keys = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
            raise CheckpointError(f"{source}: state[{index}] holds {keys}, not step and {sorted(moments)}")
        for key, value in entry.items():
            where = f"{source}: state[{index}].{key}"
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise CheckpointError(f"{where} is not a floating-point tensor")
            shape = () if key == "step" else tuple(param.shape)
            if tuple(value.shape) != shape:
                raise CheckpointError(f"{where} has shape {tuple(value.shape)}, the parameter's state has {shape}")
            if key != "step" and value.dtype != param.dtype:
                raise CheckpointError(f"{where} is {value.dtype}, the parameter is {param.dtype}")
            if not bool(torch.isfinite(value).all()) or (key == "step" and float(value) < 0):
                raise CheckpointError(f"{where} holds a value that is not finite (or a negative step)")


def check_scheduler_state(saved: dict[str, Any], scheduler: Any, source: Path, steps: int) -> None:
    """Refuse a scheduler state that does not fit ``scheduler``: other fields, a field of another type or not
    finite, ``last_epoch`` outside ``[0, steps]`` (the run's steps), a learning rate below 0."""
    live = scheduler.state_dict()
    if set(saved) != set(live):
        raise CheckpointError(f"{source}: holds {sorted(map(str, saved))}, not the scheduler's {sorted(live)}")
    for key, value in live.items():
        if not _like(saved[key], value):
            raise CheckpointError(
                f"{source}: {key}={str(saved[key])[:80]} is not a finite value of the type this run's scheduler "
                f"holds there ({str(value)[:80]})"
            )
    last = saved.get("last_epoch")
    if last is not None and not (isinstance(last, int) and 0 <= last <= steps):
        raise CheckpointError(f"{source}: last_epoch={last!r} is not a step of this run's {steps} steps")
    for key in ("base_lrs", "_last_lr"):
        if any(v < 0 for v in saved.get(key) or []):
            raise CheckpointError(f"{source}: {key} holds a negative learning rate")
    for i, fn in enumerate(saved.get("lr_lambdas") or []):
        if isinstance(fn, dict) and not all(v >= (1 if k == "total" else 0) for k, v in fn.items() if is_number(v)):
            raise CheckpointError(f"{source}: lr_lambdas[{i}] holds {fn}: the schedule's steps must be positive")


def check_info(info: dict[str, Any], source: Path, steps: int) -> None:
    """Refuse a ``state.json`` whose ``step`` is past the run's ``steps`` or whose ``world_size`` is not a
    positive process count."""
    step = info["step"]
    if step > steps:
        raise CheckpointError(
            f"{source}: step={step} is past this run's {steps} steps (a checkpoint of another run, or one "
            "written with more steps than this run is given)"
        )
    world = info.get("world_size", 1)
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise CheckpointError(f"{source}: world_size={world!r} is not a number of processes")
