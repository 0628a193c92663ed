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

Fully sharded data parallel: under ``accelerate launch`` with an FSDP configuration (accelerate exports
``ACCELERATE_USE_FSDP=true`` and ``FSDP_*`` settings to the processes it starts), :func:`setup_distributed`
records the settings in :attr:`DistContext.fsdp`. The trainer then shards the model with PyTorch's FSDP2
(:func:`shard_model`: ``fully_shard`` on each transformer layer, then on the whole model) instead of wrapping
it in DDP; the losses gather in-batch negatives exactly as under DDP (FSDP reduce-scatters the averaged
gradients, which is the same bookkeeping). :func:`full_model_state` and :func:`full_optimizer_state` gather
whole tensors on the CPU of rank 0 for saving; :func:`load_full_state` shards them back on resume.

DeepSpeed ZeRO stage 1/2: under ``accelerate launch`` with a DeepSpeed configuration (accelerate exports
``ACCELERATE_USE_DEEPSPEED=true`` and ``ACCELERATE_DEEPSPEED_*`` settings), :func:`setup_distributed` records the
settings in :attr:`DistContext.deepspeed`. The trainer then hands the model and its AdamW to
:func:`deepspeed_engine` (``deepspeed.initialize``), which shards the optimizer state and gradients and keeps whole
parameters on every process; the losses gather in-batch negatives as under DDP (ZeRO averages the gradients).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lmembed.errors import ConfigError

__all__ = [
    "DeepSpeedSettings",
    "DistContext",
    "FsdpSettings",
    "deepspeed_engine",
    "full_model_state",
    "full_optimizer_state",
    "gather_with_grad",
    "global_batch_offset",
    "is_distributed",
    "load_full_state",
    "rank",
    "setup_distributed",
    "shard_model",
    "world_size",
]

log = logging.getLogger(__name__)


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


def _env_flag(name: str, default: str = "false") -> bool:
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class FsdpSettings:
    """The FSDP settings accelerate passes to the processes it launches (``fsdp_config`` of its config file).

    ``layer_classes`` names the transformer layer classes that become FSDP units
    (``fsdp_transformer_layer_cls_to_wrap``); empty means the model's own ``_no_split_modules``.
    """

    reshard_after_forward: bool = True
    layer_classes: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls) -> FsdpSettings | None:
        """The settings when accelerate asked for FSDP (``ACCELERATE_USE_FSDP``), else ``None``.

        Only FSDP2 is implemented; settings lmembed cannot honour are refused rather than ignored.
        """
        if not _env_flag("ACCELERATE_USE_FSDP"):
            return None
        version = os.environ.get("FSDP_VERSION", "1")
        if version != "2":
            raise ConfigError(
                f"lmembed trains with FSDP2 only: set fsdp_version: 2 in the accelerate config (got {version})"
            )
        refused = {
            "FSDP_OFFLOAD_PARAMS": ("fsdp_offload_params", "CPU offload is not supported yet"),
            "FSDP_ACTIVATION_CHECKPOINTING": ("fsdp_activation_checkpointing", "use --gradient-checkpointing instead"),
        }
        for name, (key, why) in refused.items():
            if _env_flag(name):
                raise ConfigError(f"set {key}: false in the accelerate config ({why})")
        reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").strip().lower()
        if reshard not in ("true", "false"):  # FSDP1 strategy names (FULL_SHARD, ...): FSDP2 takes a boolean
            raise ConfigError(f"fsdp_reshard_after_forward must be true or false with FSDP2 (got {reshard})")
        classes = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
        return cls(
            reshard_after_forward=reshard == "true",
            layer_classes=tuple(name.strip() for name in classes.split(",") if name.strip()),
        )


@dataclass(frozen=True)
class DeepSpeedSettings:
    """The DeepSpeed settings accelerate passes to the processes it launches (``deepspeed_config`` of its config
    file). ``gradient_clipping`` is accelerate's value (None when unset); lmembed clips to its own max_grad_norm."""

    zero_stage: int = 2
    gradient_clipping: float | None = None

    @classmethod
    def from_environment(cls) -> DeepSpeedSettings | None:
        """The settings when accelerate asked for DeepSpeed (``ACCELERATE_USE_DEEPSPEED``), else ``None``.

        ZeRO stages 1 and 2 without offload are implemented (whole parameters on every process); settings lmembed
        cannot honour are refused rather than ignored.
        """
        if not _env_flag("ACCELERATE_USE_DEEPSPEED"):
            return None
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2").strip()
        if stage not in ("1", "2"):
            raise ConfigError(
                f"lmembed trains with DeepSpeed ZeRO stage 1 or 2 only (got zero_stage: {stage}); "
                "to shard the parameters too, use configs/accelerate/fsdp.yaml"
            )
        if os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
            raise ConfigError(
                "lmembed builds the DeepSpeed configuration itself: set zero_stage in the accelerate config "
                "instead of deepspeed_config_file"
            )
        for name, key in (
            ("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "offload_optimizer_device"),
            ("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "offload_param_device"),
        ):
            if os.environ.get(name, "none").strip().lower() != "none":
                raise ConfigError(f"set {key}: none in the accelerate config (offload is not supported yet)")
        accumulation = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1").strip()
        if accumulation != "1":
            raise ConfigError(
                f"set gradient_accumulation_steps: 1 in the accelerate config (got {accumulation}); "
                "for bigger batches use --grad-cache-chunk under DDP or more processes"
            )
        clipping = os.environ.get("ACCELERATE_GRADIENT_CLIPPING", "").strip().lower()
        return cls(zero_stage=int(stage), gradient_clipping=float(clipping) if clipping not in ("", "none") else None)


@dataclass
class DistContext:
    """This process's place in a (possibly single-process) run.

    ``fsdp`` holds the FSDP settings when the model is to be sharded (FSDP2) rather than wrapped in DDP;
    ``deepspeed`` the DeepSpeed settings when ``deepspeed.initialize`` is to own the model and optimizer.
    """

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    fsdp: FsdpSettings | None = None
    deepspeed: DeepSpeedSettings | None = None

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
    (this process's GPU) or an explicit ``cuda:N``. Under an FSDP configuration of accelerate (several
    processes), the context's ``fsdp`` carries its settings; under a DeepSpeed one, its ``deepspeed``.
    """
    fsdp = FsdpSettings.from_environment()
    deepspeed = DeepSpeedSettings.from_environment()
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
    if fsdp is not None and world_size() == 1:
        log.warning("FSDP was requested for a single process: training without sharding")
        fsdp = None
    if deepspeed is not None and world_size() == 1:
        log.warning("DeepSpeed was requested for a single process: training without it")
        deepspeed = None
    return DistContext(rank(), world_size(), device, fsdp, deepspeed)


# ---------------------------------------------------------------------------------------------- DeepSpeed
def deepspeed_engine(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    settings: DeepSpeedSettings,
    *,
    micro_batch_size: int,
    max_grad_norm: float | None,
) -> Any:
    """``deepspeed.initialize`` of ``model`` with ``optimizer`` (lmembed's AdamW, whose param groups the caller's
    learning-rate schedule keeps driving) under ZeRO ``settings.zero_stage``; returns the engine, which runs the
    forward pass, ``backward`` (gradient reduce-scatter) and ``step`` (clipping to ``max_grad_norm``, the update,
    and the all-gather that leaves whole parameters in ``model`` on every process).

    The process group must be initialised already (DeepSpeed joins it, gloo on CPU included).
    """
    # Lazy: DeepSpeed is an optional extra (pip install lmembed[deepspeed]); only DeepSpeed runs import it.
    import deepspeed

    dtypes = {param.dtype for param in model.parameters() if param.requires_grad}
    if torch.float16 in dtypes:
        raise ConfigError("DeepSpeed training of float16 weights is not supported: use --dtype bfloat16 or float32")
    if max_grad_norm is not None and settings.gradient_clipping not in (None, max_grad_norm):
        log.warning(
            "accelerate's gradient_clipping (%s) is not read: lmembed clips to max_grad_norm=%s",
            settings.gradient_clipping,
            max_grad_norm,
        )
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": settings.zero_stage},
        "gradient_clipping": max_grad_norm or 0.0,
        "bf16": {"enabled": torch.bfloat16 in dtypes},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    log.info("DeepSpeed ZeRO stage %d over %d processes", settings.zero_stage, world_size())
    return engine


# ---------------------------------------------------------------------------------------------- FSDP2
def _transformer_layers(model: nn.Module, class_names: tuple[str, ...]) -> list[nn.Module]:
    """The submodules that become FSDP units: instances of ``class_names``, or of the ``_no_split_modules``
    that Hugging Face models declare (their decoder/encoder layer classes)."""
    names = set(class_names)
    if not names:
        for module in model.modules():
            names.update(getattr(module, "_no_split_modules", None) or ())
    return [module for module in model.modules() if module is not model and type(module).__name__ in names]


def shard_model(model: nn.Module, settings: FsdpSettings, device: str) -> nn.Module:
    """Shard ``model`` in place over all processes with FSDP2: each transformer layer, then the whole model.

    Call it before the optimizer is built (it must see the sharded parameters). Returns ``model``.
    """
    from torch.distributed.device_mesh import init_device_mesh  # lazy: only FSDP runs need these
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(torch.device(device).type, (world_size(),))
    layers = _transformer_layers(model, settings.layer_classes)
    if not layers:
        log.warning("no transformer layers found to shard one by one: the model is one FSDP unit")
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=settings.reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=settings.reshard_after_forward)
    log.info("FSDP2: %d layers and the model sharded over %d processes", len(layers), world_size())
    return model


def _full_options(**extra: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **extra)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """Whole tensors of a sharded model's state dict, on the CPU of rank 0 (empty on the others).

    A collective: every process must call it.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state of a sharded model as whole tensors keyed by parameter name, on rank 0's CPU.

    A collective: every process must call it.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """Shard whole tensors (as :func:`full_model_state` and :func:`full_optimizer_state` wrote them) back into
    a sharded model and its optimizer; ``model_state`` may hold a subset of the parameters (the trained ones).
    Every process passes the full state."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, model_state, options=_full_options(strict=False))
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=_full_options())


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
